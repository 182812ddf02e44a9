"""What a failed attempt says about itself for the driver's error records
(``errors.jsonl``, :mod:`bellis._stats._errorlog`): taken on the failure path only.

:func:`log_offsets` is called before the failure's lines are written: where the
attempt's lines start in the worker's ``.err`` file, and where its ``.out`` output ends.
:func:`failure_details` adds the exception's type, message, innermost frame and full
traceback (capped), the host, the pid and the launcher's job id (SLURM job or array task,
``BELLIS_JOB_ID`` set by a launcher such as Dask's). The details travel as the second
item of a failed block's error field, ``[text, details]`` (``bellis._protocol``).

Bounded like the records they become: a client sends the details of the first
:data:`FULL_PER_ERROR` failures of each distinct error (:class:`Repeats`), which are as
many as the driver writes in full. Later failures of that error go home as their text
alone (a block that set ``FAILED``) or with only the error's key (``type``, ``message``,
``where``): the driver only counts them, and a worker that fails every block pays no log
offsets, host or traceback copy per block.

Every string a failure carries is valid UTF-8 (:func:`clean`): a message with lone
surrogates (a file name with undecodable bytes) goes with them escaped (``\\udcff``), or
msgpack could not send it and ``errors.jsonl`` could not be printed.

Nothing here runs for a block that succeeds.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import traceback
from types import TracebackType
from typing import Any

from .._protocol import JOB_ID_ENV

__all__ = [
    "FRAME_BUDGET",
    "FULL_PER_ERROR",
    "STATUS_FAILED_TEXT",
    "Repeats",
    "clean",
    "error_key",
    "failure_details",
    "failure_field",
    "fit",
    "job_id",
    "log_offsets",
    "repeat_field",
    "status_failed",
]

_MAX_TRACEBACK_BYTES = 64 * 1024
_MAX_MESSAGE_CHARS = 2000
_host: str | None = None

#: failures of one distinct error a client sends with their details; at least the driver's
#: full records per error (``bellis._stats._errorlog.FULL_PER_ERROR``, a test checks it)
FULL_PER_ERROR = 10
#: distinct errors a client counts; past them, every failure of a new one goes in full
_MAX_ERRORS = 1000
#: the error text of a block whose function set ``BlockStatus.FAILED``
STATUS_FAILED_TEXT = "block status set to FAILED"


def clean(text: str) -> str:
    """``text`` as valid UTF-8: lone surrogates escaped (``\\udcff``); ``text`` itself
    when it is already valid (the common case costs one scan)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class Repeats:
    """How many failures of each distinct error a client has sent with their details
    (see the module docstring). One per client: its counts mean "the driver has these"
    only for the connection they went over."""

    __slots__ = ("_sent",)

    def __init__(self) -> None:
        self._sent: dict[Any, int] = {}

    def full(self, key: Any) -> bool:
        """Whether this failure of ``key`` goes with its details; counts it."""
        sent = self._sent
        n = sent.get(key, 0)
        if n >= FULL_PER_ERROR:
            return False
        if n or len(sent) < _MAX_ERRORS:
            sent[key] = n + 1
        return True


def _host_name() -> str:
    global _host
    if _host is None:
        try:
            _host = socket.gethostname()
        except OSError:
            _host = "?"
    return _host


def job_id() -> str | None:
    """The launcher's job of this process: ``BELLIS_JOB_ID``, else SLURM's array task
    (``123_4``) or job (``123``); None outside a job."""
    env = os.environ
    named = env.get(JOB_ID_ENV)
    if named:
        return named
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return env.get("SLURM_JOB_ID") or None


def _position(stream: Any) -> tuple[str | None, int | None]:
    """The file behind ``stream`` and its end offset, its buffer flushed; (None, None)
    for a terminal, a pipe or a stream without a descriptor."""
    if stream is None:
        return None, None
    try:
        stream.flush()
        fd = stream.fileno()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None  # a terminal or a pipe: no file to point into
        offset = os.lseek(fd, 0, os.SEEK_END)
    except (OSError, ValueError, AttributeError):
        return None, None
    # the file's name, looked up once per open file (a readlink of /proc costs more than
    # the rest: a worker that fails every block would pay it per block)
    known = _paths.get(fd)
    if known is not None and known[0] == (st.st_dev, st.st_ino):
        return known[1], offset
    path: str | None = None
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = getattr(stream, "name", None)
        path = name if isinstance(name, str) and not name.startswith("<") else None
    if path is not None and not os.path.isfile(path):
        return None, None
    _paths[fd] = ((st.st_dev, st.st_ino), path)
    return path, offset


#: fd -> ((device, inode), path) of the log files the failures point into
_paths: dict[int, tuple[tuple[int, int], str | None]] = {}


def log_offsets(out: Any = None, err: Any = None) -> dict[str, Any]:
    """``log``/``log_offset`` (the ``.err`` file and where the next line starts) and
    ``out_log``/``out_offset`` (the ``.out`` file and where its output ends so far), of
    ``out`` and ``err`` (default: this process's stdout and stderr)."""
    err_path, err_off = _position(sys.stderr if err is None else err)
    out_path, out_off = _position(sys.stdout if out is None else out)
    details: dict[str, Any] = {}
    if err_path is not None:
        details["log"] = err_path
        details["log_offset"] = err_off
    if out_path is not None:
        details["out_log"] = out_path
        details["out_offset"] = out_off
    return details


def _innermost(tb: TracebackType | None) -> str | None:
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"


def failure_details(
    exc: BaseException | None, full_traceback: str | None, offsets: dict[str, Any]
) -> dict[str, Any]:
    """The details of a failed attempt (see the module docstring); ``offsets`` from
    :func:`log_offsets`. Never raises."""
    details: dict[str, Any] = dict(offsets)
    details["host"] = _host_name()
    details["pid"] = os.getpid()
    job = job_id()
    if job is not None:
        details["job"] = job
    if exc is not None:
        type_name, message, where = error_key(exc)
        details["type"] = type_name
        details["message"] = message
        if where is not None:
            details["where"] = where
        text = full_traceback
        if text is None:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        data = clean(text).encode("utf-8")
        if len(data) > _MAX_TRACEBACK_BYTES:
            data = data[-_MAX_TRACEBACK_BYTES:]
        details["traceback"] = data.decode("utf-8", "ignore")
    return details


def error_key(exc: BaseException) -> tuple[str, str, str | None]:
    """``exc``'s distinct error as its details name it: (type, message, innermost frame),
    each valid UTF-8. Never raises."""
    try:
        message = clean(str(exc)[:_MAX_MESSAGE_CHARS])
    except Exception:
        message = "<an exception that could not be formatted>"
    where = _innermost(exc.__traceback__)
    return type(exc).__qualname__, message, None if where is None else clean(where)


def repeat_field(text: str, key: tuple[str, str, str | None]) -> list[Any]:
    """The error field of a failure whose error went home in full :data:`FULL_PER_ERROR`
    times already: its text and the error's key, which is all the driver counts it by."""
    details: dict[str, Any] = {"type": key[0], "message": key[1]}
    if key[2] is not None:
        details["where"] = key[2]
    return [clean(text), details]


def failure_field(
    text: str,
    offsets: dict[str, Any] | None = None,
    exc: BaseException | None = None,
    full_traceback: str | None = None,
) -> list[Any]:
    """A failed block's error field on the wire: ``[text, details]``; ``offsets`` default
    to the logs' positions now."""
    if offsets is None:
        offsets = log_offsets()
    return [clean(text), failure_details(exc, full_traceback, offsets)]


#: the characters of failure fields one frame home may carry: the server drops a frame over
#: ``MAX_CLIENT_FRAME_BYTES`` (1 MiB), and a worker that catches its blocks' errors sends a
#: whole batch of failures (up to 64) in one request. Past it, a failure goes without its
#: detailed traceback (the record keeps the capped one, which the text is), then with
#: only the last KiB of its text and message.
FRAME_BUDGET = 256 * 1024
_TAIL = 1024


def _size(field: list[Any]) -> int:
    text, details = field
    return 64 + len(text) + sum(len(v) for v in details.values() if isinstance(v, str))


def fit(field: list[Any], used: int) -> int:
    """Shrink ``field`` (``[text, details]``, in place) so that the failures of one frame,
    ``used`` characters so far, stay within :data:`FRAME_BUDGET`; returns its size."""
    size = _size(field)
    if used + size <= FRAME_BUDGET:
        return size
    details = field[1]
    details.pop("traceback", None)
    size = _size(field)
    if used + size <= FRAME_BUDGET:
        return size
    field[0] = field[0][-_TAIL:]
    for key in ("message", "where"):
        value = details.get(key)
        if isinstance(value, str):
            details[key] = value[-_TAIL:]
    return _size(field)


def status_failed(repeats: Repeats | None = None) -> Any:
    """The error field of a block whose function set ``BlockStatus.FAILED``: in full, or
    its text alone once ``repeats`` sent it in full :data:`FULL_PER_ERROR` times."""
    if repeats is not None and not repeats.full(STATUS_FAILED_TEXT):
        return STATUS_FAILED_TEXT
    return failure_field(STATUS_FAILED_TEXT)


def render_traceback() -> tuple[str, str]:
    """The exception being handled, as the user's log settings render it (bellis's own
    frames dropped): in full for the log, and capped for the server."""
    from ..logging import cap_traceback, format_traceback

    full = format_traceback(*sys.exc_info())
    return full, cap_traceback(full)
