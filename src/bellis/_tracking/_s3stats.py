"""Per-block statistics of a tracking store on S3: one object per flush (docs/cloud.md).

A local store keeps its per-block figures in memory-mapped arrays, one element per cell
(``wall_seconds`` ... ``returned_at``, ``memory_grant_mb``, ``output_checksum``,
``cache_*``). An object has no partial write, so an S3 store cannot rewrite such arrays
at every flush (68 bytes a block for the resource arrays: 68 MB a flush for 10^6
blocks). Instead the driver writes, at a flush that has new figures, **one object of the
cells measured since the last flush**::

    <prefix>/stats/<run start ms>-<run id>-<flush number>.bin

and the readers list ``stats/`` once and merge the objects in key order (a later record
of a cell overwrites an earlier one, as a later write of the element would on disk).
The object is written before the flush's marker chunks, so a crash loses the figures of
at most the last interval, and a figure never names a block whose marker was not yet
written only for want of this object (the reverse: figures of a block whose marker was
lost run again and are overwritten).

The object's format (little-endian throughout)::

    b"BELLIS-STATS 1\\n"
    one line of JSON: {"groups": [{"arrays": [name, ...], "count": n}, ...]}
    then per group: n cells (int64, flat C-order indices), then per array n values
    (its ``ARRAY_DTYPES`` type)

A group names the arrays recorded together (the eleven resource arrays of a measured
block; the three stamps of a failed attempt; a grant; a checksum; the four cache counts).
A group of 0 cells says that the store has those arrays (a run with resource tracking
whose blocks were all skipped still has them, as on disk).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._block import STAMP_ARRAYS, STATS_ARRAYS
from ..errors import TrackingError
from ._layout import ARRAY_DTYPES, CACHE_ARRAYS, NO_WORKER, STAT_ARRAYS
from ._s3io import Bucket

__all__ = [
    "STATS_PREFIX",
    "PendingStats",
    "StatsLog",
    "encode_stats",
    "merge_stats",
    "read_stats",
]

#: the folder of the per-flush statistics objects below a store's prefix
STATS_PREFIX = "stats/"
_MAGIC = b"BELLIS-STATS 1\n"
_CELL = np.dtype("<i8")
_U32_MAX = 2**32 - 1


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")


#: what one flush takes from a log: per group of array names, its cells and their values
PendingStats = list[tuple[tuple[str, ...], NDArray[np.int64], dict[str, NDArray[Any]]]]


class StatsLog:
    """A writable S3 store's figures: whole arrays in the driver's memory (this run's
    records; a reader merges every run's objects) and, per group of arrays, the cells
    recorded since the last :meth:`take`.

    The recording thread writes the values, then (under a lock) appends the cell, so a
    flush that takes the cells reads values at least as new as the record that named them.
    """

    def __init__(self, cells: int) -> None:
        self._cells = cells
        self._arrays: dict[str, NDArray[Any]] = {}
        #: per group: the cells recorded one at a time, and those recorded as arrays
        self._pending: dict[tuple[str, ...], tuple[list[int], list[NDArray[np.int64]]]] = {}
        self._declared: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    def array(self, name: str) -> NDArray[Any]:
        """Array ``name`` (zeros where this run recorded nothing), made at first use."""
        found = self._arrays.get(name)
        if found is None:
            found = self._arrays[name] = np.zeros(self._cells, dtype=_dtype(name))
        return found

    def arrays(self, names: Iterable[str]) -> dict[str, NDArray[Any]]:
        """The arrays of ``names`` this run has (declared or recorded)."""
        return {n: self._arrays[n] for n in names if n in self._arrays}

    def declare(self, names: Sequence[str]) -> None:
        """Say that the store has arrays ``names``, whether or not a cell is recorded:
        the next object holds their group with no cell."""
        key = tuple(names)
        for name in key:
            self.array(name)
        with self._lock:
            self._declared.add(key)

    def add(self, names: tuple[str, ...], cells: NDArray[np.int64] | int) -> None:
        """Note ``cells`` of group ``names`` as recorded (after their values were set)."""
        with self._lock:
            found = self._pending.get(names)
            if found is None:
                found = self._pending[names] = ([], [])
            if isinstance(cells, int):
                found[0].append(cells)
            else:
                found[1].append(np.asarray(cells, dtype=np.int64).reshape(-1))

    # -- what the store records (as ``TrackingStore`` stores it on disk) -----------------
    def record_block(
        self, cell: int, stats: tuple[Any, ...], worker_id: int, sent_at: float, returned_at: float
    ) -> None:
        """A measured block's eleven figures (``BlockStats.to_tuple()`` and its stamps);
        the GPU figures NaN and 0 where the tuple has none, a run without workers'
        ``worker_id`` stored as ``NO_WORKER``."""
        full = len(stats) > 7
        values = (
            *stats[:5],
            stats[5] if full else float("nan"),
            stats[6] if full else 0,
            worker_id if worker_id >= 0 else NO_WORKER,
            sent_at,
            returned_at,
            stats[7] if full else 0.0,
        )
        for name, value in zip(STAT_ARRAYS, values, strict=True):
            self.array(name)[cell] = value
        self.add(STAT_ARRAYS, cell)

    def record_stamps(self, cell: int, worker_id: int, sent_at: float, returned_at: float) -> None:
        """The stamps of a failed attempt of a cell that is not done."""
        stamps = (worker_id if worker_id >= 0 else NO_WORKER, sent_at, returned_at)
        for name, value in zip(STAMP_ARRAYS, stamps, strict=True):
            self.array(name)[cell] = value
        self.add(STAMP_ARRAYS, cell)

    def record_many(
        self,
        cells: NDArray[np.intp],
        table: NDArray[Any],
        worker_id: int,
        sent_at: NDArray[np.float64],
        returned_at: NDArray[np.float64],
    ) -> None:
        """The figures of many blocks (``table``: the server's ``STATS_DTYPE`` rows)."""
        for name in STATS_ARRAYS:
            self.array(name)[cells] = table[name]
        self.array("worker_id")[cells] = worker_id if worker_id >= 0 else NO_WORKER
        self.array("sent_at")[cells] = sent_at
        self.array("returned_at")[cells] = returned_at
        self.add(STAT_ARRAYS, np.asarray(cells, dtype=np.int64))

    def record(self, name: str, cell: int, value: int) -> None:
        """One figure of one cell (a memory grant, saturating; an output checksum)."""
        array = self.array(name)
        array[cell] = min(int(value), _U32_MAX) if array.itemsize == 4 else int(value)
        self.add((name,), cell)

    def record_cache(self, cell: int, counts: Sequence[int]) -> None:
        """What the worker's chunk cache did for ``cell`` (``CACHE_ARRAYS`` order)."""
        for name, count in zip(CACHE_ARRAYS, counts, strict=True):
            array = self.array(name)
            array[cell] = min(int(count), _U32_MAX) if array.itemsize == 4 else int(count)
        self.add(CACHE_ARRAYS, cell)

    def has_pending(self) -> bool:
        return bool(self._pending or self._declared)

    def take(self) -> PendingStats:
        """The groups recorded since the last take, with their values now; cleared."""
        with self._lock:
            pending, self._pending = self._pending, {}
            declared, self._declared = self._declared, set()
        out: PendingStats = []
        for names, (ints, parts) in pending.items():
            cells = np.unique(np.concatenate([np.asarray(ints, dtype=np.int64), *parts]))
            out.append((names, cells, {n: self._arrays[n][cells] for n in names}))
        for names in declared - set(pending):
            empty = np.zeros(0, dtype=np.int64)
            out.append((names, empty, {n: self._arrays[n][empty] for n in names}))
        return out

    def restore(self, taken: PendingStats) -> None:
        """Put back what :meth:`take` gave when its object could not be written."""
        with self._lock:
            for names, cells, _values in taken:
                if len(cells):
                    self._pending.setdefault(names, ([], []))[1].insert(0, cells)
                else:
                    self._declared.add(names)


def encode_stats(taken: PendingStats) -> bytes:
    """One statistics object (see the module docstring)."""
    header = {"groups": [{"arrays": list(n), "count": len(c)} for n, c, _ in taken]}
    parts = [_MAGIC, json.dumps(header, separators=(",", ":")).encode(), b"\n"]
    for names, cells, values in taken:
        parts.append(cells.astype(_CELL).tobytes())
        for name in names:
            parts.append(values[name].astype(_dtype(name)).tobytes())
    return b"".join(parts)


def _decode(url: str, key: str, data: bytes) -> list[tuple[list[str], NDArray[Any], list[Any]]]:
    def bad(why: str) -> TrackingError:
        return TrackingError(
            f"block tracking at {url}: the statistics object {key} is not readable ({why}); "
            "delete it (only its blocks' figures are lost: their done markers stand)",
            path=url,
        )

    if not data.startswith(_MAGIC):
        raise bad("no BELLIS-STATS header")
    end = data.find(b"\n", len(_MAGIC))
    try:
        header = json.loads(data[len(_MAGIC) : end])
        groups = [(list(map(str, g["arrays"])), int(g["count"])) for g in header["groups"]]
    except (ValueError, KeyError, TypeError):
        raise bad("its header is not the format's JSON") from None
    at = end + 1
    out: list[tuple[list[str], NDArray[Any], list[Any]]] = []
    for names, count in groups:
        if any(n not in ARRAY_DTYPES for n in names):
            raise bad(f"unknown array in {names}")
        sizes = [_CELL.itemsize, *(_dtype(n).itemsize for n in names)]
        if at + count * sum(sizes) > len(data):
            raise bad("it is shorter than its header says")
        cells = np.frombuffer(data, dtype=_CELL, count=count, offset=at)
        at += count * _CELL.itemsize
        values = []
        for name in names:
            dt = _dtype(name)
            values.append(np.frombuffer(data, dtype=dt, count=count, offset=at))
            at += count * dt.itemsize
        out.append((names, cells, values))
    return out


def merge_stats(
    url: str, cells: int, objects: Iterable[tuple[str, bytes]]
) -> dict[str, NDArray[Any]]:
    """The arrays (flat, ``cells`` long) that the objects ``(key, bytes)`` record, merged
    in the order given (key order: run start, then flush); a cell outside the grid is
    left out (a store read with another grid)."""
    merged: dict[str, NDArray[Any]] = {}
    for key, data in objects:
        for names, where, values in _decode(url, key, data):
            inside = (where >= 0) & (where < cells)
            for name, vals in zip(names, values, strict=True):
                target = merged.get(name)
                if target is None:
                    target = merged[name] = np.zeros(cells, dtype=_dtype(name))
                target[where[inside]] = vals[inside]
    return merged


def read_stats(bucket: Bucket, url: str, cells: int) -> dict[str, NDArray[Any]]:
    """Every run's figures of the store at ``url``: ``stats/`` listed once, each object
    read by key, merged in key order (:func:`merge_stats`)."""
    objects = []
    for key in bucket.names(STATS_PREFIX):
        got = bucket.get(key)
        if got is not None:
            objects.append((key, got[0]))
    return merge_stats(url, cells, objects)
