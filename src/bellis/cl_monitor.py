"""daisy 1.x's command-line progress monitor: ``CLMonitor(server)``.

``from daisy.cl_monitor import CLMonitor`` (volara, older daisy scripts) works on bellis::

    server = bellis.SerialServer()          # or bellis.Server()
    CLMonitor(server)                       # attaches itself; keeping a reference is optional
    server.run_blockwise(tasks)             # shows one progress bar per task

The monitor attaches itself to the server (``server.register_observer``) and is told about
every later run of that server. It shows bellis's own progress display on stderr: one tqdm
bar per task when stderr is a terminal, plain rate-limited ``[bellis] task: ...`` lines
otherwise. It takes the place of the server's default display, and serial runs, which show
no progress by themselves, show it too. The end-of-run summary is the server's, as always.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from ._run._progress import (
    PlainProgressObserver,
    ProgressObserver,
    TqdmObserver,
    progress_interval,
)
from ._state import TaskState

__all__ = ["CLMonitor"]


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class CLMonitor:
    """A command-line progress monitor attached to ``server`` (daisy 1.x's ``CLMonitor``).

    ``server`` is a :class:`bellis.Server` or :class:`bellis.SerialServer` (anything with
    ``register_observer``). ``stream`` defaults to ``sys.stderr``, looked up at each run;
    ``min_interval_seconds`` spaces the plain lines written when it is not a terminal
    (default: ``BELLIS_PROGRESS_INTERVAL``, else 30 s, as ``run_blockwise``'s own).
    """

    def __init__(
        self,
        server: Any,
        stream: IO[str] | None = None,
        *,
        min_interval_seconds: float | None = None,
    ) -> None:
        register = getattr(server, "register_observer", None)
        if not callable(register):
            raise TypeError(
                "CLMonitor(server): server must be a bellis Server or SerialServer (an object "
                f"with register_observer()), got {type(server).__name__}"
            )
        if min_interval_seconds is None:
            min_interval_seconds = progress_interval()
        if min_interval_seconds < 0:
            raise ValueError(
                f"min_interval_seconds must not be negative, got {min_interval_seconds}"
            )
        self.server = server
        self._stream = stream
        self._interval = min_interval_seconds
        self._display: ProgressObserver | None = None
        register(self)

    def _new_display(self, states: dict[str, TaskState]) -> ProgressObserver:
        stream = self._stream if self._stream is not None else sys.stderr
        order = list(states)
        if _is_terminal(stream):
            return TqdmObserver(order, file=stream)
        return PlainProgressObserver(order, stream=stream, min_interval_seconds=self._interval)

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._display = self._new_display(states)
        self._display.on_start(states)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        if self._display is None:
            self.on_start(states)
            return
        self._display.on_progress(states)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        display, self._display = self._display, None
        if display is None:
            display = self._new_display(states)
        display.on_finish(states)
