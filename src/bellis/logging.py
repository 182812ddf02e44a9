"""Where worker output goes and how tracebacks read (daisy's ``daisy.logging``).

Worker processes write their stdout and stderr to ``<basedir>/<task dir>/worker_<slot>.out``
and ``.err``; the default basedir is ``./daisy_logs`` as in daisy. A task's slots are numbered
0, 1, ... as in daisy: a worker takes the lowest slot no live worker of its task holds, so a
replacement appends to the files of the worker it replaces, after a header line that names
it. The mode decides whether that output goes to those files (``"file"``, the default), to
the terminal only (``"console"``) or to both (``"both"``). ``set_log_basedir(None)`` means
console mode with no files at all.

The settings are process-global. Workers are started with the ``spawn`` method, so they do
not inherit them: the server sends :func:`export_settings` along and each worker calls
:func:`apply_settings` before running user code.

bellis installs no handler on its ``bellis`` logger; WARNING and above reach stderr through
Python's last-resort handler until the application configures logging.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from bellis.errors import WorkerStartError

__all__ = [
    "LOG_BASEDIR",
    "LOG_MODES",
    "TRACEBACK_STYLES",
    "LogStream",
    "apply_settings",
    "cap_traceback",
    "clear_logs",
    "close_all_log_files",
    "current_slot_files",
    "emit_failure",
    "export_settings",
    "format_traceback",
    "get_log_basedir",
    "get_log_level",
    "get_log_mode",
    "get_traceback_style",
    "get_worker_log_basename",
    "guard_std_streams",
    "logger",
    "open_worker_log",
    "set_log_basedir",
    "set_log_level",
    "set_log_mode",
    "set_traceback_style",
    "task_log_dirname",
    "warn_if_log_disk_full",
]

LOG_MODES = ("console", "file", "both")
TRACEBACK_STYLES = ("plain", "rich")
#: The default log directory, relative to the working directory (daisy's).
DEFAULT_LOG_BASEDIR = Path("./daisy_logs")
#: :func:`cap_traceback` keeps at most this many trailing lines ...
MAX_TRACEBACK_LINES = 50
#: ... and at most this many trailing bytes (UTF-8).
MAX_TRACEBACK_BYTES = 8192
TRUNCATION_MARKER = "... (traceback truncated) ..."

_LOGGER_NAME = "bellis"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IPYTHON_FILE = re.compile(r'"?<ipython-input-(\d+)-[^>]*>"?')
# the longest directory name task_log_dirname() produces before it shortens with a hash
_MAX_DIRNAME_BYTES = 200
_WINDOWS_RESERVED = frozenset('<>:"|?*')
# end of a run: a log filesystem with less than this free is reported as full
_LOW_DISK_BYTES = 1 << 20


#: The log basedir, daisy's global: :func:`set_log_basedir` sets it, and a script that
#: assigns it (``bellis.logging.LOG_BASEDIR = path``) is obeyed, as in daisy.
LOG_BASEDIR: Path | None = DEFAULT_LOG_BASEDIR


class _Settings:
    """The module's mutable state, in one place so that export/apply cover all of it."""

    def __init__(self) -> None:
        self.basedir = DEFAULT_LOG_BASEDIR
        self.mode = "file"
        self.traceback_style = "plain"
        self.show_locals = False
        self.width = 100
        self.extra_lines = 2

    @property
    def basedir(self) -> Path | None:
        # kept in the LOG_BASEDIR global, daisy's one place for it
        value: Any = LOG_BASEDIR
        return value if value is None or isinstance(value, Path) else Path(value)

    @basedir.setter
    def basedir(self, path: Path | None) -> None:
        global LOG_BASEDIR
        LOG_BASEDIR = path


_settings = _Settings()


# --------------------------------------------------------------------------------------------
# directory and mode


def set_log_basedir(path: str | os.PathLike[str] | None) -> None:
    """Set the directory worker logs go under; None turns log files off (console mode)."""
    _settings.basedir = None if path is None else Path(path)


def get_log_basedir() -> Path | None:
    """The directory worker logs go under, or None in console mode."""
    return _settings.basedir


def set_log_mode(mode: str) -> None:
    """Choose ``"file"`` (default), ``"console"`` or ``"both"`` for worker output."""
    if mode not in LOG_MODES:
        raise ValueError(f"mode must be one of {LOG_MODES}, got {mode!r}")
    _settings.mode = mode


def get_log_mode() -> str:
    """The log mode in effect: always ``"console"`` while the basedir is None."""
    if _settings.basedir is None:
        return "console"
    return _settings.mode


def set_log_level(level: int | str) -> None:
    """Set the level of the ``bellis`` logger (an int or a name such as ``"INFO"``)."""
    logging.getLogger(_LOGGER_NAME).setLevel(level)


def get_log_level() -> int:
    """The level set on the ``bellis`` logger (0, NOTSET, until one is set)."""
    return logging.getLogger(_LOGGER_NAME).level


def task_log_dirname(task_id: str) -> str:
    """The directory name of a task's logs: the id itself wherever that is safe.

    ``%`` is written ``%25`` so that the escapes below stay unambiguous; ``/``, ``\\`` and
    NUL are written ``%2F``, ``%5C`` and ``%00``, and a leading ``.`` as ``%2E`` (no hidden
    directories, no ``..``). On Windows the characters it forbids in names are escaped the
    same way. The empty id becomes ``%``. Names longer than 200 bytes keep a readable prefix
    and end in ``%~`` plus a hash of the id. Distinct ids give distinct names.
    """
    if task_id == "":
        return "%"
    reserved = _WINDOWS_RESERVED if os.name == "nt" else frozenset()
    pieces: list[str] = []
    for index, char in enumerate(task_id):
        code = ord(char)
        if (
            char in "%/\\\0"
            or (index == 0 and char == ".")
            or char in reserved
            or (code < 32 and os.name == "nt")
        ):
            pieces.append(f"%{code:02X}")
        else:
            pieces.append(char)
    name = "".join(pieces)
    if len(name.encode("utf-8", "surrogatepass")) <= _MAX_DIRNAME_BYTES:
        return name
    import hashlib  # long task ids only: a worker never loads OpenSSL for its logs

    digest = hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    prefix: list[str] = []
    size = 0
    for piece in pieces:
        size += len(piece.encode("utf-8", "surrogatepass"))
        if size > _MAX_DIRNAME_BYTES - 18:
            break
        prefix.append(piece)
    return "".join(prefix) + "%~" + digest


def get_worker_log_basename(worker_id: int, task_id: str | None = None) -> Path | None:
    """``<basedir>/[<task dir>/]worker_<id>``, or None when no log files are written.

    As in daisy, ``worker_id`` here is the worker's log slot within its task (see the
    module docstring), which the worker records and the panel name for each worker.
    """
    basedir = _settings.basedir
    if basedir is None or get_log_mode() == "console":
        return None
    directory = basedir if task_id is None else basedir / task_log_dirname(task_id)
    return directory / f"worker_{worker_id}"


def clear_logs(task_id: str | None = None) -> Path | None:
    """Delete the logs of one task, or of every task; return the directory removed.

    Returns None in console mode (no basedir). A directory that does not exist is not an
    error.
    """
    basedir = _settings.basedir
    if basedir is None:
        return None
    target = basedir if task_id is None else basedir / task_log_dirname(task_id)
    if target.exists():
        import shutil  # the driver's, never a worker's

        shutil.rmtree(target)
    return target


def _run_separator(pid: int) -> str:
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return f"=== bellis run {stamp} pid {pid} ==="


def open_worker_log(
    task_id: str,
    slot: int,
    *,
    pid: int | None = None,
    header: str | None = None,
    new_run: bool = True,
) -> tuple[Path, Path] | None:
    """Prepare ``worker_<slot>.out`` and ``.err`` of a task for appending; return their paths.

    The directory is created as needed. When ``new_run`` (the slot's first worker in this
    run) and a file already holds output from an earlier run, it gets the separator
    ``=== bellis run <ISO-8601 time> pid <pid> ===`` (``pid`` defaults to this process).
    ``header``, a line naming the worker about to write there, is then appended to both
    files. Returns None in console mode. Raises :class:`~bellis.errors.WorkerStartError`
    when the files cannot be written.
    """
    base = get_worker_log_basename(slot, task_id)
    if base is None:
        return None
    paths = (base.with_name(base.name + ".out"), base.with_name(base.name + ".err"))
    separator = _run_separator(os.getpid() if pid is None else pid)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for path in paths:
            lines = [header] if header is not None else []
            _append_log_lines(path, separator if new_run else None, lines)
    except OSError as exc:
        raise WorkerStartError(
            f"cannot create the worker log files under {base.parent}: {exc}", task_id=task_id
        ) from exc
    return paths


def _append_log_lines(path: Path, separator: str | None, lines: list[str]) -> None:
    """Create ``path``; append ``lines``, each on a line of its own, preceded by
    ``separator`` when the file already holds earlier output.

    What does not fit on a full disk is logged: the worker can still run.
    """
    with open(path, "a+b", buffering=0) as handle:
        size = handle.seek(0, os.SEEK_END)
        if size > 0 and separator is not None:
            lines = [separator, *lines]
        if not lines:
            return
        prefix = b""
        if size > 0:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                prefix = b"\n"
            handle.seek(0, os.SEEK_END)
        data = memoryview(prefix + "".join(line + "\n" for line in lines).encode("utf-8"))
        try:
            while data:
                data = data[handle.write(data) or 0 :]
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            logging.getLogger(_LOGGER_NAME).error(
                "cannot write to the worker log %s: %s", path, exc.strerror
            )
            handle.truncate(size)  # drop a partial line


class LogStream:
    """A text stream over a worker log whose write errors (a full disk) cost the output,
    not the code that printed: the first ``OSError`` is kept in :attr:`error` and handed
    to ``on_error``, and everything written after it is dropped."""

    def __init__(
        self, stream: Any, name: str, on_error: Callable[[LogStream], None] | None = None
    ) -> None:
        self._stream = stream
        self.name = name
        self.error: OSError | None = None
        self._on_error = on_error

    def _fail(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
            if self._on_error is not None:
                self._on_error(self)

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                self._stream.write(text)
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.error is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._fail(exc)

    def close(self) -> None:
        try:
            self._stream.close()  # closes the file even when its last flush fails
        except OSError as exc:
            self._fail(exc)

    def __getattr__(self, name: str) -> Any:
        # encoding, fileno(), buffer, isatty()...: those of the stream
        return getattr(self._stream, name)


def _report_dropped(stream: LogStream) -> None:
    # best effort: the other stream may still be writable
    logging.getLogger(_LOGGER_NAME).error(
        "writing this worker's %s failed (%s); its further output there is dropped",
        stream.name,
        stream.error,
    )


def guard_std_streams() -> None:
    """In a worker: make ``sys.stdout`` and ``sys.stderr`` :class:`LogStream` objects, so that a
    full disk under the worker logs does not fail the blocks that print."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, LogStream):
            setattr(sys, name, LogStream(stream, name, _report_dropped))


def warn_if_log_disk_full() -> None:
    """At the end of a run: log an error when the filesystem of the worker logs is full,
    since worker output written after it filled up is lost."""
    base = get_log_basedir()
    if base is None or get_log_mode() == "console":
        return
    try:
        st = os.statvfs(base)
    except OSError:
        return  # no log folder was made: nothing was written there
    if st.f_bavail * st.f_frsize < _LOW_DISK_BYTES:
        logging.getLogger(_LOGGER_NAME).error(
            "the filesystem of the worker logs under %s is full: worker output written "
            "after it filled up is lost",
            base,
        )


def emit_failure(message: str) -> None:
    """Write a failure message to this process's stderr (a worker's ``.err`` file).

    Never raises: reporting a failure must not cause a new one.
    """
    stream = sys.stderr if sys.stderr is not None else sys.__stderr__
    if stream is None:
        return
    try:
        stream.write(message.rstrip("\n") + "\n")
        stream.flush()
    except (OSError, ValueError):
        # stderr is closed or gone; there is nowhere left to report to
        return


# --------------------------------------------------------------------------------------------
# tracebacks


def set_traceback_style(
    style: str, *, show_locals: bool = False, width: int = 100, extra_lines: int = 2
) -> None:
    """Choose how worker tracebacks are rendered: ``"plain"`` or ``"rich"``.

    ``"rich"`` needs the ``rich`` package and raises ImportError without it. ``show_locals``
    adds each frame's local variables (both styles); ``width`` and ``extra_lines`` (source
    lines around each frame) apply to ``"rich"``.
    """
    if style not in TRACEBACK_STYLES:
        raise ValueError(f"style must be 'plain' or 'rich', got {style!r}")
    if style == "rich":
        try:
            import rich.traceback  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "set_traceback_style('rich') needs the `rich` package; install it with "
                "`pip install rich`"
            ) from exc
    if width < 20:
        raise ValueError(f"width must be at least 20, got {width}")
    if extra_lines < 0:
        raise ValueError(f"extra_lines must not be negative, got {extra_lines}")
    _settings.traceback_style = style
    _settings.show_locals = bool(show_locals)
    _settings.width = int(width)
    _settings.extra_lines = int(extra_lines)


def get_traceback_style() -> str:
    """The traceback style in effect: ``"plain"`` or ``"rich"``."""
    return _settings.traceback_style


def _is_internal(tb: TracebackType) -> bool:
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return filename.startswith(_PACKAGE_DIR)


def _strip_internal_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop the leading frames that are bellis's own; keep them all if nothing else is left."""
    current = tb
    while current is not None and _is_internal(current):
        current = current.tb_next
    return current if current is not None else tb


def _rewrite_notebook_names(text: str) -> str:
    return _IPYTHON_FILE.sub(r"[notebook cell \1]", text)


def _format_rich(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> str:
    from rich.console import Console
    from rich.traceback import Traceback

    buffer = io.StringIO()
    console = Console(file=buffer, width=_settings.width, color_system=None, soft_wrap=False)
    rendered = Traceback.from_exception(
        exc_type,
        exc,
        tb,
        width=_settings.width,
        extra_lines=_settings.extra_lines,
        show_locals=_settings.show_locals,
    )
    console.print(rendered)
    return buffer.getvalue()


def format_traceback(
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> str:
    """Render an exception as text for worker logs and the summary. Never raises.

    Leading frames inside bellis itself are dropped so the user's code comes first;
    IPython's ``<ipython-input-N-…>`` file names read ``[notebook cell N]``. The ``"rich"``
    style falls back to plain text should rich fail; should that fail too, the result is at
    least ``"<type>: <message>"``. The exception object is left untouched.
    """
    try:
        if exc_type is None:
            exc_type = type(exc) if exc is not None else type(None)  # type: ignore[assignment]
        stripped = _strip_internal_frames(tb)
        if _settings.traceback_style == "rich" and exc_type is not None and exc is not None:
            try:
                text = _format_rich(exc_type, exc, stripped)
            except Exception:
                # documented fallback: a rich rendering that fails yields the plain one below
                text = ""
            if text:
                return _rewrite_notebook_names(text)
        lines = traceback.TracebackException(
            exc_type,  # type: ignore[arg-type]
            exc,  # type: ignore[arg-type]
            stripped,
            capture_locals=_settings.show_locals,
        ).format()
        return _rewrite_notebook_names("".join(lines))
    except Exception:
        return _last_resort_text(exc_type, exc)


def _last_resort_text(exc_type: object, exc: object) -> str:
    try:
        name = getattr(exc_type, "__name__", None) or type(exc).__name__
        return f"{name}: {exc}"
    except Exception:
        return "<an exception that could not be formatted>"


def cap_traceback(text: str) -> str:
    """Keep the end of a long traceback: the last 50 lines and at most the last 8192 bytes.

    A cut text starts with the line ``... (traceback truncated) ...``. The byte cut keeps
    whole characters and, where the kept part holds a line break, whole lines.
    """
    lines = text.splitlines()
    cut = False
    if len(lines) > MAX_TRACEBACK_LINES:
        lines = lines[-MAX_TRACEBACK_LINES:]
        cut = True
    body = "\n".join(lines)
    encoded = body.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_TRACEBACK_BYTES:
        tail = encoded[-MAX_TRACEBACK_BYTES:].decode("utf-8", "ignore")
        newline = tail.find("\n")
        if newline != -1 and not encoded[-MAX_TRACEBACK_BYTES - 1 :].startswith(b"\n"):
            tail = tail[newline + 1 :]
        body = tail
        cut = True
    if not cut:
        return text
    return TRUNCATION_MARKER + "\n" + body


# --------------------------------------------------------------------------------------------
# handing the settings to spawned workers


def export_settings() -> dict[str, Any]:
    """The settings as a JSON-able dict, for :func:`apply_settings` in a spawned worker.

    A relative basedir is made absolute so that a worker started in another directory
    writes to the same place.
    """
    basedir = _settings.basedir
    return {
        "log_basedir": None if basedir is None else os.path.abspath(basedir),
        "log_mode": _settings.mode,
        "log_level": get_log_level(),
        "traceback_style": _settings.traceback_style,
        "traceback_show_locals": _settings.show_locals,
        "traceback_width": _settings.width,
        "traceback_extra_lines": _settings.extra_lines,
    }


_SETTING_KEYS = frozenset(export_settings())


def apply_settings(settings: Mapping[str, Any]) -> None:
    """Adopt settings made by :func:`export_settings` (in another process); keys may be missing.

    Unknown keys raise ValueError, as do invalid values. A ``"rich"`` style whose package is
    missing here falls back to ``"plain"`` rather than stop the worker.
    """
    unknown = sorted(set(settings) - _SETTING_KEYS)
    if unknown:
        raise ValueError(f"unknown log settings: {', '.join(map(repr, unknown))}")
    if "log_mode" in settings:
        set_log_mode(settings["log_mode"])
    if "log_basedir" in settings:
        set_log_basedir(settings["log_basedir"])
    if "log_level" in settings:
        set_log_level(settings["log_level"])
    style_keys = (
        "traceback_style",
        "traceback_show_locals",
        "traceback_width",
        "traceback_extra_lines",
    )
    if any(key in settings for key in style_keys):
        style = settings.get("traceback_style", _settings.traceback_style)
        options = {
            "show_locals": settings.get("traceback_show_locals", _settings.show_locals),
            "width": settings.get("traceback_width", _settings.width),
            "extra_lines": settings.get("traceback_extra_lines", _settings.extra_lines),
        }
        try:
            set_traceback_style(style, **options)
        except ImportError:
            set_traceback_style("plain", **options)


# --------------------------------------------------------------------------------------------
# daisy's remaining names: logger, current_slot_files(), close_all_log_files()

#: The ``bellis`` logger: bellis's own warnings (a failed block, a lost worker) go through
#: it; :func:`set_log_level` sets its level. daisy's is the ``daisy`` logger.
logger = logging.getLogger(_LOGGER_NAME)

# the (out, err) streams of the worker slot this process runs user code for, if any
_bound_slot_files: tuple[IO[str], IO[str]] | None = None


def current_slot_files() -> tuple[IO[str], IO[str]] | None:
    """The ``(out, err)`` streams of the worker slot the calling code runs in, or None.

    In a worker process these are its stdout and stderr, which lead to the worker's ``.out``
    and ``.err`` files (and, in mode ``"both"``, also to the terminal); in a serial run,
    the open log files of the task. Hand them to a subprocess (``subprocess.run(cmd,
    stdout=out, stderr=err)``) so that its output lands in the worker's logs as it is
    written. None in console mode, and outside worker code (the driver, between blocks).
    """
    if _bound_slot_files is None or get_log_mode() == "console":
        return None
    return _bound_slot_files


def _bind_slot_files(files: tuple[IO[str], IO[str]] | None) -> None:
    """Make ``files`` what :func:`current_slot_files` returns (bellis's worker start-up)."""
    global _bound_slot_files
    _bound_slot_files = files


@contextlib.contextmanager
def _slot_files_bound(out: IO[str], err: IO[str]) -> Iterator[None]:
    """:func:`current_slot_files` returns ``(out, err)`` inside the block (serial runs)."""
    previous = _bound_slot_files
    _bind_slot_files((out, err))
    try:
        yield
    finally:
        _bind_slot_files(previous)


def close_all_log_files() -> None:
    """Flush the worker log streams bound in this process (daisy calls this as a run ends).

    bellis holds no log file open between runs (each run closes the files it opened as it
    ends), so after a run there is nothing left to close. Called from worker code, it
    flushes what the slot's streams buffer so far; they stay open and bound, since they are
    the worker's own stdout and stderr. Safe to call at any time.
    """
    for stream in _bound_slot_files or ():
        try:
            stream.flush()
        except (OSError, ValueError):
            # already closed, or the disk is gone: there is nothing left to flush to
            continue
