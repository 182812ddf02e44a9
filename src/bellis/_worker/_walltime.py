"""Walltime-aware workers: stop taking blocks before the cluster job's time limit.

A worker whose launcher gave it a job time limit (``SlurmLauncher(time_limit=...)``) learns
once, at start and without asking the controller, when its job ends:

* ``SLURM_JOB_END_TIME`` (epoch seconds; SLURM 23.02 and later set it), else
* ``BELLIS_JOB_TIME_LIMIT`` (seconds, from the launcher) after ``SLURM_JOB_START_TIME``
  (23.02+) or ``BELLIS_JOB_STARTED`` (the job script's first command, ``date +%s``).

``BELLIS_WALLTIME_MARGIN`` (seconds) turns the check on. Before each block the client
compares the clock value it reads anyway (when it arms its block watchdog) with
:attr:`JobWalltime.next_check`, one float comparison; only past it does :meth:`check` run.
``check`` leaves when the job's remaining time is less than the margin plus the p95 of the
block walls so far (start to start, as the server measures a block, round trip included). It
samples every block at first, then one block per second, so the per-block cost stays one
comparison whatever the block rate.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Mapping

from .._protocol import JOB_STARTED_ENV, JOB_TIME_LIMIT_ENV, WALLTIME_MARGIN_ENV

__all__ = ["LEAVING_MARKER", "JobWalltime", "from_env"]

#: the start of the line a worker writes to its stderr when it leaves for its job's time
#: limit (the launcher looks for it to tell such an exit from an ordinary clean one)
LEAVING_MARKER = "bellis worker leaves before its job time limit:"
#: block walls kept for the p95 (the most recent)
_KEPT = 256
#: the first walls are all sampled; after that at most one block per second
_DENSE = 32
_SAMPLE_EVERY = 1.0


class JobWalltime:
    """When the job ends (``end``, on the ``time.monotonic`` clock) and the margin."""

    __slots__ = ("_next_sample", "_p95", "_started", "_walls", "end", "margin", "next_check")

    def __init__(self, end: float, margin: float) -> None:
        self.end = end
        self.margin = margin
        #: no check is needed for a block that starts before this (−inf: the next one)
        self.next_check = -math.inf
        self._walls: deque[float] = deque(maxlen=_KEPT)
        self._p95 = 0.0
        self._started: float | None = None  # the start of the block being sampled
        self._next_sample = -math.inf

    @property
    def p95(self) -> float:
        return self._p95

    @property
    def samples(self) -> int:
        return len(self._walls)

    def check(self, now: float) -> bool:
        """``now``: the start of the block about to run. True: leave (the job's remaining
        time is below margin + p95); False: run it, with :attr:`next_check` updated."""
        started = self._started
        if started is not None:
            self._walls.append(now - started)
            walls = sorted(self._walls)
            self._p95 = walls[min(len(walls) - 1, math.ceil(0.95 * len(walls)) - 1)]
            self._started = None
        leave_at = self.end - self.margin - self._p95
        if now >= leave_at:
            return True
        if len(self._walls) < _DENSE or now >= self._next_sample:
            self._started = now
            self._next_sample = now + _SAMPLE_EVERY
            self.next_check = -math.inf
        else:
            self.next_check = min(self._next_sample, leave_at)
        return False

    def leaving(self, now: float, worker_id: int) -> str:
        """The line the worker writes to its stderr as it leaves."""
        return (
            f"{LEAVING_MARKER} worker {worker_id}'s job ends in {self.end - now:.1f} s, less "
            f"than the margin ({self.margin:g} s) plus the p95 block wall ({self._p95:.2f} s "
            f"over {len(self._walls)} blocks); it takes no more blocks and exits, and a new "
            "job continues the task"
        )


def _number(env: Mapping[str, str], name: str) -> float | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def from_env(env: Mapping[str, str] | None = None) -> JobWalltime | None:
    """The job's end as this process's environment gives it; None without a margin (the
    launcher did not ask for walltime awareness) or without a way to know the end."""
    if env is None:
        env = os.environ
    margin_text = env.get(WALLTIME_MARGIN_ENV)
    if margin_text is None:
        return None
    try:
        margin = float(margin_text)
    except ValueError:
        margin = -1.0
    if not margin >= 0.0:
        raise ValueError(
            f"{WALLTIME_MARGIN_ENV}={margin_text!r} is not seconds >= 0 (set by the launcher's "
            "walltime_margin=)"
        )
    end = _number(env, "SLURM_JOB_END_TIME")
    if end is None:
        limit = _number(env, JOB_TIME_LIMIT_ENV)
        start = _number(env, "SLURM_JOB_START_TIME") or _number(env, JOB_STARTED_ENV)
        if limit is None or start is None:
            return None
        end = start + limit
    return JobWalltime(time.monotonic() + (end - time.time()), margin)
