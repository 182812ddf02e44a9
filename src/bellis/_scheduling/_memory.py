"""Memory grants: retry a block that ran out of memory on a worker with more, sans I/O.

A task with a memory request (``Task(memory_limit=...)``, or a ``SlurmLauncher(mem=...)``)
has a *ladder* of grants: the request, then the request × ``memory_growth`` (default 2) per
step, up to ``max_memory`` (default: two steps, the request × growth²). Its ordinary workers
get the request (step 0); a worker of step ``s`` > 0 is a *big* worker.

The rule (what :class:`MemoryRetries` keeps):

* A block whose worker ran out of memory while it held that block alone (a kernel or SLURM
  OOM kill, or ``MemoryError`` under ``memory_limit``) climbs one step above the grant of
  that worker. It waits, out of the scheduler's queue (the scheduler sees it as out), for a
  big worker of at least that step; a block lost with a *batch* is only a suspect, sent
  alone, as for any death.
* An OOM death is not a failed attempt: it does not spend ``max_retries``, so the ladder is
  always climbed to its top. Only a block that runs out of memory at the largest grant
  fails, at once and for good. Other failures of a block on a big worker are charged as
  usual, and its retries stay on big workers of its step.
* Ordinary blocks never go to big workers; a big worker with no block of its step or below
  waiting is told to stop. Big workers do not count against ``max_workers`` (at most that
  many big workers run at once as well), and they charge their larger grant against a
  ``requires={"mem": ...}`` budget.

Which exit is an OOM is :func:`bellis._protocol.is_oom_exit`'s to say; sizes are parsed and
written by :mod:`bellis._sizes`.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol

from .._protocol import is_oom_exit
from .._sizes import MIB, format_grant
from ..errors import ConfigurationError
from ._attempts import KIND_OOM
from ._ladder import MemoryLadder

if TYPE_CHECKING:
    from .._task_spec import TaskSpec
    from ._ports import DispatcherPort
    from ._records import Booking, ManagedWorker, Peer, TaskMemory, TaskRecord
    from ._scheduler import Scheduler
    from ._task_run import TaskRun

__all__ = [
    "DEFAULT_GROWTH",
    "MEMORY_KEYS",
    "MemoryGranter",
    "MemoryLadder",
    "MemoryRetries",
    "ladder_for",
]

logger = logging.getLogger("bellis")

DEFAULT_GROWTH: Final = 2.0
#: how long the blocks of a worker whose connection ended wait for its exit to say whether
#: it ran out of memory; then they are released as lost with an ordinary death
LOST_WAIT_SECONDS: Final = 30.0
#: the ``requires`` keys that hold a worker's memory, in megabytes
MEMORY_KEYS: Final = ("mem", "mem_mb")


class MemoryGranter(Protocol):
    """What the memory ladder reads of a launcher (``WorkerLauncher``'s capabilities)."""

    @property
    def name(self) -> str: ...
    @property
    def is_local(self) -> bool: ...
    @property
    def memory_grants(self) -> bool: ...
    @property
    def memory_request(self) -> int | None: ...
    @property
    def memory_growth(self) -> float | None: ...
    @property
    def max_memory(self) -> int | None: ...


def build_ladder(request: int, growth: float, cap: int, cap_parameter: str) -> MemoryLadder:
    """The request, then × ``growth`` per step (whole megabytes), the last one ``cap``."""
    grants = [request]
    while grants[-1] < cap:
        nxt = -(-int(grants[-1] * growth) // MIB) * MIB
        grants.append(min(max(nxt, grants[-1] + MIB), cap))
    return MemoryLadder(tuple(grants), growth, cap_parameter)


def ladder_for(
    task: TaskSpec, launcher: MemoryGranter, resources: dict[str, int]
) -> MemoryLadder | None:
    """The ladder of ``task`` run by ``launcher`` under the run's ``resources``; None when
    the task has no memory request (no grant to raise). Raises :class:`ConfigurationError`
    for a ``memory_limit`` that ``launcher`` cannot enforce, or a cap below the request."""
    grants = launcher.memory_grants
    request: int | None = task.memory_limit
    if request is None and grants:
        req = task.budget
        mb = next((req[k] for k in MEMORY_KEYS if req.get(k)), 0)
        request = mb * MIB if mb and not launcher.is_local else launcher.memory_request
    if request is None:
        return None
    if not grants:
        raise ConfigurationError(
            f"task {task.task_id!r}: memory_limit={format_grant(request)} cannot be enforced by "
            f"the {launcher.name} launcher; use "
            "LocalLauncher or SlurmLauncher(mem=...), or drop memory_limit",
            parameter="memory_limit",
        )
    growth = task.memory_growth or launcher.memory_growth or DEFAULT_GROWTH
    cap = task.max_memory
    cap_parameter = "Task(max_memory=...)"
    if cap is None:
        cap = launcher.max_memory
        cap_parameter = f"{type(launcher).__name__}(max_memory=...)"
    if cap is None:
        cap = int(request * growth * growth)
        cap_parameter = "the default max_memory, the request × memory_growth²"
    if cap < request:
        raise ConfigurationError(
            f"task {task.task_id!r}: max_memory={format_grant(cap)} is below the memory request "
            f"({format_grant(request)}); raise max_memory to at least the request",
            parameter="max_memory",
        )
    ladder = build_ladder(request, growth, cap, cap_parameter)
    # a budget of megabytes caps the grants that can ever start
    for key in MEMORY_KEYS:
        if task.requires.get(key) and key in resources:
            budget = resources[key] * MIB
            fit = tuple(g for g in ladder.grants if g <= budget) or ladder.grants[:1]
            if len(fit) < len(ladder.grants):
                ladder = MemoryLadder(fit, growth, f"run_blockwise(resources={{{key!r}: ...}})")
    return ladder


def charge(requires: dict[str, int], ladder: MemoryLadder, step: int) -> dict[str, int]:
    """What a worker of ``step`` takes from the run's budget: ``requires``, with its memory
    keys (megabytes) raised to the worker's grant."""
    if step == 0:
        return requires
    return {
        k: (max(v, ladder.megabytes(step)) if k in MEMORY_KEYS and v else v)
        for k, v in requires.items()
    }


class MemoryRetries:
    """One task's ladder and the blocks that wait for a larger grant (see the module
    docstring). ``run`` is the task's ``TaskRun``: its counters ``oom_retries`` (per grant
    the block runs again with), ``oom_successes`` (per grant a block finally succeeded
    with) and ``oom_failures`` are kept here."""

    def __init__(self, ladder: MemoryLadder, run: TaskRun) -> None:
        self.ladder = ladder
        self.run = run
        #: blocks that need a big worker: block -> the least step
        self.need: dict[int, int] = {}
        self.waiting: list[deque[int]] = [deque() for _ in ladder.grants]
        #: workers alive (booked and not yet retired) per step
        self.alive = [0] * len(ladder.grants)
        self.held_back = 0
        #: workers whose connection ended before their exit was known (their ``lost``)
        self.lost: list[ManagedWorker] = []
        #: ids of the workers whose out-of-memory death sent a block up the ladder: their
        #: start is given back (a worker that runs out of memory outside any block is not)
        self.climbed: set[int] = set()
        #: big workers that may start without spending the restart budget: one per climb
        self.credits = 0

    @property
    def big_alive(self) -> int:
        return sum(self.alive) - self.alive[0]

    def grant(self, step: int) -> int:
        return self.ladder.grants[step]

    def out_of_memory(self, k: int, step: int) -> int:
        """Block ``k`` ran out of memory on a worker of ``step``: the step it now waits
        for, or -1 when that was the top (the block fails)."""
        new = max(step, self.need.get(k, 0)) + 1
        if new > self.ladder.top:
            self.need.pop(k, None)
            self.run.oom_failures += 1
            return -1
        self.need[k] = new
        grant = self.ladder.text(new)
        self.run.oom_retries[grant] = self.run.oom_retries.get(grant, 0) + 1
        self.waiting[new].append(k)
        self.held_back += 1
        self.credits += 1
        return new

    def take(self, step: int) -> int:
        """A waiting block for a big worker of ``step`` (its own step first); -1: none."""
        if self.held_back:
            for s in range(step, 0, -1):
                if self.waiting[s]:
                    self.held_back -= 1
                    return self.waiting[s].popleft()
        return -1

    def wanted(self, most: int) -> list[int]:
        """The steps of the big workers to start now (at most ``most`` big ones alive)."""
        room = most - self.big_alive
        out: list[int] = []
        if not self.held_back:
            return out
        # blocks of each step out on a big worker (waiting for that step, not queued):
        # a big worker busy with one is no worker for the next (a few blocks: those that
        # ran out of memory)
        busy = [0] * (self.ladder.top + 1)
        for s in self.need.values():
            busy[s] += 1
        for s in range(self.ladder.top, 0, -1):
            idle = max(0, self.alive[s] - (busy[s] - len(self.waiting[s])))
            n = min(room - len(out), len(self.waiting[s]) - idle)
            out += [s] * max(0, n)
        return out

    def returned(self, scheduler: Scheduler, k: int, success: bool, step: int) -> None:
        """Block ``k``, which needs a big worker, came back from a worker of ``step``: a
        success counts for its grant; a retry is taken out of the queue to wait again."""
        s = self.need.get(k)
        if s is None:
            return
        if success:
            del self.need[k]
            grant = self.ladder.text(step)
            self.run.oom_successes[grant] = self.run.oom_successes.get(grant, 0) + 1
            store = self.run.store
            cell = -1 if store is None else self.run.cell_of(k)
            if store is not None and cell >= 0:  # block records keep the grant it took
                store.record_grant(cell, self.ladder.megabytes(step))
        elif scheduler.take_queued_index(self.run, k):
            self.waiting[s].append(k)
            self.held_back += 1
        else:
            del self.need[k]  # failed for good (its retries are spent)

    def sweep(self, scheduler: Scheduler) -> None:
        """Take the blocks that need a big worker and were given back unstarted (a big
        worker that stopped) out of the queue again."""
        for k, s in self.need.items():
            if scheduler.take_queued_index(self.run, k):
                self.waiting[s].append(k)
                self.held_back += 1

    def cap_message(self, block: str, step: int) -> str:
        lad = self.ladder
        return (
            f"block {block} ran out of memory with {lad.text(step)}, the largest grant "
            f"(memory request {lad.text(0)}, growth ×{lad.growth:g}, cap {lad.text(lad.top)} "
            f"from {lad.cap_parameter}): raise max_memory, or make the block need less memory"
        )


# -- the dispatcher's side ------------------------------------------------------------------
# ``d`` is the run's ``_dispatch.Dispatcher``, seen through ``_ports.DispatcherPort``:
# these are its decisions for tasks with a ladder, kept here so that the dispatcher only
# calls them.


def ladder_of(plan: TaskRecord) -> TaskMemory:
    """``plan``'s memory retries: the decisions below are made for tasks with a ladder."""
    mem = plan.memory
    assert mem is not None, f"task {plan.run.task_id!r} has no memory ladder"
    return mem


def close_held(d: DispatcherPort, peer: Peer, run: TaskRun, now: float) -> None:
    """``peer``'s connection ends. A big worker's blocks given back unstarted wait again; the
    blocks a managed worker held are released when its exit says how it died (an OOM climbs
    the ladder), or now when it is known already."""
    mem = ladder_of(d.plan_of[run.index])
    w = peer.worker
    if w is not None and w.mem_step:
        mem.sweep(d.scheduler)
    if not peer.held or w is None:
        return
    held, peer.held = peer.held, []
    if w.exit is None and w.lost is None:
        w.lost = (peer, held, now)
        mem.lost.append(w)
    elif w.exit is None:
        # another of the worker's connections (a process with several clients) already
        # waits for the exit to say how it died: these blocks are released now
        d.lose_held(peer, run, held, now)
    elif is_oom_exit(w.exit):
        _lost_to_oom(d, peer, run, held, now)
    else:
        d.lose_held(peer, run, held, now)


def settle_exit(d: DispatcherPort, worker: ManagedWorker, now: float) -> None:
    """``worker``'s exit is known: release the blocks it held when its connection ended.
    An OOM death that sent a block up the ladder gives its start back (the ladder's
    retries are no restarts)."""
    lost, worker.lost = worker.lost, None
    oom = is_oom_exit(worker.exit)
    if lost is not None:
        peer, held, _when = lost
        if oom:
            _lost_to_oom(d, peer, worker.run, held, now)
        else:
            d.lose_held(peer, worker.run, held, now)
    mem = ladder_of(d.plan_of[worker.run.index])
    if worker.worker_id in mem.climbed:
        mem.climbed.discard(worker.worker_id)
        if oom:
            d.plan_of[worker.run.index].free_starts += 1


def expire_lost(d: DispatcherPort, plan: TaskRecord, now: float) -> None:
    """Release, as lost with an ordinary death, the blocks of workers whose connection
    ended :data:`LOST_WAIT_SECONDS` ago and whose exit is still unknown (a connection
    dropped while its process goes on)."""
    mem = ladder_of(plan)
    keep = []
    for w in mem.lost:
        if w.lost is None:
            continue
        peer, held, when = w.lost
        if now - when < LOST_WAIT_SECONDS:
            keep.append(w)
            continue
        w.lost = None
        d.lose_held(peer, plan.run, held, now)
    mem.lost = keep


def _lost_to_oom(d: DispatcherPort, peer: Peer, run: TaskRun, held: list[int], now: float) -> None:
    if len(held) == 1:
        climb(d, peer, run, held[0], peer.sent_at, now, now)
    else:
        d.lose_held(peer, run, held, now)  # which block it was is unknown: suspects


def climb(
    d: DispatcherPort, peer: Peer, run: TaskRun, k: int, sent: float, returned: float, now: float
) -> None:
    """Block ``k`` ran out of memory on ``peer``'s worker: it waits for the next grant, or
    fails for good at the top of the ladder."""
    plan = d.plan_of[run.index]
    mem = ladder_of(plan)
    w = peer.worker
    step = w.mem_step if w is not None else 0
    block = f"{run.task_id}/{run.geom.spatial_id_of(k)}"
    new = mem.out_of_memory(k, step)
    if new < 0:
        d.record_error(peer, run, k, mem.cap_message(block, step), KIND_OOM)
        run.retries[k] = run.max_retries  # no retry left: it fails for good
        d.release(peer, run, k, False, False, sent, returned, now)
        return
    logger.warning(
        "block %s ran out of memory with %s; it runs again on a worker with %s",
        block,
        mem.ladder.text(step),
        mem.ladder.text(new),
    )
    if w is not None:
        mem.climbed.add(w.worker_id)
        w.timeline.sent(sent)
        w.timeline.returned(returned, True)
    plan.aggregates.add_block(returned - sent, None, True)
    d.dirty = True


def take_for(d: DispatcherPort, worker: ManagedWorker, run: TaskRun, draining: bool) -> int:
    """The block a big ``worker`` runs next; -1: none (it is told to stop)."""
    if draining or d.abort_reason is not None or d.shutdown_started is not None:
        return -1
    if not run.is_running:
        return -1
    mem = ladder_of(d.plan_of[run.index])
    return mem.take(worker.mem_step)


def book_big(
    d: DispatcherPort, plan: TaskRecord, now: float, batches: dict[str, list[Booking]]
) -> None:
    """Book the big workers that the blocks waiting for a larger grant need."""
    run = plan.run
    task = run.spec
    mem = ladder_of(plan)
    if plan.payload is None or not run.is_running:
        return
    for step in mem.wanted(task.max_workers):
        need = charge(task.budget, mem.ladder, step)
        if any(d.used.get(k, 0) + v > d.resources.get(k, 0) for k, v in need.items()):
            _stop_one_parked(d, plan, now)  # an idle ordinary worker makes room
            continue
        if mem.credits > 0:  # started for a climb: not a restart
            mem.credits -= 1
            plan.free_starts += 1
        elif plan.free_starts <= 0 and run.worker_restarts >= task.max_worker_restarts:
            return
        batches.setdefault(run.task_id, []).append(d.staff.book(plan, now, step))


def _stop_one_parked(d: DispatcherPort, plan: TaskRecord, now: float) -> None:
    """Tell one ordinary worker parked on ``plan``'s task to stop: a block waiting for a
    big worker may be what its parked request waits for, and the budget it holds is what
    the big worker needs."""
    while plan.parked:
        c = plan.parked.popleft()
        if c.parked:
            c.parked = False
            d.serve(c, plan.run, True, now)
            return
