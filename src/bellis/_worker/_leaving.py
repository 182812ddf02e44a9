"""What a SIGTERM does in a worker beyond its connected clients (``_client._on_sigterm``):
the shared worker loop (``_shared``) connects one client per task it serves, so around a
move no client may be connected while the task it left still has a teardown to run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["leaving", "sigterm_deferred"]


class _Leaving:
    """What a SIGTERM does in this worker beyond its clients (the shared worker loop's,
    ``_shared``, which connects a client per task it serves): ``teardown``, the teardown
    of the task it is in, runs before the exit even while no client is connected (around a
    move); while ``deferred`` (a teardown is running), a SIGTERM only sets ``came`` and the
    loop ends on its own once the teardown returned."""

    __slots__ = ("came", "deferred", "teardown")

    def __init__(self) -> None:
        self.teardown: Callable[[], Any] | None = None
        self.deferred = False
        self.came = False


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
