"""``stall_timeout`` and ``Task(setup=...)`` (issue 37): the stall bound is a block's, a
setup is bounded by the task's ``timeout`` alone. Decisions scripted against the
dispatcher with a fake clock (``kit.dispatch``)."""

from __future__ import annotations

from bellis._protocol import SETUP, ExitKind, FrameDecoder, parse_welcome
from kit.dispatch import KILL, Script, closed, send_of, task


def open_volume() -> str:
    return "volume"


def _stalling_setup(**kw: object) -> Script:
    return Script(
        task(
            process_function=lambda b, ctx: None,
            setup=open_volume,
            timeout=10,
            stall_timeout=1,
            max_worker_restarts=0,
            **kw,
        )
    )


def test_a_setup_longer_than_stall_timeout_and_shorter_than_timeout_runs_on() -> None:
    sc = _stalling_setup()
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    for _ in range(99):  # 9.9 s of a setup that reports nothing: 9.9 stall_timeouts
        sc.now += 0.1
        assert not any(i[0] == KILL for i in sc.tick())
    sc.dispatcher.receive(peer, [SETUP, 9.9, None], sc.now)
    send_of(sc.acquire(peer), peer)  # it gets its blocks
    assert w.exit is None and sc.run().last_worker_error is None


def test_a_setup_past_the_timeout_is_ended_as_a_setup_timeout_not_a_stall() -> None:
    sc = _stalling_setup()
    (w,) = sc.start_workers()
    peer = sc.connect(worker=w)
    sc.now += 10.1
    out = sc.tick()
    assert (KILL, w) in out and closed(out, peer)
    assert w.exit is not None and w.exit.kind == ExitKind.TIMEOUT
    run = sc.run()
    assert run.stall_reclaims == 0
    assert run.last_worker_error is not None
    assert "setup of task 't' timed out in worker" in run.last_worker_error
    assert "task's timeout (10s)" in run.last_worker_error


def test_the_welcome_carries_stall_timeout_for_the_blocks() -> None:
    # the worker's watchdog gets the stall bound with the WELCOME and applies it from its
    # first block on (it is armed per block, never around the setup)
    (msg,) = FrameDecoder().feed(_stalling_setup().plans["t"].welcome)
    welcome = parse_welcome(msg)
    assert welcome.stall_timeout_seconds == 1.0 and welcome.timeout_seconds == 10.0
