"""Observers attached to a server (daisy 1.x's ``ServerObserver`` idea, on bellis's protocol).

daisy 1.x let a monitor attach itself to a server (``CLMonitor(server)``) and be told about
every run that server makes. bellis's ``Server`` and ``SerialServer`` keep such observers
in an :class:`ObserverRegistry`; at each run the registry and the run's ``progress``
argument are merged by :meth:`ObserverRegistry.progress_for` into what the run notifies.
An attached observer takes the place of the default display (``progress=True``), so a
terminal never shows two bars per task; an explicit observer object passed as
``progress`` is notified as well.
"""

from __future__ import annotations

from typing import Any

from ._progress import ProgressObserver, make_observer, safe_notify
from ._state import TaskState

__all__ = ["ObserverFanOut", "ObserverRegistry"]


class ObserverFanOut:
    """Notifies several observers in order; one that raises never stops the others."""

    def __init__(self, observers: list[Any]) -> None:
        self.observers = list(observers)

    def _each(self, method: str, states: dict[str, TaskState]) -> None:
        for observer in self.observers:
            safe_notify(observer, method, states)

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._each("on_start", states)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self._each("on_progress", states)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        self._each("on_finish", states)


class ObserverRegistry:
    """The observers attached to one server, in the order they were attached."""

    def __init__(self) -> None:
        self._observers: list[Any] = []

    def register(self, observer: Any) -> None:
        """Attach ``observer`` (``on_start``, ``on_progress`` and ``on_finish``) once."""
        if not isinstance(observer, ProgressObserver):
            raise TypeError(
                "an attached observer needs on_start(states), on_progress(states) and "
                f"on_finish(states) methods; got {type(observer).__name__}"
            )
        if not any(o is observer for o in self._observers):
            self._observers.append(observer)

    def unregister(self, observer: Any) -> None:
        """Detach ``observer``; detaching one that is not attached is a no-op."""
        self._observers = [o for o in self._observers if o is not observer]

    @property
    def observers(self) -> list[Any]:
        return list(self._observers)

    def progress_for(self, progress: Any) -> Any:
        """The ``progress`` argument a run gets: ``progress`` itself when nothing is
        attached; otherwise the attached observers, plus ``progress`` when it is an
        observer object (``True`` is replaced by them, ``False``/``None`` adds nothing)."""
        if not self._observers:
            return progress
        extra: list[ProgressObserver] = []
        if progress is not True and progress is not False and progress is not None:
            checked = make_observer(progress, [])
            assert checked is not None
            extra.append(checked)
        return ObserverFanOut([*extra, *self._observers])
