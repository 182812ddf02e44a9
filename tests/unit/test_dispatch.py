"""The dispatcher by scripted events: each test feeds events with a fake clock (plain
floats) and asserts the instructions that come back. No sockets, processes or sleeps."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bellis._protocol import (
    ACQUIRE,
    BYE,
    ENDING,
    HELLO,
    REJECT,
    SHUTDOWN,
    STATS_ROW,
    TIMED_OUT,
    WorkerExit,
    compute_mac,
    parse_welcome,
    worker_token,
)
from bellis._scheduling._dispatch import (
    BATCH_TARGET_SECONDS,
    CLOSE,
    KILL,
    LAUNCH,
    MAX_BATCH,
    PROGRESS,
    SEND_FRAME,
    watchdog_margin_seconds,
)
from bellis._scheduling._records import Peer
from bellis._scheduling._task_run import ABANDONED, FINISHED, RUNNING
from bellis._sizes import GPU_SHARES
from bellis.errors import ConfigurationError, ProtocolError
from kit.dispatch import CREATED, FAIL, KEY, OK, SECRET, Script, closed, send_of, sent, task


# -- hello ------------------------------------------------------------------------------
def test_a_hello_with_a_wrong_secret_closes_the_connection_and_sends_nothing() -> None:
    sc = Script(task())
    peer = Peer(("h", 1), b"nonce", sc.now)
    sc.dispatcher.receive(peer, [HELLO, compute_mac(b"x" * 32, b"nonce"), "t", -1, 1, 0.0], sc.now)
    out = sc.take()
    assert out == [(CLOSE, peer)] and peer.closed and not peer.authed


def test_a_hello_for_another_task_is_rejected_then_closed() -> None:
    sc = Script(task())
    peer = Peer(("h", 1), b"nonce", sc.now)
    sc.dispatcher.receive(peer, [HELLO, compute_mac(SECRET, b"nonce"), "nope", -1, 1, 0.0], sc.now)
    out = sc.take()
    assert sent(out, peer) == [[REJECT, "no task 'nope' in this run"]]
    assert [i[0] for i in out] == [SEND_FRAME, CLOSE]


def test_an_unmanaged_client_is_welcomed_and_counted() -> None:
    sc = Script(task())
    peer = sc.connect()
    assert peer.authed and peer.worker is None and peer.run is sc.run()
    assert sc.plans["t"].timelines.unmanaged_clients == 1


def test_a_managed_worker_is_known_by_its_token_and_stamped() -> None:
    sc = Script(task())
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    assert peer.worker is w and w.conn is peer and w.ever_connected
    assert peer.worker_id == w.worker_id
    assert sc.plans["t"].timelines.unmanaged_clients == 0


def test_a_worker_id_without_its_token_is_an_unmanaged_client() -> None:
    sc = Script(task())
    (w,) = sc.start_workers()
    peer = Peer(("h", 1), b"nonce", sc.now)
    msg = [HELLO, compute_mac(SECRET, b"nonce"), "t", w.worker_id, 1, 0.0, b"forged"]
    sc.dispatcher.receive(peer, msg, sc.now)
    assert parse_welcome(sent(sc.take(), peer)[0]).geometry["total_shape"]
    assert peer.worker is None and w.conn is None


def test_a_second_connection_of_a_worker_is_that_worker() -> None:
    """volara-ml opens one client to read ``worker_id`` and takes blocks on a second:
    both connections are the worker's, and its blocks are counted for it."""
    sc = Script(task(blocks=2, max_workers=1))
    (w,) = sc.start_workers()
    first = sc.connect(worker=w)
    second = sc.connect(worker=w)
    assert first.worker is w and second.worker is w and second.worker_id == w.worker_id
    assert w.conns == [first, second] and w.conn is first
    assert sc.plans["t"].timelines.unmanaged_clients == 0
    (k,) = send_of(sc.acquire(second), second)
    sc.acquire(second, (k, OK, -1, None))
    sc.dispatcher.close(first, sc.now)  # the first client goes away: the worker is still here
    assert w.conns == [second] and w.exit is None


@pytest.mark.parametrize("first_open", [True, False], ids=["first-open", "first-closed"])
def test_a_worker_that_did_its_blocks_on_a_second_client_earns_its_start_back(
    first_open: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sc = Script(task(blocks=4, max_workers=1, max_worker_restarts=0))
    (w,) = sc.start_workers()
    first = sc.connect(worker=w)
    if not first_open:
        sc.dispatcher.close(first, sc.now)
    second = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(second), second)
    sc.acquire(second, (k, OK, -1, None), op=BYE)  # leaves with blocks left
    with caplog.at_level(logging.WARNING, logger="bellis"):
        out = sc.exit(w, WorkerExit("clean", 0, ""))
    assert "restart budget" not in caplog.text, caplog.text
    if first_open:
        assert closed(out, first)  # its other connection ends with it
    assert w.conns == []
    assert sc.plans["t"].free_starts == 1 and sc.run().worker_restarts == 0
    (replacement,) = sc.start_workers()  # the start it gave back: no restart, no abandon
    assert sc.run().worker_restarts == 0 and sc.run().status == RUNNING
    assert replacement.worker_id != w.worker_id


# -- batching ---------------------------------------------------------------------------
def test_the_first_request_gets_one_block_with_its_deadline() -> None:
    sc = Script(task(timeout=30))
    peer = sc.connect()
    ks = send_of(sc.acquire(peer), peer)
    assert len(ks) == 1 and peer.held == ks
    assert peer.sent_at == sc.now and peer.deadline == sc.now + 30


def test_a_returned_block_is_released_and_the_next_one_sent_in_the_same_reply() -> None:
    sc = Script(task())
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.now += 1.0
    out = sc.acquire(peer, (k, OK, -1, None))
    assert len(send_of(out, peer)) == 1
    assert sc.run().completed == 1


def test_fast_blocks_grow_the_batch_at_most_twofold_per_round_trip() -> None:
    sc = Script(task(blocks=200))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = send_of(sc.acquire(peer), peer)
    sizes = []
    for _ in range(4):
        sc.now += 0.0001 * len(held)
        held = send_of(sc.acquire(peer, *[(k, OK, -1, None) for k in held]), peer)
        sizes.append(len(held))
    assert sizes == [2, 4, 8, 16]


def test_the_batch_never_exceeds_its_cap() -> None:
    sc = Script(task(blocks=2000))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = send_of(sc.acquire(peer), peer)
    for _ in range(10):
        sc.now += 1e-6
        held = send_of(sc.acquire(peer, *[(k, OK, -1, None) for k in held]), peer)
    assert peer.batch == MAX_BATCH and len(held) == MAX_BATCH


def test_a_slow_block_shrinks_the_batch_at_once() -> None:
    sc = Script(task(blocks=200))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    peer.batch = 32
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == 32
    sc.now += 32 * BATCH_TARGET_SECONDS * 4  # four times the target per block
    held = send_of(sc.acquire(peer, *[(k, OK, -1, None) for k in held]), peer)
    assert peer.batch == 1 and len(held) == 1


def test_a_batch_paced_by_the_reported_busy_time_grows_while_the_round_trip_is_long() -> None:
    # a thousand connections: each batch waits a second in the server's queue, yet the
    # worker spent 0.1 ms per block on it
    sc = Script(task(blocks=2000))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    held = send_of(sc.acquire(peer), peer)
    sizes = []
    for _ in range(8):
        sc.now += 1.0
        returns = [(k, OK, -1, None) for k in held]
        held = send_of(sc.acquire(peer, *returns, busy=0.0001 * len(held)), peer)
        sizes.append(len(held))
    assert sizes == [2, 4, 8, 16, 32, 64, 64, 64]
    assert sc.run().completed == 1 + 2 + 4 + 8 + 16 + 32 + 64 + 64


def test_without_a_busy_time_the_round_trip_paces_the_batch() -> None:
    sc = Script(task(blocks=200))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    peer.batch = 32
    held = send_of(sc.acquire(peer), peer)
    sc.now += 1.0  # a long round trip, no busy time reported (an older or custom client)
    held = send_of(sc.acquire(peer, *[(k, OK, -1, None) for k in held]), peer)
    assert len(held) == 1


def test_a_busy_time_with_measurement_rows_paces_the_batch_and_stores_the_rows() -> None:
    sc = Script(task(blocks=200, resource_tracking=True))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.now += 1.0
    row = STATS_ROW.pack(0.0001, 0.0001, 1, 2, 3, float("nan"), 0, 0.0)
    held = send_of(sc.acquire(peer, (k, OK, 0, None), rows=row, busy=0.0001), peer)
    assert len(held) == 2 and sc.dispatcher.fatal is None and sc.run().completed == 1
    assert sc.dispatcher.plan_of[sc.run().index].aggregates.wall.n == 1


@pytest.mark.parametrize("busy", [-1.0, float("nan"), float("inf")])
def test_a_busy_time_that_is_not_a_finite_positive_number_drops_the_client(busy: float) -> None:
    sc = Script(task(blocks=4, max_retries=1))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert closed(sc.acquire(peer, (k, OK, -1, None), busy=busy), peer)
    assert sc.run().completed == 0  # nothing of the message was taken


def test_a_busy_time_without_blocks_drops_the_client() -> None:
    sc = Script(task(blocks=4))
    peer = sc.connect()
    assert closed(sc.acquire(peer, busy=0.5), peer)


def test_a_batch_takes_no_more_than_its_share_of_the_ready_blocks() -> None:
    sc = Script(task(blocks=20))
    sc.plans["t"].alive = 4
    peer = sc.connect()
    peer.batch = 64
    # one block, then up to a quarter of the 19 still ready
    assert len(send_of(sc.acquire(peer), peer)) == 19 // 4


# -- failures and rogue messages --------------------------------------------------------
def test_a_failed_block_is_recorded_and_goes_back_to_the_queue() -> None:
    sc = Script(task(blocks=1, max_retries=1))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    out = sc.acquire(peer, (k, FAIL, -1, "ValueError: boom"))
    assert send_of(out, peer) == [k]  # the retry
    run = sc.run()
    assert run.first_worker_error == run.last_worker_error == "ValueError: boom"
    (group,) = sc.errors.groups("t")
    assert group.count == 1


def test_a_worker_that_reports_a_failure_and_asks_for_more_keeps_working() -> None:
    # a worker function that caught its block's exception: the failure comes home with
    # its next request, and nothing ends that worker or books another
    sc = Script(task(blocks=2, max_workers=1, max_retries=1, max_worker_restarts=0))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    run = sc.run()
    held = send_of(sc.acquire(peer), peer)
    a = held[0]  # fails on every try; the other block succeeds
    served = list(held)
    while held:
        out = sc.acquire(
            peer,
            *((k, FAIL, -1, "ValueError: boom") if k == a else (k, OK, -1, None) for k in held),
        )
        assert not closed(out, peer) and not any(i[0] in (KILL, LAUNCH) for i in out), out
        (msg,) = sent(out, peer)
        held = msg[1:] if msg[0] != SHUTDOWN else []
        served += held
    assert sorted(served) == sorted([a, a, 1 - a])  # a's retry came to the same worker
    assert (run.completed, run.failed, run.failed_attempts) == (1, 1, 2)
    assert run.status == FINISHED and not peer.closed
    # then its function returns: a clean exit, its start given back, no restart spent
    sc.acquire(peer, op=BYE)
    sc.exit(w, WorkerExit("clean", 0, ""))
    assert (run.worker_restarts, run.worker_failures, sc.plans["t"].free_starts) == (0, 0, 1)


def test_returning_a_block_it_does_not_hold_drops_the_client_and_its_blocks_go_back() -> None:
    sc = Script(task(blocks=2, max_retries=0))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    out = sc.acquire(peer, (k + 1, OK, -1, None))
    assert closed(out, peer) and not sent(out, peer)
    # the block it held was lost with it: one failed attempt, no retries left
    assert sc.run().failed == 1 and sc.run().completed == 0


def test_a_malformed_status_drops_the_client() -> None:
    sc = Script(task())
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert closed(sc.acquire(peer, (k, "ok", -1, None)), peer)


@pytest.mark.parametrize("checksum", ["text where a checksum goes", ["e", {}], {"crc": 7}, 1 << 64])
def test_a_success_with_a_malformed_checksum_is_that_workers_protocol_error(
    checksum: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # what a success carries is stored as its outputs' checksum (verify_outputs): a worker
    # that sends anything but a uint64 there is dropped, none of its batch taken back, and
    # the server goes on serving the others without an error of its own
    sc = Script(task(blocks=2, max_retries=1))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    with caplog.at_level(logging.WARNING, logger="bellis"):
        out = sc.acquire(peer, (k, OK, -1, checksum))
    assert closed(out, peer) and not sent(out, peer)
    assert sc.run().completed == 0
    assert f"malformed output checksum for block t/{k}" in caplog.text
    assert "error while serving client" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
    # its block took the retry path: another worker does it, with a checksum
    other = sc.connect()
    ks = send_of(sc.acquire(other), other)
    sc.acquire(other, *[(j, OK, -1, (1 << 32) | 7) for j in ks])
    assert sc.run().completed == len(ks)


def test_a_rogue_opcode_from_an_authenticated_client_drops_it() -> None:
    sc = Script(task())
    peer = sc.connect()
    out = sc.acquire(peer, op=HELLO)
    assert out == [(CLOSE, peer)]


def test_asking_for_more_while_holding_blocks_drops_the_client() -> None:
    sc = Script(task(blocks=2, max_retries=1))
    peer = sc.connect()
    send_of(sc.acquire(peer), peer)
    assert closed(sc.acquire(peer), peer)
    assert peer.held == [] and sc.run().ready == 2  # the lost block is ready again


def test_a_second_request_while_parked_drops_the_client() -> None:
    sc = Script(task("up", blocks=1) + task("down", blocks=1))
    b = sc.connect("down")
    assert sc.acquire(b) == []  # parked: its block waits for "up"
    assert closed(sc.acquire(b), b)
    assert not b.parked


def test_an_unstarted_block_may_come_back_only_with_a_bye() -> None:
    sc = Script(task(blocks=2))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert closed(sc.acquire(peer, (k, CREATED, -1, None)), peer)
    other = sc.connect()
    (k2,) = send_of(sc.acquire(other), other)
    out = sc.acquire(other, (k2, CREATED, -1, None), op=BYE)
    assert closed(out, other) and not sent(out, other)
    run = sc.run()
    assert run.failed == 0 and run.ready == 2 - run.completed  # requeued, uncounted


def test_measurement_rows_that_are_not_whole_rows_drop_the_client() -> None:
    sc = Script(task())
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert closed(sc.acquire(peer, (k, OK, 0, None), rows=b"\x00" * 7), peer)


def test_a_success_without_measurements_under_resource_tracking_is_fatal() -> None:
    sc = Script(task(resource_tracking=True))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OK, -1, None))
    assert isinstance(sc.dispatcher.fatal, RuntimeError) and "resource_tracking" in str(
        sc.dispatcher.fatal
    )
    assert peer.held == []  # not charged later as a lost attempt


def test_measured_blocks_are_aggregated_before_their_release() -> None:
    sc = Script(task(resource_tracking=True))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.now += 0.5
    row = STATS_ROW.pack(0.4, 0.3, 1, 2, 3, 0.0, 0, 0.0)
    send_of(sc.acquire(peer, (k, OK, 0, None), rows=row), peer)
    assert sc.dispatcher.fatal is None and sc.run().completed == 1


@pytest.mark.parametrize("util", [101.0, -1.0, float("inf")])
def test_a_gpu_utilisation_outside_a_percentage_drops_the_client(util: float) -> None:
    sc = Script(task(resource_tracking=True))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    row = STATS_ROW.pack(0.4, 0.3, 1, 2, 3, util, 0, 0.0)
    assert closed(sc.acquire(peer, (k, OK, 0, None), rows=row), peer)
    assert sc.run().completed == 0


def test_measured_gpu_figures_reach_the_aggregates() -> None:
    sc = Script(task(resource_tracking=True))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    row = STATS_ROW.pack(0.4, 0.3, 1, 2, 3, 75.0, 3 << 30, 0.0)
    send_of(sc.acquire(peer, (k, OK, 0, None), rows=row), peer)
    assert sc.dispatcher.fatal is None and sc.run().completed == 1
    agg = sc.dispatcher.plan_of[sc.run().index].aggregates
    assert agg.gpu_util.n == 1 and agg.gpu_util.mean == 75.0
    assert agg.gpu_mem.n == 1 and agg.gpu_mem.max == 3 << 30


# -- parking ----------------------------------------------------------------------------
def test_a_request_with_no_block_ready_or_pending_gets_the_shutdown() -> None:
    sc = Script(task(blocks=1))
    a, b = sc.connect(), sc.connect()
    send_of(sc.acquire(a), a)
    assert sent(sc.acquire(b), b) == [[SHUTDOWN]]
    assert not b.parked and b not in sc.plans["t"].parked


def test_a_parked_request_gets_the_shutdown_when_its_blocks_are_orphaned() -> None:
    sc = Script(task("up", blocks=1, max_retries=0) + task("down", blocks=1))
    u, dn = sc.connect("up"), sc.connect("down")
    (k,) = send_of(sc.acquire(u), u)
    assert sc.acquire(dn) == [] and dn.parked and dn in sc.plans["down"].parked
    out = sc.acquire(u, (k, FAIL, -1, "boom"))
    assert sent(out, u) == [[SHUTDOWN]] and sc.run("down").orphaned == 1
    sc.dispatcher.tick(sc.now)  # the tick serves what no release woke
    assert sent(sc.take(), dn) == [[SHUTDOWN]]


def test_a_closed_parked_request_is_skipped_when_blocks_get_ready() -> None:
    sc = Script(task("up", blocks=2) + task("down", blocks=2, read_write_conflict=False))
    u1, u2 = sc.connect("up"), sc.connect("up")
    (k1,) = send_of(sc.acquire(u1), u1)
    (k2,) = send_of(sc.acquire(u2), u2)
    waiting = [sc.connect("down") for _ in range(3)]
    for w in waiting:
        assert sc.acquire(w) == [] and w.parked
    sc.dispatcher.close(waiting[0], sc.now)
    sc.take()
    assert not waiting[0].parked
    out = sc.acquire(u1, (k1, OK, -1, None)) + sc.acquire(u2, (k2, OK, -1, None))
    # the two blocks of "down" go to the two open requests, in the order they came
    assert not sent(out, waiting[0])
    assert len(send_of(out, waiting[1])) == 1 and len(send_of(out, waiting[2])) == 1
    assert not any(w.parked for w in waiting) and not sc.plans["down"].parked


def test_a_downstream_request_parks_until_its_upstream_block_is_done() -> None:
    sc = Script(task("up", blocks=1) + task("down", blocks=1))
    u, dn = sc.connect("up"), sc.connect("down")
    (k,) = send_of(sc.acquire(u), u)
    assert sc.acquire(dn) == []
    out = sc.acquire(u, (k, OK, -1, None))
    assert len(send_of(out, dn)) == 1


# -- deadlines --------------------------------------------------------------------------
def test_a_block_is_reclaimed_only_after_its_deadline_and_the_watchdog_margin() -> None:
    sc = Script(task(timeout=10, max_retries=1))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    send_of(sc.acquire(peer), peer)
    margin = watchdog_margin_seconds(sc.run())
    sc.dispatcher.expire(peer.deadline + margin)
    assert sc.take() == []
    sc.now = peer.deadline + margin + 0.01
    sc.dispatcher.expire(sc.now)
    out = sc.take()
    assert (KILL, w) in out and closed(out, peer)
    assert sc.run().timeout_reclaims == 1 and w.exit is not None and w.exit.kind == "timeout"
    assert sc.plans["t"].alive == 0  # retired at once: a replacement may start


class CountingPeer(Peer):
    """A peer that counts how often the dispatcher looks at what it holds."""

    __slots__ = ("looks",)

    def __init__(self, *args: Any) -> None:
        self.looks = 0
        super().__init__(*args)

    @property  # type: ignore[override]
    def held(self) -> list[int]:
        self.looks += 1
        return Peer.held.__get__(self)  # type: ignore[attr-defined,no-any-return]

    @held.setter
    def held(self, value: list[int]) -> None:
        Peer.held.__set__(self, value)  # type: ignore[attr-defined]


def test_a_tick_looks_only_at_the_connections_whose_deadline_passed() -> None:
    sc = Script(task(blocks=2000, timeout=10, max_retries=1))
    peers = []
    for i in range(1000):
        sc.now = 100.0 + i  # one block each, deadlines 1 s apart
        peer = CountingPeer(("127.0.0.1", 6000 + i), b"c%d" % i, sc.now)
        sc.dispatcher.receive(
            peer, [HELLO, compute_mac(SECRET, peer.nonce), "t", -1, 1, 0.0], sc.now
        )
        sc.take()  # the WELCOME
        assert len(send_of(sc.acquire(peer), peer)) == 1
        peers.append(peer)
    margin = watchdog_margin_seconds(sc.run())
    for peer in peers:
        peer.looks = 0
    sc.now = peers[2].deadline + margin + 0.01  # the first three are past their deadline
    sc.dispatcher.expire(sc.now)
    out = sc.take()
    assert [p for p in peers if closed(out, p)] == peers[:3]
    assert sc.run().timeout_reclaims == 3
    assert all(p.looks == 0 for p in peers[3:])  # the other 997 were not even looked at


def test_a_later_batch_with_an_earlier_deadline_is_reclaimed_at_that_deadline() -> None:
    sc = Script(task(blocks=40, timeout=10, max_retries=1))
    peer = sc.connect()
    peer.batch = 8
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == 8  # deadline 80 s away
    sc.now += 1
    peer.batch = 1
    returns = [(k, OK, -1, None) for k in held]
    assert len(send_of(sc.acquire(peer, *returns), peer)) >= 1
    peer.batch = 1
    sc.now += 1
    # the first batch's deadline has not passed, the second's (one block, 10 s) is past
    sc.now = peer.deadline + watchdog_margin_seconds(sc.run()) + 0.01
    assert len(peer.held) == 1
    sc.dispatcher.expire(sc.now)
    assert closed(sc.take(), peer) and sc.run().timeout_reclaims == 1


def test_a_connection_served_again_is_not_reclaimed_at_its_old_deadline() -> None:
    sc = Script(task(blocks=40, timeout=10, max_retries=1))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.now += 9
    send_of(sc.acquire(peer, (k, OK, -1, None)), peer)
    sc.now += 5  # past the first block's deadline, not the second's
    sc.dispatcher.expire(sc.now)
    assert sc.take() == [] and sc.run().timeout_reclaims == 0
    sc.now = peer.deadline + watchdog_margin_seconds(sc.run()) + 0.01
    sc.dispatcher.expire(sc.now)
    assert closed(sc.take(), peer) and sc.run().timeout_reclaims == 1


def test_a_batch_past_its_deadline_is_requeued_uncharged_and_its_blocks_become_suspects() -> None:
    sc = Script(task(blocks=40, timeout=1, max_retries=0))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    peer.batch = 4
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == 4
    sc.now = peer.deadline + 10
    sc.dispatcher.expire(sc.now)
    out = sc.take()
    assert (KILL, w) in out and closed(out, peer)
    run = sc.run()
    assert run.failed == 0 and run.timeout_reclaims == 0
    assert sc.plans["t"].suspects == set(held)


def test_a_suspect_block_travels_alone() -> None:
    sc = Script(task(blocks=9))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    peer.batch = 8
    held = send_of(sc.acquire(peer), peer)
    assert len(held) == 8
    sc.dispatcher.close(peer, sc.now)  # lost mid-batch
    sc.take()
    other = sc.connect()
    (first,) = send_of(sc.acquire(other), other)
    assert first not in held
    sc.now += 0.001
    (k,) = send_of(sc.acquire(other, (first, OK, -1, None)), other)
    assert other.batch == 2 and k in held  # the batch grew, yet a suspect goes alone
    sc.now += 0.001
    send_of(sc.acquire(other, (k, OK, -1, None)), other)
    assert k not in sc.plans["t"].suspects  # returned, it is no suspect any more


def test_a_watchdog_timeout_reported_by_the_worker_is_charged_and_the_worker_killed() -> None:
    sc = Script(task(timeout=5))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    out = sc.acquire(peer, (k, TIMED_OUT, -1, "watchdog"), op=BYE)
    assert (KILL, w) in out and closed(out, peer)
    assert sc.run().timeout_reclaims == 1


def test_a_disconnect_at_or_after_the_deadline_counts_as_the_timeout() -> None:
    sc = Script(task(timeout=5))
    peer = sc.connect()
    send_of(sc.acquire(peer), peer)
    sc.dispatcher.close(peer, peer.deadline)
    assert closed(sc.take(), peer) and sc.run().timeout_reclaims == 1


# -- lost workers -----------------------------------------------------------------------
def test_a_worker_lost_with_one_block_charges_that_block() -> None:
    sc = Script(task(blocks=1, max_retries=0))
    peer = sc.connect()
    send_of(sc.acquire(peer), peer)
    sc.now += 1
    sc.dispatcher.close(peer, sc.now)
    assert closed(sc.take(), peer)
    assert sc.run().failed == 1 and sc.run().status == FINISHED


def test_a_worker_lost_mid_batch_charges_none_of_its_blocks() -> None:
    sc = Script(task(blocks=40, max_retries=0))
    sc.plans["t"].alive = 1
    peer = sc.connect()
    peer.batch = 5
    held = send_of(sc.acquire(peer), peer)
    sc.dispatcher.close(peer, sc.now + 1)
    assert sc.run().failed == 0 and sc.run().ready == 40
    assert sc.plans["t"].suspects == set(held)


def test_the_blocks_a_gone_worker_returned_before_its_exit_count_as_done() -> None:
    sc = Script(task(blocks=2))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    assert sc.dispatcher.worker_exited(w, WorkerExit("error", 1, "exited with code 1"))
    sc.dispatcher.receive(peer, [BYE, k, OK, -1, None], sc.now, draining=True)
    sc.dispatcher.settle_exit(w, sc.now)
    assert sc.run().completed == 1 and sc.run().failed == 0
    assert sc.run().worker_failures == 1


# -- workers and the restart budget -----------------------------------------------------
def test_a_rebalance_books_up_to_max_workers_within_the_resources() -> None:
    sc = Script(task(blocks=10, max_workers=4, requires={"gpu": 1}), resources={"gpu": 3})
    sc.dispatcher.rebalance(sc.now)
    ((op, plan, bookings),) = sc.take()
    assert op == LAUNCH and plan is sc.plans["t"]
    assert [b.slot for b in bookings] == [0, 1, 2]
    # the budget counts GPUs in integer shares (GPU_SHARES to a GPU)
    assert (
        sc.dispatcher.used == {"gpu": 3 * GPU_SHARES} and plan.alive == 3 and plan.free_starts == 1
    )


def test_half_gpus_pack_two_workers_on_each_gpu_of_the_budget() -> None:
    sc = Script(task(blocks=10, max_workers=8, requires={"gpu": 0.5}), resources={"gpu": 3})
    sc.dispatcher.rebalance(sc.now)
    ((_op, plan, bookings),) = sc.take()
    assert [b.slot for b in bookings] == [0, 1, 2, 3, 4, 5]
    assert sc.dispatcher.used == {"gpu": 3 * GPU_SHARES} and plan.alive == 6


def test_thirds_of_a_gpu_fill_the_budget_exactly() -> None:
    sc = Script(task(blocks=10, max_workers=9, requires={"gpu": 1 / 3}), resources={"gpu": 2})
    sc.dispatcher.rebalance(sc.now)
    ((_op, _plan, bookings),) = sc.take()
    assert len(bookings) == 6 and sc.dispatcher.used == {"gpu": 2 * GPU_SHARES}


def test_a_release_books_workers_only_for_the_task_it_made_ready() -> None:
    pipeline = task("up", blocks=1, max_workers=1) + task("down", blocks=1, max_workers=1)
    sc = Script(pipeline | task("other", blocks=3, max_workers=1))
    ups = sc.start_workers()
    assert sorted(w.run.task_id for w in ups) == ["other", "up"]
    wo = next(w for w in ups if w.run.task_id == "other")
    po = sc.connect("other", worker=wo)
    (k,) = send_of(sc.acquire(po), po)
    sc.acquire(po, (k, OK, -1, None), op=BYE)
    sc.exit(wo, WorkerExit("clean", 0, ""))  # "other" could start a worker again
    u = sc.connect("up")
    (k,) = send_of(sc.acquire(u), u)
    out = sc.acquire(u, (k, OK, -1, None))
    # the release books for "down" (just made ready), not for every task of the run
    assert [(i[0], i[1].run.task_id) for i in out if i[0] == LAUNCH] == [(LAUNCH, "down")]
    sc.dispatcher.tick(sc.now)  # the tick books the rest
    assert [i[1].run.task_id for i in sc.take() if i[0] == LAUNCH] == ["other"]


def test_a_clean_exit_after_work_gives_its_start_back() -> None:
    sc = Script(task(blocks=2, max_workers=1))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.acquire(peer, (k, OK, -1, None), op=BYE)
    assert sc.plans["t"].free_starts == 0
    sc.exit(w, WorkerExit("clean", 0, ""))
    assert sc.plans["t"].free_starts == 1 and sc.run().worker_restarts == 0


def test_a_clean_exit_without_connecting_counts_against_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sc = Script(task(blocks=2, max_workers=1, max_worker_restarts=1))
    (w,) = sc.start_workers()
    with caplog.at_level(logging.WARNING, logger="bellis"):
        sc.exit(w, WorkerExit("clean", 0, ""))
    assert "without ever connecting" in caplog.text and "127.0.0.1:4242" in caplog.text
    assert sc.plans["t"].free_starts == 0
    sc.start_workers()  # the replacement is a restart
    assert sc.run().worker_restarts == 1 and sc.run().worker_starts == 2


def test_a_failed_exit_is_a_worker_failure_and_its_replacement_a_restart() -> None:
    sc = Script(task(blocks=2, max_workers=1, max_worker_restarts=2))
    (w,) = sc.start_workers()
    sc.exit(w, WorkerExit("error", 1, "exited with code 1\nstderr tail"))
    run = sc.run()
    assert run.worker_failures == 1 and run.first_worker_error.startswith("exited with code 1")
    sc.start_workers()
    assert run.worker_restarts == 1


@pytest.mark.parametrize("exit_seen", [True, False], ids=["exit-seen", "exit-unseen"])
def test_a_worker_ending_on_its_first_failed_block_counts_once_even_as_the_run_ends(
    exit_seen: bool,
) -> None:
    """The worker's first block raised, so it ends (its function may be broken) and its BYE
    says so. That block was the run's last: the run ends as the BYE is read, before the
    process exit is seen (or the exit is never seen: the run's end stops the launcher).
    The worker failure is counted once either way, as the BYE arrives."""
    sc = Script(task(blocks=1, max_workers=1, max_retries=0))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    run = sc.run()
    sc.dispatcher.receive(peer, [BYE, k, FAIL, -1, "boom", ENDING], sc.now)
    sc.take()
    assert run.status != RUNNING and run.worker_failures == 1  # the run ended with it
    if exit_seen:
        sc.exit(w, WorkerExit("error", 1, "exited with code 1"))
    assert run.worker_failures == 1


def test_an_ending_mark_with_anything_else_is_a_protocol_error() -> None:
    sc = Script(task(blocks=2, max_workers=1))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    (k,) = send_of(sc.acquire(peer), peer)
    sc.dispatcher.receive(peer, [BYE, k, FAIL, -1, "boom", {"ending": 2}], sc.now)
    assert closed(sc.take(), peer) and sc.run().worker_failures == 0


def test_a_task_out_of_restarts_abandons_itself_and_its_downstream_tasks() -> None:
    sc = Script(task("up", blocks=2, max_workers=1, max_worker_restarts=0) + task("down", blocks=2))
    sc.dispatcher.rebalance(sc.now)
    ((_op, plan, (booking,)),) = sc.take()  # only "up" has ready blocks
    sc.dispatcher.launched(plan, booking, object(), None)
    w = sc.dispatcher.workers[booking.worker_id]
    waiting = sc.connect("down")
    assert sc.acquire(waiting) == []  # parked: no block of "down" is ready
    sc.exit(w, WorkerExit("error", 1, "boom"))
    sc.dispatcher.tick(sc.now)
    out = sc.take()
    assert not any(i[0] == LAUNCH for i in out)
    assert sent(out, waiting) == [[SHUTDOWN]]
    assert sc.run("up").status == ABANDONED and sc.run("down").status == ABANDONED


def test_no_worker_starts_once_the_budget_is_spent() -> None:
    sc = Script(task(blocks=4, max_workers=1, max_worker_restarts=1))
    for _ in range(2):
        (w,) = sc.start_workers()
        sc.exit(w, WorkerExit("error", 1, "boom"))
    sc.dispatcher.rebalance(sc.now)
    assert sc.take() == []
    sc.dispatcher.tick(sc.now)
    assert sc.run().status == ABANDONED


def test_a_failed_launch_undoes_its_booking_but_spends_its_start() -> None:
    sc = Script(task(blocks=4, max_workers=1, requires={"cpu": 1}), resources={"cpu": 1})
    sc.dispatcher.rebalance(sc.now)
    ((_op, plan, (booking,)),) = sc.take()
    sc.dispatcher.launch_failed(plan, booking, OSError("no such file"), sc.now)
    run = sc.run()
    assert plan.alive == 0 and sc.dispatcher.used == {"cpu": 0} and plan.free_starts == 0
    assert run.worker_failures == 1 and "could not start a worker" in run.last_worker_error
    assert plan.take_slot() == (0, "replacing worker 0, which could not be started")


def test_a_worker_that_connects_after_its_exit_was_seen_is_a_fatal_configuration() -> None:
    sc = Script(task())
    (w,) = sc.start_workers()
    sc.exit(w, WorkerExit("clean", 0, ""))
    peer = Peer(("h", 1), b"nonce", sc.now)
    msg = [HELLO, compute_mac(SECRET, b"nonce"), "t", w.worker_id, 1, 0.0]
    msg.append(compute_mac(worker_token(KEY, w.worker_id), b"nonce"))
    sc.dispatcher.receive(peer, msg, sc.now)
    out = sc.take()
    assert sent(out, peer) == [[REJECT, "this worker's process already exited"]]
    assert isinstance(sc.dispatcher.fatal, ConfigurationError)


def test_a_worker_given_up_for_lost_is_turned_away_without_failing_the_run() -> None:
    sc = Script(task())
    (w,) = sc.start_workers()
    sc.exit(w, WorkerExit("error", None, "the launcher lost track of this worker"))
    peer = Peer(("h", 1), b"nonce", sc.now)
    msg = [HELLO, compute_mac(SECRET, b"nonce"), "t", w.worker_id, 1, 0.0]
    msg.append(compute_mac(worker_token(KEY, w.worker_id), b"nonce"))
    sc.dispatcher.receive(peer, msg, sc.now)
    assert sent(sc.take(), peer) == [[REJECT, "this worker was given up for lost"]]
    assert sc.dispatcher.fatal is None


def test_a_replacement_takes_a_new_slot_until_the_timed_out_worker_is_seen_to_end() -> None:
    sc = Script(task(blocks=4, timeout=1, max_workers=1, max_worker_restarts=5))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    send_of(sc.acquire(peer), peer)
    sc.dispatcher.expire(peer.deadline + 5)
    sc.take()
    assert sc.plans["t"].retired_unseen == 1
    sc.dispatcher.rebalance(sc.now)
    ((op, _plan, (booking,)),) = sc.take()
    assert op == LAUNCH and booking.slot != w.slot
    assert booking.reason == "restart in a new slot (the worker it replaces has not ended yet)"
    sc.dispatcher.launched(sc.plans["t"], booking, object(), None)
    assert not sc.dispatcher.worker_exited(w, WorkerExit("timeout", 87, "killed"))
    assert sc.plans["t"].retired_unseen == 0


def test_the_exit_of_a_worker_retired_after_a_timeout_only_frees_its_slot() -> None:
    sc = Script(task(timeout=1, max_workers=1))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    send_of(sc.acquire(peer), peer)
    sc.dispatcher.expire(peer.deadline + 5)
    sc.take()
    failures = sc.run().worker_failures
    assert not sc.dispatcher.worker_exited(w, WorkerExit("timeout", 87, "killed"))
    assert sc.run().worker_failures == failures
    assert sc.plans["t"].take_slot()[1] == (
        f"replacing worker {w.worker_id}, whose block exceeded the block timeout"
    )


# -- abort, shutdown, progress ----------------------------------------------------------
def test_after_an_abort_requests_get_the_shutdown_and_no_worker_starts() -> None:
    sc = Script(task())
    sc.dispatcher.abort("SIGINT")
    peer = sc.connect()
    assert sent(sc.acquire(peer), peer) == [[SHUTDOWN]]
    sc.dispatcher.tick(sc.now)
    assert not any(i[0] == LAUNCH for i in sc.take())


def test_the_shutdown_tells_parked_requests_to_stop_and_lists_the_live_workers() -> None:
    sc = Script(task("up", blocks=1) + task("down", blocks=1))
    sc.dispatcher.rebalance(sc.now)
    ((_op, plan, (booking,)),) = sc.take()
    sc.dispatcher.launched(plan, booking, object(), None)
    w = sc.dispatcher.workers[booking.worker_id]
    b = sc.connect("down")
    sc.acquire(b)  # parked
    live = sc.dispatcher.begin_shutdown(sc.now)
    assert sent(sc.take(), b) == [[SHUTDOWN]]
    assert live == [w] and w.timeline is booking.timeline


def test_progress_is_reported_when_something_changed_at_most_twice_a_second() -> None:
    sc = Script(task())
    sc.dispatcher.tick(sc.now)
    assert (PROGRESS,) in sc.take()
    sc.dispatcher.tick(sc.now + 0.1)
    assert (PROGRESS,) not in sc.take()
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert (PROGRESS,) not in sc.acquire(peer, (k, OK, -1, None))  # progress waits for a tick
    sc.dispatcher.tick(sc.now + 0.2)
    assert (PROGRESS,) not in sc.take()  # changed, but too soon
    sc.dispatcher.tick(sc.now + 0.6)
    assert (PROGRESS,) in sc.take()


def test_wall_times_follow_the_synced_clock_yet_one_workers_batches_never_overlap() -> None:
    sc = Script(task())
    sc.dispatcher.sync_clock(sc.now, 1_700_000_000.0)
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    assert peer.sent_wall == pytest.approx(1_700_000_000.0)
    sc.now += 1.0
    sc.dispatcher.sync_clock(sc.now, 1_700_000_002.0)  # the wall clock was stepped by a second
    (k,) = send_of(sc.acquire(peer, (k, OK, -1, None)), peer)
    assert peer.sent_wall == pytest.approx(1_700_000_002.0)
    sc.now += 1.0
    sc.dispatcher.sync_clock(sc.now, 1_700_000_001.0)  # and back by two: no overlap with the last
    send_of(sc.acquire(peer, (k, OK, -1, None)), peer)
    assert peer.sent_wall == pytest.approx(1_700_000_003.0)
    assert sc.run().status == RUNNING


# -- the protocol's parsing -------------------------------------------------------------
def test_a_hello_parses_into_its_typed_fields() -> None:
    from bellis._protocol import Hello, parse_hello

    mac = compute_mac(SECRET, b"nonce")
    assert parse_hello([HELLO, mac, "t", 3, 99, 0.25, b"w"], SECRET, b"nonce") == Hello(
        "t", 3, 99, 0.25, b"w"
    )
    assert parse_hello([HELLO, mac, "t", -1, 99, 0.25], SECRET, b"nonce").worker_mac is None
    with pytest.raises(ProtocolError, match="malformed hello"):
        parse_hello([HELLO, mac, 7, -1, 99, 0.25], SECRET, b"nonce")


def test_a_block_returned_twice_in_one_message_is_refused_before_anything_is_taken() -> None:
    from bellis._protocol import parse_returns

    msg = [ACQUIRE, 4, OK, -1, None, 4, OK, -1, None]
    with pytest.raises(ProtocolError, match="not held"):
        parse_returns(msg, 8, 0, {4, 5}, False, "t")
    assert parse_returns([ACQUIRE, -1, OK, -1, None, 5, FAIL, 0, "e"], 8, 1, {5}, False, "t") == [
        (5, FAIL, 0, "e")
    ]
