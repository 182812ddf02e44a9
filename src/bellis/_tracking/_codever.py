"""Which code made each done block: the store's fingerprint table and ``code_version``.

On disk, beside the arrays of ``_store``::

    <path>/code_versions.json        {"format": 1, "versions": [{index, hash, first_seen,
                                     functions, files, version, packages}, ...]}
    <path>/code_version/...          uint16 per cell: the index of the fingerprint that
                                     made the done block; 0 = unknown

The table holds each fingerprint once (the run's ``_fingerprint.Fingerprint.record()``
plus its index and the UNIX time it was first seen); indices start at 1. The array is
created by the first run that records a fingerprint, like ``memory_grant_mb``: blocks
done before it (daisy 2.0.0, older bellis) read 0, "unknown", and are never reported as
made by other code. daisy 2.0.0 ignores both the file and the array.

The scheduler writes one uint16 per block marked done (``TrackingStore.code_view``,
``record_success``), before the done byte, so a done block always names its code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrackingError
from ._files import read_json, write_atomic

__all__ = [
    "CODE_ARRAY",
    "MAX_CODE_INDEX",
    "TABLE_NAME",
    "clear_cells",
    "code_counts",
    "read_table",
    "register",
]

CODE_ARRAY = "code_version"
TABLE_NAME = "code_versions.json"
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


def register(root: Path, record: dict[str, Any], now: float) -> tuple[int, list[dict[str, Any]]]:
    """The index of fingerprint ``record`` in the table at ``root``, appended (first seen
    ``now``) when new; returns it with the table."""
    table = read_table(root)
    for entry in table:
        if entry.get("hash") == record.get("hash"):
            return int(entry["index"]), table
    index = max((int(e["index"]) for e in table), default=0) + 1
    if index > MAX_CODE_INDEX:
        return 0, table
    table.append({"index": index, "first_seen": now, **record})
    doc = {"format": 1, "versions": table}
    # durable: the table must survive whatever the done markers that name it survive
    write_atomic(
        root / TABLE_NAME, json.dumps(doc, indent=1, sort_keys=True).encode(), durable=True
    )
    return index, table


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


def clear_cells(done: Any, codes: Any, indices: list[int]) -> int:
    """Unmark the done cells made by the fingerprints ``indices``; returns how many."""
    wanted = np.asarray(sorted(indices), dtype=np.uint16)
    cleared = 0
    for _start, d, c in _slabs(done, codes):
        hit = (d != 0) & np.isin(c, wanted)
        n = int(np.count_nonzero(hit))
        if n:
            d[hit] = 0
            cleared += n
    return cleared
