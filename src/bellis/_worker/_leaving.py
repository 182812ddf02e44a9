"""What a SIGTERM does in a worker beyond its connected clients (``_client._on_sigterm``):
the shared worker loop (``_shared``) serves the task it moves to on the same client, so
around a move the task it left may still have a teardown to run while the client already
holds the new task's first blocks (they go back unstarted); and
while a task's setup is entered (:class:`SetupGuard`), whether the SIGTERM ends the worker
at once (the setup is still running: nothing entered, nothing to tear down) or waits for
the teardown to be registered (the setup's ``__enter__`` has returned)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import FrameType, GeneratorType
from typing import Any

__all__ = ["SetupGuard", "leaving", "sigterm_deferred"]


class SetupGuard:
    """A task's setup being entered in this worker (``_setup.enter_in_worker``): what a
    SIGTERM that comes meanwhile does.

    The rule: a teardown runs exactly once per setup that completed, none for one that
    did not. A setup completed once the ``__enter__`` of the context manager it returned
    has returned (a setup that returned anything else has no teardown). Between that
    return and the teardown's registration (``leaving.teardown``) only bellis's own code
    runs; a SIGTERM there must neither exit without the teardown nor run user code that
    is not there yet. So :meth:`defers`: True (the handler only notes the SIGTERM, and the
    worker leaves, with its teardown, once it is registered) when ``__enter__`` was called
    and what runs now is not user code any more: the interrupted frame is bellis's own
    (``__enter__`` returned), or the context manager is a ``@contextmanager`` one whose
    generator is suspended at its ``yield`` (its body ran; what runs is contextlib's return
    path, or a profiler). Otherwise the setup is running (or has not begun, or made no
    context manager): the SIGTERM ends the worker at once, without a teardown, as it
    always did in a setup. (An ``__enter__`` written in C that blocks in a system call is
    taken for returned: the SIGTERM waits for it.)
    """

    __slots__ = ("entering", "made", "ours")

    def __init__(self, ours: dict[str, Any]) -> None:
        #: the globals of bellis's module that enters the setup: its frames are ours
        self.ours = ours
        #: the context manager the setup made; set just before its ``__enter__`` is called
        self.made: Any = None
        self.entering = False

    def defers(self, frame: FrameType | None) -> bool:
        """Whether a SIGTERM that interrupted ``frame`` waits for the teardown to be
        registered (see the class docstring)."""
        if not self.entering:
            return False
        if frame is not None and frame.f_globals is self.ours:
            return True
        made = self.made
        if type(made).__module__ != "contextlib":
            return False  # a context manager of the user's: its __enter__ still runs
        gen = getattr(made, "gen", None)  # @contextmanager's: its body reached its yield
        return type(gen) is GeneratorType and gen.gi_suspended


class _Leaving:
    """What a SIGTERM does in this worker beyond its clients: ``teardown``, the teardown
    of the task it is in, runs before the exit (also between a move's MOVE and the loop's
    own call of it); while ``deferred`` (a teardown is running), a SIGTERM only sets
    ``came`` and the loop ends on its own once the teardown returned. ``guard``: a task's
    setup is being entered (:class:`SetupGuard`)."""

    __slots__ = ("came", "deferred", "guard", "teardown")

    def __init__(self) -> None:
        self.teardown: Callable[[], Any] | None = None
        self.deferred = False
        self.came = False
        self.guard: SetupGuard | None = None


#: this process's (see :class:`_Leaving`)
leaving = _Leaving()


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[_Leaving]:
    """A SIGTERM within only sets ``leaving.came`` (and asks every client to stop)."""
    leaving.deferred = True
    try:
        yield leaving
    finally:
        leaving.deferred = False
