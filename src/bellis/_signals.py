"""Signal handlers that a forked child does not inherit: shared by the driver's run loop
and the worker's client."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["handle_as_before", "install_abort_handlers", "install_handler", "restore_handler"]

#: bellis's signal handlers in place: signum -> (the handler, the one it replaced)
_INSTALLED: dict[int, tuple[Any, Any]] = {}
_fork_masks: list[Any] = []
_fork_hooks: list[bool] = []


def install_handler(signum: int, handler: Any) -> Any:
    """``signal.signal(signum, handler)``; returns the handler it replaced.

    A child forked while it is in place (a ``multiprocessing`` pool, ``os.fork()``) starts
    with the replaced handler instead: ``signum`` is blocked across the fork and unblocked
    in the child only once the old handler is back, so a ``Pool.terminate()`` that comes
    before the child's Python is set up still ends it (a Python-level handler would lose
    the signal there).
    """
    previous = signal.signal(signum, handler)
    _INSTALLED[signum] = (handler, previous)
    if not _fork_hooks:
        os.register_at_fork(
            before=_before_fork,
            after_in_parent=_after_fork_in_parent,
            after_in_child=_after_fork_in_child,
        )
        _fork_hooks.append(True)
    return previous


def restore_handler(signum: int, previous: Any) -> None:
    """Put back the handler :func:`install_handler` replaced."""
    _INSTALLED.pop(signum, None)
    signal.signal(signum, previous)


def _before_fork() -> None:
    if _INSTALLED:
        _fork_masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, set(_INSTALLED)))


def _after_fork_in_parent() -> None:
    if _fork_masks:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_masks.pop())


def _after_fork_in_child() -> None:
    if not _fork_masks:
        return
    for signum, (ours, previous) in list(_INSTALLED.items()):
        if signal.getsignal(signum) is ours:
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
    _INSTALLED.clear()
    signal.pthread_sigmask(signal.SIG_SETMASK, _fork_masks.pop())


def handle_as_before(signum: int, frame: Any, previous: Any) -> None:
    """In a forked child that still has bellis's handler for ``signum`` (one forked without
    the fork hooks): put back the ``previous`` handler and handle the signal with it, so
    that the child behaves as it would have without bellis."""
    if previous is None:
        previous = signal.SIG_DFL  # installed outside Python: the default is the closest
    signal.signal(signum, previous)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        os.kill(os.getpid(), signum)  # SIG_DFL, now in place, ends the process


def install_abort_handlers() -> tuple[Callable[[], str | None], Callable[[], None]]:
    """SIGINT/SIGTERM set a flag the loop polls; returns (poll, restore)."""
    flag: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        return (lambda: None), (lambda: None)

    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            # a child forked during the run (a pool started by a check_function): it ends
            # as it would have without bellis, instead of setting a flag nobody reads
            handle_as_before(signum, frame, old_int if signum == signal.SIGINT else old_term)
            return
        flag.append("SIGINT" if signum == signal.SIGINT else "SIGTERM")

    old_int = install_handler(signal.SIGINT, handler)
    old_term = install_handler(signal.SIGTERM, handler)

    def poll() -> str | None:
        return flag[0] if flag else None

    def restore() -> None:
        restore_handler(signal.SIGINT, old_int)
        restore_handler(signal.SIGTERM, old_term)

    return poll, restore
