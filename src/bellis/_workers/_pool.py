"""Worker management for the run loop: start, watch, replace and stop worker processes.

The run loop (``bellis._server.RunLoop``) mixes this in. A task may start a worker when it
has a process function, is running, has ready blocks, has fewer workers alive than
``max_workers`` and than blocks ready or processing, has start budget left (the first
``max_workers`` starts are free, and a worker that exits cleanly after doing work gives
its start back; any other start is a restart, capped by ``max_worker_restarts``), and fits
the run's ``resources``. A task with work left, no worker alive and no budget left is
abandoned, and its downstream tasks with it.

Each worker writes to its task's log *slot* files, ``worker_<slot>.out`` and ``.err``: a new
worker takes the lowest slot that no worker of its task holds, and holds it until it is
seen to end (or fails to start). Before it starts, a header line naming it, its start time
and why it was started (the first start, or which worker it replaces and how that one
ended) is appended to both files, so that a run with many restarts leaves two files per
slot, not per worker started.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._protocol import WELCOME, encode
from .._scheduler import RUNNING, Scheduler, TaskRun
from ..errors import WorkerStartError
from ._launchers import WorkerExit, WorkerHandle, WorkerLauncher, WorkerSpec

if TYPE_CHECKING:
    from .._server import _Conn

__all__ = ["ManagedWorker", "TaskPlan", "WorkerPool"]

logger = logging.getLogger("bellis")


def _size(path: Any) -> int:
    """The size of file ``path`` (0 for none)."""
    if path is None:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class ManagedWorker:
    """A managed worker: its launcher handle, its connection and its timeline."""

    __slots__ = (
        "conn",
        "earned",
        "ever_connected",
        "exit",
        "handle",
        "log",
        "run",
        "slot",
        "timeline",
        "worker_id",
    )

    def __init__(self, worker_id: int, run: TaskRun, handle: WorkerHandle, timeline: Any) -> None:
        self.worker_id = worker_id
        self.run = run
        self.handle = handle
        self.conn: _Conn | None = None
        self.ever_connected = False
        # a clean exit gives the start back only if the worker returned a block or was
        # told to stop; one that connects and leaves at once must burn the budget
        self.earned = False
        self.exit: WorkerExit | None = None
        self.timeline = timeline
        self.log: str | None = None
        self.slot = 0


class TaskPlan:
    """What the run loop needs to know about one task beyond the scheduler."""

    def __init__(
        self,
        run: TaskRun,
        payload: bytes | None,
        launcher: WorkerLauncher,
        aggregates: Any,
        timelines: Any,
    ) -> None:
        self.run = run
        self.payload = payload
        self.launcher = launcher
        self.aggregates = aggregates
        self.timelines = timelines
        self.alive = 0
        self.free_starts = run.task.max_workers
        self.parked: deque[_Conn] = deque()
        # blocks lost with a batch (which one killed the worker is unknown): sent alone
        self.suspects: set[int] = set()
        self.workers: list[ManagedWorker] = []
        # log slots: the free ones (a heap), how many exist, and per slot why its last
        # worker of this run left (the next one's header says so)
        self._free_slots: list[int] = []
        self._slot_count = 0
        self._slot_left: dict[int, str] = {}
        task = run.task
        g = run.geom
        self.geometry = {
            "total_offset": list(g.total_offset),
            "total_shape": list(g.total_shape),
            # the block template: read at the total offset, write shifted by the context
            "read_offset": list(g.total_offset),
            "read_shape": list(g.read_shape),
            "write_offset": list(g.tw_offset),
            "write_shape": list(g.write_shape),
            "fit": g.fit,
            "conflict": g.read_write_conflict,
        }
        self.welcome = encode([WELCOME, task.timeout_secs, task.resource_tracking, self.geometry])

    def take_slot(self) -> tuple[int, str | None]:
        """The lowest free log slot, and why its last worker of this run left (None: it
        has had none)."""
        if self._free_slots:
            slot = heapq.heappop(self._free_slots)
        else:
            slot = self._slot_count
            self._slot_count += 1
        return slot, self._slot_left.get(slot)

    def release_slot(self, slot: int, why: str) -> None:
        """Free ``slot``; ``why`` goes into the header of the next worker that takes it."""
        self._slot_left[slot] = why
        heapq.heappush(self._free_slots, slot)


def _replacing(worker_id: int, ex: WorkerExit) -> str:
    """``replacing worker 3, which exited with code 1`` and the like, for a slot header."""
    return f"replacing worker {worker_id}, {_how_it_ended(ex)}"


def _how_it_ended(ex: WorkerExit) -> str:
    if ex.kind == "timeout":
        return "whose block exceeded the block timeout"
    if ex.kind == "interrupted":
        return "which was interrupted"
    if ex.kind == "walltime":
        return "which left before its job time limit"
    first = ex.message.splitlines()[0] if ex.message else ""
    if first.startswith("out of memory"):
        return "which ran out of memory"
    if ex.code == 0:
        return "which exited cleanly"
    if ex.code is not None and ex.code < 0:
        try:
            name = signal.Signals(-ex.code).name
        except ValueError:
            name = str(-ex.code)
        return f"which died of signal {name}"
    if ex.code is not None:
        return f"which exited with code {ex.code}"
    return f"which was lost ({first})" if first else "which was lost"


def _slot_header(worker_id: int, slot: int, reason: str) -> str:
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"=== bellis worker {worker_id} (slot {slot}) started {stamp}: {reason} ==="


class WorkerPool:
    """The worker half of the run loop (a mixin: the loop owns the state it uses)."""

    s: Scheduler
    plans: dict[str, TaskPlan]
    plan_of: dict[int, TaskPlan]
    workers: dict[int, ManagedWorker]
    resources: dict[str, int]
    used: dict[str, int]
    next_worker_id: int
    grace_seconds: float
    abort_reason: str | None
    fatal: BaseException | None
    shutdown_started: float | None
    dirty: bool
    context_extra: Callable[[TaskRun, int], dict[str, str]]
    log_paths: Callable[[str, int, str, bool], tuple[Any, Any]]
    log_mode: str
    gone: dict[int, ManagedWorker]
    host: str
    port: int
    _close: Callable[..., None]
    _read_what_is_left: Callable[[_Conn], None]
    _serve: Callable[..., None]

    def _group_live(self) -> dict[int, list[ManagedWorker]]:
        groups: dict[int, list[ManagedWorker]] = {}
        for w in self.workers.values():
            if w.exit is None:
                groups.setdefault(id(self.plan_of[w.run.index].launcher), []).append(w)
        return groups

    def _cancel_all(self, groups: dict[int, list[ManagedWorker]]) -> None:
        for ws in groups.values():
            launcher = self.plan_of[ws[0].run.index].launcher
            launcher.cancel([w.handle for w in ws], self.grace_seconds)

    def _retire(self, worker: ManagedWorker) -> None:
        plan = self.plan_of[worker.run.index]
        plan.alive -= 1
        for k, v in worker.run.task.requires.items():
            if k in self.used:
                self.used[k] -= v

    def _poll_workers(
        self, now: float, *, replace: bool, final: bool = False, interrupted: bool = False
    ) -> None:
        for w in list(self.workers.values()):
            if w.handle is None:
                continue
            launcher = self.plan_of[w.run.index].launcher
            try:
                ex = launcher.poll(w.handle)
            except Exception as exc:
                # a launcher that cannot say how its worker is (a closed dask client, a
                # cluster that went away) has lost it: its blocks take the retry path
                ex = WorkerExit(
                    "error", None, f"the {launcher.name} launcher lost track of this worker: {exc}"
                )
            if ex is None:
                if final:
                    w.timeline.exited(now, "interrupted")
                continue
            already = w.exit is not None
            self.workers.pop(w.worker_id, None)
            self.gone[w.worker_id] = w
            plan = self.plan_of[w.run.index]
            if already:
                assert w.exit is not None
                plan.release_slot(w.slot, _replacing(w.worker_id, w.exit))
                continue
            if interrupted:
                # alive when the run was aborted (the final poll of an aborted run sees
                # only those), however it then ended
                ex = WorkerExit("interrupted", ex.code, ex.message)
            w.exit = ex
            plan.release_slot(w.slot, _replacing(w.worker_id, ex))
            if w.conn is not None:
                # what it sent before exiting (its last returns) may still be unread
                self._read_what_is_left(w.conn)
            if w.conn is not None:
                self._close(w.conn, lost=True)
            w.timeline.exited(now, ex.kind)
            self._retire(w)
            run = w.run
            if ex.kind in ("clean", "walltime") and w.earned:
                # (walltime: it left before its cluster job's time limit, blocks remaining)
                plan.free_starts += 1
            elif ex.kind == "clean" and w.ever_connected:
                logger.warning(
                    "worker %d of task '%s' exited without processing a block; it counts "
                    "against the restart budget",
                    w.worker_id,
                    run.task_id,
                )
            elif ex.kind == "clean":
                logger.warning(
                    "worker %d of task '%s' exited without ever connecting: its function "
                    "returned at once, or it could not reach this server at %s:%s (then set "
                    "BELLIS_HOST or run_blockwise(host=...) to an address the workers can "
                    "reach; its log says which)",
                    w.worker_id,
                    run.task_id,
                    self.host,
                    self.port,
                )
            if ex.kind not in ("clean", "walltime", "interrupted") and run.status == RUNNING:
                run.worker_failures += 1
                if run.first_worker_error is None:
                    run.first_worker_error = ex.message
                run.last_worker_error = ex.message
                logger.warning(
                    "worker exited with error worker_id=%d task_id=%s: %s",
                    w.worker_id,
                    run.task_id,
                    ex.message.splitlines()[0] if ex.message else ex.kind,
                )

    def _check_abandon(self) -> None:
        for plan in self.plans.values():
            run = plan.run
            if run.status != RUNNING or plan.alive > 0 or plan.payload is None:
                continue
            if run.remaining <= 0 or run.processing > 0:
                continue
            if plan.free_starts > 0 or run.worker_restarts < run.task.max_worker_restarts:
                continue
            hit = self.s.abandon(run, "worker restart cap exhausted")
            for r in hit:
                if r is run:
                    logger.warning(
                        "task '%s' abandoned: worker restart cap reached; its %d remaining "
                        "blocks are lost (counted as orphaned)",
                        r.task_id,
                        r.lost_on_abandon,
                    )
                else:
                    logger.warning(
                        "downstream task '%s' abandoned: upstream input will never arrive, "
                        "accounting remaining blocks as orphaned",
                        r.task_id,
                    )
                p = self.plan_of[r.index]
                while p.parked:
                    self._serve(p.parked.popleft(), r, True)
            self.dirty = True

    def _rebalance(self) -> None:
        if (
            self.abort_reason is not None
            or self.fatal is not None
            or self.shutdown_started is not None
        ):
            return
        batches: dict[str, list[tuple[WorkerSpec, Any]]] = {}
        grew = True
        while grew:  # round robin: one worker per eligible task per pass
            grew = False
            for plan in self.plans.values():
                if self._eligible(plan):
                    spawn = self._prepare_spawn(plan)
                    if spawn is not None:
                        batches.setdefault(plan.run.task_id, []).append(spawn)
                    grew = True
        for task_id, prepared in batches.items():
            self._launch(self.plans[task_id], prepared)

    def _eligible(self, plan: TaskPlan) -> bool:
        run = plan.run
        task = run.task
        if plan.payload is None or run.status != RUNNING or run.ready <= 0:
            return False
        if plan.alive >= task.max_workers or plan.alive >= run.ready + run.processing:
            return False
        if plan.free_starts <= 0 and run.worker_restarts >= task.max_worker_restarts:
            return False
        for k, v in task.requires.items():
            if self.used.get(k, 0) + v > self.resources.get(k, 0):
                return False
        return True

    def _prepare_spawn(self, plan: TaskPlan) -> tuple[WorkerSpec, Any] | None:
        """Book one new worker of ``plan``'s task (id, budget, resources, log files).

        None when its log files cannot be created: that start failed like a launch that
        raised (see :meth:`_launch_failed`), and it used up its share of the budget.
        """
        run = plan.run
        wid = self.next_worker_id
        self.next_worker_id += 1
        if plan.free_starts > 0:
            plan.free_starts -= 1
        else:
            run.worker_restarts += 1
        run.worker_starts += 1
        for k, v in run.task.requires.items():
            self.used[k] = self.used.get(k, 0) + v
        plan.alive += 1
        timeline = plan.timelines.spawned(wid, time.monotonic())
        slot, before = plan.take_slot()
        if before is None and any(
            w.exit is not None and w.run is run for w in self.workers.values()
        ):
            # a new slot while a worker retired after a block timeout is yet to be seen
            # to end: it holds its slot until then
            before = "restart in a new slot (the worker it replaces has not ended yet)"
        header = _slot_header(wid, slot, "first start" if before is None else before)
        timeline.slot = slot
        try:
            out_path, err_path = self.log_paths(run.task_id, slot, header, before is None)
        except WorkerStartError as exc:
            self._launch_failed(plan, timeline, exc, slot, wid)
            return None
        if out_path is not None and err_path is not None:
            timeline.log_files = (str(out_path), str(err_path))
        env = dict(os.environ)
        ctx = self.context_extra(run, wid)
        env["BELLIS_CONTEXT"] = env["DAISY_CONTEXT"] = ctx["__encoded__"]
        # the worker unpickles the function only after putting the driver's path in place
        env["BELLIS_SYS_PATH"] = os.pathsep.join(p for p in sys.path if p)
        spec = WorkerSpec(
            task_id=run.task_id,
            worker_id=wid,
            env=env,
            payload=plan.payload or b"",
            out_path=out_path,
            err_path=err_path,
            requires=run.task.requires,
            timeout_secs=run.task.timeout_secs,
            tee=self.log_mode == "both",
            err_offset=_size(err_path),
            slot=slot,
        )
        return spec, timeline

    def _launch(self, plan: TaskPlan, prepared: list[tuple[WorkerSpec, Any]]) -> None:
        """Start booked workers; several at once through ``launch_many`` where offered
        (SLURM submits them as one job array, all or nothing)."""
        launcher = plan.launcher
        many = getattr(launcher, "launch_many", None)
        if many is not None and len(prepared) > 1:
            try:
                handles = list(many([spec for spec, _ in prepared]))
            except Exception as exc:
                for spec, timeline in prepared:
                    self._launch_failed(plan, timeline, exc, spec.slot_index, spec.worker_id)
                return
            for item, handle in zip(prepared, handles, strict=True):
                self._adopt(plan, item, handle)
            return
        for item in prepared:
            try:
                handle = launcher.launch(item[0])
            except Exception as exc:
                self._launch_failed(plan, item[1], exc, item[0].slot_index, item[0].worker_id)
                continue
            self._adopt(plan, item, handle)

    def _adopt(self, plan: TaskPlan, item: tuple[WorkerSpec, Any], handle: WorkerHandle) -> None:
        spec, timeline = item
        worker = ManagedWorker(spec.worker_id, plan.run, handle, timeline)
        worker.log = plan.launcher.log_location(handle)
        worker.slot = spec.slot_index
        self.workers[spec.worker_id] = worker
        plan.workers.append(worker)

    def _launch_failed(
        self, plan: TaskPlan, timeline: Any, exc: Exception, slot: int, worker_id: int
    ) -> None:
        """A launcher that raised started nothing it will report on: undo the booking."""
        run = plan.run
        plan.alive -= 1
        plan.release_slot(slot, f"replacing worker {worker_id}, which could not be started")
        for k, v in run.task.requires.items():
            self.used[k] -= v
        msg = f"could not start a worker for task '{run.task_id}': {exc}"
        run.worker_failures += 1
        if run.first_worker_error is None:
            run.first_worker_error = msg
        run.last_worker_error = msg
        timeline.exited(time.monotonic(), "error")
        logger.warning("%s", msg)
