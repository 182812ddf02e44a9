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
from collections.abc import Sequence
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
    "lanes",
    "recent_blocks",
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
) -> list[dict[str, Any]]:
    """One lane per worker id (ascending; blocks run by no managed worker, as in serial
    mode, in a lane named ``driver``), each block ``[start, end, cell, peak RSS MB or None,
    CPU share or None]`` in start order."""
    out: list[dict[str, Any]] = []
    for wid in sorted({int(x) for x in worker.tolist()}):
        pick = np.flatnonzero(worker == wid)
        pick = pick[np.argsort(sent[pick], kind="stable")]
        blocks = []
        for i in pick.tolist():
            mb = None if rss is None else round(float(rss[i]) / 2**20, 1)
            share = None
            if cpu is not None and float(wall[i]) > 0:
                share = round(float(cpu[i]) / float(wall[i]), 3)
            blocks.append([float(sent[i]), float(returned[i]), int(cells[i]), mb, share])
        out.append({"worker": "driver" if wid == NO_WORKER else str(wid), "blocks": blocks})
    return out


def recent_blocks(store: Path) -> dict[str, Any] | None:
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
    by_time = np.argsort(returned, kind="stable")
    return {
        "window_seconds": RECENT_WINDOW_SECONDS,
        "start": float(max(float(sent.min()), end - RECENT_WINDOW_SECONDS)),
        "end": end,
        "blocks": int(cells.size),
        "workers": len({int(x) for x in worker.tolist()}),
        "lanes": lanes(worker, sent, returned, cells, rss, cpu, wall),
        "histogram": wall_histogram(wall.tolist()),
        "trend": wall_trend(returned[by_time].tolist(), wall[by_time].tolist()),
    }
