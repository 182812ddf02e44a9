"""``Task(setup=...)``'s pure decisions (issue 37, item 1): the forms a setup may take and
what each makes, the parameter's errors, which block functions get the context, the
fingerprint over the setup and the task-setup phase of the worker timeline."""

from __future__ import annotations

import contextlib
import functools
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import bellis as daisy
from bellis._fingerprint import fingerprint
from bellis._stats._timeline import WorkerTimeline
from bellis._worker._setup import enter, with_context
from bellis.errors import ConfigurationError


def make(**kw: Any) -> Any:
    kw.setdefault("process_function", lambda block: None)
    return daisy.Task(
        "t", daisy.Roi((0,), (30,)), daisy.Roi((0,), (10,)), daisy.Roi((0,), (10,)), **kw
    )


# -- the forms ------------------------------------------------------------------------------


def test_a_plain_functions_value_is_the_context_with_no_teardown() -> None:
    handle = object()
    warm = enter(lambda: handle, "t")
    assert warm.ctx is handle
    assert warm.leave() is None
    assert warm.seconds >= 0.0


def test_a_context_manager_factory_is_entered_and_exited_once() -> None:
    calls: list[str] = []

    @contextlib.contextmanager
    def open_volume() -> Iterator[str]:
        calls.append("enter")
        yield "volume"
        calls.append("exit")

    warm = enter(open_volume, "t")
    assert warm.ctx == "volume" and calls == ["enter"]
    assert warm.leave() is None and calls == ["enter", "exit"]
    assert warm.leave() is None and calls == ["enter", "exit"]  # once


def test_a_class_with_enter_and_exit_is_entered_and_its_exit_gets_no_exception() -> None:
    seen: list[Any] = []

    class Volume:
        def __enter__(self) -> str:
            return "entered"

        def __exit__(self, *exc: Any) -> None:
            seen.append(exc)

    warm = enter(Volume, "t")
    assert warm.ctx == "entered"
    warm.leave()
    assert seen == [(None, None, None)]


def test_a_teardown_that_raises_is_returned_and_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @contextlib.contextmanager
    def broken() -> Iterator[None]:
        yield None
        raise OSError("cannot close the volume")

    warm = enter(broken, "t")
    exc = warm.leave()
    assert isinstance(exc, OSError)
    assert "the teardown of task 't'" in caplog.text
    assert "cannot close the volume" in caplog.text


def test_a_setup_that_raises_propagates_its_own_exception() -> None:
    def fails() -> None:
        raise ValueError("no volume")

    with pytest.raises(ValueError, match="no volume"):
        enter(fails, "t")


def test_with_context_passes_the_context_as_the_second_argument() -> None:
    got: list[Any] = []
    fn = with_context(lambda block, ctx: got.append((block, ctx)), "ctx")
    fn("block")
    assert got == [("block", "ctx")]


# -- the parameter ---------------------------------------------------------------------------


def test_setup_defaults_to_none_and_no_context() -> None:
    task = make()
    assert task.setup is None and task.passes_context is False


@pytest.mark.parametrize(
    ("fn", "passes"),
    [
        (lambda block: None, False),
        (lambda block, ctx: None, True),
        (lambda block, ctx=None: None, True),
        (lambda *args: None, False),
        (functools.partial(lambda scale, block, ctx: None, 2), True),
    ],
)
def test_a_block_function_with_two_parameters_gets_the_context(fn: Any, passes: bool) -> None:
    task = make(process_function=fn, setup=dict)
    assert task.setup is dict and task.passes_context is passes
    # without a setup every function is called f(block), as in daisy
    assert make(process_function=fn).passes_context is False


def test_a_context_manager_object_instead_of_its_factory_says_how_to_fix_it() -> None:
    @contextlib.contextmanager
    def open_volume() -> Iterator[None]:
        yield None

    with pytest.raises(ConfigurationError, match=r"setup=open_arrays, not") as info:
        make(setup=open_volume())
    assert info.value.parameter == "setup"


def test_a_setup_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"setup='zarr' is not callable"):
        make(setup="zarr")


def test_a_setup_that_needs_arguments_is_refused_with_the_fix() -> None:
    def open_volume(path: str) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"functools\.partial") as info:
        make(setup=open_volume)
    assert "cannot be called without arguments" in str(info.value)
    make(setup=functools.partial(open_volume, "/data"))  # bound: fine


def test_a_worker_function_cannot_have_a_setup() -> None:
    with pytest.raises(ConfigurationError, match="setup= runs before a block function"):
        make(process_function=lambda: None, setup=dict)


# -- the fingerprint -------------------------------------------------------------------------

SCRIPT = """
def open_volume():
    return {"scale": SCALE}

def process(block, ctx):
    return block * ctx["scale"]
"""


def _functions(scale: int) -> tuple[Any, Any]:
    ns: dict[str, Any] = {"__name__": "__main__", "SCALE": scale}
    exec(compile(textwrap.dedent(SCRIPT), "<script>", "exec"), ns)
    return ns["process"], ns["open_volume"]


def test_the_fingerprint_covers_the_setup() -> None:
    process, setup = _functions(2)
    without = fingerprint(process)
    assert fingerprint(process, None, None) == without  # no setup: the hash as before
    with_setup = fingerprint(process, None, setup)
    assert with_setup.hash != without.hash
    assert "open_volume" in with_setup.functions
    assert fingerprint(*_functions(2)[:1], None, _functions(2)[1]).hash == with_setup.hash
    changed = fingerprint(process, None, _functions(3)[1])
    assert changed.hash != with_setup.hash


# -- the timeline ----------------------------------------------------------------------------


def test_the_task_setup_is_apart_from_startup_idle_and_blocks() -> None:
    tl = WorkerTimeline(0)
    tl.spawned(10.0)
    tl.reported_setup(0.3)
    tl.first_acquire(10.5)  # the HELLO: startup 0.5
    tl.task_setup_done(2.0, 12.5)  # its setup took 2 s
    tl.sent(12.6)  # idle 0.1, not 2.1
    tl.returned(13.6)
    tl.shutdown_requested(13.7)
    tl.exited(13.8, "clean")
    r = tl.record()
    assert r.startup == pytest.approx(0.5)
    assert r.task_setup == pytest.approx(2.0)
    assert r.idle.total == pytest.approx(0.1)
    assert r.compute.total == pytest.approx(1.0)
    assert WorkerTimeline(1).record().task_setup is None
