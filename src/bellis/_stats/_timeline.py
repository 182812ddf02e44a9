"""The worker timeline: lifecycle phases of managed workers, stamped by the server.

Theory of operation
-------------------
The server owns one :class:`WorkerTimeline` per managed worker and stamps it from
events it already handles, with its own monotonic clock (the ``t`` arguments)::

    spawn ──startup──▶ first acquire ─idle─▶ send ─compute─▶ return ─idle─▶ send ...
                                                   ... return ─final wait─▶ shutdown
                                                                   ─teardown─▶ exit

* **task setup** — ``Task(setup=...)``, run once by the worker after it connected and
  before it asked for a block: the seconds it reports (a SETUP message); the idle gap
  before its first block starts when that report arrives.
* **startup** — the spawn call to the first acquire. It splits into **setup**, the
  worker's own measure of its life so far, reported with its first acquire, and
  **launch** = startup − setup: what happened before the worker's clock started (the
  spawn itself, a cluster queue).
* **idle** — the previous return (or the first acquire) to the next send, one sample
  per block, pooled across workers in the task's aggregate.
* **compute** — send to return: the server's round trip, failed blocks included.
* **final wait** — the last return to the shutdown (a ``RequestShutdown`` or the start
  of the run's shutdown, whichever comes first), kept per worker and out of idle.
* **teardown** — that shutdown to the exit; only clean exits have one.

For a worker that exits cleanly after a shutdown, the phases tile its life exactly:
``startup + Σ idle + Σ compute + final_wait + teardown == exit − spawn``; with a task
setup, ``+ task setup`` on the left, to within one message's way from worker to server.

Every per-event method is a few float assignments and at most one accumulator update.
"""

from __future__ import annotations

from typing import Any, Final

from ._aggregates import Stat, Welford
from ._reports import EXIT_KINDS, WorkerRecord

__all__ = ["TimelineSet", "WorkerTimeline"]

_EXIT_KINDS: Final = frozenset(EXIT_KINDS)


class WorkerTimeline:
    """Lifecycle stamps of one managed worker (times from the server's monotonic clock)."""

    __slots__ = (
        "_exit_t",
        "_first_acquire_t",
        "_last_mark_t",
        "_sent_t",
        "_setup_seconds",
        "_shutdown_t",
        "_spawn_t",
        "blocks",
        "blocks_failed",
        "compute",
        "exit_kind",
        "final_wait",
        "gpus",
        "idle",
        "log_files",
        "moved_from",
        "moved_to",
        "slot",
        "task_setup",
        "worker_id",
    )

    def __init__(self, worker_id: int, spawned_at: float | None = None) -> None:
        self.worker_id = worker_id
        self._spawn_t = spawned_at
        self._setup_seconds: float | None = None
        self._first_acquire_t: float | None = None
        self._last_mark_t: float | None = None
        self._sent_t: float | None = None
        self._shutdown_t: float | None = None
        self._exit_t: float | None = None
        self.exit_kind: str | None = None
        self.final_wait: float | None = None
        self.idle = Welford()
        self.compute = Welford()
        self.blocks = 0
        self.blocks_failed = 0
        #: seconds its task's setup took, as it reported them; None: no setup ran
        self.task_setup: float | None = None
        #: its log slot within the task, and its ``(stdout, stderr)`` log files (set by
        #: the server when it starts the worker; none in console mode)
        self.slot: int | None = None
        self.log_files: tuple[str, str] | None = None
        #: the GPUs it was given (its ``CUDA_VISIBLE_DEVICES``); None: none assigned
        self.gpus: tuple[str, ...] | None = None
        #: a worker shared between tasks (``_scheduling._sharing``): the task it came
        #: from, and the one it left for (its part here then ends as a clean exit)
        self.moved_from: str | None = None
        self.moved_to: str | None = None

    # ------------------------------------------------------------------ events

    def spawned(self, t: float) -> None:
        """The spawn call for this worker was made at ``t``."""
        self._spawn_t = t

    def reported_setup(self, setup_seconds: float) -> None:
        """The worker's own setup duration (its process age at its first acquire)."""
        self._setup_seconds = setup_seconds if setup_seconds > 0.0 else 0.0

    def task_setup_done(self, seconds: float, t: float) -> None:
        """The worker reported at ``t`` that its task's setup took ``seconds``: its idle
        time starts now."""
        self.task_setup = seconds if seconds > 0.0 else 0.0
        if self._sent_t is None and self._last_mark_t is not None:
            self._last_mark_t = t

    def first_acquire(self, t: float) -> None:
        """The worker's first ``AcquireBlock`` arrived at ``t`` (later calls are ignored)."""
        if self._first_acquire_t is None:
            self._first_acquire_t = t
            self._last_mark_t = t

    def _idle_until(self, t: float) -> float:
        """The idle gap a block sent at ``t`` closes (0 when the clock stepped back)."""
        last = self._last_mark_t
        if last is None:
            self.first_acquire(t)
            last = t
        if self._sent_t is not None:
            raise ValueError(f"worker {self.worker_id}: a block was sent while one is in flight")
        gap = t - last
        return gap if gap > 0.0 else 0.0

    def sent(self, t: float) -> None:
        """A block was sent to this worker at ``t``; closes one idle gap."""
        self.idle.add(self._idle_until(t))
        self._sent_t = t

    def returned(self, t: float, failed: bool = False) -> None:
        """The block in flight came back at ``t`` (``ReleaseBlock`` or ``BlockFailed``)."""
        sent = self._sent_t
        if sent is None:
            raise ValueError(f"worker {self.worker_id}: a block returned that was never sent")
        rt = t - sent
        self.compute.add(rt if rt > 0.0 else 0.0)
        if failed:
            self.blocks_failed += 1
        else:
            self.blocks += 1
        self._sent_t = None
        self._last_mark_t = t

    def ran_batch(self, t: float, step: float, n: int) -> None:
        """``n`` blocks out back to back from ``t``, ``step`` each, all returned successful:
        ``sent(t + i * step)`` and ``returned(t + (i + 1) * step)`` for each ``i``, in one
        (the gaps between them are 0)."""
        if n <= 0:
            return
        self.idle.add(self._idle_until(t))
        self.idle.add_repeated(0.0, n - 1)
        self.compute.add_repeated(step if step > 0.0 else 0.0, n)
        self.blocks += n
        self._last_mark_t = t + n * step

    def shutdown_requested(self, t: float) -> None:
        """The server told this worker to shut down at ``t`` (the first shutdown counts)."""
        if self._shutdown_t is not None or self._exit_t is not None:
            return
        self._shutdown_t = t
        last = self._last_mark_t
        if self._sent_t is None and last is not None:
            wait = t - last
            self.final_wait = wait if wait > 0.0 else 0.0

    def run_shutdown(self, t: float) -> None:
        """The run began shutting down at ``t``: the teardown of a worker never told starts."""
        self.shutdown_requested(t)

    def exited(self, t: float, kind: str) -> None:
        """The worker's spawn call returned at ``t``, as ``kind``: one of
        :data:`EXIT_KINDS` (the strings of ``bellis._protocol.ExitKind``, which documents
        each). The first exit counts."""
        if kind not in _EXIT_KINDS:
            raise ValueError(f"exit kind must be one of {EXIT_KINDS}, got {kind!r}")
        if self._exit_t is None:
            self._exit_t = t
            self.exit_kind = kind

    def rejoined(self, t: float) -> None:
        """A shared worker came back to this task at ``t`` after it had moved on: its
        part here goes on (the time away counts as idle)."""
        self._exit_t = None
        self.exit_kind = None
        self._shutdown_t = None
        self.final_wait = None
        self.moved_to = None

    # ------------------------------------------------------------------ derived

    @property
    def has_exited(self) -> bool:
        return self._exit_t is not None

    @property
    def startup(self) -> float | None:
        if self._spawn_t is None or self._first_acquire_t is None:
            return None
        d = self._first_acquire_t - self._spawn_t
        return d if d > 0.0 else 0.0

    @property
    def setup(self) -> float | None:
        """The reported setup, capped at the startup the server saw."""
        s = self._setup_seconds
        startup = self.startup
        if s is None or startup is None:
            return s
        return s if s < startup else startup

    @property
    def launch(self) -> float | None:
        startup, setup = self.startup, self.setup
        if startup is None or setup is None:
            return None
        return startup - setup

    @property
    def teardown(self) -> float | None:
        if self.exit_kind != "clean" or self._shutdown_t is None or self._exit_t is None:
            return None
        d = self._exit_t - self._shutdown_t
        return d if d > 0.0 else 0.0

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            worker_id=self.worker_id,
            startup=self.startup,
            launch=self.launch,
            setup=self.setup,
            idle=Stat.from_welford(self.idle),
            compute=Stat.from_welford(self.compute),
            teardown=self.teardown,
            exit=self.exit_kind,
            blocks=self.blocks,
            blocks_failed=self.blocks_failed,
            final_wait=self.final_wait,
            slot=self.slot,
            log_files=self.log_files,
            gpus=self.gpus,
            moved_from=self.moved_from,
            moved_to=self.moved_to,
            task_setup=self.task_setup,
        )


class TimelineSet:
    """The timelines of one task's managed workers in one run, and its unmanaged clients."""

    __slots__ = ("_workers", "unmanaged_clients")

    def __init__(self) -> None:
        self._workers: dict[int, WorkerTimeline] = {}
        self.unmanaged_clients = 0

    def spawned(self, worker_id: int, t: float) -> WorkerTimeline:
        """Start the timeline of a newly spawned worker (ids are unique within a run)."""
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id} was already spawned in this run")
        tl = self._workers[worker_id] = WorkerTimeline(worker_id, t)
        return tl

    def get(self, worker_id: int) -> WorkerTimeline | None:
        return self._workers.get(worker_id)

    def __getitem__(self, worker_id: int) -> WorkerTimeline:
        return self._workers[worker_id]

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

    def __len__(self) -> int:
        return len(self._workers)

    def unmanaged_client(self) -> None:
        """Count a client that connected without a server-assigned worker id."""
        self.unmanaged_clients += 1

    def run_shutdown(self, t: float) -> None:
        """The run began shutting down at ``t``: start every live worker's teardown."""
        for tl in self._workers.values():
            if not tl.has_exited:
                tl.run_shutdown(t)

    def exit_open(self, t: float, kind: str = "interrupted") -> None:
        """Close every worker that has not exited yet as ``kind`` (e.g. at an abort)."""
        for tl in self._workers.values():
            if not tl.has_exited:
                tl.exited(t, kind)

    def records(self) -> list[WorkerRecord]:
        return [self._workers[i].record() for i in sorted(self._workers)]

    def to_json(self) -> dict[str, Any]:
        """The ``workers`` section of a run line."""
        startup, launch, setup, teardown, idle, task_setup = (Welford() for _ in range(6))
        exits: dict[str, int] = {}
        records = self.records()
        for i in sorted(self._workers):
            idle.merge(self._workers[i].idle)
        for r in records:
            for w, v in ((startup, r.startup), (launch, r.launch), (setup, r.setup)):
                if v is not None:
                    w.add(v)
            if r.teardown is not None:
                teardown.add(r.teardown)
            if r.task_setup is not None:
                task_setup.add(r.task_setup)
            if r.exit is not None:
                exits[r.exit] = exits.get(r.exit, 0) + 1

        def stat(w: Welford) -> dict[str, Any] | None:
            return Stat.from_welford(w).to_dict() if w.n else None

        return {
            "count": len(records),
            "unmanaged_clients": self.unmanaged_clients,
            "startup": stat(startup),
            "launch": stat(launch),
            "setup": stat(setup),
            "idle": stat(idle),
            "teardown": stat(teardown),
            "task_setup": stat(task_setup),
            "exits": exits,
            "records": [r.to_dict() for r in records],
        }
