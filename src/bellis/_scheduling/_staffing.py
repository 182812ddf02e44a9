"""Who works on a distributed run, sans I/O: the workers started, what each start costs,
and whether a task may have another.

Theory of operation
-------------------
:class:`Staffing` is the part of the :class:`~bellis._scheduling._dispatch.Dispatcher` that books,
starts and retires *managed* workers (those a launcher started for the run). It keeps the
workers by id (live ones in :attr:`~Staffing.workers`, ended ones in
:attr:`~Staffing.gone`), the run's resources and what the live workers take of them, and
each task's restart budget on its :class:`~bellis._scheduling._records.TaskRecord`. The dispatcher
asks it (:meth:`~Staffing.eligible`, :meth:`~Staffing.book`, :meth:`~Staffing.out_of_starts`)
and tells it what happened (:meth:`~Staffing.launched`, :meth:`~Staffing.launch_failed`,
:meth:`~Staffing.exited`, :meth:`~Staffing.account_exit`); it sends nothing itself.

* **The restart budget.** A task's first ``max_workers`` starts are free. A worker that
  exits cleanly after it returned a block or was told to stop (*earned*) gives its start
  back; any other start is a restart, counted against ``max_worker_restarts``: a worker that
  fails, times out, is lost, exits at once or without ever connecting, and a launch that
  fails. A task with work left, no worker alive and no start left is abandoned (by the
  dispatcher, which asks :meth:`~Staffing.out_of_starts`), and its downstream tasks with it.
* **Resources.** A worker takes its task's ``requires`` (or, on a larger memory grant, what
  :func:`._memory.charge` says) from the run's resources from its booking until it is
  retired or its launch fails; a task gets no worker its resources cannot hold.
* **Memory grants.** A worker has a step on its task's memory ladder (0: the request);
  :mod:`bellis._scheduling._memory` books the larger ones and counts them on ``plan.memory``.
"""

from __future__ import annotations

import logging
from typing import Any

from .._protocol import ExitKind, Hello, WorkerExit, verify_mac, worker_token
from .._task_params import budget_units
from ._memory import charge
from ._records import Booking, ManagedWorker, Peer, TaskRecord, replacing
from ._task_run import RUNNING, TaskRun

__all__ = ["Staffing"]

logger = logging.getLogger("bellis")


class Staffing:
    """The managed workers of one run, their starts and their resources (see the module
    docstring)."""

    def __init__(self, plans: dict[str, TaskRecord], resources: dict[str, int]) -> None:
        self.plan_of = {p.run.index: p for p in plans.values()}
        self.resources = budget_units(resources)  # gpu in shares, as each task's _budget
        #: what the live workers take of :attr:`resources`
        self.used: dict[str, int] = {k: 0 for k in resources}
        self.workers: dict[int, ManagedWorker] = {}
        #: workers whose process has ended, by id: a connection that claims one of them
        #: comes from a worker that outlived its spawn function
        self.gone: dict[int, ManagedWorker] = {}
        self.next_worker_id = 0

    # -- booking -----------------------------------------------------------------------
    def eligible(self, plan: TaskRecord) -> bool:
        """Whether ``plan``'s task can use one more ordinary worker now."""
        run = plan.run
        task = run.spec
        if plan.payload is None or run.status != RUNNING or run.ready <= 0:
            return False
        alive, out = plan.alive, run.processing
        if plan.memory is not None:  # big workers and the blocks they wait for aside
            alive -= plan.memory.big_alive
            out = max(0, out - plan.memory.held_back - plan.memory.big_alive)
        if alive >= task.max_workers or alive >= run.ready + out:
            return False
        if self.out_of_starts(plan):
            return False
        for k, v in task.budget.items():
            if self.used.get(k, 0) + v > self.resources.get(k, 0):
                return False
        return True

    def out_of_starts(self, plan: TaskRecord) -> bool:
        """No free start left and the restart budget spent (or starts refused for good)."""
        return plan.starts_refused or (
            plan.free_starts <= 0 and plan.run.worker_restarts >= plan.run.spec.max_worker_restarts
        )

    def stranded(self, plan: TaskRecord) -> bool:
        """``plan``'s task has blocks left but no worker alive, none out (but those
        waiting for a larger memory grant) and no start left: it is to be abandoned."""
        run = plan.run
        if run.status != RUNNING or plan.alive > 0 or plan.payload is None:
            return False
        waiting = 0 if plan.memory is None else plan.memory.held_back
        if run.remaining <= 0 or run.processing > waiting:
            return False
        return self.out_of_starts(plan)

    def book(self, plan: TaskRecord, now: float, mem_step: int = 0) -> Booking:
        """Book one new worker of ``plan``'s task: its id, budget, resources, log slot
        (and its step on the task's memory ladder)."""
        run = plan.run
        wid = self.next_worker_id
        self.next_worker_id += 1
        if plan.free_starts > 0:
            plan.free_starts -= 1
        else:
            run.worker_restarts += 1
        run.worker_starts += 1
        for k, v in self.charge(plan, mem_step).items():
            self.used[k] = self.used.get(k, 0) + v
        plan.alive += 1
        if plan.memory is not None:
            plan.memory.alive[mem_step] += 1
        timeline = plan.timelines.spawned(wid, now)
        slot, before = plan.take_slot()
        if before is None and plan.retired_unseen > 0:
            # a new slot while a worker retired after a block timeout is yet to be seen
            # to end: it holds its slot until then
            before = "restart in a new slot (the worker it replaces has not ended yet)"
        timeline.slot = slot
        return Booking(wid, slot, before, timeline, mem_step)

    def charge(self, plan: TaskRecord, mem_step: int) -> dict[str, int]:
        """What a worker of ``plan`` at ``mem_step`` takes from the run's resources."""
        if not mem_step or plan.memory is None:
            return plan.run.spec.budget
        return charge(plan.run.spec.budget, plan.memory.ladder, mem_step)

    def launched(self, plan: TaskRecord, booking: Booking, handle: Any, log: str | None) -> None:
        """The booked worker was started: ``handle`` is its launcher's handle."""
        worker = ManagedWorker(booking.worker_id, plan.run, handle, booking.timeline)
        worker.log = log
        worker.slot = booking.slot
        worker.mem_step = booking.mem_step
        self.workers[booking.worker_id] = worker
        plan.workers.append(worker)

    def launch_failed(self, plan: TaskRecord, booking: Booking, exc: Exception, now: float) -> None:
        """The booked worker could not be started: the booking is undone; the start it
        used stays spent, and the task counts a worker failure."""
        run = plan.run
        plan.alive -= 1
        if plan.memory is not None:
            plan.memory.alive[booking.mem_step] -= 1
        plan.release_slot(
            booking.slot, f"replacing worker {booking.worker_id}, which could not be started"
        )
        for k, v in self.charge(plan, booking.mem_step).items():
            self.used[k] -= v
        msg = f"could not start a worker for task '{run.task_id}': {exc}"
        if getattr(exc, "permanent", False):
            plan.starts_refused = True  # every later start would fail the same way
        run.worker_failures += 1
        if run.first_worker_error is None:
            run.first_worker_error = msg
        run.last_worker_error = msg
        booking.timeline.exited(now, ExitKind.ERROR)
        logger.warning("%s", msg)

    # -- connections ------------------------------------------------------------------
    def identify(
        self, hello: Hello, nonce: bytes, worker_key: bytes, run: TaskRun
    ) -> ManagedWorker | None:
        """The managed worker of ``run`` that a HELLO answering ``nonce`` proves to be (None:
        the client is unmanaged). Only a client that holds that worker's own token is the
        managed worker: anyone with the run's secret may connect, but only as an unmanaged
        client. A worker with a connection open may open more (several clients in one
        process): each is that worker's."""
        wid = hello.worker_id
        if wid < 0 or hello.worker_mac is None:
            return None
        if not verify_mac(worker_token(worker_key, wid), nonce, hello.worker_mac):
            return None
        worker = self.workers.get(wid) or self.gone.get(wid)
        if worker is None or worker.run is not run:
            return None
        return worker

    def connected(self, worker: ManagedWorker, peer: Peer, setup: Any, now: float) -> None:
        """``worker`` is served on ``peer`` now, besides any connection it has open already
        (``setup``: the seconds it reports its start took, on its first connection)."""
        worker.conns.append(peer)
        if not worker.ever_connected:
            worker.ever_connected = True
            worker.timeline.first_acquire(now)
            if isinstance(setup, int | float):
                worker.timeline.reported_setup(float(setup))

    # -- exits -------------------------------------------------------------------------
    def exited(self, worker: ManagedWorker, ex: WorkerExit, interrupted: bool) -> bool:
        """``worker``'s process ended as ``ex`` says. True when that is news (it was not
        retired already, after a timeout); its log slot is free either way."""
        already = worker.exit is not None
        self.workers.pop(worker.worker_id, None)
        self.gone[worker.worker_id] = worker
        plan = self.plan_of[worker.home.index]  # its log slot is its first task's
        if already:
            assert worker.exit is not None
            plan.retired_unseen -= 1
            plan.release_slot(worker.slot, replacing(worker.worker_id, worker.exit))
            return False
        if interrupted:
            # alive when the run was aborted (the final poll of an aborted run sees only
            # those), however it then ended
            ex = WorkerExit(ExitKind.INTERRUPTED, ex.code, ex.message)
        worker.exit = ex
        plan.release_slot(worker.slot, replacing(worker.worker_id, ex))
        return True

    def move(self, worker: ManagedWorker, src: TaskRecord, dst: TaskRecord, now: float) -> None:
        """``worker`` leaves ``src``'s task for ``dst``'s (``_sharing``): its resources,
        its place under ``max_workers`` and its start go with it; its timeline in ``src``
        ends, and its part in ``dst`` begins (or goes on, when it comes back)."""
        src.alive -= 1
        dst.alive += 1
        for k, v in src.run.spec.budget.items():
            if k in self.used:
                self.used[k] -= v
        for k, v in dst.run.spec.budget.items():
            self.used[k] = self.used.get(k, 0) + v
        # it left src as a clean exit would: src gets its start back; dst holds it until
        # the worker ends there (account_exit gives it back to dst on a clean exit)
        src.free_starts += 1
        dst.free_starts -= 1
        if worker in src.workers:
            src.workers.remove(worker)
        dst.workers.append(worker)
        worker.run = dst.run
        old = worker.timeline
        old.shutdown_requested(now)
        old.moved_to = dst.run.task_id
        old.exited(now, ExitKind.CLEAN)
        tl = dst.timelines.get(worker.worker_id)
        if tl is None:
            tl = dst.timelines.spawned(worker.worker_id, now)
            tl.first_acquire(now)
            tl.slot, tl.log_files = old.slot, old.log_files
        else:
            tl.rejoined(now)
        tl.moved_from = src.run.task_id
        worker.timeline = tl
        logger.debug(
            "worker %d moves from task '%s' to task '%s'",
            worker.worker_id,
            src.run.task_id,
            dst.run.task_id,
        )

    def retire(self, worker: ManagedWorker) -> None:
        """``worker`` no longer counts as alive: its resources go back."""
        plan = self.plan_of[worker.run.index]
        plan.alive -= 1
        if plan.memory is not None:
            plan.memory.alive[worker.mem_step] -= 1
        for k, v in self.charge(plan, worker.mem_step).items():
            if k in self.used:
                self.used[k] -= v

    def ending_reported(self, worker: ManagedWorker) -> None:
        """``worker`` said it ends because its first block raised (its function may be
        broken): a worker failure of its task, counted once, now (its exit, seen later or
        not at all once the run has ended, counts it no more)."""
        run = worker.run
        if worker.failure_counted or run.status != RUNNING:
            return
        worker.failure_counted = True
        run.worker_failures += 1

    def account_exit(self, worker: ManagedWorker, address: tuple[str, int]) -> None:
        """Give ``worker``'s start back, or charge it to the restart budget and count a
        worker failure, as its exit says. ``address``: where workers reach the server (a
        worker that never connected is told it)."""
        ex = worker.exit
        assert ex is not None
        run = worker.run
        plan = self.plan_of[run.index]
        if ex.kind in (ExitKind.CLEAN, ExitKind.WALLTIME) and worker.earned:
            # (walltime: it left before its cluster job's time limit, blocks remaining)
            plan.free_starts += 1
        elif ex.kind == ExitKind.CLEAN and worker.ever_connected:
            logger.warning(
                "worker %d of task '%s' exited without processing a block; it counts "
                "against the restart budget",
                worker.worker_id,
                run.task_id,
            )
        elif ex.kind == ExitKind.CLEAN:
            logger.warning(
                "worker %d of task '%s' exited without ever connecting: its function "
                "returned at once, or it could not reach this server at %s:%s (then set "
                "BELLIS_HOST or run_blockwise(host=...) to an address the workers can "
                "reach; its log says which)",
                worker.worker_id,
                run.task_id,
                address[0],
                address[1],
            )
        if (
            ex.kind not in (ExitKind.CLEAN, ExitKind.WALLTIME, ExitKind.INTERRUPTED)
            and run.status == RUNNING
        ):
            if not worker.failure_counted:  # (counted when its BYE said it ends)
                run.worker_failures += 1
            # a worker whose setup raised: its error names the setup (``_dispatch``)
            message = worker.setup_error or ex.message
            if run.first_worker_error is None:
                run.first_worker_error = message
            run.last_worker_error = message
            logger.warning(
                "worker exited with error worker_id=%d task_id=%s: %s",
                worker.worker_id,
                run.task_id,
                ex.message.splitlines()[0] if ex.message else ex.kind,
            )
