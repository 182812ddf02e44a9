"""What each block left costs, from the sample: which blocks the sample takes, what a
sampled block costs once its worker is warm, its share of a round trip, and the cost of
every block left (the nearest sampled block, or a line in a ``cost_hint``). Pure numpy:
no clock, no I/O; :mod:`._forecast` runs the sample and calls these.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._scheduling._batching import BATCH_TARGET_SECONDS, MAX_BATCH

__all__ = [
    "choose",
    "in_window",
    "nearest",
    "per_block_overhead",
    "pick",
    "predict_costs",
    "round_trips",
    "sample_outcome",
    "warm_up",
    "z_order",
]

#: above this many block x sample pairs the nearest sampled block is looked up along the
#: Z-order curve (:func:`nearest`); below, exactly (chunked)
_NEAREST_CELLS = 50_000_000
#: seconds a stamp may lie outside the sample run's start and end (float rounding: the
#: stamps and the run's bounds are taken on one clock, the server's ``time.time()``)
_STAMP_SLACK = 0.05


def z_keys(flat: np.ndarray[Any, Any], grid: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Each flat index's place on the Z-order (Morton) curve over ``grid``: its axes' bits
    interleaved (as many as fit a uint64; the low bits dropped above that)."""
    coords = np.unravel_index(flat, grid)
    nd = len(grid)
    bits = max(1, max(int(s - 1).bit_length() for s in grid))
    keep = min(bits, 64 // nd)
    key = np.zeros(len(flat), dtype=np.uint64)
    for b in range(keep):
        for d, c in enumerate(coords):
            bit = (np.asarray(c) >> (bits - keep + b)) & 1
            key |= bit.astype(np.uint64) << np.uint64(b * nd + d)
    return key


def z_order(flat: np.ndarray[Any, Any], grid: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """``flat`` (flat indices into ``grid``) sorted along the Z-order (Morton) curve:
    blocks near in the order are near in every axis, so equal slices of it are compact
    regions that tile the grid (in C order, a slice is a few rows: the picks would line up
    along the last axis)."""
    ordered: np.ndarray[Any, Any] = flat[np.argsort(z_keys(flat, grid), kind="stable")]
    return ordered


def pick(
    left: np.ndarray[Any, Any], n: int, hint: np.ndarray[Any, Any] | None, rng: Any
) -> np.ndarray[Any, Any]:
    """``n`` flat indices of ``left`` blocks, spread (see the module docstring)."""
    candidates = z_order(np.flatnonzero(left.reshape(-1)), left.shape)
    if n <= 0 or not len(candidates):
        return np.zeros(0, dtype=np.int64)
    if n >= len(candidates):
        all_left: np.ndarray[Any, Any] = candidates
        return all_left

    def stratified(order: np.ndarray[Any, Any], m: int) -> np.ndarray[Any, Any]:
        edges = np.linspace(0, len(order), m + 1)
        lo = np.floor(edges[:-1]).astype(np.int64)
        hi = np.maximum(lo + 1, np.floor(edges[1:]).astype(np.int64))
        pos = lo + (rng.random(m) * (hi - lo)).astype(np.int64)
        picked: np.ndarray[Any, Any] = order[np.minimum(pos, len(order) - 1)]
        return picked

    if hint is None:
        return np.unique(stratified(candidates, n))
    h = hint[candidates]
    by_hint = candidates[np.argsort(h, kind="stable")]
    first = stratified(by_hint, n - n // 3)
    rest = np.setdiff1d(candidates, first)
    m = min(n - len(first), len(rest))
    weights = hint[rest] + 1e-12
    second = rng.choice(rest, size=m, replace=False, p=weights / weights.sum())
    return np.unique(np.concatenate([first, second]))


def choose(
    left: np.ndarray[Any, Any],
    first: np.ndarray[Any, Any],
    n: int,
    hint: np.ndarray[Any, Any] | None,
    rng: Any,
) -> np.ndarray[Any, Any]:
    """A task's sample: ``n`` flat indices of blocks left to do (``left``: one bool per
    block, False for a block done or masked), spread by :func:`pick`, first among the
    ``first`` blocks (those that wait for no other, a subset of ``left``), then, if they
    are too few, among the rest. A block that is not left is never taken; when fewer than
    ``n`` are left, every one of them is."""
    first = first & left
    picked = pick(first, n, hint, rng)
    if len(picked) < n:  # a small first level: more, of any level
        rest = left.copy()
        rest.reshape(-1)[picked] = False
        picked = np.union1d(picked, pick(rest, n - len(picked), hint, rng))
    return picked.astype(np.int64)


def sample_outcome(
    done: np.ndarray[Any, Any],
    sent_at: np.ndarray[Any, Any] | None,
    returned_at: np.ndarray[Any, Any] | None,
    window: tuple[float, float] | None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """What became of each picked block in the sample run, from the store after it:
    ``(ran, completed, found_done)``, one bool each per block. ``ran``: the sample run
    handed it out (its stamps are inside ``window``, the run's start and end:
    :func:`in_window`); ``completed``: it ran and is done, its figures the sample's own;
    ``found_done``: done without running in the sample (a ``check_function`` found its
    output, or another run did it meanwhile): its figures, if any, are another run's and
    are not used. Without stamps (no resource tracking) or a window, a done block counts
    as run."""
    is_done = np.asarray(done) != 0
    if sent_at is None or returned_at is None or window is None:
        return is_done.copy(), is_done.copy(), np.zeros(len(is_done), dtype=bool)
    ran = in_window(sent_at, returned_at, window)
    return ran, ran & is_done, is_done & ~ran


def warm_up(
    worker_id: np.ndarray[Any, Any],
    sent_at: np.ndarray[Any, Any],
    wall: np.ndarray[Any, Any],
    where: tuple[np.ndarray[Any, Any], tuple[int, ...]] | None = None,
) -> tuple[float | None, np.ndarray[Any, Any]]:
    """A worker's first blocks pay for its warm-up: imports, first allocations (a fresh
    process faults in memory that later blocks reuse), caches; on a 2-core machine it
    took 8 of a worker's blocks to settle (benchmarks/RESULTS.md, "Forecast accuracy").
    The first half of each worker's positions may be warming up; the second half is the
    steady state. Each warming block is compared with what it would cost when steady: the
    nearest steady block's wall (``where``: the blocks' flat indices and the grid, so a
    smooth gradient of costs is not taken for warm-up), else the steady blocks' median.
    Per position ``j`` among a worker's blocks, the excess is the median over the workers
    of that difference (0 if below), and never more than the position before's (a
    warm-up only wanes: this keeps noise from adding up). Returns the summed excess (the
    warm-up, which the simulation adds to every worker's start) and each block's wall
    less its position's excess (never below the least steady wall): every sampled block
    stays in the cost model (a heavy-tailed sample cannot afford to lose its few costly
    blocks), as it would run in the steady state. ``(None, wall)`` with too few blocks to
    tell."""
    position = np.zeros(len(wall), dtype=np.int64)
    for w in np.unique(worker_id):
        idx = np.flatnonzero(worker_id == w)
        position[idx[np.argsort(sent_at[idx], kind="stable")]] = np.arange(len(idx))
    k = (int(position.max()) + 1) // 2 if len(wall) else 0
    later = position >= k
    if k == 0 or later.sum() < 3:
        return None, wall
    expected = np.full(len(wall), float(np.median(wall[later])))
    if where is not None:
        flat, grid = where
        early = np.flatnonzero(~later)
        steady_idx = np.flatnonzero(later)
        expected[early] = wall[steady_idx[nearest(grid, flat[early], flat[steady_idx])]]
    floor = float(wall[later].min())
    steady = wall.astype(np.float64)
    total = 0.0
    last = math.inf
    for j in range(k):
        at = position == j
        excess = min(last, max(0.0, float(np.median(wall[at] - expected[at]))))
        steady[at] = np.maximum(wall[at] - excess, floor)
        total += excess
        last = excess
    return total, steady


def in_window(
    sent_at: np.ndarray[Any, Any],
    returned_at: np.ndarray[Any, Any],
    window: tuple[float, float],
) -> np.ndarray[Any, Any]:
    """Per block: whether its stamps (``sent_at``, ``returned_at``, seconds since the epoch
    on the server's clock) lie inside ``window`` (the sample run's start and end on that
    clock), in order. A block whose stamps are not is not the sample run's own: a block
    done in an earlier run, or marked done by a ``check_function`` without running (its
    stamps are 0, or an earlier attempt's)."""
    start, end = window
    sent = np.asarray(sent_at, dtype=np.float64)
    back = np.asarray(returned_at, dtype=np.float64)
    out: np.ndarray[Any, Any] = (
        np.isfinite(sent)
        & np.isfinite(back)
        & (sent > 0)
        & (sent >= start - _STAMP_SLACK)
        & (back >= sent)
        & (back <= end + _STAMP_SLACK)
    )
    return out


def round_trips(
    worker_id: np.ndarray[Any, Any],
    sent_at: np.ndarray[Any, Any],
    returned_at: np.ndarray[Any, Any],
    wall: np.ndarray[Any, Any],
    window: tuple[float, float],
) -> list[float]:
    """Per worker with two batches or more: the seconds per batch it was out of its block
    function while it held blocks (dispatch, the round trip, recording), from when its
    first batch was sent to when its last came back. The blocks of one batch share their
    ``sent_at``. Every sampled block is ready at once, so a worker never waits for one in
    between.

    The stamps must all be the sample run's own: inside ``window``, its start and end on
    the same clock (:func:`in_window`). A stamp of another run (a block done before, its
    stamps from another day, or 0) would make a span of months; it raises ValueError
    instead of giving one."""
    foreign = ~in_window(sent_at, returned_at, window)
    if foreign.any():
        i = int(np.flatnonzero(foreign)[0])
        raise ValueError(
            f"{int(foreign.sum())} of {len(foreign)} blocks have stamps outside the sample "
            f"run ({window[0]:.3f} to {window[1]:.3f}), e.g. sent {float(sent_at[i]):.3f}, "
            f"returned {float(returned_at[i]):.3f}: they are not the sample's own timings"
        )
    out = []
    for w in np.unique(worker_id):
        idx = np.flatnonzero(worker_id == w)
        batches = len(np.unique(sent_at[idx]))
        if batches < 2:
            continue
        span = float(returned_at[idx].max() - sent_at[idx].min())
        out.append(max(0.0, (span - float(wall[idx].sum())) / batches))
    return out


def per_block_overhead(round_trip: float, costs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Each block's share of its batch's round trip in the run: a worker gets as many
    blocks at once as fit in ``BATCH_TARGET_SECONDS`` (``_scheduling._batching``), so fast
    blocks share one round trip and slow ones pay it alone."""
    per = np.floor(BATCH_TARGET_SECONDS / np.maximum(costs, 1e-9))
    batch = np.clip(per, 1, MAX_BATCH)
    out: np.ndarray[Any, Any] = round_trip / batch
    return out


def nearest(
    grid: tuple[int, ...], targets: np.ndarray[Any, Any], sampled: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """For each flat index in ``targets``, the position in ``sampled`` of the nearest
    sampled block (euclidean in grid coordinates). Above :data:`_NEAREST_CELLS` target x
    sample pairs (10^6 blocks left and a 2% sample are 2 * 10^10), the nearer of its two
    neighbours on the Z-order curve instead: near, not always the nearest, in
    O(n log n)."""
    tc = np.stack(np.unravel_index(targets, grid), axis=1).astype(np.float64)
    sc = np.stack(np.unravel_index(sampled, grid), axis=1).astype(np.float64)
    if len(targets) * len(sampled) > _NEAREST_CELLS:
        keys = z_keys(sampled, grid)
        by_key = np.argsort(keys, kind="stable")
        at = np.searchsorted(keys[by_key], z_keys(targets, grid))
        before = by_key[np.clip(at - 1, 0, len(sampled) - 1)]
        after = by_key[np.clip(at, 0, len(sampled) - 1)]
        d_before = ((tc - sc[before]) ** 2).sum(axis=1)
        d_after = ((tc - sc[after]) ** 2).sum(axis=1)
        near: np.ndarray[Any, Any] = np.where(d_after < d_before, after, before)
        return near
    out = np.empty(len(targets), dtype=np.int64)
    step = max(1, _NEAREST_CELLS // max(1, len(sampled)) // 8)
    for a in range(0, len(targets), step):
        d = ((tc[a : a + step, None, :] - sc[None, :, :]) ** 2).sum(axis=2)
        out[a : a + step] = d.argmin(axis=1)
    return out


def predict_costs(
    grid: tuple[int, ...],
    targets: np.ndarray[Any, Any],
    sampled: np.ndarray[Any, Any],
    costs: np.ndarray[Any, Any],
    hint: np.ndarray[Any, Any] | None,
) -> tuple[np.ndarray[Any, Any], str]:
    if not len(targets):
        return np.zeros(0), "none"
    if not len(sampled):
        return np.zeros(len(targets)), "none (no sampled block completed)"
    if hint is not None and len(sampled) >= 3 and np.ptp(hint[sampled]) > 0:
        slope, icpt = np.polyfit(hint[sampled], costs, 1)
        if slope > 0:
            pred = icpt + slope * hint[targets]
            return np.maximum(pred, costs.min()), "a line in cost_hint"
    return costs[nearest(grid, targets, sampled)], "the nearest sampled block"
