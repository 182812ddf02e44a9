"""Workers shared between a run's tasks, by scripted events on a fake clock: which tasks
share workers (``_sharing.share_groups``), when a worker moves (``MOVE``), and that
``max_workers`` and the resources hold at every step. No sockets, processes or sleeps."""

from __future__ import annotations

from typing import Any

import bellis as daisy
from bellis._payload import SharedFunction
from bellis._protocol import MOVE, SEND, SHUTDOWN, FrameDecoder, WorkerExit
from bellis._report._panel import worker_rows
from bellis._scheduling._dispatch import SEND_FRAME
from bellis._scheduling._records import Peer
from bellis._scheduling._sharing import share_groups
from bellis._worker._shared import FunctionCache, TaskCode
from kit.dispatch import OK, Script, task


class _Local:
    """A launcher as ``share_groups`` sees one: local or not."""

    def __init__(self, is_local: bool = True) -> None:
        self.is_local = is_local


def _share(sc: Script, launchers: dict[str, Any] | None = None, **arities: int) -> None:
    one = _Local()
    launchers = launchers or {tid: one for tid in sc.plans}
    share_groups(sc.plans.values(), launchers, {tid: arities.get(tid, 1) for tid in sc.plans})


def _said(sc: Script, peer: Peer) -> list[list[Any]]:
    dec = FrameDecoder()
    return [m for i in sc.take() if i[0] == SEND_FRAME and i[1] is peer for m in dec.feed(i[2])]


def _finish(sc: Script, peer: Peer, blocks: list[int]) -> list[list[Any]]:
    """Return ``blocks`` done and ask for more: what the worker is told."""
    sc.dispatcher.receive(peer, [0x3, *[x for k in blocks for x in (k, OK, -1, None)]], sc.now)
    return _said(sc, peer)


def _work(sc: Script, peer: Peer, held: list[int] | None = None) -> list[list[Any]]:
    """Return ``held`` done and ask for more, again while blocks come: the last reply
    (empty: the request waits, parked)."""
    held = held or []
    while True:
        told = _finish(sc, peer, held)
        if not told or told[0][0] != SEND:
            return told
        held = list(told[0][1:])


def _moved(sc: Script, told: list[list[Any]], task_id: str) -> list[int]:
    """``told`` is one MOVE to ``task_id``, with its WELCOME: the blocks that came with it."""
    (msg,) = told
    assert msg[:3] == [MOVE, task_id, sc.plans[task_id].welcome], msg
    return list(msg[3:])


def _first_send(sc: Script, peer: Peer) -> list[int]:
    sc.dispatcher.receive(peer, [0x3], sc.now)
    (msg,) = _said(sc, peer)
    assert msg[0] == SEND, msg
    return list(msg[1:])


def test_a_worker_whose_task_is_done_moves_to_a_task_with_ready_blocks() -> None:
    a = task("a", blocks=3, max_workers=1, requires={"cpu": 1})
    b = task("b", blocks=3, max_workers=1, requires={"cpu": 1})
    sc = Script(daisy.Pipeline([a, b]), resources={"cpu": 1})
    _share(sc)
    (w,) = sc.start_workers()  # the budget holds one worker: a's
    assert w.run.task_id == "a" and sc.plans["b"].alive == 0
    peer = sc.connect("a", w)
    # a's blocks, until a has none; then, in one reply, b's WELCOME and b's first block
    first = _moved(sc, _work(sc, peer), "b")
    assert len(first) == 1 and peer.held == first and peer.run is sc.run("b")
    # the worker, its resources and its start moved with it; no process started
    assert (sc.plans["a"].alive, sc.plans["b"].alive) == (0, 1)
    assert sc.dispatcher.used == {"cpu": 1}
    assert w.run.task_id == "b" and w.home.task_id == "a"
    assert sc.dispatcher.rebalance(sc.now) is None and sc.take() == []
    # the same connection serves b: no reconnection; it returns b's block and gets more
    assert peer.worker is w and w.conns == [peer]
    told = _finish(sc, peer, first)
    assert told[0][0] == SEND and len(told[0]) >= 2, told
    # each task's timeline has the worker's part in it
    assert sc.plans["a"].timelines[w.worker_id].record().moved_to == "b"
    assert sc.plans["b"].timelines[w.worker_id].record().moved_from == "a"
    assert sc.plans["a"].timelines[w.worker_id].record().blocks == 3
    # the summary's worker tables say so
    (row_a,) = worker_rows([sc.plans["a"].timelines[w.worker_id].record()])
    (row_b,) = worker_rows([sc.plans["b"].timelines[w.worker_id].record()])
    assert row_a[-1] == "moved to b" and row_b[0] == f"{w.worker_id} (from a)"


def test_a_worker_waits_for_its_own_blocks_then_feeds_a_starved_task() -> None:
    # a's blocks read their neighbours: level 1 waits for level 0 (pending, not ready);
    # b reads what a writes
    a = daisy.Task(
        "a",
        daisy.Roi((0,), (60,)),
        daisy.Roi((0,), (20,)),
        daisy.Roi((5,), (10,)),
        process_function=lambda blk: None,
        read_write_conflict=True,
        max_workers=2,
        requires={"cpu": 1},
    )
    b = task("b", blocks=6, max_workers=2, requires={"cpu": 1})
    sc = Script(a + b, resources={"cpu": 2})
    _share(sc)
    w1, w2 = sc.start_workers()
    assert w1.run.task_id == w2.run.task_id == "a"
    p1, p2 = sc.connect("a", w1), sc.connect("a", w2)
    _first_send(sc, p1)  # w1 holds a block of level 0 ...
    assert _work(sc, p2) == []  # ... and w2 runs the rest it can, then waits
    run_a = sc.run("a")
    assert run_a.ready == 0 and run_a.pending > 0 and sc.run("b").ready > 0
    # nothing ready in a, but blocks to come: it waits (parked), it does not move
    assert p2.parked and w2.run.task_id == "a"
    # b has ready blocks, no worker, and the budget cannot start one: on the tick, b
    # takes the waiting worker
    assert sc.plans["b"].alive == 0 and sc.dispatcher.used == {"cpu": 2}
    sc.now += 0.05
    sc.dispatcher.tick(sc.now)
    assert len(_moved(sc, _said(sc, p2), "b")) == 1  # b's WELCOME and its first block
    assert not p2.parked and w2.run.task_id == "b" and p2.run is sc.run("b")
    assert (sc.plans["a"].alive, sc.plans["b"].alive) == (1, 1)
    assert sc.dispatcher.used == {"cpu": 2}


def test_no_move_past_the_target_tasks_max_workers() -> None:
    a = task("a", blocks=1, max_workers=1, requires={"cpu": 1})
    b = task("b", blocks=6, max_workers=1, requires={"cpu": 1})
    sc = Script(daisy.Pipeline([a, b]), resources={"cpu": 2})
    _share(sc)
    by_task = {w.run.task_id: w for w in sc.start_workers()}
    wa = by_task["a"]
    assert sorted(by_task) == ["a", "b"]
    pa = sc.connect("a", wa)
    held = _first_send(sc, pa)
    assert _finish(sc, pa, held) == [[SHUTDOWN]]  # b has its one worker already
    assert sc.plans["b"].alive == 1 and sc.dispatcher.used == {"cpu": 2}


def _no_context() -> None:
    return None


def test_which_tasks_share_workers() -> None:
    one, other = _Local(), _Local()
    tasks = [
        task("a", requires={"cpu": 1}),
        task("b", requires={"cpu": 1}),
        task("c", requires={"cpu": 2}),  # other requirements
        task("d", requires={"cpu": 1}),  # another launcher
        task("e", requires={"cpu": 1}),  # a spawn function
        task("f", requires={"cpu": 1}, speculative=True),  # straggler backups
        task("g", requires={"cpu": 1, "gpu": 1}),  # GPUs are booked per task
        task("h", requires={"cpu": 1}),  # a batch launcher
        task("i", requires={"cpu": 1}),  # a batch launcher
        task("j", requires={"cpu": 1}, setup=_no_context),  # a setup: shares (#37)
    ]
    sc = Script(daisy.Pipeline(tasks), resources={"cpu": 8, "gpu": 1})
    batch = _Local(is_local=False)
    launchers = {t.task_id: one for t in tasks} | {"d": other, "h": batch, "i": batch}
    groups = share_groups(
        sc.plans.values(), launchers, {t.task_id: 0 if t.task_id == "e" else 1 for t in tasks}
    )
    assert {tid: [p.run.task_id for p in ps] for tid, ps in groups.items()} == {
        "a": ["b", "j"],
        "b": ["a", "j"],
        "j": ["a", "b"],  # its setup and teardown move with the worker (_worker._shared)
    }
    assert sc.plans["e"].shares_with == [] and sc.plans["h"].shares_with == []


def test_a_killed_moved_worker_is_charged_to_the_task_it_served() -> None:
    a = task("a", blocks=4, max_workers=1, requires={"cpu": 1})
    b = task("b", blocks=3, max_workers=1, requires={"cpu": 1})
    sc = Script(daisy.Pipeline([a, b]), resources={"cpu": 1})
    _share(sc)
    (w,) = sc.start_workers()
    pa = sc.connect("a", w)
    assert len(_moved(sc, _work(sc, pa), "b")) == 1  # it holds a block of b
    sc.now += 1.0
    sc.exit(w, WorkerExit("error", -9, "killed"))
    run_b = sc.run("b")
    assert run_b.worker_failures == 1 and sc.run("a").worker_failures == 0
    assert sc.plans["b"].alive == 0 and sc.dispatcher.used == {"cpu": 0}
    # the replacement is started for b, the task with blocks left
    (r,) = sc.start_workers()
    assert r.run.task_id == "b" and r.home.task_id == "b"
    # the dead worker's log slot was a's: a's slot is free again
    assert sc.plans["a"].take_slot()[0] == 0


def _double(x: int) -> int:
    return 2 * x


def _triple(x: int) -> int:
    return 3 * x


def test_a_payload_carries_the_other_tasks_functions() -> None:
    import pickle

    import msgpack
    import pytest

    from bellis._payload import PAYLOAD_FORMAT, WorkerPayload
    from bellis.errors import ProtocolError

    own = WorkerPayload(pickle.dumps(_double), 1, ("/x",), {})
    assert WorkerPayload.from_bytes(own.to_bytes()).shared == ()  # left off the wire
    shared = (SharedFunction("b", pickle.dumps(_triple), (("_triple", 3, "/f.py"),)),)
    back = WorkerPayload.from_bytes(
        WorkerPayload(own.function, 1, (), {}, (), shared=shared).to_bytes()
    )
    assert back.shared == shared
    # a task with a setup, fn(block, ctx) and declared inputs: all of it travels
    warm = (
        SharedFunction(
            "c", pickle.dumps(_triple), (), pickle.dumps(_no_context), 2, (("/s", "raw", True),), 7
        ),
    )
    back = WorkerPayload.from_bytes(
        WorkerPayload(own.function, 1, (), {}, (), shared=shared + warm).to_bytes()
    )
    assert back.shared == shared + warm
    entry = ["c", own.function, [], None, 0, [], -1]  # arity 0: no block function
    bad_arity = msgpack.packb([PAYLOAD_FORMAT, own.function, 1, [], {}, [], None, [], -1, [entry]])
    with pytest.raises(ProtocolError, match="shared function"):
        WorkerPayload.from_bytes(bad_arity)
    bad = msgpack.packb(
        [PAYLOAD_FORMAT, own.function, 1, [], {}, [], None, [], -1, [["b", "not bytes", []]]]
    )
    with pytest.raises(ProtocolError, match="shared function"):
        WorkerPayload.from_bytes(bad)


def test_a_shared_worker_keeps_a_bounded_number_of_functions() -> None:
    import pickle

    shared = tuple(
        SharedFunction(tid, pickle.dumps(fn)) for tid, fn in (("b", _triple), ("c", _double))
    )
    cache = FunctionCache("a", TaskCode(_double, None, False, (), None), shared, limit=2)
    assert cache.get("b").fn(5) == 15 and cache.loaded == ["a", "b"] and cache.loads == 1
    # b dropped, not a: the worker's own task (from its payload, unpickled) is always kept
    assert cache.get("c").fn(5) == 10 and cache.loaded == ["a", "c"]
    assert cache.get("a").fn(5) == 10 and cache.loads == 2
    assert cache.get("b") is cache.get("b") and cache.loads == 3  # kept: not loaded again
    assert cache.loaded == ["a", "b"]


def test_a_new_worker_goes_to_the_task_most_in_need() -> None:
    a = task("a", blocks=1, max_workers=1, requires={"cpu": 1})
    b = task("b", blocks=5, max_workers=1, requires={"cpu": 1})
    sc = Script(daisy.Pipeline([a, b]), resources={"cpu": 1})
    _share(sc)
    (w,) = sc.start_workers()
    assert w.run.task_id == "b"  # 5 ready blocks and no worker against 1
