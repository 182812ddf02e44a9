"""The live page's map and counts of a local store, updated from what changed only.

Each refresh of the page needs every cell's state (the map) and the counts (done, failed,
retried, failed attempts). Rebuilding them from scratch costs several passes over the
``done`` and ``failures`` arrays and the tiling (about 0.2 s for 10^6 cells, seconds for
10^7). :class:`MapDelta` keeps the decoded state between refreshes (a copy of both
arrays, each cell's state code, the counts, and per tile of the map its counts) and, at
each refresh, updates them from the cells whose ``done`` or ``failures`` differ from its
copy: their old state's counts out, their new state's in.

How it finds what changed. A bellis store's array is one chunk file, memory-mapped and
written in place by the run (no syscall per block), so the chunk file's ``mtime`` is no
witness: the kernel stamps a shared mapping's file when a store hits a clean page (the
first one after a writeback), not at each store, so a file can change for many seconds
under one ``mtime``, and a timestamp's granularity (1 ns to 2 s, by filesystem) adds to
that. So nothing is trusted but the bytes: each refresh reads the two chunk files
(``pread`` from the page cache, holes skipped: ``_tracking.SlabReader``) a slab at a
time, compares each slab with the copy (a ``memcmp``-speed pass) and decodes only the
cells that differ. A refresh can never show a state older than the files at its read,
whatever the clocks say; what it saves is the decoding and the tiling, which were the
cost (``benchmarks/RESULTS.md``).

Pure: :meth:`MapDelta.update_slab` takes the arrays' current values, so the unit tests
script the changes; :func:`read_store_into` feeds it from a store's files.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DONE",
    "FAILED",
    "NO_BLOCK",
    "PARTLY",
    "RETRIED",
    "SLAB",
    "UNTOUCHED",
    "MapDelta",
    "Totals",
    "read_store_into",
    "tile_counts",
    "tile_factors",
    "tile_index",
    "tiles_of_counts",
]

#: cells compared per step (a few MiB of copies at a time)
SLAB: Final = 1 << 20

# each cell's or tile's state on the map (``_live.STATE_NAMES``)
NO_BLOCK: Final = 0
UNTOUCHED: Final = 1
DONE: Final = 2
RETRIED: Final = 3
FAILED: Final = 4
PARTLY: Final = 5
"""a tile some of whose blocks are done (a tiled map only)"""


def tile_factors(shape: tuple[int, ...], max_cells: int) -> tuple[int, ...]:
    """The tile size per axis that leaves at most ``max_cells`` tiles of ``shape``: the
    longest axis (in tiles) halved first, so a slice stays in proportion."""
    factors = [1] * len(shape)

    def cells() -> int:
        n = 1
        for s, f in zip(shape, factors, strict=True):
            n *= -(-s // f)
        return n

    while cells() > max(1, max_cells):
        sizes = [-(-s // f) for s, f in zip(shape, factors, strict=True)]
        factors[int(np.argmax(sizes))] *= 2
    return tuple(factors)


def tile_counts(
    codes: NDArray[np.uint8], factors: tuple[int, ...]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Per tile of ``factors`` cells of the 3-D ``codes``: the block cells, the done ones
    (done or done after failed attempts), the done after failed attempts, the failed."""
    shape = codes.shape
    out_shape = tuple(-(-s // f) for s, f in zip(shape, factors, strict=True))
    padded = np.zeros(tuple(o * f for o, f in zip(out_shape, factors, strict=True)), np.uint8)
    padded[tuple(slice(0, s) for s in shape)] = codes
    split: list[int] = []
    for o, f in zip(out_shape, factors, strict=True):
        split.extend((o, f))
    blocks = padded.reshape(split)
    axes = tuple(range(1, 2 * len(shape), 2))

    def count(*states: int) -> NDArray[np.int64]:
        hit = np.isin(blocks, states)
        return np.asarray(hit.sum(axis=axes), dtype=np.int64)

    return (
        count(UNTOUCHED, DONE, RETRIED, FAILED),
        count(DONE, RETRIED),
        count(RETRIED),
        count(FAILED),
    )


def tiles_of_counts(
    present: NDArray[np.int64],
    n_done: NDArray[np.int64],
    n_retried: NDArray[np.int64],
    n_failed: NDArray[np.int64],
) -> NDArray[np.uint8]:
    """Each tile's state from its counts (``_live.tile_codes``' rules)."""
    tiles = np.full(present.shape, NO_BLOCK, dtype=np.uint8)
    tiles[present > 0] = UNTOUCHED
    tiles[(n_done > 0) & (n_done < present)] = PARTLY
    tiles[(n_done == present) & (present > 0)] = DONE
    tiles[(n_done == present) & (present > 0) & (n_retried > 0)] = RETRIED
    tiles[n_failed > 0] = FAILED
    return tiles


def tile_index(
    cells: NDArray[np.intp], volume: tuple[int, int, int], factors: tuple[int, ...]
) -> NDArray[np.intp]:
    """The flat tile of each flat cell of a 3-D ``volume`` tiled by ``factors``."""
    d1, d2 = volume[1], volume[2]
    t1, t2 = -(-d1 // factors[1]), -(-d2 // factors[2])
    i0, rest = np.divmod(cells, d1 * d2)
    i1, i2 = np.divmod(rest, d2)
    return np.asarray(
        ((i0 // factors[0]) * t1 + i1 // factors[1]) * t2 + i2 // factors[2], dtype=np.intp
    )


def _codes(
    done: NDArray[Any], failures: NDArray[Any], block: NDArray[np.bool_] | None
) -> NDArray[np.uint8]:
    is_done = done != 0
    failed_any = failures > 0
    codes = np.full(is_done.shape, UNTOUCHED, dtype=np.uint8)
    codes[is_done] = DONE
    codes[is_done & failed_any] = RETRIED
    codes[~is_done & failed_any] = FAILED
    if block is not None:
        codes[~block] = NO_BLOCK
    return codes


class Totals:
    """The counts of a store's cells, as ``bellis status`` counts them: done cells,
    failed (failures and not done), done after failed attempts, failed attempts."""

    __slots__ = ("attempts", "done", "failed", "retried")

    def __init__(self) -> None:
        self.done = self.failed = self.retried = self.attempts = 0

    def add(self, done: NDArray[Any], failures: NDArray[Any], sign: int) -> None:
        is_done = done != 0
        failed_any = failures > 0
        self.done += sign * int(np.count_nonzero(is_done))
        self.failed += sign * int(np.count_nonzero(failed_any & ~is_done))
        self.retried += sign * int(np.count_nonzero(failed_any & is_done))
        self.attempts += sign * int(failures.sum(dtype=np.uint64))

    def as_tuple(self) -> tuple[int, int, int, int]:
        return self.done, self.failed, self.retried, self.attempts


class MapDelta:
    """The decoded state of a store's ``done`` and ``failures`` arrays (flat, ``cells``
    long, on the 3-D map ``volume`` tiled by ``factors``; ``block``: which cells hold a
    block, flat, None: all), updated a slab at a time from the arrays' current values.

    ``changed``: the cells found changed by the last :meth:`update` or
    :func:`read_store_into`."""

    def __init__(
        self,
        volume: tuple[int, int, int],
        factors: tuple[int, ...],
        block: NDArray[np.bool_] | None,
        failures_dtype: Any = np.uint32,
    ) -> None:
        self.volume = volume
        self.factors = factors
        self.cells = volume[0] * volume[1] * volume[2]
        self.block = block
        self.tiled = any(f != 1 for f in factors)
        self.done = np.zeros(self.cells, dtype=np.uint8)
        self.failures = np.zeros(self.cells, dtype=failures_dtype)
        self.codes: NDArray[np.uint8] = _codes(self.done, self.failures, block)
        self.totals = Totals()
        self.counts: tuple[NDArray[np.int64], ...] = ()
        if self.tiled:
            self.counts = tile_counts(self.codes.reshape(volume), factors)
        self.changed = 0

    def update_slab(self, a: int, done: NDArray[Any], failures: NDArray[Any] | None) -> int:
        """Cells ``[a, a + len(done))`` now hold ``done`` and ``failures`` (None: all
        zero, a hole); decode the cells that differ from the copy. Returns how many did."""
        n = int(done.size)
        b = a + n
        old_d, old_f = self.done[a:b], self.failures[a:b]
        new_d = done
        new_f = np.zeros(n, dtype=self.failures.dtype) if failures is None else failures
        if np.array_equal(old_d, new_d) and np.array_equal(old_f, new_f):
            return 0
        idx = np.flatnonzero((old_d != new_d) | (old_f != new_f))
        d, f = new_d[idx], new_f[idx]
        self.totals.add(old_d[idx], old_f[idx], -1)
        self.totals.add(d, f, +1)
        cells = idx + a
        block = None if self.block is None else self.block[cells]
        old_codes = self.codes[cells]
        new_codes = _codes(d, f, block)
        if self.tiled:
            tiles = tile_index(cells, self.volume, self.factors)
            size = self.counts[0].size
            for counter, states in zip(
                self.counts[1:], ((DONE, RETRIED), (RETRIED,), (FAILED,)), strict=True
            ):
                flat = counter.reshape(-1)
                flat += np.bincount(tiles[np.isin(new_codes, states)], minlength=size)
                flat -= np.bincount(tiles[np.isin(old_codes, states)], minlength=size)
        self.codes[cells] = new_codes
        self.done[cells] = d
        self.failures[cells] = f
        self.changed += int(idx.size)
        return int(idx.size)

    def update(self, done: NDArray[Any], failures: NDArray[Any]) -> int:
        """The whole arrays' current values (flat); returns the cells that changed."""
        self.changed = 0
        for a in range(0, self.cells, SLAB):
            b = min(self.cells, a + SLAB)
            self.update_slab(a, done[a:b], failures[a:b])
        return self.changed

    def tiles(self) -> NDArray[np.uint8]:
        """The map: each tile's state (each cell's, untiled), 3-D."""
        if not self.tiled:
            return self.codes.reshape(self.volume)
        return tiles_of_counts(*self.counts)


def read_store_into(delta: MapDelta, done: Any, failures: Any) -> int:
    """Feed ``delta`` the current ``done`` and ``failures`` of an open store (its mapped
    chunks, read with ``pread`` and holes skipped); returns the cells that changed."""
    from .._tracking import SlabReader

    delta.changed = 0
    readers = [SlabReader(done), SlabReader(failures)]
    try:
        for a in range(0, delta.cells, SLAB):
            b = min(delta.cells, a + SLAB)
            d = readers[0].read(a, b)
            delta.update_slab(
                a, np.zeros(b - a, np.uint8) if d is None else d, readers[1].read(a, b)
            )
    finally:
        for reader in readers:
            reader.close()
    return delta.changed
