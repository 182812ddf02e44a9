"""The dispatcher as the modules it calls see it: a typed seam, sans I/O.

:mod:`._memory`, :mod:`._backups` and :mod:`._returns` decide for the dispatcher
(:class:`bellis._scheduling._dispatch.Dispatcher`) and call it back. They cannot import it
(it imports them), so each takes it as a :class:`DispatcherPort`: exactly the methods
and attributes they use, no more. The dispatcher satisfies it structurally; ``mypy
--strict`` checks that at every call that hands it over. A test double for those modules
needs only what is listed here.

This module holds protocols only: it imports the records it names for annotations alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._protocol import ExitKind
    from ._records import Booking, ManagedWorker, Peer, TaskRecord
    from ._scheduler import Scheduler
    from ._task_run import TaskRun

__all__ = ["Booker", "DispatcherPort"]


class Booker(Protocol):
    """The part of the run's staffing (``_staffing.Staffing``) that books a worker."""

    def book(self, plan: TaskRecord, now: float, mem_step: int = 0) -> Booking:
        """Book a worker of ``plan``'s task at ``mem_step`` of its memory ladder."""
        ...


class DispatcherPort(Protocol):
    """What :mod:`._memory`, :mod:`._backups` and :mod:`._returns` use of the dispatcher.

    The attributes are read-only here, except :attr:`dirty` and :attr:`fatal`, which
    they set."""

    #: the run changed since progress was last reported
    dirty: bool
    #: the error the run fails with (None: none yet)
    fatal: BaseException | None

    @property
    def scheduler(self) -> Scheduler:
        """The run's scheduler."""
        ...

    @property
    def plan_of(self) -> dict[int, TaskRecord]:
        """Each task's plan, by its ``TaskRun.index``."""
        ...

    @property
    def staff(self) -> Booker:
        """The run's staffing: who books workers."""
        ...

    @property
    def resources(self) -> dict[str, int]:
        """The run's resource budget."""
        ...

    @property
    def used(self) -> dict[str, int]:
        """What the live workers take of :attr:`resources`."""
        ...

    @property
    def abort_reason(self) -> str | None:
        """Why the run was aborted (None: it was not)."""
        ...

    @property
    def shutdown_started(self) -> float | None:
        """When the run began to stop (None: it has not)."""
        ...

    def serve(self, peer: Peer, run: TaskRun, draining: bool, now: float) -> None:
        """Answer ``peer``'s request: blocks, a park, or the word to stop."""
        ...

    def serve_parked(self, plan: TaskRecord, now: float) -> None:
        """Serve the requests parked on ``plan``'s task while it has ready blocks."""
        ...

    def release(
        self,
        peer: Peer,
        run: TaskRun,
        k: int,
        success: bool,
        measured: bool,
        sent: float,
        returned: float,
        now: float,
        lost: bool = False,
    ) -> None:
        """Release block ``k`` to the scheduler (``lost``: its worker went away)."""
        ...

    def released(self, plan: TaskRecord, run: TaskRun, now: float) -> None:
        """After releases of ``run``'s blocks: wake parked requests."""
        ...

    def record_error(
        self,
        peer: Peer,
        run: TaskRun,
        k: int,
        text: str,
        kind: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Block ``k`` failed with ``text`` (``kind``, ``details``: its error record)."""
        ...

    def lose_held(self, peer: Peer, run: TaskRun, held: list[int], now: float) -> None:
        """The blocks ``held`` went with ``peer``'s connection."""
        ...

    def stop_worker(
        self, worker: ManagedWorker | None, text: str, now: float, kind: ExitKind = ...
    ) -> None:
        """Kill ``worker`` and retire it with exit ``kind``."""
        ...

    def close(self, peer: Peer, now: float) -> None:
        """End ``peer``'s connection: the blocks it held go back."""
        ...
