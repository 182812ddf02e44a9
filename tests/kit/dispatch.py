"""The dispatcher by scripted events: a ``Script`` feeds a ``Dispatcher`` events with a fake
clock (plain floats) and hands back the instructions it gave. No sockets, processes or
sleeps: for the unit tests (``test_dispatch``, ``test_memory``, ``test_backups``)."""

from __future__ import annotations

from typing import Any

import bellis as daisy
from bellis._protocol import (
    ACQUIRE,
    HELLO,
    SEND,
    SHUTDOWN,
    FrameDecoder,
    WorkerExit,
    compute_mac,
    parse_welcome,
    worker_token,
)
from bellis._scheduling._dispatch import CLOSE, KILL, LAUNCH, SEND_FRAME, Dispatcher
from bellis._scheduling._records import ManagedWorker, Peer, TaskRecord
from bellis._scheduling._scheduler import Scheduler
from bellis._stats._aggregates import TaskAggregates
from bellis._stats._errorgroups import ErrorCollector
from bellis._stats._timeline import TimelineSet

SECRET = b"s" * 32
KEY = b"k" * 32
OK, FAIL, CREATED = 2, 3, 0


def task(task_id: str = "t", blocks: int = 8, **kw: Any) -> daisy.Task:
    kw.setdefault("process_function", lambda b: None)
    kw.setdefault("read_write_conflict", False)
    return daisy.Task(
        task_id,
        daisy.Roi((0,), (10 * blocks,)),
        daisy.Roi((0,), (10,)),
        daisy.Roi((0,), (10,)),
        **kw,
    )


class Script:
    """A dispatcher over ``pipeline``, the clock at ``now``, and what it said."""

    def __init__(self, pipeline: Any, resources: dict[str, int] | None = None) -> None:
        self.scheduler = Scheduler(pipeline)
        self.errors = ErrorCollector()
        self.plans = {
            r.task_id: TaskRecord(r, b"fn", TaskAggregates(), TimelineSet())
            for r in self.scheduler.runs
        }
        self.dispatcher = Dispatcher(
            self.scheduler,
            self.plans,
            secret=SECRET,
            worker_key=KEY,
            resources=resources or {},
            errors=self.errors,
            address=("127.0.0.1", 4242),
        )
        self.now = 100.0
        self.peers = 0

    def run(self, task_id: str = "t") -> Any:
        return self.plans[task_id].run

    def take(self) -> list[tuple[Any, ...]]:
        out = list(self.dispatcher.out)
        self.dispatcher.out.clear()
        return out

    def frames(self, peer: Peer) -> list[list[Any]]:
        """The messages sent to ``peer`` since the last take (the rest is dropped)."""
        dec = FrameDecoder()
        return [
            m for i in self.take() if i[0] == SEND_FRAME and i[1] is peer for m in dec.feed(i[2])
        ]

    def connect(self, task_id: str = "t", worker: ManagedWorker | None = None) -> Peer:
        self.peers += 1
        peer = Peer(("127.0.0.1", 5000 + self.peers), b"n%d" % self.peers, self.now)
        wid = -1 if worker is None else worker.worker_id
        msg = [HELLO, compute_mac(SECRET, peer.nonce), task_id, wid, 1234, 0.5]
        if worker is not None:
            msg.append(compute_mac(worker_token(KEY, wid), peer.nonce))
        self.dispatcher.receive(peer, msg, self.now)
        parse_welcome(self.frames(peer)[0])  # a WELCOME, well formed
        return peer

    def acquire(
        self,
        peer: Peer,
        *returns: tuple[int, int, int, Any],
        rows: bytes | None = None,
        op: int = ACQUIRE,
        busy: float | None = None,
    ) -> list[Any]:
        """Send ``returns`` (with their measurement ``rows`` and the worker's ``busy``
        seconds, if given) and ask for more; the reply (None: parked) or CLOSE."""
        msg: list[Any] = [op]
        for r in returns:
            msg.extend(r)
        if rows is not None:
            msg.append(rows)
        if busy is not None:
            msg.append(busy)
        self.dispatcher.receive(peer, msg, self.now)
        return self.take()

    def launch(self) -> list[tuple[ManagedWorker, Any]]:
        """Carry out the LAUNCH instructions of a rebalance: every booking starts. The
        workers started, each with its booking."""
        self.dispatcher.rebalance(self.now)
        started = []
        for instr in self.take():
            assert instr[0] == LAUNCH
            for booking in instr[2]:
                self.dispatcher.launched(instr[1], booking, object(), None)
                started.append((self.dispatcher.workers[booking.worker_id], booking))
        return started

    def start_workers(self) -> list[ManagedWorker]:
        """``launch``'s workers."""
        return [worker for worker, _booking in self.launch()]

    def exit(self, worker: ManagedWorker, ex: WorkerExit) -> list[tuple[Any, ...]]:
        if self.dispatcher.worker_exited(worker, ex):
            self.dispatcher.settle_exit(worker, self.now)
        return self.take()

    def tick(self) -> list[tuple[Any, ...]]:
        self.dispatcher.expire(self.now)
        self.dispatcher.tick(self.now)
        return self.take()


def sent(instrs: list[tuple[Any, ...]], peer: Peer) -> list[list[Any]]:
    dec = FrameDecoder()
    return [m for i in instrs if i[0] == SEND_FRAME and i[1] is peer for m in dec.feed(i[2])]


def closed(instrs: list[tuple[Any, ...]], peer: Peer) -> bool:
    return any(i[0] == CLOSE and i[1] is peer for i in instrs)


def send_of(instrs: list[tuple[Any, ...]], peer: Peer) -> list[int]:
    (msg,) = sent(instrs, peer)
    assert msg[0] == SEND, msg
    return msg[1:]


def told_to_stop(instrs: list[tuple[Any, ...]], peer: Peer) -> bool:
    return [SHUTDOWN] in sent(instrs, peer)


def killed(instrs: list[tuple[Any, ...]], worker: ManagedWorker) -> bool:
    return any(i[0] == KILL and i[1] is worker for i in instrs)
