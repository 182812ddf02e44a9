"""Stall detection: is a running block still doing anything?

``Task(stall_timeout=s)`` asks each worker's watchdog thread (``bellis._worker._watchdog``) to
look at its process every ``s / 10`` seconds while a block runs. A block is *stalled*
when, for ``s`` seconds, none of these moved:

* the CPU time of the worker process, less the watchdog thread's own;
* the CPU time of its children: the ones it waited for (``RUSAGE_CHILDREN``) and, when that
  did not move and the process has a child, the ones still running (the ``/proc`` walk of
  :mod:`bellis._worker._profiling`);
* its IO counters (``/proc/self/io``: bytes passed to ``read``/``write`` calls of any kind,
  files, pipes and sockets alike), less what the watchdog itself read;
* the heartbeat counter, which :func:`bellis.heartbeat` (``block.heartbeat()``) advances.

Everything here runs in the watchdog thread; a block pays nothing. :class:`StallMonitor` is
the decision, fed by two callables, so it is tested with scripted readings and a fake
clock; :class:`ProcessSampler` reads the real counters. Nothing beyond the standard library
and bellis's worker-side modules is imported (psutil is used where ``/proc`` is missing, and
only if the worker already imported it).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable

from .._block import heartbeats
from ._profiling import (
    _IS_LINUX,
    _SECONDS_PER_TICK,
    _descendant_cpu_ticks,
    _has_children,
    _walk_bytes,
)

__all__ = [
    "CPU_EPSILON",
    "ProcessSampler",
    "StallMonitor",
]

#: CPU seconds that must accumulate (since the last sign of life) to count as movement:
#: above the error of subtracting the watchdog thread's own CPU from its process's
CPU_EPSILON = 0.005

#: a cheap reading: (process CPU less the sampler's own, reaped children's CPU, IO
#: counter, heartbeats)
Reading = tuple[float, float, int, int]


class StallMonitor:
    """The stall decision for one process, fed readings through two callables.

    ``cheap()`` returns a :data:`Reading`; ``live_children()`` the CPU seconds of the
    still-running descendants (a walk of ``/proc``, so it is called only when the cheap
    reading has not moved). :meth:`begin` starts watching a block at time ``now``;
    :meth:`check` returns True once nothing moved for ``stall_timeout`` seconds.
    """

    def __init__(
        self,
        stall_timeout: float,
        cheap: Callable[[], Reading],
        live_children: Callable[[], float],
        cpu_epsilon: float = CPU_EPSILON,
    ) -> None:
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout!r}")
        self.stall_timeout = stall_timeout
        self._cheap = cheap
        self._live_children = live_children
        self._eps = cpu_epsilon
        self._ref: Reading = (0.0, 0.0, 0, 0)
        self._ref_live: float | None = None
        #: when the block was last seen to move (or began)
        self.last_moved = 0.0

    def begin(self, now: float) -> None:
        """Start watching a new block at ``now``."""
        self._ref = self._cheap()
        self._ref_live = None
        self.last_moved = now

    def _moved(self, r: Reading) -> bool:
        ref, eps = self._ref, self._eps
        return r[0] - ref[0] > eps or abs(r[1] - ref[1]) > eps or r[2] != ref[2] or r[3] != ref[3]

    def check(self, now: float) -> bool:
        """Sample at ``now``; True when the block has shown no sign of life for
        ``stall_timeout`` seconds."""
        r = self._cheap()
        if self._moved(r):
            self._ref = r
            self._ref_live = None
            self.last_moved = now
            return False
        live = self._live_children()
        ref_live = self._ref_live
        self._ref_live = live
        if ref_live is not None and abs(live - ref_live) > self._eps:
            self.last_moved = now
            return False
        # a first look at the live children sets their reference: a child that works
        # moves it by the next sample
        return now - self.last_moved >= self.stall_timeout

    def idle_seconds(self, now: float) -> float:
        """Seconds since the block last moved."""
        return now - self.last_moved


class ProcessSampler:
    """Reads this process's counters for :class:`StallMonitor`, from the watchdog thread.

    The watchdog thread's own CPU (``time.thread_time``) and the bytes it reads from
    ``/proc`` are subtracted, so that watching does not look like progress.
    """

    def __init__(self) -> None:
        self._own_bytes = 0
        self._io_path = "/proc/self/io" if os.access("/proc/self/io", os.R_OK) else None

    def _read(self, path: str) -> bytes:
        """One ``read`` of a small ``/proc`` file, counted as the sampler's own IO."""
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, 8192)
        finally:
            os.close(fd)
        self._own_bytes += len(data)
        return data

    def cheap(self) -> Reading:
        me = resource.getrusage(resource.RUSAGE_SELF)
        # read after the process total, so the sampler's own CPU in between is subtracted
        # too (an error downwards, never towards movement)
        own_cpu = time.thread_time()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = me.ru_utime + me.ru_stime - own_cpu
        return (cpu, kids.ru_utime + kids.ru_stime, self._io(), heartbeats())

    def _io(self) -> int:
        if self._io_path is not None:
            before = self._own_bytes  # /proc/self/io counts a read once it has returned
            try:
                data = self._read(self._io_path)
            except OSError as exc:
                # the watchdog thread has no caller to raise to: say so in the worker's log
                self._io_path = None
                sys.stderr.write(f"bellis stall watchdog: IO is not watched, {exc}\n")
                return 0
            total = 0
            for line in data.splitlines():
                if line.startswith((b"rchar:", b"wchar:")):
                    total += int(line.split()[1])
            return total - before
        psutil = sys.modules.get("psutil")
        if psutil is not None:
            try:
                c = psutil.Process().io_counters()
            except Exception:  # no IO counters on this platform
                return 0
            return int(getattr(c, "read_chars", c.read_count) + getattr(c, "write_chars", 0))
        return 0

    def live_children(self) -> float:
        """CPU seconds of this process's running descendants (0.0 where unknown).

        The walk of ``/proc`` is :mod:`bellis._worker._profiling`'s, done only when this process
        has a child at all; what it reads is the sampler's own IO.
        """
        if not _IS_LINUX:
            return self._psutil_children()
        if not _has_children():
            return 0.0
        walked = _walk_bytes[0]
        ticks = _descendant_cpu_ticks()
        self._own_bytes += _walk_bytes[0] - walked
        return ticks * _SECONDS_PER_TICK

    def _psutil_children(self) -> float:
        psutil = sys.modules.get("psutil")
        if psutil is None:
            return 0.0
        total = 0.0
        try:
            for child in psutil.Process().children(recursive=True):
                t = child.cpu_times()
                total += t.user + t.system
        except Exception:  # a child that ended meanwhile, or no access
            return total
        return total
