"""Advice lines for the HTML report, each derived from the store's figures alone.

Every rule states the figure it read and gives a line only where the data supports it
(enough measured blocks, a threshold crossed); ``docs/report.md`` lists the rules.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from .._sizes import format_iec, recommended_memory
from ._data import StoreData
from ._panel import format_duration

__all__ = ["advice"]

MIN_BLOCKS: Final = 20
OUTLIER_FACTOR: Final = 5.0
WAIT_RATIO: Final = 0.5
#: below this share of block time with the GPU busy (mean SM utilisation), the blocks wait
GPU_BUSY_SHARE: Final = 0.5
IDLE_SHARE: Final = 0.25
STARTUP_SHARE: Final = 0.25
TAIL_SHARE: Final = 0.2


def _column(s: StoreData, name: str) -> np.ndarray | None:  # type: ignore[type-arg,unused-ignore]
    if name not in s.stats:
        return None
    return s.stats[name].reshape(-1)[s.measured()].astype(np.float64)


def _task_advice(s: StoreData) -> list[str]:
    out: list[str] = []
    who = s.task_id
    failed = s.counts[1]
    if failed:
        out.append(
            f"{who}: {failed} block(s) failed and are not done: see the failure map for where "
            "they lie and the worker logs for why; the next run retries them after the "
            "blocks never tried"
        )
    latest = s.last_report
    said = latest.abandoned if latest is not None and latest.outcome == "abandoned" else {}
    if said.get("rule"):
        out.append(
            f"{who}: the last run abandoned the task ({said.get('reason')}): the rule that "
            f"fired is {said['rule']}; {said.get('option')} changes it; {said.get('rerun')}"
        )
    rss = _column(s, "peak_rss_bytes")
    if rss is not None and len(rss) >= MIN_BLOCKS and rss.max() > 0:
        p99, top = float(np.percentile(rss, 99)), float(rss.max())
        out.append(
            f"{who}: p99 peak RSS {format_iec(p99)}, max {format_iec(top)}: a memory "
            f"request of {format_iec(recommended_memory(top))} covers every block (max + 25%, "
            "rounded up to 64 MiB, as bellis.plan recommends)"
        )
    wall = _column(s, "wall_seconds")
    cpu = _column(s, "cpu_seconds")
    if wall is not None and cpu is not None and len(wall) >= MIN_BLOCKS and wall.sum() > 0:
        children = _column(s, "cpu_children_seconds")
        used = cpu.sum() + (children.sum() if children is not None else 0.0)
        ratio = used / wall.sum()
        if ratio < WAIT_RATIO:
            out.append(f"{who}: cpu / wall = {ratio:.2f}: blocks mostly wait, on IO or on a device")
        elif ratio > 1.5:
            out.append(
                f"{who}: cpu / wall = {ratio:.2f}: blocks use about {ratio:.0f} cores each; "
                "request that many cores per worker"
            )
    util = _column(s, "gpu_util_pct")
    if util is not None:
        util = util[np.isfinite(util)]
        if len(util) >= MIN_BLOCKS and float(util.mean()) < GPU_BUSY_SHARE * 100:
            out.append(
                f"{who}: the GPU is busy {util.mean():.0f}% of block time (mean SM "
                "utilisation): the blocks wait on IO or on the CPU; read ahead, or give each "
                "worker more CPUs"
            )
    if wall is not None and len(wall) >= MIN_BLOCKS:
        median = float(np.median(wall))
        slow = int((wall > OUTLIER_FACTOR * median).sum()) if median > 0 else 0
        if slow:
            out.append(
                f"{who}: {slow} block(s) took more than {OUTLIER_FACTOR:g}x the median "
                f"({format_duration(median)}): see the slowest-blocks table"
            )
    ret = _column(s, "returned_at")
    if ret is not None and len(ret) >= 100 and s.runs:
        last = s.runs[-1]
        start = last.get("run_started_at")
        if isinstance(start, int | float):
            mine = np.sort(ret[ret >= start])
            if len(mine) >= 100:
                at99 = float(mine[int(0.99 * (len(mine) - 1))])
                span = float(mine[-1]) - float(start)
                tail = float(mine[-1]) - at99
                if span > 0 and tail / span > TAIL_SHARE:
                    out.append(
                        f"{who}: the last 1% of the last run's blocks took {tail / span:.0%} "
                        f"of its time ({format_duration(tail)}): a few slow blocks hold the "
                        "end of the run; see the slowest-blocks table"
                    )
    rep = s.last_report
    if rep is not None and rep.workers.records:
        idle = sum(w.idle.total for w in rep.workers.records)
        compute = sum(w.compute.total for w in rep.workers.records)
        startup = sum(w.startup or 0.0 for w in rep.workers.records)
        life = idle + compute + startup
        if idle + compute > 0 and idle / (idle + compute) > IDLE_SHARE:
            out.append(
                f"{who}: idle is {idle / (idle + compute):.0%} of worker time: more blocks "
                "per worker or fewer workers"
            )
        if life > 0 and startup / life > STARTUP_SHARE:
            out.append(
                f"{who}: worker startup is {startup / life:.0%} of worker time: start fewer "
                "workers or give each more blocks"
            )
    return out


def advice(stores: list[StoreData]) -> list[str]:
    """Every advice line of every store, in store order."""
    return [line for s in stores for line in _task_advice(s)]
