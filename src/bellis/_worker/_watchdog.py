"""The worker's watchdog: the thread that ends a block that runs too long or stalls.

Every :class:`~bellis._worker._client.Client` has one. A block past ``Task(timeout=...)``,
or one that shows no CPU, IO or heartbeat for ``Task(stall_timeout=...)`` (the decision is
:mod:`bellis._worker._stall`'s), ends the worker process, even inside C code: the watchdog
tells the server first (through ``notify``, the client's last frame, with the block's
wire-only status :data:`~bellis._protocol.TIMED_OUT` or :data:`~bellis._protocol.STALLED`),
then exits with :data:`~bellis._protocol.EXIT_BLOCK_TIMEOUT` or
:data:`~bellis._protocol.EXIT_BLOCK_STALLED`. A block that merely raises is the client's
business, not this module's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from .._protocol import EXIT_BLOCK_STALLED, EXIT_BLOCK_TIMEOUT, STALLED, TIMED_OUT
from . import _failure

__all__ = ["Watchdog"]


class Watchdog:
    """Kills this process when a block overruns its deadline, even inside C code, or,
    with ``stall`` seconds set (``Task(stall_timeout=...)``), when a block stalls.

    Arming costs one float store; a daemon thread polls the deadline and, with ``stall``,
    samples the process (:mod:`bellis._worker._stall`) while a block runs.
    """

    def __init__(self, worker_id: int) -> None:
        self.deadline = 0.0
        self.task_id = ""
        self.timeout = 0.0
        self.stall = 0.0  # stall_timeout in seconds, 0.0: off (set before the first arm)
        self.worker_id = worker_id
        self.k = -1
        self.notify: Any = None  # notify(k, text, status): tell the server before dying
        self._thread: threading.Thread | None = None

    def arm(self, timeout: float, k: int) -> None:
        if self._thread is None:
            self.timeout = timeout
            self._thread = threading.Thread(target=self._run, name="bellis-watchdog", daemon=True)
            self._thread.start()
        self.k = k
        self.deadline = time.monotonic() + timeout

    def disarm(self) -> None:
        self.deadline = 0.0

    def _run(self) -> None:
        period = min(0.5, max(0.01, self.timeout / 20))
        monitor = None
        if self.stall > 0:
            from ._stall import ProcessSampler, StallMonitor

            sampler = ProcessSampler()
            monitor = StallMonitor(self.stall, sampler.cheap, sampler.live_children)
            period = min(period, max(0.01, self.stall / 10))
        watched = 0.0  # the deadline of the block the monitor watches: a new one restarts it
        while True:
            time.sleep(period)
            d = self.deadline
            if not d:
                continue
            now = time.monotonic()
            if now > d:
                self._die(
                    f"still running after timeout={self.timeout:g}s",
                    TIMED_OUT,
                    EXIT_BLOCK_TIMEOUT,
                )
            if monitor is None:
                continue
            if d != watched:
                watched = d
                monitor.begin(now)
            elif monitor.check(now) and self.deadline == d:
                self._die(
                    f"stalled: no CPU, IO or heartbeat for {monitor.idle_seconds(now):.1f}s "
                    f"(stall_timeout={self.stall:g}s)",
                    STALLED,
                    EXIT_BLOCK_STALLED,
                )

    def _die(self, why: str, status: int, code: int) -> None:
        text = (
            f"bellis worker {self.worker_id}: block {self.task_id}/{self.k} {why}; "
            "killing worker process"
        )
        field = _failure.failure_field(text)  # the logs' offsets before its lines
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        if self.notify is not None:
            self.notify(self.k, field, status)
        os._exit(code)
