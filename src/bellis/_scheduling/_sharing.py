"""Workers shared between a run's tasks, sans I/O: which tasks a worker may move between,
and when it moves.

Theory of operation
-------------------
A managed worker is started for one task. When that task has no ready block for it, it
would wait (its request parked) or be told to stop, while another task of the run waits
for a worker of its own to start. Instead, the dispatcher may *move* it: the worker is
answered ``MOVE task_id`` (``_protocol``) with that task's WELCOME and, when no teardown
or setup runs in between, its first block, serves that task on the same connection (one
round trip; ``Dispatcher.move_worker``) and runs that task's block function
(``_worker._shared``), with no process started and no reconnection.

* **Who may move where** (:func:`share_groups`): tasks whose workers are interchangeable.
  Both have a block function (a spawn function runs its own loop: never shared; a
  ``Task(setup=...)`` does not stop a task sharing: the worker tears the old task's setup
  down and runs the new task's on each move, ``_worker._shared``), the same
  launcher object and one that starts local processes (a batch job is submitted, named
  and accounted per task), the same ``requires`` without GPUs (a GPU is booked per task
  and log slot), and neither has a memory ladder (``memory_limit``), straggler backups
  (``speculative``) or a start gate (a plan's sample run). Everything else a task sets
  (timeout, stall timeout, resource tracking, read-back, geometry) comes in its WELCOME,
  which the worker gets with every MOVE.
* **When a worker moves** (:func:`move_target`): it asks for blocks, its task has no ready
  block and will have none (none waits on a dependency: the blocks left are all out
  with workers, or the task has ended), and a compatible task has blocks left and room
  for one more worker (below its ``max_workers`` and below the work it has). The one
  chosen has the most ready blocks per worker (a task with none ready only when no task
  has any: the worker waits there instead of exiting); ties go to the task first in the
  pipeline.
* **A starved task** (:func:`starved`, :func:`parked_donor`): a task with ready blocks and
  no worker, which cannot start one (the resources are taken), takes a worker waiting
  on a compatible task with no ready block. Without this, a retried block whose
  workers all moved on could wait for a worker that never comes.
* **Who gets a new worker first** (:func:`by_need`): where tasks share workers under a
  resources budget, the run books new workers (a replacement, say) for the task with the
  most ready blocks per live worker first.
* **What moves with the worker** (``Staffing.move``): its resources (equal on both
  sides, so the budget holds at every moment), its place under each task's
  ``max_workers`` (a move never takes a task past it), and its start: the task it
  leaves gets it back as after a clean exit, the task it joins holds it until the worker
  ends there. Its log slot stays with the task that started it (its log files are that
  slot's; a header line in them marks each move). Its timeline is split: each task's
  timeline set has the worker's part in that task, the one it left marked ``moved_to``,
  the one it joined ``moved_from``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ._locality import Stream
from ._records import ManagedWorker, Peer, TaskRecord
from ._task_run import RUNNING, TaskRun

__all__ = [
    "by_need",
    "movable",
    "move_target",
    "parked_donor",
    "rebind",
    "share_groups",
    "starved",
]


class SharingLauncher(Protocol):
    """What sharing reads of a launcher (``WorkerLauncher``'s capabilities)."""

    @property
    def is_local(self) -> bool: ...


def _shareable(plan: TaskRecord, launcher: SharingLauncher | None, arity: int) -> bool:
    spec = plan.run.spec
    return (
        plan.payload is not None
        and arity in (1, 2)
        and launcher is not None
        and launcher.is_local
        and "gpu" not in spec.budget
        and plan.memory is None
        and plan.gate is None
        and spec.backup_after is None
    )


def share_groups(
    plans: Iterable[TaskRecord],
    launchers: Mapping[str, SharingLauncher | None],
    arities: Mapping[str, int],
) -> dict[str, list[TaskRecord]]:
    """Set each plan's ``shares_with`` (the other tasks its workers may move to, in
    pipeline order) and return them by task id. ``launchers``: each task's launcher;
    ``arities``: 1 for a block function, 2 for one called ``fn(block, ctx)`` (a setup's
    context), 0 for a spawn function."""
    groups: dict[tuple[Any, ...], list[TaskRecord]] = {}
    for plan in plans:
        tid = plan.run.task_id
        launcher = launchers[tid]
        if not _shareable(plan, launcher, arities.get(tid, 0)):
            continue
        key = (id(launcher), tuple(sorted(plan.run.spec.budget.items())))
        groups.setdefault(key, []).append(plan)
    out: dict[str, list[TaskRecord]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for plan in members:
            plan.shares_with = [p for p in members if p is not plan]
            out[plan.run.task_id] = plan.shares_with
    return out


def by_need(plans: Iterable[TaskRecord], resources: Mapping[str, int]) -> list[TaskRecord]:
    """The order in which the run books new workers (its first ones, and replacements):
    where tasks share workers under a ``resources`` budget (which decides who gets a
    scarce start), the task with the most ready blocks per live worker first (ties in
    pipeline order); otherwise the pipeline's order, as always."""
    plans = list(plans)
    if not resources or not any(p.shares_with for p in plans):
        return plans
    return sorted(plans, key=lambda p: -p.run.ready / (p.alive + 1))


def _room(plan: TaskRecord) -> bool:
    """Whether ``plan``'s task can take one more worker: running, below its
    ``max_workers`` and below the blocks it has left."""
    run = plan.run
    return (
        run.status == RUNNING
        and plan.gate is None
        and plan.alive < run.task.max_workers
        and plan.alive < run.remaining
    )


def movable(worker: ManagedWorker | None) -> bool:
    """Whether ``worker`` can be moved: a live managed worker with one connection."""
    return worker is not None and worker.exit is None and len(worker.conns) == 1


def rebind(peer: Peer, old: TaskRun, new: TaskRun) -> None:
    """``peer``'s connection leaves ``old``'s task for ``new``'s (a move, on the same
    connection): its place in ``old``'s locality order and its coherence count end, as
    at a close, and it starts in ``new``'s as a new connection does after its WELCOME
    (the caller bounds a setup it runs there)."""
    if old.local is not None:
        old.local.drop(peer.stream)
    peer.stream = Stream()
    if peer.trail is not None and old.coherence is not None:
        old.coherence.retire(peer.trail)
    peer.trail = None if new.coherence is None else new.coherence.trail()
    peer.run = new
    peer.batch = 1


def move_target(plan: TaskRecord) -> TaskRecord | None:
    """The task a worker of ``plan``'s task that asks for blocks and gets none moves to,
    or None: it stays (its request waits, or it is told to stop, as without sharing)."""
    run = plan.run
    if not plan.shares_with or run.ready > 0:
        return None
    if run.status == RUNNING and run.pending > 0:
        return None  # blocks of its own will be ready: it waits for them
    best: TaskRecord | None = None
    best_need = 0.0
    waiting: TaskRecord | None = None
    for other in plan.shares_with:
        if not _room(other):
            continue
        r = other.run
        if r.ready > 0:
            need = r.ready / (other.alive + 1)
            if need > best_need:
                best, best_need = other, need
        elif waiting is None and r.pending > 0:
            waiting = other
    return best if best is not None else waiting


def starved(plan: TaskRecord, can_start: bool) -> bool:
    """Whether ``plan``'s task has ready blocks, no worker and cannot start one
    (``can_start``: the staffing's verdict), so that it takes a waiting worker of a
    compatible task."""
    run = plan.run
    return (
        bool(plan.shares_with)
        and not can_start
        and plan.alive == 0
        and run.ready > 0
        and run.status == RUNNING
        and plan.gate is None
    )


def parked_donor(plan: TaskRecord) -> tuple[TaskRecord, Peer] | None:
    """A parked request of a compatible task with no ready block, whose worker can move
    to ``plan``'s task (the first found, in pipeline order), or None."""
    for other in plan.shares_with:
        if other.run.ready > 0:
            continue
        for peer in other.parked:
            if peer.parked and not peer.closed and movable(peer.worker):
                return other, peer
    return None
