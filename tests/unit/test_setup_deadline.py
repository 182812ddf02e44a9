"""The server's bound on a worker's ``Task(setup=...)`` (issue 37), and the setup named in
the WELCOME: decisions scripted against the dispatcher with a fake clock (``kit.dispatch``)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import bellis as daisy
from bellis._protocol import (
    ACQUIRE,
    MOVE,
    SEND,
    SETUP,
    WELCOME,
    ExitKind,
    FrameDecoder,
    Welcome,
    encode_welcome,
    parse_welcome,
)
from bellis._scheduling._abandon import RESTART_CAP
from bellis._scheduling._records import setup_reference
from bellis._scheduling._sharing import share_groups
from bellis.errors import ProtocolError
from kit.dispatch import KILL, OK, Script, closed, send_of, task


def open_volume() -> str:
    return "volume"


def _with_setup(**kw: Any) -> Any:
    return task(process_function=lambda b, ctx: None, setup=open_volume, **kw)


def _decode(frame: bytes) -> list[Any]:
    (msg,) = FrameDecoder().feed(frame)
    return msg  # type: ignore[no-any-return]


def test_a_setup_that_does_not_report_within_the_timeout_gets_its_worker_killed() -> None:
    sc = Script(_with_setup(timeout=5, max_worker_restarts=0))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    sc.now += 4.9
    assert not any(i[0] == KILL for i in sc.tick())  # within the bound: it runs on
    sc.now += 0.2
    out = sc.tick()
    assert (KILL, w) in out and closed(out, peer)
    assert w.exit is not None and w.exit.kind == ExitKind.TIMEOUT
    run = sc.run()
    assert run.last_worker_error is not None
    assert "setup of task 't' timed out in worker" in run.last_worker_error
    assert "task's timeout (5s)" in run.last_worker_error
    # its start is spent: with no restart left the task is abandoned
    assert run.abandon_reason == RESTART_CAP


def test_a_setup_that_reports_in_time_is_not_bounded_any_more() -> None:
    sc = Script(_with_setup(timeout=5))
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    sc.now += 4.0
    sc.dispatcher.receive(peer, [SETUP, 4.0, None], sc.now)
    sc.now += 2.0  # past the setup's bound: it reported, nothing happens
    assert not any(i[0] == KILL for i in sc.tick())
    send_of(sc.acquire(peer), peer)  # its blocks are timed as always
    sc.now += 5.0 + 1.0
    assert (KILL, w) in sc.tick()
    assert sc.run().timeout_reclaims == 1
    assert sc.run().last_worker_error is None or "setup" not in sc.run().last_worker_error


def test_a_task_without_a_setup_and_an_unmanaged_client_get_no_setup_bound() -> None:
    sc = Script(task(timeout=5))
    (w,) = sc.start_workers()
    sc.connect(worker=w)
    sc.now += 60.0
    assert not any(i[0] == KILL for i in sc.tick())
    sc = Script(_with_setup(timeout=5))
    peer = sc.connect()  # a worker started by hand: never killed by the server
    sc.now += 60.0
    assert not closed(sc.tick(), peer)


def test_the_welcome_names_the_tasks_setup() -> None:
    welcome = _decode(Script(_with_setup()).plans["t"].welcome)
    assert parse_welcome(welcome).setup == f"{__name__}:open_volume"
    assert parse_welcome(_decode(Script(task()).plans["t"].welcome)).setup is None


def test_a_setup_reference_is_empty_where_it_cannot_be_imported_by_name() -> None:
    def local() -> None: ...

    assert setup_reference(open_volume) == f"{__name__}:open_volume"
    assert setup_reference(local) == ""
    assert setup_reference(functools.partial(open_volume)) == ""
    assert setup_reference(lambda: None) == ""
    main = type("M", (), {"__call__": lambda self: None, "__module__": "__main__"})
    assert setup_reference(main) == ""


def test_the_welcome_round_trips_a_setup_without_the_fields_before_it() -> None:
    geometry: dict[str, Any] = {"fit": "valid"}
    w = Welcome(timeout_seconds=5.0, resource_tracking=False, geometry=geometry, setup="m:f")
    back = parse_welcome(_decode(encode_welcome(w)))
    assert (back.setup, back.stall_timeout_seconds, back.verify) == ("m:f", None, None)
    plain = Welcome(timeout_seconds=5.0, resource_tracking=False, geometry=geometry)
    assert len(_decode(encode_welcome(plain))) == 4  # nothing added without a setup
    with pytest.raises(ProtocolError, match="setup is 3"):
        parse_welcome([WELCOME, 5.0, False, geometry, None, None, 3])


class _Local:
    is_local = True


def _moved_to_b(**b_kw: Any) -> tuple[Script, Any, Any]:
    """A worker started for 'a' (its setup reported), moved to 'b' when a's blocks ran
    out: the script, the worker and its connection, which serves 'b' now."""
    a = task(
        "a",
        2,
        process_function=lambda b, ctx: None,
        setup=open_volume,
        timeout=5,
        max_workers=1,
        requires={"cpu": 1},
    )
    b = task(
        "b",
        2,
        process_function=lambda b, ctx: None,
        setup=open_volume,
        max_workers=1,
        requires={"cpu": 1},
        **b_kw,
    )
    sc = Script(daisy.Pipeline([a, b]), resources={"cpu": 1})
    local = _Local()  # one launcher: the tasks share its workers
    share_groups(sc.plans.values(), {t: local for t in sc.plans}, {t: 2 for t in sc.plans})
    (w,) = sc.start_workers()
    pa = sc.connect("a", w)
    sc.dispatcher.receive(pa, [SETUP, 0.5, None], sc.now)
    returns: list[tuple[int, int, int, Any]] = []
    while True:
        sc.dispatcher.receive(pa, [ACQUIRE, *[x for r in returns for x in r]], sc.now)
        (msg,) = sc.frames(pa)
        if msg[0] != SEND:
            break
        returns = [(k, OK, -1, None) for k in msg[1:]]
    # b's WELCOME, on the same connection; no block: the worker runs a's teardown and
    # b's setup first
    assert msg == [MOVE, "b", sc.plans["b"].welcome], msg
    assert pa.run is sc.run("b") and not pa.held
    return sc, w, pa


def test_the_setup_a_worker_runs_after_a_move_is_bounded_by_the_new_tasks_timeout() -> None:
    sc, w, pb = _moved_to_b(timeout=3, max_worker_restarts=0)
    sc.now += 2.9
    assert not any(i[0] == KILL for i in sc.tick())  # within b's bound (not a's 5s)
    sc.now += 0.2
    out = sc.tick()
    assert (KILL, w) in out and closed(out, pb)
    assert w.exit is not None and w.exit.kind == ExitKind.TIMEOUT
    run_b, run_a = sc.run("b"), sc.run("a")
    assert run_b.last_worker_error is not None
    assert "setup of task 'b' timed out in worker" in run_b.last_worker_error
    assert "task's timeout (3s)" in run_b.last_worker_error
    assert run_a.last_worker_error is None
    # the start is charged to b: with no restart left, b is abandoned
    assert run_b.abandon_reason == RESTART_CAP


def test_a_moved_workers_setup_that_reports_in_time_is_not_killed() -> None:
    sc, w, pb = _moved_to_b(timeout=3)
    sc.now += 2.0
    sc.dispatcher.receive(pb, [SETUP, 2.0, None], sc.now)
    sc.now += 10.0
    assert not any(i[0] == KILL for i in sc.tick())
    assert w.exit is None and sc.run("b").last_worker_error is None
