"""The records a run's dispatcher keeps: one per connection (:class:`Peer`), per worker
(:class:`ManagedWorker`) and per task (:class:`TaskRecord`), and the booking of a worker to
start (:class:`Booking`). Plain state with no I/O; :mod:`bellis._scheduling._dispatch` decides what
happens to them.

A task's workers write to its log *slot* files, ``worker_<slot>.out`` and ``.err``: a new
worker takes the lowest slot that no worker of its task holds, and holds it until it is
seen to end (or fails to start). The header line of the next worker in a slot says why the
last one left (:func:`replacing`).
"""

from __future__ import annotations

import heapq
import signal  # the names of signals only
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .._outputs._readback import wire_outputs
from .._protocol import ExitKind, Welcome, WorkerExit, encode_welcome
from .._stats._aggregates import TaskAggregates
from .._stats._timeline import TimelineSet, WorkerTimeline
from ._gate import StartGate
from ._ladder import MemoryLadder
from ._locality import Stream
from ._task_run import TaskRun

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = [
    "Booking",
    "ManagedWorker",
    "Peer",
    "TaskBackups",
    "TaskMemory",
    "TaskRecord",
    "replacing",
    "setup_reference",
]


def setup_reference(setup: Any) -> str:
    """``module:qualname`` of a setup that a worker started by hand (``bellis worker``)
    can import by name; "" for one it cannot (defined in the driver's script, which runs
    as ``__main__``, a closure, a ``functools.partial``, an instance)."""
    module = getattr(setup, "__module__", None)
    qualname = getattr(setup, "__qualname__", None)
    if (
        not isinstance(module, str)
        or not isinstance(qualname, str)
        or module == "__main__"
        or "<" in qualname  # <locals>, <lambda>
    ):
        return ""
    return f"{module}:{qualname}"


class Peer:
    """What the dispatcher knows of one connection (the shell subclasses it with the
    socket and its buffers)."""

    __slots__ = (
        "addr",
        "authed",
        "batch",
        "closed",
        "deadline",
        "due",
        "held",
        "nonce",
        "opened_at",
        "parked",
        "run",
        "sent_at",
        "sent_wall",
        "setup_due",
        "stream",
        "trail",
        "worker",
        "worker_id",
    )

    def __init__(self, addr: Any, nonce: bytes, now: float) -> None:
        self.addr = addr
        self.nonce = nonce
        self.authed = False
        #: set when the dispatcher decided to close it (the CLOSE instruction follows)
        self.closed = False
        self.run: TaskRun | None = None
        self.worker: ManagedWorker | None = None
        self.worker_id = -1
        self.held: list[int] = []
        #: its request waits in its task's ``parked`` queue (an entry there whose peer's
        #: flag is clear is stale: skipped when popped)
        self.parked = False
        self.batch = 1
        self.sent_at = 0.0
        self.sent_wall = 0.0
        self.deadline = 0.0
        #: when its entry in the dispatcher's deadline heap falls due (inf: none there)
        self.due = float("inf")
        #: when its worker's setup (``Task(setup=...)``) is to have reported, at the
        #: latest (its task's ``timeout`` after the WELCOME); None: no setup awaited
        self.setup_due: float | None = None
        self.opened_at = now
        #: its place in its task's locality order (``_locality``): the blocks it gets
        #: follow on from its last ones
        self.stream = Stream()
        #: the blocks it was sent and its task's coherence figure has not counted yet
        #: (``_locality.Coherence.trail``; None: not counted)
        self.trail: list[int] | None = None


class ManagedWorker:
    """A managed worker: its launcher handle, its connections and its timeline.

    One worker process may open several clients (volara-ml reads ``worker_id`` from one and
    takes blocks on another): every connection that proves to be this worker is this
    worker's, and its blocks, its exit and its start are counted once, for the process."""

    __slots__ = (
        "conns",
        "earned",
        "ever_connected",
        "exit",
        "failure_counted",
        "handle",
        "home",
        "log",
        "lost",
        "mem_step",
        "run",
        "setup_error",
        "slot",
        "timeline",
        "worker_id",
    )

    def __init__(self, worker_id: int, run: TaskRun, handle: Any, timeline: WorkerTimeline) -> None:
        self.worker_id = worker_id
        #: the task it serves now (a shared worker moves: ``_sharing``)
        self.run = run
        #: the task it was started for, whose log slot it holds to its end
        self.home = run
        self.handle = handle
        #: its open connections, oldest first (one per client the process opened)
        self.conns: list[Peer] = []
        self.ever_connected = False
        # a clean exit gives the start back only if the worker returned a block or was
        # told to stop; one that connects and leaves at once must burn the budget
        self.earned = False
        self.exit: WorkerExit | None = None
        self.timeline = timeline
        self.log: str | None = None
        self.slot = 0
        #: its step on its task's memory ladder (0: the request; see ``bellis._scheduling._memory``)
        self.mem_step = 0
        #: (connection, blocks, when) it held when its connection ended, released once its
        #: exit says whether it ran out of memory (tasks with a memory ladder only)
        self.lost: tuple[Peer, list[int], float] | None = None
        #: the error text of its task's setup, when that raised (``Task(setup=...)``):
        #: what its exit says in the summary and the abandonment error
        self.setup_error: str | None = None
        #: its failure was counted when its BYE said it ends (its first block raised)
        self.failure_counted = False

    @property
    def conn(self) -> Peer | None:
        """Its oldest open connection (None: none open)."""
        return self.conns[0] if self.conns else None


class Booking(NamedTuple):
    """One worker the dispatcher booked (its id, budget, resources and log slot) for the
    shell to start: ``reason`` says why its slot's last worker left (None: the first)."""

    worker_id: int
    slot: int
    reason: str | None
    timeline: WorkerTimeline
    #: its step on the task's memory ladder (0: the request)
    mem_step: int = 0


class TaskRecord:
    """What the run needs to know about one task beyond the scheduler."""

    def __init__(
        self,
        run: TaskRun,
        payload: bytes | None,
        aggregates: TaskAggregates,
        timelines: TimelineSet,
    ) -> None:
        self.run = run
        self.payload = payload
        self.aggregates = aggregates
        self.timelines = timelines
        self.alive = 0
        #: workers stopped after a block timeout whose process is yet to be seen to end
        #: (each still holds its log slot)
        self.retired_unseen = 0
        self.free_starts = run.spec.max_workers
        #: a start failed in a way no later start can mend (``WorkerStartError.permanent``)
        self.starts_refused = False
        self.parked: deque[Peer] = deque()
        #: a plan's sample run: the first blocks wait for the workers (``_gate.StartGate``)
        self.gate: StartGate | None = None
        # blocks lost with a batch (which one killed the worker is unknown): sent alone
        self.suspects: set[int] = set()
        self.workers: list[ManagedWorker] = []
        #: the other tasks its workers may move to (``_sharing.share_groups``)
        self.shares_with: list[TaskRecord] = []
        #: straggler backups (a ``_backups.Backups``), None when the task has none
        self.backups: TaskBackups | None = None
        #: the task's memory ladder and the blocks waiting for a larger grant
        #: (a ``_memory.MemoryRetries``); None: the task has no memory request
        self.memory: TaskMemory | None = None
        # log slots: the free ones (a heap), how many exist, and per slot why its last
        # worker of this run left (the next one's header says so)
        self._free_slots: list[int] = []
        self._slot_count = 0
        self._slot_left: dict[int, str] = {}
        task = run.spec
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
        self.welcome = encode_welcome(
            Welcome(
                timeout_seconds=task.timeout_secs,
                resource_tracking=task.resource_tracking,
                geometry=self.geometry,
                stall_timeout_seconds=task.stall_timeout_secs,
                # the outputs its workers read back after each block
                verify=(
                    (
                        task.verify_outputs == "allow_empty",
                        wire_outputs(task.outputs, task.verify_stored),
                    )
                    if task.verify_outputs
                    else None
                ),
                # where a worker started by hand imports the task's setup from
                setup=None if task.setup is None else setup_reference(task.setup),
            )
        )

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


def replacing(worker_id: int, ex: WorkerExit) -> str:
    """``replacing worker 3, which exited with code 1`` and the like, for a slot header."""
    return f"replacing worker {worker_id}, {_how_it_ended(ex)}"


def _how_it_ended(ex: WorkerExit) -> str:
    if ex.kind == ExitKind.TIMEOUT:
        return "whose block exceeded the block timeout"
    if ex.kind == ExitKind.STALLED:
        return "whose block stalled"
    if ex.kind == ExitKind.INTERRUPTED:
        return "which was interrupted"
    if ex.kind == ExitKind.WALLTIME:
        return "which left before its job time limit"
    if ex.kind == ExitKind.PREEMPTED:
        return "which was stopped: the other copy of its block finished first"
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


# ``_backups`` and ``_memory`` import this module (their decisions take its records), so a
# record cannot name their classes back without an import cycle: it names them by what
# they offer, and ``mypy --strict`` checks each class against its protocol where a record
# gets one (``_dispatch.Dispatcher``, ``_run._runner``).


class TaskBackups(Protocol):
    """``TaskRecord.backups``: one task's straggler backups (``_backups.Backups``)."""

    #: the task's record
    plan: TaskRecord
    #: block -> (the original's connection, the copy's): both hold the block
    copies: dict[int, tuple[Peer, Peer]]
    #: requests that wait for a straggler
    idle: deque[Peer]

    def add_finished(self, seconds: float, n: int) -> None: ...
    def stragglers(self, now: float) -> list[Peer]: ...
    def copy_for(self, peer: Peer, now: float) -> int: ...
    def wait(self, peer: Peer) -> bool: ...
    def unpair(self, k: int, peer: Peer) -> Peer | None: ...
    def won(self, k: int, winner: Peer, loser: Peer, copy: bool, now: float) -> None: ...
    def post_races(self) -> None: ...


class TaskMemory(Protocol):
    """``TaskRecord.memory``: one task's memory ladder and the blocks that wait for a
    larger grant (``_memory.MemoryRetries``)."""

    ladder: MemoryLadder
    #: blocks that need a big worker: block -> the least step
    need: dict[int, int]
    #: workers alive per step
    alive: list[int]
    held_back: int
    #: workers whose connection ended before their exit was known
    lost: list[ManagedWorker]
    #: ids of the workers whose out-of-memory death sent a block up the ladder
    climbed: set[int]
    #: big workers that may start without spending the restart budget
    credits: int

    @property
    def big_alive(self) -> int: ...
    def grant(self, step: int) -> int: ...
    def out_of_memory(self, k: int, step: int) -> int: ...
    def take(self, step: int) -> int: ...
    def wanted(self, most: int) -> list[int]: ...
    def returned(self, scheduler: Scheduler, k: int, success: bool, step: int) -> None: ...
    def sweep(self, scheduler: Scheduler) -> None: ...
    def cap_message(self, block: str, step: int) -> str: ...
