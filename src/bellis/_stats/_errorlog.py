"""``errors.jsonl``: one JSON line per failed block attempt, written by the driver, bounded.

Every failed attempt of a block (it raised, set ``BlockStatus.FAILED``, timed out, stalled,
ran out of memory, or its worker was lost) is one *record*: the block's id and grid
coordinate, the attempt number and time, the failure ``kind``, the exception's type,
message, innermost frame and traceback (capped at :data:`MAX_TRACEBACK_BYTES`), the worker,
host, pid and launcher job it ran on, and the worker's log files with the byte offsets of
the attempt's lines. With a tracking store the file lies beside ``runs.jsonl`` in the
store (zarr readers ignore it); without one, in the task's log folder.

Bounded: :class:`ErrorLog` writes full records for the first :data:`FULL_PER_ERROR`
attempts of each distinct error (type, message, innermost frame) of a task in a run, and
after that only *count* lines (``"count": n``, cumulative, written when the count reaches
a power of two and when the run ends), so a million identical failures write kilobytes.
A task's distinct errors are capped too (:data:`MAX_KEYS`; further ones fold into one).

Crash safety: each line is appended with one ``write`` on an ``O_APPEND`` descriptor; a
torn last line (a crash mid-write) is terminated before the next line is appended and
skipped by :func:`read_errors`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..errors import TrackingError

__all__ = [
    "ERRORS_FILE",
    "FULL_PER_ERROR",
    "MAX_TRACEBACK_BYTES",
    "ErrorCount",
    "ErrorGroupRecord",
    "ErrorLog",
    "ErrorRecord",
    "LogReader",
    "attempt_logs",
    "cap_text",
    "format_messages",
    "frame_of_traceback",
    "group_errors",
    "group_key",
    "group_title",
    "line_number",
    "line_numbers",
    "log_excerpt",
    "read_errors",
    "records_of_run",
]

logger = logging.getLogger("bellis")

#: the file's name, beside ``runs.jsonl``
ERRORS_FILE: Final = "errors.jsonl"
#: full records per distinct error of a task in a run; further attempts are counted
FULL_PER_ERROR: Final = 10
#: a record's traceback keeps at most this many bytes (its end, where the error is)
MAX_TRACEBACK_BYTES: Final = 64 * 1024
#: distinct errors per task in a run; further ones are counted under one key
MAX_KEYS: Final = 1000
#: bytes of full records per task in a run; past it, every error is only counted
MAX_FULL_BYTES: Final = 16 * 1024 * 1024
#: block coordinates a count line names
SAMPLE_BLOCKS: Final = 10
#: the key of the errors past :data:`MAX_KEYS`
OTHER_KEY: Final = ("(further distinct errors)", "", "")
_VERSION: Final = 1


def cap_text(text: str, limit: int = MAX_TRACEBACK_BYTES) -> str:
    """``text`` with at most ``limit`` UTF-8 bytes: its end, after a marker line."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    tail = data[-limit:].decode("utf-8", "ignore")
    return "... (traceback truncated) ...\n" + tail[tail.find("\n") + 1 :]


def _summary_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One failed attempt of one block, as ``errors.jsonl`` holds it.

    ``coord`` is the block's cell in the tracking grid (the coordinate ``bellis status``
    and :meth:`TaskReport.block` take), or its block-grid index when the task has no store
    (``grid`` is always the block-grid index). ``kind`` is one of ``raised``, ``status
    FAILED``, ``timeout``, ``stalled``, ``out of memory``, ``lost worker``, ``error``.
    ``log`` / ``log_offset`` are the worker's ``.err`` file and the byte offset of the
    attempt's first line there; ``out_log`` / ``out_offset`` its ``.out`` file and the
    offset where the attempt's output ended. Fields not known are None.
    """

    task_id: str
    block_id: int
    coord: tuple[int, ...]
    attempt: int
    time: float
    kind: str
    type: str | None
    message: str
    where: str | None
    traceback: str
    grid: tuple[int, ...] = ()
    worker_id: int | None = None
    host: str | None = None
    pid: int | None = None
    job_id: str | None = None
    log: str | None = None
    log_offset: int | None = None
    out_log: str | None = None
    out_offset: int | None = None
    run: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """The distinct error: (type or kind, message, innermost frame)."""
        return error_key(self.raw)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ErrorRecord:
        def opt_int(v: Any) -> int | None:
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        def opt_str(v: Any) -> str | None:
            return v if isinstance(v, str) else None

        return cls(
            task_id=str(d.get("task", "")),
            block_id=int(d.get("block", -1)),
            coord=tuple(int(x) for x in d.get("coord") or ()),
            attempt=int(d.get("attempt", 0)),
            time=float(d.get("time", 0.0)),
            kind=str(d.get("kind", "error")),
            type=opt_str(d.get("type")),
            message=str(d.get("message", "")),
            where=opt_str(d.get("where")),
            traceback=str(d.get("traceback", "")),
            grid=tuple(int(x) for x in d.get("grid") or ()),
            worker_id=opt_int(d.get("worker")),
            host=opt_str(d.get("host")),
            pid=opt_int(d.get("pid")),
            job_id=opt_str(d.get("job")),
            log=opt_str(d.get("log")),
            log_offset=opt_int(d.get("log_offset")),
            out_log=opt_str(d.get("out_log")),
            out_offset=opt_int(d.get("out_offset")),
            run=d.get("run") if isinstance(d.get("run"), int | float) else None,
            raw=dict(d),
        )


def error_key(d: Mapping[str, Any]) -> tuple[str, str, str]:
    """A record's distinct error: (exception type, or the failure kind without one; the
    message; the innermost frame)."""
    key = d.get("key")
    if isinstance(key, list) and len(key) == 3:
        return (str(key[0]), str(key[1]), str(key[2]))
    return (
        str(d.get("type") or d.get("kind") or "error"),
        str(d.get("message") or ""),
        str(d.get("where") or ""),
    )


# ----------------------------------------------------------------------- grouping
#
# One rule, wherever errors are listed (the end-of-run summary, ``bellis status --failed``,
# the report's Failures section, ``TaskReport.error_groups``): an error is grouped by its
# exception type and the innermost frame that raised it (file:line), so that one raise
# whose message varies (``ValueError(f"bad data at {x}")``) is one group, listing its
# messages with their counts. An error without a frame (a timeout, a lost worker, a block
# that set ``BlockStatus.FAILED``) is grouped by its kind and message.

#: messages listed per group (the rest are counted)
SHOWN_MESSAGES: Final = 3


def group_key(type_: str, message: str, where: str | None) -> tuple[str, str]:
    """The group an error (type or kind, message, innermost frame) is listed under."""
    return (type_, "at " + where) if where else (type_, message)


def frame_of_traceback(text: str) -> str | None:
    """The innermost frame a formatted traceback names, as the worker's details name it
    (``"/path/f.py:12 in process"``); None when the text names no frame."""
    i = text.rfind('File "')
    if i < 0:
        return None
    line = text[i + 6 :].split("\n", 1)[0]
    path, sep, rest = line.partition('", line ')
    if not sep:
        return None
    number, sep, name = rest.partition(", in ")
    if not (number.isdigit() and sep):
        return None
    return f"{path}:{number} in {name.strip()}"


def group_title(type_: str, messages: Sequence[tuple[str, int]]) -> str:
    """A group's headline: ``ValueError: bad data`` for one message, else
    ``ValueError (12 distinct messages)``."""
    if len(messages) == 1:
        return f"{type_}: {messages[0][0]}" if messages[0][0] else type_
    return f"{type_} ({len(messages)} distinct messages)"


def format_messages(messages: Sequence[tuple[str, int]], shown: int = SHOWN_MESSAGES) -> str:
    """The first ``shown`` messages of a group with their counts of failed attempts:
    ``"bad data at 3" (2), "bad data at 7" (2) and 10 more``."""
    parts = [f"{m!r} ({n})" if m else f"(no message) ({n})" for m, n in messages[:shown]]
    text = ", ".join(parts)
    if len(messages) > shown:
        text += f" and {len(messages) - shown} more"
    return text


# ----------------------------------------------------------------------- writing


def _append(fd: int, data: bytes) -> None:
    """One line, in one ``write`` (a short write, rare on a regular file, goes on)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class ErrorCount:
    """One distinct error of an :class:`ErrorLog`: its attempts so far, the count its
    last count line wrote, and its sample blocks."""

    __slots__ = ("count", "counting", "key", "kind", "log", "samples", "written")

    def __init__(self, log: ErrorLog, key: tuple[str, str, str], kind: str) -> None:
        self.log = log
        self.key = key
        self.count = 0
        self.written = 0  # the count of the last count line
        self.kind = kind
        self.samples: list[list[int]] = []
        #: its attempts are only counted now: its full records and samples are done with
        self.counting = False

    def again(self) -> bool:
        """Count one more attempt of this error, if it is only counted now (else False:
        the attempt needs :meth:`ErrorLog.add`). The driver's dispatcher does the same
        inline for a run whose blocks keep failing the same way: ``count`` up by one, and
        :meth:`write_line` when it reaches a power of two."""
        if not self.counting:
            return False
        n = self.count = self.count + 1
        if not n & (n - 1):  # a power of two: bounded lines
            self.write_line()
        return True

    def write_line(self) -> None:
        """Write this error's count line now (cumulative: the latest one counts)."""
        self.log._write_count(self.key, self, self.log._task)


class ErrorLog:
    """The appender of one task's ``errors.jsonl`` for one run (see the module docstring).

    The file is opened at the first record; :meth:`close` writes the final counts. A
    file that cannot be written is logged once, and the run goes on without it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: float,
        *,
        full_per_error: int = FULL_PER_ERROR,
        max_keys: int = MAX_KEYS,
    ) -> None:
        self.path = Path(path)
        self.run = run
        self.full_per_error = full_per_error
        self.max_keys = max_keys
        self._fd: int | None = None
        self._broken = False
        self._keys: dict[tuple[str, str, str], ErrorCount] = {}
        #: the error texts, without details, of errors that are only counted now
        self._texts: dict[str, ErrorCount] = {}
        self._full_bytes = 0
        self._task: Any = None

    def _open(self) -> int | None:
        if self._fd is not None or self._broken:
            return self._fd
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags, 0o644)
            size = os.fstat(fd).st_size
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                _append(fd, b"\n")  # a torn last line must not swallow the next one
        except OSError as exc:
            self._fail(exc)
            return None
        self._fd = fd
        return fd

    def _fail(self, exc: OSError) -> None:
        self._broken = True
        logger.error("cannot write the error records %s: %s", self.path, exc)

    def _write(self, obj: Mapping[str, Any]) -> int:
        fd = self._open()
        if fd is None:
            return 0
        data = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
        try:
            _append(fd, data)
        except OSError as exc:
            self._fail(exc)
            return 0
        return len(data)

    def add(self, record: dict[str, Any], text: str | None = None) -> ErrorCount | None:
        """Write one failed attempt: in full while its error is among the first
        :data:`FULL_PER_ERROR` attempts, else as a count. ``text``: the attempt's error
        text, where its error is a function of that text alone (no details name it);
        :meth:`repeat` then counts the next attempts with that text. Returns the error's
        :class:`ErrorCount` once it is only counted (its :meth:`ErrorCount.again` counts
        the next attempt), else None."""
        key = error_key(record)
        state = self._keys.get(key)
        if state is None:
            if len(self._keys) >= self.max_keys:
                key = OTHER_KEY
                state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = ErrorCount(self, key, str(record.get("kind", "error")))
        if self._task is None:
            self._task = record.get("task")
        state.count += 1
        coord = record.get("coord")
        if isinstance(coord, list) and len(state.samples) < SAMPLE_BLOCKS:
            state.samples.append(coord)
        full = (
            key != OTHER_KEY
            and state.count <= self.full_per_error
            and self._full_bytes < MAX_FULL_BYTES
        )
        if full:
            record["traceback"] = cap_text(str(record.get("traceback", "")))
            self._full_bytes += self._write({"v": _VERSION, "run": self.run, **record})
            state.written = state.count
            return None
        # no later attempt of this error is written in full: once its samples are taken
        # too, repeat() counts them without a record
        state.counting = len(state.samples) >= SAMPLE_BLOCKS
        if text is not None and len(self._texts) < self.max_keys:
            self._texts[text] = state
        if state.count & (state.count - 1) == 0:  # a power of two: bounded lines
            self._write_count(key, state, record.get("task"))
        return state if state.counting else None

    def repeat(self, text: str, details: Mapping[str, Any] | None) -> bool:
        """Count one failed attempt of an error that is only counted now, and return
        True; False when the attempt needs :meth:`add` (its error is not counted yet, or
        its block may still be a sample). ``details``: what the worker said, which names
        the error by its ``type``, ``message`` and ``where``; without them, the error is
        found by its ``text`` (see :meth:`add`). The per-attempt path of a run whose
        blocks keep failing the same way: a lookup and an increment."""
        if details is None:
            state = self._texts.get(text)
        elif details.get("type"):
            message = details.get("message")
            if message is None:
                return False
            state = self._keys.get((details["type"], message, details.get("where") or ""))
        elif details.get("message") is None and not details.get("where"):
            state = self._texts.get(text)  # the details say where, not what
        else:
            return False
        return state is not None and state.again()

    def _write_count(self, key: tuple[str, str, str], state: ErrorCount, task: Any) -> None:
        self._write(
            {
                "v": _VERSION,
                "run": self.run,
                "task": task,
                "key": list(key),
                "kind": state.kind,
                "count": state.count,
                "blocks": state.samples,
            }
        )
        state.written = state.count

    def close(self, task_id: str) -> None:
        """Write the final count of every error that went past its full records."""
        for key, state in self._keys.items():
            if state.count != state.written:
                self._write_count(key, state, task_id)
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:  # the lines are written; only their durability is unsure
                logger.warning(
                    "errors.jsonl: fsync failed (%s); its lines may not survive a crash", exc
                )
            os.close(self._fd)
            self._fd = None


# ----------------------------------------------------------------------- reading


def read_errors(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every valid line of an ``errors.jsonl`` (a folder: the one in it), oldest first;
    [] when there is none. A torn or invalid line is skipped."""
    p = Path(path)
    if p.is_dir():
        p = p / ERRORS_FILE
    try:
        raw = p.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:  # there, but unreadable: "none recorded" would be false
        raise TrackingError(
            f"cannot read the error records {p}: {exc}; check its permissions", path=str(p)
        ) from exc
    out: list[dict[str, Any]] = []
    for line in raw.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(d, dict) and d.get("v") == _VERSION:
            if b"\\ud" in line or b"\\uD" in line:  # maybe a lone surrogate: escape it
                d = _valid_utf8(d)
            out.append(d)
    return out


def _valid_utf8(value: Any) -> Any:
    """``value`` (from JSON) with every string valid UTF-8: a lone surrogate, which a
    record of an older bellis may hold (an error message about an undecodable file
    name), escaped as ``\\udcff`` so that printing it cannot fail."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_valid_utf8(k): _valid_utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_utf8(v) for v in value]
    return value


def records_of_run(lines: Sequence[Mapping[str, Any]], run: float | None = None) -> list[Any]:
    """The lines of run ``run`` (None: the last run in ``lines``)."""
    if run is None:
        runs = [d.get("run") for d in lines if d.get("run") is not None]
        if not runs:
            return list(lines)
        run = runs[-1]
    return [d for d in lines if d.get("run") == run]


@dataclass
class ErrorGroupRecord:
    """One distinct error of a task: every attempt it ended, from the records and counts."""

    task_id: str
    #: the first error of the group: (type or kind, message, innermost frame)
    key: tuple[str, str, str]
    kind: str
    count: int
    blocks: list[tuple[int, ...]]
    first: ErrorRecord | None
    records: list[ErrorRecord]
    #: its messages with their failed attempts, in the order first seen
    messages: list[tuple[str, int]] = field(default_factory=list)

    @property
    def title(self) -> str:
        """``ValueError: bad data``, or ``ValueError (12 distinct messages)``."""
        return group_title(self.key[0], self.messages or [(self.key[1], self.count)])

    def to_json(self) -> dict[str, Any]:
        first = self.first
        return {
            "task": self.task_id,
            "type": self.key[0],
            "message": self.key[1],
            "messages": [{"message": m, "count": n} for m, n in self.messages],
            "where": self.key[2] or None,
            "kind": self.kind,
            "count": self.count,
            "blocks": [list(b) for b in self.blocks],
            "traceback": None if first is None else first.traceback,
            "log": None if first is None else first.log,
            "log_offset": None if first is None else first.log_offset,
            "first": None if first is None else dict(first.raw),
        }


def group_errors(lines: Iterable[Mapping[str, Any]]) -> list[ErrorGroupRecord]:
    """Group records and count lines by task and :func:`group_key` (type and innermost
    frame), in the order first seen, each group with its messages and their counts.

    A distinct error's count is the larger of its full records and its last count line
    (count lines are cumulative within a run); runs add up."""
    groups: dict[tuple[str, tuple[str, str]], ErrorGroupRecord] = {}
    group_of: dict[tuple[str, tuple[str, str, str]], ErrorGroupRecord] = {}
    counted: dict[tuple[str, tuple[str, str, str], Any], int] = {}
    full: dict[tuple[str, tuple[str, str, str], Any], int] = {}
    for d in lines:
        task = str(d.get("task", ""))
        key = error_key(d)
        g = group_of.get((task, key))
        if g is None:
            gk = (task, group_key(*key))
            g = groups.get(gk)
            if g is None:
                g = groups[gk] = ErrorGroupRecord(
                    task, key, str(d.get("kind", "error")), 0, [], None, []
                )
            group_of[(task, key)] = g
        run_key = (task, key, d.get("run"))
        if "count" in d:
            counted[run_key] = max(counted.get(run_key, 0), int(d.get("count") or 0))
            for b in d.get("blocks") or ():
                c = tuple(int(x) for x in b)
                if c not in g.blocks and len(g.blocks) < SAMPLE_BLOCKS:
                    g.blocks.append(c)
            continue
        rec = ErrorRecord.from_json(d)
        g.records.append(rec)
        if g.first is None:
            g.first = rec
        full[run_key] = full.get(run_key, 0) + 1
        if rec.coord not in g.blocks and len(g.blocks) < SAMPLE_BLOCKS:
            g.blocks.append(rec.coord)
    per_message: dict[int, dict[str, int]] = {}
    for run_key in dict.fromkeys([*full, *counted]):
        task, key, _run = run_key
        g = group_of[(task, key)]
        n = max(full.get(run_key, 0), counted.get(run_key, 0))
        g.count += n
        messages = per_message.setdefault(id(g), {})
        messages[key[1]] = messages.get(key[1], 0) + n
    out = list(groups.values())
    for g in out:
        g.messages = list(per_message.get(id(g), {}).items())
    return out


def line_number(path: str | os.PathLike[str], offset: int) -> int | None:
    """The 1-based line at byte ``offset`` of ``path``; None when it cannot be read."""
    return line_numbers(path, [offset])[offset]


def line_numbers(path: str | os.PathLike[str], offsets: Iterable[int]) -> dict[int, int | None]:
    """The 1-based line at each byte offset of ``path``, from one pass over the file up to
    the last of them (an offset past its end: the line after its last); None for each
    when it cannot be read."""
    wanted = sorted(set(offsets))
    out: dict[int, int | None] = {}
    try:
        with open(path, "rb") as f:
            n, pos = 1, 0
            for offset in wanted:
                while pos < offset:
                    chunk = f.read(min(offset - pos, 1 << 20))
                    if not chunk:
                        break
                    n += chunk.count(b"\n")
                    pos += len(chunk)
                out[offset] = n
    except OSError:
        return dict.fromkeys(wanted)
    return out


class LogReader:
    """The worker log files that many attempts point into, read once each: the line
    numbers of all their offsets in a file come from one pass over it (at its first
    use), and the excerpts from a seek to each offset. What :func:`attempt_logs` reads
    for one attempt, for many (the report's embedded attempts, ``bellis status``):
    counting lines from a huge log's start once per attempt would read it per attempt."""

    def __init__(self, records: Iterable[ErrorRecord] = ()) -> None:
        self._wanted: dict[str, set[int]] = {}
        for r in records:
            if r.log is not None and r.log_offset is not None:
                self._wanted.setdefault(r.log, set()).add(r.log_offset)
        self._lines: dict[str, dict[int, int | None]] = {}

    def line(self, path: str, offset: int) -> int | None:
        """The 1-based line at byte ``offset`` of ``path`` (:func:`line_number`)."""
        lines = self._lines.get(path)
        if lines is None:
            wanted = self._wanted.get(path, set()) | {offset}
            lines = self._lines[path] = line_numbers(path, wanted)
        elif offset not in lines:  # not among the records given: one more pass
            lines.update(line_numbers(path, [offset]))
        return lines[offset]

    def logs(
        self,
        record: ErrorRecord,
        *,
        err_lines: int = 40,
        out_lines: int = 10,
        max_bytes: int = 16384,
    ) -> dict[str, Any]:
        """``record``'s ``log_line``, ``log_lines`` and ``out_lines`` (see
        :func:`attempt_logs`)."""
        log_line: int | None = None
        log_lines: list[str] = []
        out: list[str] = []
        if record.log is not None and record.log_offset is not None:
            log_line = self.line(record.log, record.log_offset)
            log_lines = log_excerpt(
                record.log, record.log_offset, max_lines=err_lines, max_bytes=max_bytes
            )
        if record.out_log is not None and record.out_offset is not None and out_lines > 0:
            out = log_excerpt(
                record.out_log,
                record.out_offset,
                before=True,
                max_lines=out_lines,
                max_bytes=max_bytes,
            )
        return {"log_line": log_line, "log_lines": log_lines, "out_lines": out}


def log_excerpt(
    path: str | os.PathLike[str],
    offset: int,
    *,
    before: bool = False,
    max_lines: int = 40,
    max_bytes: int = 16384,
) -> list[str]:
    """Lines of ``path`` from byte ``offset`` on (``before``: the last lines before it),
    at most ``max_lines`` and ``max_bytes``; a run separator or a worker's header line
    ends the excerpt. [] when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            if before:
                start = max(0, offset - max_bytes)
                f.seek(start)
                data = f.read(offset - start)
            else:
                f.seek(offset)
                data = f.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if before:
        if offset - max_bytes > 0 and lines:
            lines = lines[1:]  # the first may be cut
        kept: list[str] = []
        for line in reversed(lines):
            if _is_boundary(line):
                break
            kept.append(line)
        return list(reversed(kept))[-max_lines:]
    out: list[str] = []
    for i, line in enumerate(lines):
        if i and _is_boundary(line):
            break
        out.append(line)
        if len(out) >= max_lines:
            break
    return out


def attempt_logs(
    record: ErrorRecord,
    *,
    err_lines: int = 40,
    out_lines: int = 10,
    max_bytes: int = 16384,
) -> dict[str, Any]:
    """What the worker's log files say about one attempt, read at its recorded offsets:
    ``log_line`` (the 1-based line of the attempt's first line in its ``.err`` file),
    ``log_lines`` (at most ``err_lines`` lines of ``.err`` from there on) and
    ``out_lines`` (the last ``out_lines`` lines of ``.out`` before the attempt ended).
    Missing or unreadable files give None and []. ``bellis status --block`` and the
    HTML report's block details both show these; for many attempts, a
    :class:`LogReader` reads each file once."""
    return LogReader().logs(record, err_lines=err_lines, out_lines=out_lines, max_bytes=max_bytes)


def _is_boundary(line: str) -> bool:
    return line.startswith("=== bellis run ") or line.startswith("=== bellis worker ")
