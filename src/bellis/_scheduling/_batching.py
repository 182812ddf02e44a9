"""How many blocks a connection gets at once, and the checks on what a returned batch
reports about itself (its measurement rows, the worker's busy time). Pure functions of
plain values; :mod:`bellis._scheduling._dispatch` calls them once per returned batch.

A batch aims at about :data:`BATCH_TARGET_SECONDS` of work: it at most doubles per round
trip and shrinks at once when blocks get slow. The pace per block comes from the time the
worker reports it spent on the batch (bellis's client sends it with its ACQUIRE); a client
that does not report it is paced by the round trip, which also counts the time its
returned batch waited in the server behind the other connections (with many connections
that wait alone would shrink every batch to one block).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from .._block import BlockStatus
from .._protocol import STATS_ROW, Returned
from .._stats._aggregates import STATS_DTYPE
from ..errors import ProtocolError

__all__ = [
    "BATCH_TARGET_SECONDS",
    "MAX_BATCH",
    "busy_seconds",
    "measured_rows",
    "measurements",
    "next_batch",
    "unmeasured_error",
]

#: a connection gets as many ready blocks at once as fit in about this much time (measured
#: per block), so fast blocks share one round trip; blocks slower than this go one at a time
BATCH_TARGET_SECONDS: Final = 0.02
MAX_BATCH: Final = 64

_ROW_BYTES: Final = STATS_ROW.size
_SECONDS_COLUMNS: Final = [0, 1, 7]  # wall, cpu, cpu_children in a STATS_ROW
_GPU_UTIL_COLUMN: Final = 5
_INF: Final = float("inf")
_SUCCESS: Final = int(BlockStatus.SUCCESS)


def next_batch(batch: int, seconds_per_block: float) -> int:
    """The next batch size after a batch of ``batch`` blocks at ``seconds_per_block``:
    at most twice ``batch`` (and :data:`MAX_BATCH`), at once smaller when blocks are slow."""
    ideal = int(BATCH_TARGET_SECONDS / seconds_per_block) if seconds_per_block > 0 else MAX_BATCH
    if ideal > batch:
        return min(ideal, batch * 2, MAX_BATCH)
    return max(1, ideal)


def busy_seconds(value: Any) -> float:
    """The busy time a client reports for the batch it returns: finite, non-negative."""
    if not 0.0 <= value < _INF:  # (NaN fails the comparison too)
        raise ProtocolError(f"malformed busy time {value!r}: not a finite number >= 0")
    return float(value)


def measurements(rows: Any) -> np.ndarray[Any, Any]:
    """A message's ``rows`` as a ``STATS_DTYPE`` array, checked as a whole: wall, CPU
    and child CPU finite and non-negative, GPU utilisation NaN (not measured) or a
    percentage (the integer fields are unsigned by type)."""
    if type(rows) is not bytes or not rows or len(rows) % _ROW_BYTES:
        raise ProtocolError("malformed measurements: not a whole number of stats rows")
    floats = np.frombuffer(rows, dtype="<f8").reshape(-1, 8)
    seconds = floats[:, _SECONDS_COLUMNS]
    if not ((seconds >= 0.0) & (seconds < _INF)).all():
        raise ProtocolError("malformed measurements: a time is negative, infinite or NaN")
    util = floats[:, _GPU_UTIL_COLUMN]
    if not (np.isnan(util) | ((util >= 0.0) & (util <= 100.0))).all():
        raise ProtocolError("malformed measurements: a GPU utilisation outside 0..100")
    return np.frombuffer(rows, dtype=STATS_DTYPE)


def measured_rows(
    processed: list[Returned], tracking: bool
) -> tuple[list[int], list[int], list[int]] | int:
    """The successful blocks of a returned batch ``processed`` (``(k, status, row,
    error)``, unstarted blocks left out) that carry a measurement row: their blocks, rows
    and places in the batch. An int instead: the first success without a row in a task
    with resource ``tracking`` (the run fails on it)."""
    ks: list[int] = []
    picks: list[int] = []
    slots: list[int] = []
    for i, (k, status, row, _error) in enumerate(processed):
        if status != _SUCCESS:
            continue
        if row >= 0:
            ks.append(k)
            picks.append(row)
            slots.append(i)
        elif tracking:
            return k
    return ks, picks, slots


def unmeasured_error(addr: str, task_id: str, k: int) -> RuntimeError:
    """The error a run fails with when a client at ``addr`` returned block ``k`` of a task
    with resource tracking without its measurements."""
    return RuntimeError(
        f'task "{task_id}" has resource_tracking enabled but worker at {addr} returned '
        f"block {task_id}/{k} without measurements. Wrap the block body in "
        "`with bellis.profile_block(block):` (daisy.profile_block) — bellis's own workers "
        "do this automatically, so this usually means a custom client is bypassing "
        "bellis.Client."
    )
