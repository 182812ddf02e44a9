"""Clearing chosen done markers, and the record of the last ``bellis verify``.

``bellis verify --reset`` clears the done markers of the blocks whose outputs did not
verify and of the downstream blocks that read them, so the next run redoes exactly those.
It does so under the store's run lock (:class:`~._disk.StoreLock`): a store a run holds is
refused, naming the run. Only the ``done`` byte of each cell is cleared; failure counts,
figures and the block's old checksum stay (a rerun overwrites the checksum before it
marks the block done again).

``verify.json`` keeps what the last verify found, for ``bellis status`` and the report::

    {"version": 1, "time": <UNIX seconds>, "checked": n, "verified": n,
     "missing": [cell, ...], "changed": [cell, ...], "unverifiable": n, "reset": bool,
     "grid": [n, ...]}

``missing`` and ``changed`` hold at most :data:`MAX_LISTED` cells each (the counts are
``missing_count`` and ``changed_count``), flat cells of the tracking grid ``grid``. The
readers count a listed cell as mismatched only while it is still what the verify saw:

* a verify with ``reset`` cleared every cell it lists: a listed cell done again was
  redone since (and verified by its new checksum), so none counts;
* otherwise a listed cell counts while it is done;
* the cells name places in ``grid``: a migration to a grown volume remaps them
  (:func:`remap_verify_record`, after its commit), and a record whose ``grid`` is not the
  store's (a migration interrupted between the two) lists nothing. A record without
  ``grid`` (an older bellis) is taken as it is.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from .._donemarks import is_store_url
from ..errors import TrackingError
from ._disk import StoreLock
from ._files import clear_cells, map_array, write_atomic

__all__ = [
    "MAX_LISTED",
    "VERIFY_NAME",
    "VerifyCounts",
    "clear_done",
    "read_verify_record",
    "remap_verify_record",
    "verify_codes",
    "verify_counts",
    "write_verify_record",
]

VERIFY_NAME = "verify.json"
#: the most cells ``verify.json`` lists per kind
MAX_LISTED = 100_000


def clear_done(path: str | os.PathLike[str], grid: tuple[int, ...], cells: Sequence[int]) -> int:
    """Clear the done markers of flat ``cells`` of the store at ``path`` (tracking grid
    ``grid``) under its run lock; returns how many were done."""
    display = os.fspath(path)
    root = Path(path)
    try:
        lock = StoreLock.acquire(root, display)
    except OSError as exc:
        raise TrackingError(f"cannot lock block tracking at {display}: {exc}") from exc
    try:
        mapped = map_array(root, "done", grid)
        done = mapped.reshape(-1)
        cleared = clear_cells(done, cells)
        mapped.flush()
        del done, mapped
    except OSError as exc:
        raise TrackingError(f"io error clearing done markers at {display}: {exc}") from exc
    finally:
        lock.release()
    return cleared


def write_verify_record(
    path: str | os.PathLike[str],
    *,
    checked: int,
    verified: int,
    missing: Sequence[int],
    changed: Sequence[int],
    unverifiable: int,
    reset: bool,
    grid: Sequence[int],
) -> None:
    """Write ``verify.json`` into the store at ``path`` (tracking grid ``grid``),
    atomically."""
    doc: dict[str, Any] = {
        "version": 1,
        "time": time.time(),
        "checked": checked,
        "verified": verified,
        "missing_count": len(missing),
        "changed_count": len(changed),
        "missing": sorted(missing)[:MAX_LISTED],
        "changed": sorted(changed)[:MAX_LISTED],
        "unverifiable": unverifiable,
        "reset": reset,
        "grid": [int(n) for n in grid],
    }
    _write(path, doc)


def _write(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    data = json.dumps(doc, sort_keys=True).encode()
    if is_store_url(path):  # the object <prefix>/verify.json
        from ._s3objects import write_object

        write_object(path, VERIFY_NAME, data)
        return
    try:
        write_atomic(Path(path) / VERIFY_NAME, data)
    except OSError as exc:
        raise TrackingError(f"cannot write {Path(path) / VERIFY_NAME}: {exc}") from exc


def _read_bytes(path: str | os.PathLike[str], name: str) -> bytes:
    """The store's file (on S3: object) ``name``; OSError when it cannot be read."""
    if is_store_url(path):
        from ._s3objects import read_object

        raw = read_object(path, name)
        if raw is None:
            raise FileNotFoundError(name)
        return raw
    return (Path(path) / name).read_bytes()


def _read(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        doc = json.loads(_read_bytes(path, VERIFY_NAME))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("version") == 1 else None


def _store_grid(path: str | os.PathLike[str]) -> list[int] | None:
    """The tracking grid of the store at ``path`` (its ``done`` array's shape)."""
    try:
        meta = json.loads(_read_bytes(path, "done/zarr.json"))
        return [int(n) for n in meta["shape"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_verify_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``verify.json`` of the store at ``path``; None when it was never verified (or the
    record cannot be read: it is a summary, not the store's state). A record of another
    grid than the store's lists no cells (module docstring). A store on S3 keeps it as
    the object ``<prefix>/verify.json``."""
    doc = _read(path)
    if doc is not None and isinstance(doc.get("grid"), list):
        if doc["grid"] != _store_grid(path):
            doc = {**doc, "missing": [], "changed": [], "stale_grid": True}
    return doc


def remap_verify_record(
    path: str | os.PathLike[str],
    old_grid: Sequence[int],
    new_grid: Sequence[int],
    shift: Sequence[int],
) -> bool:
    """After a migration to a grown volume (old cell ``c`` is new cell ``c + shift``):
    rewrite the cells ``verify.json`` lists in ``new_grid``. Returns whether it rewrote
    one; a record of another grid than ``old_grid`` is left as it is."""
    doc = _read(path)
    if doc is None:
        return False
    if doc.get("grid") not in (None, [int(n) for n in old_grid]):
        return False
    old = tuple(int(n) for n in old_grid)
    new = tuple(int(n) for n in new_grid)
    for kind in ("missing", "changed"):
        cells = np.asarray([int(c) for c in doc.get(kind) or []], dtype=np.int64)
        cells = cells[(cells >= 0) & (cells < int(np.prod(old, dtype=np.int64)))]
        if cells.size:
            coords = np.unravel_index(cells, old)
            moved = tuple(c + int(k) for c, k in zip(coords, shift, strict=True))
            cells = np.ravel_multi_index(moved, new)
        doc[kind] = sorted(int(c) for c in cells)
    doc["grid"] = list(new)
    _write(path, doc)
    return True


#: cells per pass of :func:`verify_counts` (no grid-size temporaries)
_SLAB = 1 << 22


class VerifyCounts(NamedTuple):
    """Done blocks by what verify knows of them (``bellis status``, the report)."""

    verified: int  #: a checksum recorded, and not listed as mismatched by the last verify
    mismatched: int  #: listed as missing or changed by the last verify, and still done
    unverifiable: int  #: done without a checksum
    last_verify: float | None  #: when the last ``bellis verify`` ran (None: never)


def _listed(record: dict[str, Any] | None) -> NDArray[np.int64]:
    """The cells ``record`` lists as mismatched that may still be (module docstring)."""
    if record is None or record.get("reset"):
        return np.zeros(0, dtype=np.int64)
    cells = [c for kind in ("missing", "changed") for c in record.get(kind) or []]
    return np.asarray(sorted(int(c) for c in cells), dtype=np.int64)


def verify_codes(
    done: NDArray[Any], checksums: NDArray[Any] | None, record: dict[str, Any] | None
) -> NDArray[np.int8]:
    """Per cell of flat ``done``: -1 not done, 0 done without a checksum, 1 verified (a
    checksum recorded), 2 mismatched (the last verify's ``record`` lists it)."""
    codes = np.where(np.asarray(done) != 0, np.int8(0), np.int8(-1))
    if checksums is not None:
        codes[(codes == 0) & (np.asarray(checksums) != 0)] = 1
    listed = _listed(record)
    listed = listed[(listed >= 0) & (listed < codes.size)]
    hit = listed[codes[listed] >= 0]
    codes[hit] = 2
    return codes


def verify_counts(
    done: NDArray[Any], checksums: NDArray[Any] | None, record: dict[str, Any] | None
) -> VerifyCounts:
    """:class:`VerifyCounts` of flat ``done`` and ``checksums``, a slab at a time."""
    verified = unverifiable = 0
    n = int(done.size)
    for a in range(0, n, _SLAB):
        d = np.asarray(done[a : a + _SLAB]) != 0
        if checksums is None:
            unverifiable += int(np.count_nonzero(d))
            continue
        c = np.asarray(checksums[a : a + _SLAB]) != 0
        verified += int(np.count_nonzero(d & c))
        unverifiable += int(np.count_nonzero(d & ~c))
    listed = _listed(record)
    listed = listed[(listed >= 0) & (listed < n)]
    still = listed[np.asarray(done)[listed] != 0] if listed.size else listed
    mismatched = int(still.size)
    if mismatched and checksums is not None:
        # a listed cell had a checksum when it was verified: it leaves the verified count
        verified -= int(np.count_nonzero(np.asarray(checksums)[still] != 0))
    last = record.get("time") if record is not None else None
    return VerifyCounts(
        max(0, verified),
        mismatched,
        unverifiable,
        float(last) if isinstance(last, int | float) else None,
    )
