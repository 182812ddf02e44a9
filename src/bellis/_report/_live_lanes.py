"""The lanes a run leaves in its tracking store: ``live_lanes.json``.

A store without per-block stamps (a task without ``resource_tracking``) does not say
which worker ran a block, nor when: only the driver knows, from the blocks it takes back.
So that ``bellis serve`` (another process, during the run or after it) draws the same
lanes as the run's own page, the driver writes its window of recent blocks into the
store as one small JSON document (``_run._lanes.LanesWriter``): at most every
:data:`WRITE_SECONDS` while blocks come back, and once more when the run ends, each time
replacing the whole file atomically (a reader sees the old document or the new one,
never half of one). Never per block.

The document (:data:`FORMAT` 1)::

    {"format": 1, "written": UNIX seconds, "pid": the driver's,
     "blocks": base64 of a little-endian float64 array of n rows
               [worker, sent, returned, cell, ok],           # the latest, oldest first
     "races": [[cell, winner's worker, its start, loser's worker, its start, ended,
                the copy won], ...],                        # the races that ended
     "racing": [[cell, original's worker, its start, copy's worker, its start], ...]}

Workers are the driver's worker ids (-1: the driver itself, a serial run), times UNIX
seconds, cells the store's flat cells. A file this module cannot read (another format, a
torn copy from a filesystem without atomic renames) is treated as absent and said so.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np

from ._live_recent import attach_marks, driver_recent, race_marks, running_marks

__all__ = [
    "FORMAT",
    "LANES_NAME",
    "WRITE_SECONDS",
    "file_marks",
    "file_recent",
    "lanes_document",
    "read_lanes",
    "snapshot",
    "write_lanes",
]

#: the file, in the store's directory (a zarr reader ignores it)
LANES_NAME: Final = "live_lanes.json"
FORMAT: Final = 1
#: how often the driver rewrites it at most, while blocks come back
WRITE_SECONDS: Final = 2.0
_TMP_PREFIX: Final = ".bellis-tmp-"

_T = TypeVar("_T")


def snapshot(items: Iterable[_T]) -> list[_T]:
    """A list of ``items`` (a collection or a dict's view, which the run's thread changes
    while this thread reads it): a copy that met a change is taken again."""
    for _ in range(100):
        try:
            return list(items)
        except RuntimeError:  # "deque mutated during iteration", "dict changed size"
            continue
    return []


def lanes_document(
    blocks: Sequence[tuple[int, float, float, int, bool]],
    races: Sequence[tuple[int, int, float, int, float, float, bool]],
    racing: Sequence[tuple[int, int, float, int, float]],
    cell_of: Callable[[int], int] | None,
    written: float,
) -> bytes:
    """The document of a run's window: ``blocks`` ``(worker, sent, returned, k, ok)``,
    the ended ``races`` and the ``racing`` pairs, each naming block ``k`` (its cell:
    ``cell_of``, None: ``k`` is its cell). The blocks go as one binary column block (a
    few ms for 5,000 of them: the run's last write is in its wall time)."""
    table = np.array(blocks, dtype="<f8").reshape(-1, 5)
    of = _same if cell_of is None else cell_of
    if cell_of is not None and len(table):
        table[:, 3] = [cell_of(k) for k in table[:, 3].astype(np.int64).tolist()]
    doc = {
        "format": FORMAT,
        "written": round(written, 4),
        "pid": os.getpid(),
        "blocks": base64.b64encode(np.ascontiguousarray(table).tobytes()).decode("ascii"),
        "races": [
            [of(k), ww, round(ws, 4), wl, round(ls, 4), round(end, 4), 1 if copy else 0]
            for k, ww, ws, wl, ls, end, copy in races
        ],
        "racing": [[of(k), wo, round(so, 4), wc, round(sc, 4)] for k, wo, so, wc, sc in racing],
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def write_lanes(root: Path, data: bytes) -> None:
    """Replace ``root``'s lanes file with ``data`` atomically (a temporary file in the
    same directory, then ``os.replace``); not durable: a crash loses a snapshot at most."""
    file = root / LANES_NAME
    tmp = root / f"{_TMP_PREFIX}{os.getpid()}-{LANES_NAME}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_lanes(root: Path) -> dict[str, Any] | None:
    """``root``'s lanes document; None when there is none. Raises ValueError for a file
    that is not one (the caller says so on the page)."""
    try:
        raw = (root / LANES_NAME).read_bytes()
    except FileNotFoundError:
        return None
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{root / LANES_NAME} is not a lanes document of format {FORMAT}")
    return doc


def _same(cell: int) -> int:
    return cell


def _marks(doc: dict[str, Any], run_going: bool) -> list[dict[str, Any]]:
    marks = race_marks(
        [
            (int(c), int(ww), float(ws), int(wl), float(ls), float(e), bool(cp))
            for c, ww, ws, wl, ls, e, cp in doc["races"]
        ],
        _same,
    )
    if run_going:
        going = [
            (int(c), int(wo), float(so), int(wc), float(sc)) for c, wo, so, wc, sc in doc["racing"]
        ]
        marks += running_marks(going, _same, float(doc["written"]))
    return marks


def file_marks(root: Path, run_going: bool) -> list[dict[str, Any]]:
    """The races' marks of ``root``'s lanes file (none without one): for the lanes drawn
    from a store's per-block stamps."""
    doc = read_lanes(root)
    return [] if doc is None else _marks(doc, run_going)


def file_recent(root: Path, run_going: bool) -> dict[str, Any] | None:
    """The lanes, histogram and trend (as the run's own page draws them) and the races'
    marks from ``root``'s lanes file; None without one, or before a block came back. A
    race still going is drawn up to when the file was written, and only while the run
    goes (``run_going``): a file left by a run that died mid-race does not show it
    running forever."""
    doc = read_lanes(root)
    if doc is None:
        return None
    raw = base64.b64decode(doc["blocks"], validate=True)
    out = driver_recent(np.frombuffer(raw, dtype="<f8").reshape(-1, 5), _same)
    if out is None:
        return None
    out["source"] = "file"
    attach_marks(out, _marks(doc, run_going))
    return out
