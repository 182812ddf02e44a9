"""Worker processes through their launchers: start the workers the dispatcher booked,
poll them, kill one, stop them all, close the launchers.

Nothing here decides anything: which workers to start, and what an exit means for the
run, is :mod:`bellis._scheduling._dispatch`'s (see its restart budget). Before a worker starts, a
header line naming it, its start time and why it was started (the first start, or which
worker it replaces and how that one ended) is appended to both of its slot's log files, so
that a run with many restarts leaves two files per slot, not per worker started.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .._launchers._base import WorkerHandle, WorkerLauncher, WorkerSpec
from .._launchers._gpus import GpuShortage
from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV, SYS_PATH_ENV, ExitKind, WorkerExit
from .._scheduling._records import Booking, ManagedWorker, TaskRecord
from .._scheduling._task_run import TaskRun
from ..errors import WorkerStartError

__all__ = ["WorkerPool"]

logger = logging.getLogger("bellis")


def _size(path: Any) -> int:
    """The size of file ``path`` (0 for none)."""
    if path is None:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _slot_header(
    worker_id: int, slot: int, reason: str, gpus: tuple[str, ...] | None = None
) -> str:
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    where = f"slot {slot}" if gpus is None else f"slot {slot}, GPU {','.join(gpus)}"
    return f"=== bellis worker {worker_id} ({where}) started {stamp}: {reason} ==="


class WorkerPool:
    """Launcher I/O for one run's workers."""

    def __init__(
        self,
        plans: dict[str, TaskRecord],
        launchers: dict[str, WorkerLauncher],
        *,
        context_extra: Callable[[TaskRun, int], dict[str, str]],
        log_paths: Callable[[str, int, str, bool], tuple[Any, Any]],
        log_mode: str = "file",
        grace_seconds: float = 5.0,
    ) -> None:
        self.plans = plans
        self.plan_of = {p.run.index: p for p in plans.values()}
        #: each task's launcher, by task id (a task's own, else the run's)
        self.launchers = launchers
        self.context_extra = context_extra
        self.log_paths = log_paths
        self.log_mode = log_mode
        self.grace_seconds = grace_seconds
        #: launchers whose workers' exits wake the run loop (``exit_watch``), by identity,
        #: with that descriptor; the others have all their workers polled at every tick
        self.watched: dict[int, tuple[WorkerLauncher, int]] = {}
        self.unwatched: set[int] = set()
        #: the most workers the run may keep on each launcher (by identity) at once
        self.expected: dict[int, int] = {}
        for plan in plans.values():
            launcher = self.launcher_of(plan)
            run = plan.run
            self.expected[id(launcher)] = self.expected.get(id(launcher), 0) + min(
                run.spec.max_workers, max(run.remaining, 0)
            )
            if id(launcher) in self.watched or id(launcher) in self.unwatched:
                continue
            fd = launcher.exit_watch()
            if fd is None:
                self.unwatched.add(id(launcher))
            else:
                self.watched[id(launcher)] = (launcher, fd)

    def launcher_of(self, plan: TaskRecord) -> WorkerLauncher:
        """The launcher of the workers of ``plan``'s task."""
        return self.launchers[plan.run.task_id]

    def start(
        self, plan: TaskRecord, bookings: list[Booking]
    ) -> list[tuple[Booking, WorkerHandle | None, Exception | None]]:
        """Start booked workers: ``(booking, handle, None)`` for each one started,
        ``(booking, None, error)`` for each that could not be (its log files or its
        launcher failed). Several start at once through ``launch_many`` where the launcher
        ``starts_many_at_once`` (SLURM submits them as one job array, all or nothing)."""
        out: list[tuple[Booking, WorkerHandle | None, Exception | None]] = []
        prepared: list[tuple[WorkerSpec, Booking]] = []
        for i, booking in enumerate(bookings):
            try:
                prepared.append((self._prepare(plan, booking, len(bookings) - i), booking))
            except WorkerStartError as exc:
                out.append((booking, None, exc))
        launcher = self.launcher_of(plan)
        if launcher.starts_many_at_once and len(prepared) > 1:
            try:
                handles = launcher.launch_many([spec for spec, _ in prepared])
            except Exception as exc:
                return out + [(booking, None, exc) for _spec, booking in prepared]
            return out + [(b, h, None) for (_s, b), h in zip(prepared, handles, strict=True)]
        for spec, booking in prepared:
            try:
                out.append((booking, launcher.launch(spec), None))
            except Exception as exc:
                self._release_gpus(plan, booking.slot, spec.gpus)
                out.append((booking, None, exc))
        return out

    def _prepare(self, plan: TaskRecord, booking: Booking, starting: int = 1) -> WorkerSpec:
        """The launch spec of a booked worker, started with ``starting - 1`` more after
        it; its log files are created (and get their header) now. Raises
        :class:`WorkerStartError` when they cannot be."""
        run = plan.run
        wid, slot, before = booking.worker_id, booking.slot, booking.reason
        gpus = self._take_gpus(plan, slot)
        header = _slot_header(wid, slot, "first start" if before is None else before, gpus)
        try:
            out_path, err_path = self.log_paths(run.task_id, slot, header, before is None)
        except BaseException:
            self._release_gpus(plan, slot, gpus)
            raise
        if out_path is not None and err_path is not None:
            booking.timeline.log_files = (str(out_path), str(err_path))
        env = dict(os.environ)
        ctx = self.context_extra(run, wid)
        env[CONTEXT_ENV] = env[DAISY_CONTEXT_ENV] = ctx["__encoded__"]
        # for the fork server's worker start-up (a worker's own path is in its payload)
        env[SYS_PATH_ENV] = os.pathsep.join(p for p in sys.path if p)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            booking.timeline.gpus = gpus
        return WorkerSpec(
            task_id=run.task_id,
            worker_id=wid,
            env=env,
            payload=plan.payload or b"",
            out_path=out_path,
            err_path=err_path,
            requires=run.spec.requires,
            timeout_secs=run.spec.timeout_secs,
            starting=starting,
            restart=before is not None,
            expected=self.expected.get(id(self.launcher_of(plan)), 0),
            tee=self.log_mode == "both",
            err_offset=_size(err_path),
            slot=slot,
            memory=None if plan.memory is None else plan.memory.grant(booking.mem_step),
            gpus=gpus,
        )

    def _take_gpus(self, plan: TaskRecord, slot: int) -> tuple[str, ...] | None:
        """The GPUs of a worker of ``plan`` in ``slot`` (``_launchers._gpus``): None where
        its task needs none or its launcher does not assign them (a batch system does)."""
        shares = plan.run.spec.budget.get("gpu", 0)
        if not shares or not self.launcher_of(plan).gpu_devices():
            return None  # no GPU to hand out: 'gpu' is only counted (see _checks._check_gpus)
        try:
            gpus = self.launcher_of(plan).take_gpus(plan.run.task_id, slot, shares)
        except GpuShortage as exc:
            raise WorkerStartError(
                f"task '{plan.run.task_id}': {exc}; mixed GPU fractions across tasks can "
                "leave no device with room: give the tasks the same requires['gpu']"
            ) from exc
        return gpus

    def _release_gpus(self, plan: TaskRecord, slot: int, gpus: tuple[str, ...] | None) -> None:
        if gpus is not None:
            self.launcher_of(plan).release_gpus(plan.run.task_id, slot)

    def log_location(self, plan: TaskRecord, handle: WorkerHandle) -> str | None:
        """Where a started worker's output goes."""
        where: str | None = self.launcher_of(plan).log_location(handle)
        return where

    def poll(
        self, workers: Iterable[ManagedWorker]
    ) -> Iterator[tuple[ManagedWorker, WorkerExit | None]]:
        """Each of ``workers`` with how it ended (None: it is still running)."""
        for w in list(workers):
            if w.handle is None:
                continue
            launcher = self.launcher_of(self.plan_of[w.run.index])
            try:
                ex = launcher.poll(w.handle)
            except Exception as exc:
                # a launcher that cannot say how its worker is (a closed dask client, a
                # cluster that went away) has lost it: its blocks take the retry path
                ex = WorkerExit(
                    ExitKind.ERROR,
                    None,
                    f"the {launcher.name} launcher lost track of this worker: {exc}",
                )
            yield w, ex

    def poll_due(
        self, workers: dict[int, ManagedWorker], launcher: WorkerLauncher | None = None
    ) -> Iterator[tuple[ManagedWorker, WorkerExit | None]]:
        """The workers (of ``workers``, by id) that may have ended, with how they ended:
        those a watched launcher (``launcher``, or each) says ended, and, without
        ``launcher``, every worker of the launchers that cannot say."""
        for watched, _fd in list(self.watched.values()):
            if launcher is not None and watched is not launcher:
                continue
            for handle in watched.ended():
                w = workers.get(handle.spec.worker_id)
                if w is None or w.handle is not handle:
                    watched.poll(handle)  # settled already: the launcher's books only
                    continue
                yield from self.poll([w])
        if launcher is None and self.unwatched:
            yield from self.poll(
                w
                for w in list(workers.values())
                if id(self.launcher_of(self.plan_of[w.run.index])) in self.unwatched
            )

    def kill(self, worker: ManagedWorker) -> None:
        """Stop ``worker`` now, where its launcher can (the backstop of a block timeout)."""
        if worker.handle is not None:
            self.launcher_of(self.plan_of[worker.run.index]).kill(worker.handle)

    def cancel(self, workers: Iterable[ManagedWorker]) -> None:
        """Stop ``workers`` through their launchers: a polite request, the grace period,
        then a hard kill (see ``WorkerLauncher.cancel``)."""
        groups: dict[int, list[ManagedWorker]] = {}
        for w in workers:
            groups.setdefault(id(self.launcher_of(self.plan_of[w.run.index])), []).append(w)
        for ws in groups.values():
            launcher = self.launcher_of(self.plan_of[ws[0].run.index])
            launcher.cancel([w.handle for w in ws], self.grace_seconds)

    def shutting_down(self) -> None:
        """Tell every launcher that the workers were told to stop."""
        for plan in self.plans.values():
            self.launcher_of(plan).shutting_down()

    def close(self) -> None:
        """Close every launcher (its jobs cancelled, its files removed), whatever fails."""
        for plan in self.plans.values():
            try:
                self.launcher_of(plan).close()
            except Exception as exc:
                logger.error(
                    "closing the %s launcher of task '%s' failed: %s; check for workers "
                    "left running",
                    self.launcher_of(plan).name,
                    plan.run.task_id,
                    exc,
                )
