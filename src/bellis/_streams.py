"""The standard streams as they are when bellis writes to them.

bellis keeps no reference to ``sys.stdout`` or ``sys.stderr``. Whoever replaces them
(``contextlib.redirect_stdout``, pytest's ``capsys``, a notebook kernel, a logging
framework) gets what bellis prints while their stream is in place, so every writer looks
the stream up when it writes:

* the execution summary and the panel: :func:`print_to_stdout`;
* progress bars, which tqdm would bind to one stream object for the bar's life:
  :class:`StreamInForce`, a stand-in that forwards each call to ``sys.stderr`` as it is then;
* worker output echoed in log mode ``"both"``: the launcher's tee threads write it with
  :func:`write_to_stream`.

A stream that is None (``pythonw``, or code that set ``sys.stdout = None`` to silence
output) receives nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any, Literal

__all__ = [
    "StdoutHandler",
    "StreamInForce",
    "StreamName",
    "print_to_stdout",
    "stream_in_force",
    "write_to_stream",
]

StreamName = Literal["stdout", "stderr"]


def stream_in_force(name: StreamName) -> IO[str] | None:
    """``sys.stdout`` or ``sys.stderr`` as it is now (None where there is none)."""
    stream: IO[str] | None = getattr(sys, name)
    return stream


def write_to_stream(name: StreamName, text: str) -> None:
    """Write ``text`` to ``sys.<name>`` as it is now, then flush; nothing where it is None."""
    stream = stream_in_force(name)
    if stream is None:
        return
    stream.write(text)
    stream.flush()


def print_to_stdout(text: str) -> None:
    """Print ``text`` and a newline to ``sys.stdout`` as it is now, then flush.

    The summary and the panel go here: a ``redirect_stdout`` around ``run_blockwise``, a
    test's ``capsys`` or a notebook cell sees them. (Worker output never sits on the
    driver's ``sys.stdout``: serial runs redirect it only while a block function runs.)
    """
    write_to_stream("stdout", text + "\n")


class StreamInForce:
    """A text stream that forwards every call to ``sys.<name>`` as it is at that call.

    For writers that keep the stream object they are given (tqdm keeps it for the bar's
    life): a ``redirect_stderr`` that starts or ends while a bar is open moves the bar with
    it. Attributes other than ``write`` and ``flush`` (``encoding``, ``isatty()``,
    ``fileno()``...) are those of the stream in force.
    """

    def __init__(self, name: StreamName) -> None:
        self._name: StreamName = name

    def write(self, text: str) -> int:
        stream = stream_in_force(self._name)
        if stream is None:
            return len(text)
        return stream.write(text)

    def flush(self) -> None:
        stream = stream_in_force(self._name)
        if stream is not None:
            stream.flush()

    def isatty(self) -> bool:
        stream = stream_in_force(self._name)
        return stream is not None and bool(stream.isatty())

    def __getattr__(self, attribute: str) -> Any:
        stream = stream_in_force(self._name)
        if stream is None:
            raise AttributeError(f"sys.{self._name} is None, so it has no {attribute!r}")
        return getattr(stream, attribute)

    def __repr__(self) -> str:
        return f"<StreamInForce sys.{self._name}>"


class StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A logging handler that writes to ``sys.stdout`` as it is at each record (the way
    Python's last-resort handler uses ``sys.stderr``), not the one in force when the
    handler was made."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)

    @property  # type: ignore[override,unused-ignore]
    def stream(self) -> IO[str] | None:
        return sys.stdout
