"""The live page's recent blocks: worker lanes and the distribution of block wall times.

Drawn from a store's per-block stamps (``worker_id``, ``sent_at``, ``returned_at``) and
statistics (``wall_seconds``, ``cpu_seconds``, ``peak_rss_bytes``), which a task writes when
it tracks resources (``Task(resource_tracking=True)``); a store without them has no
recent blocks to show. The window ends at the store's latest stamp, so a finished run
shows its last minutes too. Read read-only, like the rest of the page's state, at most
once a second, never per block.

- :func:`lanes`: per worker, the blocks it ran in the window (start, end, cell, peak RSS,
  CPU share); the gaps between them are the worker's idle time.
- :func:`wall_histogram`: the wall times of the window's blocks in equal bins.
- :func:`wall_trend`: the least-squares line of wall time over return time; its slope
  per minute, the rise it makes over the window relative to the mean, and whether that
  is a rising trend (:data:`RISE_FLAG` or more, with a correlation of :data:`MIN_R` or
  more over at least :data:`MIN_TREND_BLOCKS` blocks): blocks that grow slower hint at
  memory pressure or a filling disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from .._block import NO_WORKER
from .._tracking import open_readonly

__all__ = [
    "MIN_R",
    "MIN_TREND_BLOCKS",
    "RECENT_WINDOW_SECONDS",
    "RISE_FLAG",
    "attach_marks",
    "driver_recent",
    "lanes",
    "race_marks",
    "recent_blocks",
    "running_marks",
    "wall_histogram",
    "wall_trend",
]

#: how far back the lanes and the distribution reach from the latest stamp
RECENT_WINDOW_SECONDS: Final = 300.0
#: the most blocks they hold (the latest ones)
MAX_RECENT_BLOCKS: Final = 5000
HISTOGRAM_BINS: Final = 20
#: a rising trend: the fit rises by this share of the mean wall time over the window ...
RISE_FLAG: Final = 0.2
#: ... with at least this correlation, over at least this many blocks
MIN_R: Final = 0.5
MIN_TREND_BLOCKS: Final = 20


def wall_histogram(walls: Sequence[float], bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """``{"edges": [...], "counts": [...]}``: ``walls`` in ``bins`` equal bins from 0 to
    the largest (``bins + 1`` edges); no edges and no counts when there are no walls."""
    if not len(walls):
        return {"edges": [], "counts": []}
    top = max(float(max(walls)), 1e-9)
    counts, edges = np.histogram(np.asarray(walls, dtype=np.float64), bins, (0.0, top))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def wall_trend(times: Sequence[float], walls: Sequence[float]) -> dict[str, Any] | None:
    """The least-squares line ``wall = a + b * time`` of blocks returned at ``times``
    with wall times ``walls``: ``{"slope_per_minute", "rise", "r", "blocks", "rising"}``,
    ``rise`` the change of the fit over the span of ``times`` as a share of the mean wall
    time; None for fewer than 3 blocks or a span of no time."""
    t = np.asarray(times, dtype=np.float64)
    w = np.asarray(walls, dtype=np.float64)
    n = int(t.size)
    if n < 3:
        return None
    span = float(t.max() - t.min())
    if span <= 0:
        return None
    tc, wc = t - t.mean(), w - w.mean()
    stt = float(np.dot(tc, tc))
    sww = float(np.dot(wc, wc))
    slope = float(np.dot(tc, wc)) / stt
    r = 0.0 if sww == 0 else float(np.dot(tc, wc)) / math.sqrt(stt * sww)
    mean = float(w.mean())
    rise = slope * span / mean if mean > 0 else 0.0
    return {
        "slope_per_minute": slope * 60.0,
        "rise": rise,
        "r": r,
        "blocks": n,
        "rising": bool(n >= MIN_TREND_BLOCKS and rise >= RISE_FLAG and r >= MIN_R),
    }


def lanes(
    worker: NDArray[Any],
    sent: NDArray[Any],
    returned: NDArray[Any],
    cells: NDArray[Any],
    rss: NDArray[Any] | None,
    cpu: NDArray[Any] | None,
    wall: NDArray[Any],
    failed: NDArray[Any] | None = None,
    origin: float = 0.0,
) -> list[dict[str, Any]]:
    """One lane per worker id (ascending; blocks run by no managed worker, as in serial
    mode, in a lane named ``driver``), each block ``[start, end, cell, peak RSS MB or None,
    CPU share or None, failed (True, False, or None: not known)]`` in start order, start
    and end in seconds after ``origin`` to 0.1 ms (short numbers: a short answer)."""
    out: list[dict[str, Any]] = []
    for wid in np.unique(worker).tolist():
        pick = np.flatnonzero(worker == wid)
        pick = pick[np.argsort(sent[pick], kind="stable")]
        n = int(pick.size)
        # whole columns at once (the page's answer is built at most once a second, in the
        # driver's process when the run serves it: no Python step per block but the zip)
        nothing: list[Any] = [None] * n
        mb = nothing if rss is None else np.round(rss[pick] / 2**20, 1).tolist()
        share = nothing
        if cpu is not None:
            w = wall[pick].astype(np.float64)
            ok = w > 0
            ratio = np.round(np.divide(cpu[pick], w, out=np.zeros(n), where=ok), 3)
            share = [
                r if good else None for r, good in zip(ratio.tolist(), ok.tolist(), strict=True)
            ]
        bad = nothing if failed is None else np.asarray(failed[pick], dtype=bool).tolist()
        blocks = list(
            zip(
                np.round(sent[pick].astype(np.float64) - origin, 4).tolist(),
                np.round(returned[pick].astype(np.float64) - origin, 4).tolist(),
                cells[pick].astype(np.int64).tolist(),
                mb,
                share,
                bad,
                strict=True,
            )
        )
        out.append({"worker": lane_name(int(wid)), "blocks": blocks})
    return out


def recent_blocks(store: Path | str) -> dict[str, Any] | None:
    """The lanes, the wall-time histogram and its trend of the blocks ``store`` saw
    returned in the :data:`RECENT_WINDOW_SECONDS` before its latest stamp (at most
    :data:`MAX_RECENT_BLOCKS`, the latest); None when the store has no stamps."""
    with open_readonly(store) as s:
        stats = s.stats
        if not all(name in stats for name in ("worker_id", "sent_at", "returned_at")):
            return None
        returned_all = np.array(stats["returned_at"]).reshape(-1)
        stamped = np.flatnonzero(returned_all > 0)
        if not stamped.size:
            return None
        end = float(returned_all[stamped].max())
        cells = stamped[returned_all[stamped] > end - RECENT_WINDOW_SECONDS]
        if cells.size > MAX_RECENT_BLOCKS:
            order = np.argsort(returned_all[cells], kind="stable")
            cells = np.sort(cells[order[-MAX_RECENT_BLOCKS:]])

        def column(name: str) -> NDArray[Any] | None:
            arr = stats.get(name)
            return None if arr is None else np.asarray(arr).reshape(-1)[cells]

        worker = column("worker_id")
        sent = column("sent_at")
        assert worker is not None and sent is not None
        returned = returned_all[cells]
        wall = column("wall_seconds")
        if wall is None:
            wall = returned - sent
        wall = np.where(wall > 0, wall, np.maximum(returned - sent, 0.0))
        rss, cpu = column("peak_rss_bytes"), column("cpu_seconds")
    return _window(worker, sent, returned, cells, rss, cpu, wall, None, end)


def _window(
    worker: NDArray[Any],
    sent: NDArray[Any],
    returned: NDArray[Any],
    cells: NDArray[Any],
    rss: NDArray[Any] | None,
    cpu: NDArray[Any] | None,
    wall: NDArray[Any],
    failed: NDArray[Any] | None,
    end: float,
) -> dict[str, Any]:
    """The lanes, the histogram and the trend of the blocks of one window ending at
    ``end``: what :func:`recent_blocks` and :func:`driver_recent` both answer."""
    by_time = np.argsort(returned, kind="stable")
    start = float(max(float(sent.min()), end - RECENT_WINDOW_SECONDS))
    return {
        "window_seconds": RECENT_WINDOW_SECONDS,
        "start": start,
        "end": end,
        "blocks": int(cells.size),
        "workers": int(np.unique(worker).size),
        "lanes": lanes(worker, sent, returned, cells, rss, cpu, wall, failed, start),
        "histogram": wall_histogram(wall.tolist()),
        "trend": wall_trend(returned[by_time].tolist(), wall[by_time].tolist()),
    }


def lane_name(worker_id: int) -> str:
    """The lane of ``worker_id``: its number, or ``driver`` (no managed worker: -1 in the
    driver, :data:`NO_WORKER` in a store)."""
    return "driver" if worker_id < 0 or worker_id == NO_WORKER else str(worker_id)


def driver_recent(
    entries: Sequence[tuple[int, float, float, int, bool]] | NDArray[np.float64],
    cell_of: Callable[[int], int],
) -> dict[str, Any] | None:
    """The lanes, the histogram and the trend (as :func:`recent_blocks` makes them) of the
    blocks the driver released, ``(worker_id, sent, returned, k, ok)`` in UNIX seconds
    (``TaskRun.recent``), for a run that tracks no resources: no RSS, no CPU, each bar
    marked failed or not. Blocks ``k`` are named by their store cell (``cell_of``). The
    window is the :data:`RECENT_WINDOW_SECONDS` before the latest return; None when no
    block came back yet."""
    if not len(entries):
        return None
    table = np.array(entries[-MAX_RECENT_BLOCKS:], dtype=np.float64)  # one pass, in C
    end = float(table[:, 2].max())
    table = table[table[:, 2] > end - RECENT_WINDOW_SECONDS]
    worker = table[:, 0].astype(np.int64)
    sent, returned = table[:, 1], table[:, 2]
    ks = table[:, 3].astype(np.int64)
    cells = np.array([cell_of(k) for k in ks.tolist()], dtype=np.int64)
    failed = table[:, 4] == 0
    wall = np.maximum(returned - sent, 0.0)
    out = _window(worker, sent, returned, cells, None, None, wall, failed, end)
    out["source"] = "driver"
    return out


def race_marks(
    races: Sequence[tuple[int, int, float, int, float, float, bool]],
    cell_of: Callable[[int], int],
) -> list[dict[str, Any]]:
    """The lanes' marks of the races between a straggler and its backup copy
    (``TaskRun.races``: block ``k``, the winner's worker and start, the loser's worker and
    start, when the race ended, whether the copy won), two marks per race: the original
    (``kind`` ``straggler``) and the copy (``backup``), each on its worker's lane from its
    start to the race's end, with whether it won."""
    out: list[dict[str, Any]] = []
    for k, w_win, w_start, w_lose, l_start, ended, copy_won in races:
        cell = cell_of(k)
        for worker, start, won in ((w_win, w_start, True), (w_lose, l_start, False)):
            is_copy = won == copy_won
            out.append(
                {
                    "cell": cell,
                    "worker": lane_name(worker),
                    "start": start,
                    "end": ended,
                    "kind": "backup" if is_copy else "straggler",
                    "won": won,
                }
            )
    return out


def running_marks(
    racing: Sequence[tuple[int, int, float, int, float]], cell_of: Callable[[int], int], now: float
) -> list[dict[str, Any]]:
    """The lanes' marks of the races still going (block ``k``, the original's worker and
    start, the copy's worker and start): both copies drawn as running, from each one's
    start to ``now`` (``won`` None: neither has won yet)."""
    out: list[dict[str, Any]] = []
    for k, w_orig, s_orig, w_copy, s_copy in racing:
        cell = cell_of(k)
        for worker, start, kind in ((w_orig, s_orig, "straggler"), (w_copy, s_copy, "backup")):
            out.append(
                {
                    "cell": cell,
                    "worker": lane_name(worker),
                    "start": start,
                    "end": max(start, now),
                    "kind": kind,
                    "won": None,
                    "running": True,
                }
            )
    return out


def attach_marks(recent: dict[str, Any], marks: list[dict[str, Any]]) -> None:
    """Put ``marks`` on the lanes of ``recent``: a worker a mark names that has no lane
    yet (its only block is the one still running) gets an empty one, and the window ends
    no sooner than the latest mark (a race still going ends now)."""
    if not marks:
        return
    recent["marks"] = marks
    names = {lane["worker"] for lane in recent["lanes"]}
    for m in marks:
        if m["worker"] not in names:
            names.add(m["worker"])
            recent["lanes"].append({"worker": m["worker"], "blocks": []})
            recent["workers"] = len(recent["lanes"])
    recent["end"] = max(float(recent["end"]), max(float(m["end"]) for m in marks))
