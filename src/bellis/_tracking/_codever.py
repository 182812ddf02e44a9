"""Which code made each done block: the store's code-version table and ``code_version``.

On disk, beside the arrays of ``_store``::

    <path>/code_versions.json        {"format": 1, "versions": [{index, hash, first_seen,
                                     run_started_at, functions, files, version, packages
                                     | same_as}, ...]}
    <path>/code_version/...          uint16 per cell: the index of the entry whose run
                                     made the done block; 0 = unknown

Every run that has blocks to do adds one entry (indices start at 1): its fingerprint
(``_fingerprint.Fingerprint.record()``), the UNIX time its run started
(``run_started_at``) and the time that fingerprint was first seen in this store
(``first_seen``). A fingerprint seen before is not written again: the entry names the
first entry of that hash (``same_as``). So the index of a done block says both which code
made it and in which run, and two blocks of two tasks compare by the start of the runs
that made them: a block made in a later run than a downstream block that reads it was
redone after that block (``_run/_provenance``). A fingerprint is one code version; an
index is one run of it.

The array is created by the first run that records an index, like ``memory_grant_mb``:
blocks done before it (daisy 2.0.0, older bellis) read 0, "unknown", are never reported
as made by other code, and count as made before any known run. daisy 2.0.0 ignores the
file and the array. Past 65,535 entries a run records its blocks as 0 (unknown).

The scheduler writes one uint16 per block marked done (``TrackingStore.hot_writer``,
``record_success``), before the done byte, so a done block always names its code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._fingerprint import CODE_ARRAY_NAME, CODE_TABLE_NAME, RECORD_KEYS, resolve, version_counts
from ..errors import TrackingError
from ._files import read_json, write_atomic

__all__ = [
    "CODE_ARRAY",
    "MAX_CODE_INDEX",
    "RECORD_KEYS",
    "TABLE_NAME",
    "add_entry",
    "code_counts",
    "made_at",
    "read_table",
    "register",
    "resolve",
    "version_counts",
]

CODE_ARRAY = CODE_ARRAY_NAME
TABLE_NAME = CODE_TABLE_NAME
#: the largest index a uint16 holds; later fingerprints are stored as 0 (unknown)
MAX_CODE_INDEX = 2**16 - 1

_SLAB = 1 << 22  # cells per pass: no grid-size temporaries


def read_table(root: Path) -> list[dict[str, Any]]:
    """The fingerprints a store has seen, by index (empty for a store without a table).

    A table that exists but cannot be read is an error, never an empty table: renumbering
    from 1 would credit blocks of other code to the current code."""
    path = root / TABLE_NAME
    try:
        doc = read_json(path)
    except (OSError, ValueError) as exc:
        raise TrackingError(
            f"cannot read the code-version table {path}: {exc}; restore it, or remove it "
            "and the store's code_version array (its done blocks then count as made by "
            "unknown code)",
            path=str(path),
        ) from exc
    if doc is None:
        return []
    versions = doc.get("versions")
    if not isinstance(versions, list):
        raise TrackingError(
            f"the code-version table {path} has no 'versions' list; restore it, or remove "
            "it and the store's code_version array",
            path=str(path),
        )
    return [v for v in versions if isinstance(v, dict) and isinstance(v.get("index"), int)]


def register(
    root: Path, record: dict[str, Any], started: float, floor: int = 0
) -> tuple[int, list[dict[str, Any]]]:
    """Add the entry of one run that started at ``started`` with fingerprint ``record``
    to the table at ``root``; returns its index (0 past :data:`MAX_CODE_INDEX`) and the
    table. A hash seen before is recorded as ``same_as`` its first entry.

    ``floor``: the largest index the store's ``code_version`` array holds. The new index
    is above it even when the table lacks those entries (deleted by hand, or lost): an
    index is never given to two runs, so blocks of a lost entry stay of unknown origin
    (other code) instead of being credited to this run's code."""
    table = read_table(root)
    index, text = add_entry(table, record, started, floor)
    if text is None:
        return 0, table
    # durable: the table must survive whatever the done markers that name it survive
    write_atomic(root / TABLE_NAME, text, durable=True)
    return index, table


def add_entry(
    table: list[dict[str, Any]], record: dict[str, Any], started: float, floor: int = 0
) -> tuple[int, bytes | None]:
    """:func:`register`'s entry appended to ``table`` (in place): its index and the
    table's new document; (0, None) past :data:`MAX_CODE_INDEX` (nothing added). For a
    store that keeps the table elsewhere than in a file (``_s3``)."""
    index = max(max((int(e["index"]) for e in table), default=0), floor) + 1
    if index > MAX_CODE_INDEX:
        return 0, None
    first = next((e for e in table if e.get("hash") == record.get("hash")), None)
    entry: dict[str, Any] = {"index": index, "hash": record.get("hash"), "run_started_at": started}
    if first is None:
        entry["first_seen"] = started
        entry.update((k, record.get(k)) for k in RECORD_KEYS)
    else:
        entry["first_seen"] = first.get("first_seen", started)
        entry["same_as"] = int(first.get("same_as", first["index"]))
    table.append(entry)
    # one entry per line, each by json's C encoder (``indent=`` takes the pure-Python one,
    # a millisecond or more of a run's start for an entry with many packages)
    lines = ",\n".join(json.dumps(e, sort_keys=True) for e in table)
    text = '{"format": 1, "versions": [\n' + lines + "\n]}\n"
    return index, text.encode()


def made_at(table: list[dict[str, Any]]) -> NDArray[np.float64]:
    """Per code index, when the run that made such a block started (UNIX seconds);
    ``-inf`` for 0 (unknown) and indices the table lacks: those blocks count as made
    before every known run. An entry of an older bellis, without ``run_started_at``,
    counts from its ``first_seen``."""
    times = np.full(MAX_CODE_INDEX + 1, -np.inf)
    for e in table:
        i = int(e["index"])
        t = e.get("run_started_at", e.get("first_seen"))
        if 0 < i <= MAX_CODE_INDEX and isinstance(t, int | float):
            times[i] = float(t)
    return times


def _slabs(done: Any, codes: Any) -> Any:
    flat_done = done.reshape(-1)
    flat_codes = codes.reshape(-1)
    for start in range(0, flat_done.size, _SLAB):
        yield start, flat_done[start : start + _SLAB], flat_codes[start : start + _SLAB]


def code_counts(done: Any, codes: Any) -> dict[int, int]:
    """Done cells per code index (0: unknown), one slab of cells at a time."""
    total = np.zeros(MAX_CODE_INDEX + 1, dtype=np.int64)
    for _start, d, c in _slabs(done, codes):
        sel = c[d != 0]
        if sel.size:
            total += np.bincount(sel, minlength=MAX_CODE_INDEX + 1)
    return {int(i): int(total[i]) for i in np.flatnonzero(total)}
