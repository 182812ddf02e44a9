"""``Task(setup=...)`` in one process: the setup entered once, what it made, its teardown.

Theory of operation
-------------------
A task's setup is a callable that takes no argument. A worker process calls it once,
after its connection is welcomed and before it asks for its first block of the task
(:func:`enter_in_worker`); serial mode calls it once in the driver, before the task's first
block (``bellis._run._serial``). Two forms, told apart by what the call returns:

* **a context manager** (an object whose type has ``__enter__`` and ``__exit__``: what a
  ``@contextlib.contextmanager`` function or a class with those methods returns) is
  entered, as a ``with`` statement would: what ``__enter__`` returns is the *context*, and
  ``__exit__(None, None, None)`` is the teardown, run when the process leaves the task;
* **anything else** is the context itself, kept for the life of the process; there is no
  teardown (the process's exit frees it).

A block function that takes two positional parameters gets the context with every block,
``fn(block, ctx)`` (:func:`with_context`); one that takes one is called ``fn(block)``, as
without a setup.

The teardown runs when the worker leaves the task on its own: told to stop (a clean exit),
at its job's time limit, after its first block raised, moved to another task of the run
(``_shared``: before that task's setup), on a SIGTERM (while no block runs, the SIGTERM
handler of ``_client`` calls ``_leaving.leaving.teardown``, registered from the instant
the setup's ``__enter__`` returned (``_leaving.SetupGuard``) until the loop runs the
teardown itself, and kept between a move's MOVE and the old task's teardown; in a block,
the loop ends after the block); not when the process is killed (SIGKILL, a
block timeout, a setup past the task's timeout, an out-of-memory end). A teardown that
raises is logged (the worker's ``.err`` log; the driver's log in serial mode) and changes
no block's outcome.
``__exit__`` always gets ``(None, None, None)``: a block's exception is the block's, and
no teardown may swallow it.

A setup that raises ends the worker before it took a block: its traceback goes to the log
and, in a SETUP message (``bellis._protocol``), to the server, which writes an error record
of kind ``setup failed`` (no block) and charges the worker's exit to the task's restart
budget. The SETUP message also carries how long a setup that succeeded took, which the
report's worker phases show as ``task setup``. A SETUP that does not come within the
task's ``timeout`` of the WELCOME (a first setup's, or the one after a move to another task)
gets the worker killed by the server (an error record of
kind ``setup timed out``: ``_scheduling._attempts.setup_timed_out``).

A worker started by hand (``bellis worker``) runs ``--setup``, or else the task's own
setup, imported by the name its WELCOME gives (``bellis._cli._main``, which imports the
user's modules by name).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._leaving import SetupGuard

__all__ = [
    "Warm",
    "enter",
    "enter_in_worker",
    "setup_failure_text",
    "with_context",
]

logger = logging.getLogger("bellis")


class Warm:
    """A setup entered in this process: what it made (:attr:`ctx`), how long it took
    (:attr:`seconds`) and its teardown (the context manager's ``__exit__``, if any)."""

    __slots__ = ("_exit", "ctx", "seconds", "task_id")

    def __init__(
        self, task_id: str, ctx: Any, seconds: float, exit_: Callable[..., Any] | None
    ) -> None:
        self.task_id = task_id
        self.ctx = ctx
        self.seconds = seconds
        self._exit = exit_

    def leave(self) -> BaseException | None:
        """Run the teardown once (nothing without one). An exception it raises is logged
        and returned, never raised: the blocks' outcomes stand."""
        exit_ = self._exit
        if exit_ is None:
            return None
        self._exit = None
        try:
            exit_(None, None, None)
        except Exception as exc:
            from ..logging import format_traceback

            text = format_traceback(type(exc), exc, exc.__traceback__)
            logger.error(
                "the teardown of task '%s' (the __exit__ of what Task(setup=...) returned) "
                "raised; no block's outcome changes:\n%s",
                self.task_id,
                text.rstrip("\n"),
            )
            return exc
        return None


def enter(setup: Callable[[], Any], task_id: str, guard: SetupGuard | None = None) -> Warm:
    """Call ``setup`` and enter what it returns when that is a context manager (see the
    module docstring). Its exception propagates.

    ``guard`` (a worker's, ``enter_in_worker``): the teardown is registered as the
    SIGTERM handler's (``_leaving.leaving.teardown``) before this returns, and the guard
    tells the handler when ``__enter__`` is under way (``_leaving.SetupGuard``)."""
    t0 = time.perf_counter()
    made = setup()
    kind = type(made)
    exit_ = None
    if hasattr(kind, "__enter__") and hasattr(kind, "__exit__"):
        # looked up on the type, as ``with`` does, and before ``__enter__`` (as ``with``
        # does): once ``__enter__`` returned, no user code runs until the teardown is
        # registered
        exit_ = kind.__exit__.__get__(made, kind)
        if guard is not None:
            guard.made = made
            guard.entering = True
        ctx = kind.__enter__(made)
    else:
        ctx = made
    warm = Warm(task_id, ctx, time.perf_counter() - t0, exit_)
    if guard is not None:
        from ._leaving import leaving

        leaving.teardown = warm.leave
    return warm


def with_context(fn: Callable[[Any, Any], Any], ctx: Any) -> Callable[[Any], Any]:
    """The block function ``fn(block, ctx)`` as a one-argument one."""

    def block_function(block: Any) -> Any:
        return fn(block, ctx)

    return block_function


def setup_failure_text(task_id: str, where: str, traceback_text: str) -> str:
    """The error text of a setup that raised: it names the setup, not a block."""
    return (
        f"setup of task '{task_id}' failed {where} (Task(setup=...) raised before any "
        f"block ran):\n{traceback_text.rstrip()}"
    )


def enter_in_worker(client: Any, setup: Callable[[], Any]) -> Warm | None:
    """Run ``setup`` in this worker, connected as ``client``, and tell the server how long
    it took (a SETUP message). None when it raised: its traceback went to the log and to
    the server, and the connection is closed; the worker then ends (exit code 1).

    The teardown is the SIGTERM handler's (``_leaving.leaving.teardown``) from the instant
    the setup completed: a SIGTERM at any moment runs it exactly once if the setup's
    ``__enter__`` returned, never if it had not (``_leaving.SetupGuard``). The caller
    unregisters it (under ``_leaving.sigterm_deferred``) when it runs the teardown itself."""
    from .._protocol import SETUP
    from ..errors import ConnectionLostError
    from ._leaving import SetupGuard, leaving

    t0 = time.perf_counter()
    # a SIGTERM from here on: see SetupGuard (it ends the worker at once while the setup
    # runs; once the setup's __enter__ returned, it waits for the teardown's registration)
    guard = leaving.guard = SetupGuard(globals())
    failed: Exception | None = None
    try:
        warm = enter(setup, client.task_id, guard)
    except Exception as exc:
        failed = exc
    finally:
        leaving.guard = None
    if failed is not None:
        from ..logging import cap_traceback, format_traceback
        from . import _failure

        seconds = time.perf_counter() - t0
        offsets = _failure.log_offsets()  # before the lines below
        full = format_traceback(type(failed), failed, failed.__traceback__)
        where = f"in worker {client.worker_id}"
        text = setup_failure_text(client.task_id, where, full)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        capped = setup_failure_text(client.task_id, where, cap_traceback(full))
        field = _failure.failure_field(capped, offsets, failed, full)
        try:
            client._send([SETUP, seconds, field])
        except ConnectionLostError:
            pass  # the run has ended: nothing to report to
        client.close()
        return None
    if leaving.came:
        # a SIGTERM came after the setup's __enter__ returned: handled now that the
        # teardown is registered (it runs once, then the worker exits)
        signal.raise_signal(signal.SIGTERM)
    try:
        client._send([SETUP, warm.seconds, None])
    except ConnectionLostError:
        pass  # the run ended meanwhile: the block loop finds the connection closed
    return warm
