"""AHEAD by scripted events (``_scheduling._ahead``): a worker of fast blocks asks for its
next batch while the last block of its batch runs, and every rule that looks at a block
out alone keeps working. A fake clock, no sockets, processes or sleeps."""

from __future__ import annotations

from bellis._protocol import (
    AHEAD,
    BYE,
    TIMED_OUT,
    FrameDecoder,
    Welcome,
    encode_welcome,
    parse_welcome,
)
from bellis._scheduling._records import Peer
from kit.dispatch import CREATED, OK, Script, closed, send_of, sent, task


def _fast(sc: Script, peer: Peer, batch: int = 4) -> list[int]:
    """``peer`` holds a batch of ``batch`` fast blocks."""
    peer.batch = batch
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == batch
    return held


def _ahead(sc: Script, peer: Peer, done: list[int], busy: float | None = None) -> list[int]:
    """An AHEAD returning ``done`` (all but the block the worker runs): what came back."""
    sc.now += 0.001 * max(1, len(done))
    out = sc.acquire(peer, *[(k, OK, -1, None) for k in done], op=AHEAD, busy=busy)
    assert not closed(out, peer)
    return send_of(out, peer)


def test_the_welcome_allows_ahead_only_where_no_rule_looks_at_a_block_out_alone() -> None:
    plain = Script(task())
    assert plain.plans["t"].ahead
    for kw in ({"speculative": True}, {"stall_timeout": 30}):
        sc = Script(task(**kw))  # type: ignore[arg-type]
        assert not sc.plans["t"].ahead
        peer = sc.connect()
        held = _fast(sc, peer, 2)
        out = sc.acquire(peer, (held[0], OK, -1, None), op=AHEAD)
        assert closed(out, peer)  # a worker told no AHEAD that sends one: a protocol error
    # the field round-trips, and a WELCOME without it (an older server) says no
    w = Welcome(600.0, False, {"fit": "valid"}, ahead=True)
    (msg,) = FrameDecoder().feed(encode_welcome(w))
    assert parse_welcome(msg) == w
    (msg,) = FrameDecoder().feed(encode_welcome(Welcome(600.0, False, {"fit": "valid"})))
    assert not parse_welcome(msg).ahead and len(msg) == 4


def test_an_ahead_sends_the_next_batch_while_the_last_block_runs() -> None:
    sc = Script(task(blocks=200))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer)
    last = held[-1]
    nxt = _ahead(sc, peer, held[:-1], busy=0.003)  # 1 ms a block: the batch doubles
    assert len(nxt) == 8 and last not in nxt
    assert peer.held == [last, *nxt]  # the running block, then the batch behind it
    assert sc.run().completed == 3
    # the next AHEAD returns the block that ran and all of this batch but its last one
    nxt2 = _ahead(sc, peer, [last, *nxt[:-1]], busy=0.004)
    assert len(nxt2) == 16 and peer.held == [nxt[-1], *nxt2] and sc.run().completed == 11
    # the blocks go on in the connection's stream, each handed out once
    assert len({*held, *nxt, *nxt2}) == len(held) + len(nxt) + len(nxt2)


def test_an_ahead_paces_the_batch_from_the_busy_time() -> None:
    sc = Script(task(blocks=2000))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer, 2)
    sizes = []
    for _ in range(5):
        # 0.1 ms per block; the batch sent ahead grows as an ACQUIRE's would
        got = _ahead(sc, peer, held[:-1], busy=0.0001 * max(1, len(held) - 1))
        sizes.append(len(got))
        held = [held[-1], *got]
    assert sizes == [4, 8, 16, 32, 64]


def test_slow_blocks_go_one_at_a_time_with_nothing_ahead() -> None:
    sc = Script(task(blocks=200))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer, 2)
    # 50 ms a block: the batch shrinks to one, and nothing goes ahead
    assert _ahead(sc, peer, held[:1], busy=0.05) == []
    assert peer.held == [held[1]] and peer.batch == 1


def test_nothing_goes_ahead_where_few_ready_blocks_are_left() -> None:
    sc = Script(task(blocks=7))
    sc.plans["t"].alive = 2
    peer = sc.connect()
    held = _fast(sc, peer, 3)
    # 4 ready, 2 workers: one block may still go ahead; then 3: under two per worker
    assert len(_ahead(sc, peer, held[:-1], busy=0.001)) == 1
    running = peer.held[-1]
    assert _ahead(sc, peer, peer.held[:-1], busy=0.001) == []
    assert peer.held == [running] and sc.run().ready == 3
    # the ACQUIRE once its block is done gets its share, as without AHEAD
    sc.now += 0.001
    assert len(send_of(sc.acquire(peer, (running, OK, -1, None)), peer)) == 1


def test_nothing_goes_ahead_while_a_suspect_waits() -> None:
    sc = Script(task(blocks=100))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer, 4)
    lost = sc.connect()
    suspects = _fast(sc, lost, 4)
    sc.dispatcher.close(lost, sc.now)  # lost mid-batch: its blocks are suspects
    sc.take()
    assert sc.plans["t"].suspects == set(suspects)
    # a suspect must run alone; nothing goes ahead until none is left
    assert _ahead(sc, peer, held[:-1], busy=0.001) == []
    assert peer.held == [held[-1]]


def test_a_worker_lost_with_a_batch_ahead_charges_none_of_its_blocks() -> None:
    sc = Script(task(blocks=100, max_retries=0))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer)
    _ahead(sc, peer, held[:-1], busy=0.003)
    out = list(peer.held)
    assert len(out) == 1 + 8
    sc.dispatcher.close(peer, sc.now + 1)  # which block killed it is unknown
    assert sc.run().failed == 0 and sc.plans["t"].suspects == set(out)


def test_a_worker_lost_after_nothing_went_ahead_charges_the_block_it_ran() -> None:
    sc = Script(task(blocks=9, max_retries=0))
    sc.plans["t"].alive = 4
    peer = sc.connect()
    held = _fast(sc, peer, 2)
    assert _ahead(sc, peer, held[:1], busy=0.002) == []  # 7 ready for 4 workers
    sc.dispatcher.close(peer, sc.now + 1)
    # the block out alone is the one that ran: charged, as a batch of one is today
    assert sc.run().failed == 1 and not sc.plans["t"].suspects


def test_a_timeout_after_an_ahead_charges_the_block_and_requeues_the_batch_ahead() -> None:
    sc = Script(task(blocks=100, timeout=5))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    held = _fast(sc, peer)
    ahead = _ahead(sc, peer, held[:-1], busy=0.003)
    # the watchdog ends the running block before the worker read the batch sent ahead:
    # its notice (a BYE) names that block only
    out = sc.acquire(peer, (held[-1], TIMED_OUT, -1, "watchdog"), op=BYE)
    assert closed(out, peer)
    run = sc.run()
    assert run.timeout_reclaims == 1 and run.failed == 0
    assert not sc.plans["t"].suspects & set(ahead)  # unstarted: back uncharged
    assert peer.held == []


def test_an_ahead_that_leaves_other_than_one_block_held_drops_the_client() -> None:
    sc = Script(task(blocks=100))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer)
    out = sc.acquire(peer, *[(k, OK, -1, None) for k in held[:-2]], op=AHEAD)
    assert closed(out, peer) and not sent(out, peer)


def test_a_bye_after_an_ahead_gives_the_unstarted_blocks_back() -> None:
    sc = Script(task(blocks=100))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = _fast(sc, peer)
    ahead = _ahead(sc, peer, held[:-1], busy=0.003)
    # the worker read the batch ahead, ran its block, then leaves (a SIGTERM)
    out = sc.acquire(
        peer, (held[-1], OK, -1, None), *[(k, CREATED, -1, None) for k in ahead], op=BYE
    )
    assert closed(out, peer)
    run = sc.run()
    assert run.completed == 4 and run.failed == 0 and not sc.plans["t"].suspects
