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

import time
from collections.abc import Callable
from typing import Any

from .._state import TaskState
from ._progress import ProgressObserver, ProgressThrottle, make_observer, safe_notify

__all__ = ["AttachableObservers", "ObserverFanOut", "ObserverRegistry", "run_observed"]


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


class AttachableObservers:
    """``register_observer``/``unregister_observer`` for a server class (daisy 1.x's
    ``ServerObserver`` protocol); the server passes ``self._observers.progress_for(...)``
    to its runs."""

    _observers: ObserverRegistry

    def _init_observers(self) -> None:
        self._observers = ObserverRegistry()

    def register_observer(self, observer: Any) -> None:
        """Attach a progress observer to every later run of this server
        (:class:`bellis.cl_monitor.CLMonitor` attaches itself). It replaces the default
        display of ``progress=True``; a serial run, which shows no progress by itself,
        notifies it too."""
        self._observers.register(observer)

    def unregister_observer(self, observer: Any) -> None:
        """Detach an observer attached with :meth:`register_observer`."""
        self._observers.unregister(observer)


def run_observed(
    observer: Any,
    snapshot: Callable[[], dict[str, TaskState]],
    run: Callable[[Callable[[], None] | None], None],
    *,
    interval_seconds: float = 0.5,
) -> None:
    """Call ``run(on_block)`` with ``observer`` told about it (the serial loop's progress).

    ``on_block`` is None without an observer; otherwise the loop calls it after every block
    and it sends ``on_progress`` at most once per ``interval_seconds``. ``on_start`` comes
    first, and a last ``on_progress`` and ``on_finish`` come even when ``run`` raises.
    """
    if observer is None:
        run(None)
        return
    throttle = ProgressThrottle(interval_seconds)

    def on_block() -> None:
        if throttle.should_fire(time.monotonic(), True):
            safe_notify(observer, "on_progress", snapshot())

    safe_notify(observer, "on_start", snapshot())
    try:
        run(on_block)
    finally:
        states = snapshot()
        safe_notify(observer, "on_progress", states)
        safe_notify(observer, "on_finish", states)
