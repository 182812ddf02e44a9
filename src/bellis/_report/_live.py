"""The live page's state: what ``/api/state.json`` holds, built from tracking stores.

Everything here reads stores read-only (``_tracking``'s ``open_readonly`` and
``read_status``, as ``bellis status`` does) and never takes a run's lock, so it works
on a store a run is writing, on a finished one and on daisy 2.0.0's (counts, no
statistics). :class:`LiveState` keeps what one sample cannot say (the done counts of
earlier samples, for a rate where the store has no ``returned_at`` stamps) and caches its
last answer for ``min_interval_seconds``, so a page refreshed by many tabs reads each store
at most once a second.

The map: each block's state as one byte (:data:`STATE_NAMES`, the report's states and
colours), the grid as a 3-D volume (a 1-D grid is ``1 x 1 x n``, a 2-D one ``1 x r x c``),
aggregated into tiles of ``k0 x k1 x k2`` cells when it has more than :data:`MAP_CELLS`
cells (:func:`tile_codes`), so a 10^6-block task's map stays a few hundred kB of JSON.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from .._donemarks import StoreLocation, join_location, location_name
from .._stats._errorlog import group_errors, read_errors, records_of_run
from .._tracking import STAT_ARRAYS, StoreLayout, is_run_in_progress, open_readonly, read_status
from .._tracking._status import StatusSnapshot
from ._live_delta import (
    DONE,
    FAILED,
    NO_BLOCK,
    PARTLY,
    RETRIED,
    UNTOUCHED,
    MapDelta,
    read_store_into,
    tile_counts,
    tile_factors,
    tiles_of_counts,
)
from ._live_lanes import file_marks, file_recent
from ._live_recent import attach_marks, recent_blocks

__all__ = [
    "DONE",
    "FAILED",
    "MAP_CELLS",
    "NO_BLOCK",
    "PARTLY",
    "RETRIED",
    "STATE_COLOURS",
    "STATE_NAMES",
    "UNTOUCHED",
    "LiveState",
    "eta_range",
    "state_codes",
    "tile_codes",
    "window_rates",
]

STATE_NAMES: Final = (
    "no block",
    "untouched",
    "done",
    "done after failed attempts",
    "failed",
    "partly done (tile)",
)
#: the report's colours (``_page_script``'s state scale, ``_figures.FAILED_COLOUR`` ...)
STATE_COLOURS: Final = ("#ffffff", "#e6e6e6", "#2ca02c", "#ff7f0e", "#d62728", "#98df8a")
#: the most cells the map sends; a larger grid is aggregated into tiles
MAP_CELLS: Final = 250_000
#: blocks whose failed attempts and last error the page can show on hover
MAX_BLOCK_DETAILS: Final = 2000
#: the server's fixed paths of the run's report and trace (:meth:`LiveState.documents`)
REPORT_PATH: Final = "/report.html"
TRACE_PATH: Final = "/trace.json"
#: the windows of the recent rate and of the ETA's range
RECENT_SECONDS: Final = 30.0
ETA_WINDOWS: Final = 4


def state_codes(
    done: NDArray[Any], failures: NDArray[Any], block: NDArray[np.bool_] | None
) -> NDArray[np.uint8]:
    """Each cell's state (:data:`STATE_NAMES`) from the store's ``done`` and ``failures``
    arrays and which cells hold a block (None: unknown, every cell does)."""
    is_done = np.asarray(done) != 0
    failed_any = np.asarray(failures) > 0
    codes = np.full(is_done.shape, UNTOUCHED, dtype=np.uint8)
    codes[is_done] = DONE
    codes[is_done & failed_any] = RETRIED
    codes[~is_done & failed_any] = FAILED
    if block is not None:
        codes[~block] = NO_BLOCK
    return codes


def tile_codes(
    codes: NDArray[np.uint8], max_cells: int = MAP_CELLS
) -> tuple[NDArray[np.uint8], tuple[int, ...]]:
    """``codes`` (a 3-D volume of states) aggregated into tiles so that at most
    ``max_cells`` remain; returns the tiles and the tile size per axis (all 1: unchanged).

    A tile is failed when any of its blocks failed, done (or done after failed attempts,
    when any was) when all are, partly done when some are, untouched when none are, and no
    block when it holds none. Tiles grow the longest axis first (a square factor on the
    two slice axes, then axis 0), so a slice stays in proportion."""
    factors = tile_factors(codes.shape, max_cells)
    if all(f == 1 for f in factors):
        return codes, factors
    return tiles_of_counts(*tile_counts(codes, factors)), factors


def window_rates(
    points: Sequence[tuple[float, int]], now: float, windows: int, width_seconds: float
) -> list[float]:
    """Blocks per second in each of the last ``windows`` windows of ``width_seconds``
    before ``now``, from ``(time, cumulative done)`` points (ascending in time); a window
    with fewer than two points in reach is left out."""
    rates: list[float] = []
    for i in range(windows):
        hi_t, lo_t = now - i * width_seconds, now - (i + 1) * width_seconds
        inside = [(t, d) for t, d in points if lo_t <= t <= hi_t]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (t0, d0), (t1, d1) = inside[0], inside[-1]
            rates.append(max(0, d1 - d0) / (t1 - t0))
    return rates


def eta_range(remaining: int, rates: Sequence[float]) -> tuple[float, float | None] | None:
    """``(soonest, latest)`` seconds until ``remaining`` blocks are done at the fastest and
    the slowest of ``rates`` (recent windows); latest is None when a window made no
    progress; None when there is no rate at all. ``(0, 0)`` when nothing remains."""
    if remaining <= 0:
        return 0.0, 0.0
    positive = [r for r in rates if r > 0]
    if not positive:
        return None
    slowest = min(rates)
    return remaining / max(positive), (remaining / slowest if slowest > 0 else None)


def _count_lines(path: Path) -> int:
    """The runs a store's ``runs.jsonl`` records (its non-empty lines); 0 without one."""
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except FileNotFoundError:
        return 0


def _as_volume(a: NDArray[Any]) -> NDArray[Any]:
    if a.ndim == 1:
        return a.reshape(1, 1, -1)
    if a.ndim == 2:
        return a.reshape(1, *a.shape)
    return a


def _block_mask(layout: StoreLayout | None, grid: tuple[int, ...]) -> NDArray[np.bool_] | None:
    if layout is None:
        return None
    masks = layout.block_axis_masks()
    out = np.ones(grid, dtype=bool)
    for axis, m in enumerate(masks):
        shape = [1] * len(grid)
        shape[axis] = -1
        out &= m.reshape(shape)
    return out


def _intervals(layout: StoreLayout | None, grid: tuple[int, ...]) -> list[Any] | None:
    """The write interval of each block along each axis of the map (for hover), the
    same for every refresh of a store (33 ms a refresh for a 1000 x 1000 grid: cached)."""
    if layout is None:
        return None
    return _intervals_of(layout, grid)


@lru_cache(maxsize=32)
def _intervals_of(layout: StoreLayout, grid: tuple[int, ...]) -> list[Any]:
    # the list is shared by every answer that names this layout: read, never changed
    vol = (1,) * (3 - len(grid)) + tuple(range(len(grid)))
    out: list[Any] = []
    for i, axis in enumerate(vol):
        if i < 3 - len(grid):
            out.append([[0, 0]])
        else:
            out.append([None if iv is None else list(iv) for iv in layout.write_intervals(axis)])
    return out


def _runs_name(store: StoreLocation) -> str:
    """Where a store's runs are: a local store's runs.jsonl; on S3 (a URL), one object
    per run below runs/ (docs/cloud.md)."""
    return "runs/" if isinstance(store, str) else "runs.jsonl"


class _TaskHistory:
    def __init__(self) -> None:
        self.points: deque[tuple[float, int]] = deque(maxlen=600)


class LiveState:
    """The page's JSON for the stores at ``paths`` (each a store or a folder of stores),
    read read-only, at most once per ``min_interval_seconds``."""

    def __init__(
        self,
        stores: Sequence[StoreLocation],
        *,
        min_interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stores = list(stores)
        self.min_interval = min_interval_seconds
        self.clock = clock
        self.lock = threading.Lock()
        #: one report or trace is made at a time (each reads every store)
        self.making = threading.Lock()
        self.cached: tuple[float, bytes] | None = None
        self.history: dict[StoreLocation, _TaskHistory] = {}
        #: per local store, its decoded map and counts (and the key they are valid for)
        self.deltas: dict[StoreLocation, tuple[Any, MapDelta]] = {}
        #: the driver's counters (``run_blockwise(dashboard=...)``): a callable returning
        #: ``{store path: {"running_blocks", "skipped", "orphaned", ...}}``; None for
        #: ``bellis serve``, whose page shows ``n/a`` where the store does not know
        self.driver: Callable[[], dict[str, dict[str, Any]]] | None = None

    def documents(self) -> dict[str, tuple[Callable[[], bytes], str]]:
        """The report and the trace of the stores, for the server's fixed paths
        ``/report.html`` and ``/trace.json``: made when asked, one at a time."""
        return {
            REPORT_PATH: (self.report_html, "text/html; charset=utf-8"),
            TRACE_PATH: (self.trace_json, "application/json"),
        }

    def report_html(self) -> bytes:
        """The HTML report of the stores (``bellis report``'s), made now."""
        from ._data import load_stores
        from ._html import render_html

        with self.making:
            return render_html(load_stores(list(self.stores))).encode("utf-8")

    def trace_json(self) -> bytes:
        """The Chrome trace of the stores (``bellis report --trace``'s), made now."""
        import json

        from ._trace import build_trace

        with self.making:
            trace = build_trace(self.stores)
            return json.dumps(trace, separators=(",", ":"), allow_nan=False).encode("utf-8")

    def json_bytes(self) -> bytes:
        """The state as UTF-8 JSON, rebuilt when the cached one is older than the
        interval (one builder at a time; the others wait and share its answer)."""
        import json

        with self.lock:
            now = self.clock()
            if self.cached is not None and now - self.cached[0] < self.min_interval:
                return self.cached[1]
            body = json.dumps(self.build(now), separators=(",", ":")).encode("utf-8")
            self.cached = (now, body)
            return body

    def build(self, now: float) -> dict[str, Any]:
        driver = self.driver
        # the stores first, then the driver: the driver's blocks and races are then at
        # least as fresh as the store's counts (a block the store shows done is on a lane)
        tasks = [self.task_state(store, now) for store in self.stores]
        counters = driver() if driver is not None else {}
        for task in tasks:
            mine = counters.get(task["path"])
            if mine is not None:
                mine = dict(mine)
                recent, marks = mine.pop("recent", None), mine.pop("marks", None)
                task.update(mine)
                task["from_driver"] = True
                # lanes from the store's stamps (with RSS and CPU) where it has them, else
                # from the blocks the driver released; the races marked on either
                # (the driver's window is fresher than the one it wrote to the store's file)
                now_recent = task.get("recent")
                if recent is not None and (
                    now_recent is None or now_recent.get("source") == "file"
                ):
                    task["recent"] = recent
                if marks and isinstance(task.get("recent"), dict) and "lanes" in task["recent"]:
                    attach_marks(task["recent"], marks)
        running = any(t.get("running") for t in tasks)
        known = all(t.get("run_known") for t in tasks)
        return {
            "time": now,
            "finished": not running and known,
            "run_known": running or known,
            "tasks": tasks,
            # the report and the trace, made from the stores when asked (relative URLs)
            "report_url": REPORT_PATH[1:],
            "trace_url": TRACE_PATH[1:],
            "states": list(STATE_NAMES),
            "colours": list(STATE_COLOURS),
        }

    def task_state(self, store: StoreLocation, now: float) -> dict[str, Any]:
        after = now - RECENT_SECONDS * ETA_WINDOWS - 1.0
        delta: MapDelta | None = None
        try:
            if isinstance(store, str):  # a URL (docs/cloud.md): read by key
                snap = read_status(store, stamps_after=after)
            else:  # only what changed since the last refresh is decoded (``_live_delta``)
                snap, delta = self._local_status(store, after)
        except Exception as exc:  # a store being created, or unreadable: say so on the page
            self.deltas.pop(store, None)
            return {"name": location_name(store), "path": os.fspath(store), "error": str(exc)}
        running = is_run_in_progress(store)
        history = self.history.setdefault(store, _TaskHistory())
        history.points.append((now, snap.done_count))
        blocks = snap.blocks
        total = snap.cells if blocks is None else blocks
        rates = self._rates(snap, history, now)
        overall = self._overall_rate(snap, history)
        remaining = max(0, total - snap.done_count)
        eta = eta_range(remaining, rates) if running is not False else None
        errors = self._errors(store)
        return {
            "name": location_name(store),
            "path": os.fspath(store),
            "running": running is True,
            "run_known": running is not None,
            "blocks": blocks,
            "cells": snap.cells,
            "total_is_bound": blocks is None,
            "done": snap.done_count,
            "failed": snap.failed_count,
            "untouched": snap.untouched,
            "retried": snap.retried,
            "failed_attempts": snap.attempts,
            # the store does not record these: the driver's own page shows them
            "skipped": None,
            "running_blocks": None,
            "orphaned": None,
            "from_driver": False,
            "resources": bool(snap.present),
            "runs": snap.runs,
            "rate_recent": rates[0] if rates else None,
            "rate_overall": overall,
            "eta_seconds": None if eta is None else list(eta),
            "map": self._map(store, snap, errors["per_block"], delta),
            # lanes and wall times: from the per-block stamps of resource tracking, else
            # from the window of blocks the driver wrote to the store (``_live_lanes``)
            "recent": self._recent(store, snap, running is True),
            "errors": errors["groups"],
            "runs_jsonl": os.fspath(join_location(store, _runs_name(store))),
            "report_hint": f"bellis report {os.fspath(store)} -o report.html",
        }

    def _recent(
        self, store: StoreLocation, snap: StatusSnapshot, going: bool
    ) -> dict[str, Any] | None:
        try:
            if isinstance(store, str):  # on S3: the stamps of its stats/ objects only
                return recent_blocks(store) if "returned_at" in snap.present else None
            if "returned_at" not in snap.present:
                return file_recent(store, going)
            recent = recent_blocks(store)
            if recent is not None:  # the races the driver wrote, on the stamps' lanes
                attach_marks(recent, file_marks(store, going))
            return recent
        except Exception as exc:  # (a store growing under a run): the rest of the page stands
            return {"error": f"cannot read the lanes of the recent blocks: {exc}"}

    def _rates(self, snap: StatusSnapshot, history: _TaskHistory, now: float) -> list[float]:
        if snap.stamped and snap.returned_at is not None:
            stamps = snap.returned_at[snap.returned_at > 0]
            first = float(stamps.min()) if stamps.size else now
            rates = []
            for i in range(ETA_WINDOWS):
                hi, lo = now - i * RECENT_SECONDS, now - (i + 1) * RECENT_SECONDS
                # a window reaches back no further than the first stamp it can see
                span = hi - max(lo, first)
                if span < 1.0:
                    break
                count = int(np.count_nonzero((stamps > lo) & (stamps <= hi)))
                rates.append(count / span)
            return rates
        return window_rates(list(history.points), now, ETA_WINDOWS, RECENT_SECONDS)

    def _overall_rate(self, snap: StatusSnapshot, history: _TaskHistory) -> float | None:
        if snap.stamped and snap.returned_at is not None:
            stamps = snap.returned_at[snap.returned_at > 0]
            if stamps.size >= 2 and float(stamps.max()) > float(stamps.min()):
                return float(stamps.size) / (float(stamps.max()) - float(stamps.min()))
        pts = history.points
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            return max(0, pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        return None

    def _errors(self, store: StoreLocation) -> dict[str, Any]:
        if isinstance(store, str):  # on S3: its runs' errors/ objects, merged while open
            with open_readonly(store) as s:
                lines = records_of_run(read_errors(s.runs_jsonl.parent))
        else:
            lines = records_of_run(read_errors(store))
        groups = []
        per_block: dict[tuple[int, ...], str] = {}
        for g in group_errors(lines):
            first = g.first
            log = None
            if first is not None and first.log is not None:
                log = first.log + (
                    "" if first.log_offset is None else f" (byte {first.log_offset})"
                )
            groups.append(
                {
                    "title": g.title,
                    "where": g.key[2] or None,
                    "kind": g.kind,
                    "count": g.count,
                    "blocks": [list(b) for b in g.blocks[:20]],
                    "log": log,
                }
            )
            for rec in g.records:
                if len(per_block) < MAX_BLOCK_DETAILS:
                    head = rec.type or rec.kind
                    per_block[rec.coord] = f"{head}: {rec.message}" if rec.message else head
        return {"groups": groups, "per_block": per_block}

    def _local_status(self, store: Path, after: float) -> tuple[StatusSnapshot, MapDelta | None]:
        """What the page needs of a local store's status (``read_status``'s counts, layout,
        stamps and runs), with the counts and the map kept in this store's
        :class:`MapDelta` and updated from the cells that changed. A grid the map cannot
        draw (no cells, more than three axes) is read by ``read_status``."""
        with open_readonly(store) as s:
            grid = tuple(s.grid_shape)
            cells = int(s.done.size)
            if not grid or len(grid) > 3 or cells == 0:
                self.deltas.pop(store, None)
                return read_status(store, stamps_after=after), None
            record = s.record
            layout = StoreLayout.from_record(record)
            if layout is not None and layout.grid_shape != grid:
                layout = None
            volume = (1,) * (3 - len(grid)) + grid  # the map's 3-D volume (``_as_volume``)
            key = (grid, json.dumps(record, sort_keys=True, default=str), s.failures.dtype.str)
            kept = self.deltas.get(store)
            if kept is None or kept[0] != key:  # a new store, or one grown or remade
                mask = _block_mask(layout, grid)
                delta = MapDelta(
                    (volume[0], volume[1], volume[2]),
                    tile_factors(volume, MAP_CELLS),
                    None if mask is None else mask.reshape(-1),
                    s.failures.dtype,
                )
                kept = self.deltas[store] = (key, delta)
            delta = kept[1]
            read_store_into(delta, s.done, s.failures)
            stats = s.stats
            present = [name for name in STAT_ARRAYS if name in stats]
            returned = None
            stamped = False
            if "returned_at" in stats:  # (the stamps are read whole: resource tracking only)
                flat = np.asarray(stats["returned_at"]).reshape(-1)
                stamped = bool(np.any(flat > 0))
                returned = np.array(flat[flat > after], dtype=np.float64)
            task_hash = s.task_hash
            runs = _count_lines(s.runs_jsonl)
        n_done, n_failed, retried, attempts = delta.totals.as_tuple()
        empty = np.zeros((0, 0), dtype=bool)
        snap = StatusSnapshot(
            os.fspath(store),
            grid,
            task_hash,
            record,
            cells,
            n_done,
            n_failed,
            attempts,
            retried,
            empty,
            empty,
            present,
            runs,
            returned,
            stamped,
            layout,
        )
        return snap, delta

    def _map(
        self,
        store: StoreLocation,
        snap: StatusSnapshot,
        last_error: dict[tuple[int, ...], str],
        delta: MapDelta | None = None,
    ) -> dict[str, Any] | None:
        grid = snap.grid
        if not grid or len(grid) > 3 or snap.cells == 0:
            return None
        if delta is not None:  # kept up to date by ``_local_status``
            failures = delta.failures
            codes_shape = delta.volume
            tiles, factors = delta.tiles(), delta.factors
        else:
            with open_readonly(store) as s:
                done = np.array(s.done)
                failures = np.array(s.failures)
            codes = _as_volume(state_codes(done, failures, _block_mask(snap.layout, grid)))
            codes_shape = codes.shape
            tiles, factors = tile_codes(codes)
        details: dict[str, Any] = {}
        if all(f == 1 for f in factors):
            flat_failures = failures.reshape(-1)
            for cell in np.flatnonzero(flat_failures)[:MAX_BLOCK_DETAILS].tolist():
                coord = tuple(int(c) for c in np.unravel_index(cell, grid))
                details[str(cell)] = {
                    "attempts": int(flat_failures[cell]),
                    "error": last_error.get(coord),
                }
        layout = snap.layout
        return {
            "shape": list(tiles.shape),
            "grid": list(codes_shape),
            "tile": list(factors),
            "codes": base64.b64encode(np.ascontiguousarray(tiles).tobytes()).decode("ascii"),
            "ndim": len(grid),
            "first_cell": None
            if layout is None
            else [0] * (3 - len(grid)) + [first for first, _ in layout.block_cells],
            "intervals": _intervals(layout, grid),
            "details": details,
        }
