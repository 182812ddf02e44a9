"""What a run prints: the execution summary, the resume notice and the progress observers.

Everything here works on :class:`~bellis._state.TaskState` snapshots and never touches the
scheduler. The server feeds an :class:`ErrorCollector` with every failed attempt, calls the
observers through :func:`safe_notify` (throttled by :class:`ProgressThrottle`), and at the end
prints :func:`format_summary` to ``sys.stdout`` as it is then (:mod:`bellis._streams`).
Progress goes to ``sys.stderr``, as tqdm's and daisy's does: users pipe stdout.

Status symbols (one per task, in the summary and on the progress bars):

* ``✗``: at least one block failed permanently;
* ``∅``: otherwise, at least one block was orphaned by an upstream failure;
* ``…``: otherwise, some block is still pending, ready or processing (daisy 2.0.0 ignored
  ``ready`` here, so an interrupted run could show ``✔``);
* ``✔``: every block completed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from bellis._state import TaskState
from bellis._streams import StreamInForce
from bellis.logging import task_log_dirname

__all__ = [
    "ErrorCollector",
    "ErrorGroup",
    "JsonProgressObserver",
    "PlainProgressObserver",
    "ProgressObserver",
    "ProgressThrottle",
    "TqdmObserver",
    "format_summary",
    "make_observer",
    "resume_message",
    "safe_notify",
    "status_symbol",
]

logger = logging.getLogger("bellis")

#: The timeout a task gets when it does not pass one (daisy 2.0.0's default).
DEFAULT_TIMEOUT_SECONDS = 600.0
#: Block ids kept per error group; further blocks are only counted.
MAX_BLOCK_IDS_PER_GROUP = 1000
#: Distinct errors kept per task; further distinct errors are folded into one group.
MAX_GROUPS_PER_TASK = 100
#: Block ids printed per error group in the summary.
SHOWN_BLOCK_IDS = 10
#: Error groups printed in full (with their traceback) per task in the summary.
SHOWN_GROUPS = 5
#: Summary line of the group that collects errors beyond :data:`MAX_GROUPS_PER_TASK`.
OTHER_ERRORS_SUMMARY = "(further distinct errors, not listed individually)"

_INDENT = "    "
_DETAIL_INDENT = "      "
_UPSTREAM_ABANDONED = "upstream task abandoned"
_SKIP_KINDS = ("done markers", "skip mask", "check function")


# --------------------------------------------------------------------------------------------
# shared helpers


def status_symbol(state: TaskState) -> str:
    """Return the task's status symbol (see the module docstring)."""
    if state.failed_count > 0:
        return "✗"
    if state.orphaned_count > 0:
        return "∅"
    if state.pending_count > 0 or state.ready_count > 0 or state.processing_count > 0:
        return "…"
    return "✔"


def _ordered_ids(states: Mapping[str, TaskState], task_order: Sequence[str]) -> list[str]:
    """Ids of ``states`` in ``task_order``, then any others alphabetically."""
    listed = [task_id for task_id in dict.fromkeys(task_order) if task_id in states]
    seen = set(listed)
    return listed + sorted(task_id for task_id in states if task_id not in seen)


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    word = singular if count == 1 else (plural if plural is not None else singular + "s")
    return f"{count} {word}"


def _indent_block(text: str, indent: str) -> list[str]:
    """Indent every non-empty line of ``text``; empty lines stay empty."""
    return [indent + line if line.strip() else "" for line in text.rstrip("\n").splitlines()]


def _skip_breakdown(state: TaskState) -> list[tuple[str, int]]:
    counts = (state.skipped_done_count, state.skipped_mask_count, state.skipped_check_count)
    return [(kind, count) for kind, count in zip(_SKIP_KINDS, counts, strict=True) if count > 0]


# --------------------------------------------------------------------------------------------
# error grouping


@dataclass
class ErrorGroup:
    """Every failed attempt of one task that ended with the same error.

    ``summary`` is the error's last non-empty line (exception type and message),
    ``traceback`` the first traceback seen, ``block_ids`` the distinct blocks it hit in the
    order first seen (at most :data:`MAX_BLOCK_IDS_PER_GROUP`), ``count`` every failed
    attempt, and ``log_path`` the worker log the first one was recorded in.
    """

    summary: str
    traceback: str
    block_ids: list[int] = field(default_factory=list)
    count: int = 0
    log_path: str | None = None


def error_summary_line(traceback_text: str) -> str:
    """Return the last non-empty line of a traceback: ``"ValueError: boom"``."""
    for line in reversed(traceback_text.splitlines()):
        if line.strip():
            return line.strip()
    return "(no error text was captured)"


class ErrorCollector:
    """Groups the failed attempts of each task by distinct error.

    Memory is O(distinct errors): one :class:`ErrorGroup` per distinct summary line, each
    keeping one traceback and at most :data:`MAX_BLOCK_IDS_PER_GROUP` block ids. Past
    ``max_groups_per_task`` distinct errors in a task, new errors are counted in one last
    group whose summary is :data:`OTHER_ERRORS_SUMMARY`.
    """

    def __init__(self, *, max_groups_per_task: int = MAX_GROUPS_PER_TASK) -> None:
        if max_groups_per_task < 1:
            raise ValueError(f"max_groups_per_task must be at least 1, got {max_groups_per_task}")
        self._max_groups = max_groups_per_task
        self._groups: dict[str, dict[str, ErrorGroup]] = {}
        self._block_sets: dict[tuple[str, str], set[int]] = {}

    def add(
        self,
        task_id: str,
        spatial_id: int,
        traceback_text: str,
        log_path: str | Path | None = None,
    ) -> ErrorGroup:
        """Record one failed attempt of block ``spatial_id``; return its group."""
        summary = error_summary_line(traceback_text)
        groups = self._groups.setdefault(task_id, {})
        group = groups.get(summary)
        if group is None:
            if len(groups) >= self._max_groups:
                summary = OTHER_ERRORS_SUMMARY
                group = groups.get(summary)
            if group is None:
                text = "" if summary == OTHER_ERRORS_SUMMARY else traceback_text.rstrip("\n")
                group = ErrorGroup(summary=summary, traceback=text)
                groups[summary] = group
        group.count += 1
        if group.log_path is None and log_path is not None:
            group.log_path = str(log_path)
        seen = self._block_sets.setdefault((task_id, summary), set())
        if spatial_id not in seen and len(group.block_ids) < MAX_BLOCK_IDS_PER_GROUP:
            seen.add(spatial_id)
            group.block_ids.append(spatial_id)
        return group

    def groups(self, task_id: str) -> list[ErrorGroup]:
        """The task's groups in the order their errors first occurred."""
        return list(self._groups.get(task_id, {}).values())

    def task_ids(self) -> list[str]:
        """Ids of the tasks with at least one recorded error."""
        return list(self._groups)

    def as_dict(self) -> dict[str, list[ErrorGroup]]:
        """``{task_id: groups}`` as :func:`format_summary` takes it."""
        return {task_id: self.groups(task_id) for task_id in self._groups}


# --------------------------------------------------------------------------------------------
# the execution summary


def format_summary(
    states: Mapping[str, TaskState],
    task_order: Sequence[str],
    *,
    log_dir: str | Path | None,
    interrupted: bool = False,
    errors: Mapping[str, list[ErrorGroup]] | None = None,
    worker_log_dirs: Mapping[str, str | Path] | None = None,
) -> str:
    """Render the Execution Summary (SPEC §6.1); the text has no trailing newline.

    ``log_dir`` is the worker-log base directory, or None when no log files were written.
    ``worker_log_dirs`` maps a task to its log directory where it is not
    ``<log_dir>/<task_id>``. ``errors`` comes from :meth:`ErrorCollector.as_dict`; without it
    a failed task shows its ``first_worker_error`` as daisy does.
    """
    ordered = _ordered_ids(states, task_order)
    lines: list[str] = []
    if interrupted:
        lines.append("Run interrupted; counts at shutdown:")
    lines += ["", "Execution Summary", "-----------------", ""]
    lines += _table_lines(states, ordered)

    skip_lines = [line for task_id in ordered if (line := _skip_line(task_id, states[task_id]))]
    if skip_lines:
        lines.append("")
        lines += skip_lines

    for task_id in ordered:
        groups = list(errors.get(task_id, [])) if errors is not None else []
        section = _failure_section(task_id, states[task_id], groups)
        if section:
            lines.append("")
            lines += section

    for task_id in ordered:
        timeout = _timeout_line(task_id, states[task_id])
        if timeout:
            lines += ["", timeout]
        stall = _stall_line(task_id, states[task_id])
        if stall:
            lines += ["", stall]

    troubled = [task_id for task_id in ordered if _has_trouble(states[task_id])]
    if troubled and log_dir is not None:
        lines.append("")
        lines += _log_pointer_lines(troubled, log_dir, worker_log_dirs or {})
    return "\n".join(lines)


def _table_lines(states: Mapping[str, TaskState], ordered: list[str]) -> list[str]:
    name_w = max([4, *(len(task_id) for task_id in ordered)]) + 2
    widths = (7, 10, 7, 6, 8)
    titles = ("blocks", "completed", "skipped", "failed", "orphaned")

    def row(first: str, cells: Sequence[str]) -> str:
        parts = [first.ljust(name_w)]
        parts += [cell.rjust(width) for cell, width in zip(cells, widths, strict=True)]
        return _INDENT + "  ".join(parts)

    lines = [row("task", titles), _INDENT + "  ".join("─" * w for w in (name_w, *widths))]
    for task_id in ordered:
        state = states[task_id]
        counts = (
            state.total_block_count,
            state.completed_count,
            state.skipped_count,
            state.failed_count,
            state.orphaned_count,
        )
        lines.append(row(f"{task_id} {status_symbol(state)}", [str(c) for c in counts]))
    return lines


def _skip_line(task_id: str, state: TaskState) -> str | None:
    if state.skipped_count <= 0:
        return None
    line = f"{_INDENT}Skipped: {state.skipped_count} in task '{task_id}'"
    kinds = _skip_breakdown(state)
    if kinds:
        line += " (" + ", ".join(f"{kind} {count}" for kind, count in kinds) + ")"
    return line


def _is_cap_abandoned(state: TaskState) -> bool:
    return state.abandoned and state.abandon_reason != _UPSTREAM_ABANDONED


def _has_trouble(state: TaskState) -> bool:
    return state.failed_count > 0 or _is_cap_abandoned(state)


def _failure_section(task_id: str, state: TaskState, groups: list[ErrorGroup]) -> list[str]:
    lines: list[str] = []
    if state.abandoned:
        line = f"{_INDENT}Task '{task_id}' was abandoned"
        if state.abandon_reason:
            line += f" ({state.abandon_reason})"
        if _is_cap_abandoned(state):
            line += (
                f": workers failed {_plural(state.worker_failure_count, 'time')}, "
                f"{_plural(state.worker_restart_count, 'restart')} performed"
            )
        lines.append(line + ".")
    if not _has_trouble(state):
        return lines
    if groups:
        lines += _group_lines(task_id, state, groups)
    elif state.failed_count > 0:
        lines.append(f"{_INDENT}First failure in task '{task_id}':")
        text = state.first_worker_error or "(no error text was captured)"
        lines += _indent_block(text, _DETAIL_INDENT)
        more = state.failed_count - 1
        if more > 0:
            lines.append(f"{_DETAIL_INDENT}(+ {more} more failed blocks — see worker logs)")
    elif state.last_worker_error:
        lines.append(f"{_INDENT}Last worker error:")
        lines += _indent_block(state.last_worker_error, _DETAIL_INDENT)
    else:
        lines.append(f"{_INDENT}No worker error was captured.")
    return lines


def _group_lines(task_id: str, state: TaskState, groups: list[ErrorGroup]) -> list[str]:
    distinct = _plural(len(groups), "distinct error")
    if state.failed_count > 0:
        failed = _plural(state.failed_count, "block")
        head = f"{_INDENT}{failed} failed in task '{task_id}' with {distinct}:"
    else:
        head = f"{_INDENT}Worker errors in task '{task_id}' ({distinct}):"
    lines = [head]
    for group in groups[:SHOWN_GROUPS]:
        lines.append("")
        lines.append(_INDENT + group.summary)
        lines += [_DETAIL_INDENT + line for line in _group_detail(group)]
        if group.traceback and group.traceback.strip() != group.summary:
            lines += _indent_block(group.traceback, _DETAIL_INDENT)
    hidden = groups[SHOWN_GROUPS:]
    if hidden:
        attempts = sum(group.count for group in hidden)
        lines.append("")
        lines.append(
            f"{_INDENT}… and {_plural(len(hidden), 'more distinct error')} "
            f"({_plural(attempts, 'failed attempt')}) — see worker logs"
        )
    return lines


def _group_detail(group: ErrorGroup) -> list[str]:
    ids = group.block_ids
    shown = ", ".join(str(block_id) for block_id in ids[:SHOWN_BLOCK_IDS])
    text = ("block " if len(ids) == 1 else "blocks ") + shown
    if len(ids) > SHOWN_BLOCK_IDS:
        rest = len(ids) - SHOWN_BLOCK_IDS
        at_least = "at least " if len(ids) >= MAX_BLOCK_IDS_PER_GROUP else ""
        text += f", … and {at_least}{rest} more"
    if group.count != len(ids) or len(ids) >= MAX_BLOCK_IDS_PER_GROUP:
        text += f" ({_plural(group.count, 'failed attempt')})"
    if group.log_path is None:
        return [text]
    return [text, f"first recorded in {group.log_path}"]


def _timeout_line(task_id: str, state: TaskState) -> str | None:
    if state.timeout_reclaim_count <= 0:
        return None
    default = " — the default" if state.timeout_secs == DEFAULT_TIMEOUT_SECONDS else ""
    return (
        f"{_INDENT}{state.timeout_reclaim_count} block attempt(s) in task '{task_id}' exceeded "
        f"the block timeout ({state.timeout_secs:g}s{default}; pass Task(timeout=...) to raise "
        "it for slow blocks)"
    )


def _stall_line(task_id: str, state: TaskState) -> str | None:
    if state.stall_reclaim_count <= 0:
        return None
    return (
        f"{_INDENT}{state.stall_reclaim_count} block attempt(s) in task '{task_id}' stalled: "
        f"no CPU, IO or heartbeat for {state.stall_timeout_secs or 0.0:g}s (stall_timeout; "
        "a block that waits legitimately calls block.heartbeat())"
    )


def _log_pointer_lines(
    troubled: list[str], log_dir: str | Path, worker_log_dirs: Mapping[str, str | Path]
) -> list[str]:
    base = str(log_dir).rstrip("/\\") or str(log_dir)

    def task_dir(task_id: str) -> str:
        explicit = worker_log_dirs.get(task_id)
        if explicit is not None:
            return str(explicit).rstrip("/\\") + "/"
        return f"{base}/{task_log_dirname(task_id)}/"

    if len(troubled) == 1:
        return [f"{_INDENT}See worker logs for details under {task_dir(troubled[0])}"]
    lines = [f"{_INDENT}See worker logs for failed tasks under {base}/"]
    lines += [_DETAIL_INDENT + task_dir(task_id) for task_id in troubled]
    return lines


def resume_message(state: TaskState) -> str | None:
    """The INFO text for a task that skipped blocks, or None when it skipped none.

    ``task 'seg': resumed — 12/12 blocks skipped via done markers (Task.reset() or
    done_marker_path=False reprocesses them)``. The kinds are named as they apply; with more
    than one kind each gets its count.
    """
    if state.skipped_count <= 0:
        return None
    head = (
        f"task '{state.task_id}': resumed — "
        f"{state.skipped_count}/{state.total_block_count} blocks skipped"
    )
    kinds = _skip_breakdown(state)
    if len(kinds) == 1:
        head += f" via {kinds[0][0]}"
    elif kinds:
        head += " via " + ", ".join(f"{kind} ({count})" for kind, count in kinds)
    if state.skipped_done_count > 0 or not kinds:
        head += " (Task.reset() or done_marker_path=False reprocesses them)"
    return head


# --------------------------------------------------------------------------------------------
# observers


@runtime_checkable
class ProgressObserver(Protocol):
    """Anything with these three methods can watch a run (SPEC §1.13)."""

    def on_start(self, states: dict[str, TaskState]) -> None: ...

    def on_progress(self, states: dict[str, TaskState]) -> None: ...

    def on_finish(self, states: dict[str, TaskState]) -> None: ...


_OBSERVER_METHODS = ("on_start", "on_progress", "on_finish")
_warned_observers: weakref.WeakSet[Any] = weakref.WeakSet()
_warned_observer_ids: set[int] = set()


def _first_failure_of(observer: object) -> bool:
    """True the first time ``observer`` fails; afterwards False."""
    try:
        if observer in _warned_observers:
            return False
        _warned_observers.add(observer)
        return True
    except TypeError:
        # not weak-referenceable or not hashable: fall back to its id
        key = id(observer)
        if key in _warned_observer_ids:
            return False
        _warned_observer_ids.add(key)
        return True


def safe_notify(observer: object, method_name: str, states: dict[str, TaskState]) -> bool:
    """Call ``observer.<method_name>(states)``; return True when it did not raise.

    An observer must never break a run: any ``Exception`` is caught and reported once per
    observer as a WARNING on the ``bellis`` logger; later failures of the same observer are
    counted out silently because a broken bar would otherwise warn twice a second.
    """
    try:
        getattr(observer, method_name)(states)
    except Exception as exc:
        if _first_failure_of(observer):
            logger.warning(
                "progress observer %r failed in %s: %s: %s (further errors from this "
                "observer are not reported)",
                observer,
                method_name,
                type(exc).__name__,
                exc,
            )
        return False
    return True


class TqdmObserver:
    """One ``tqdm.auto`` bar per task, created in ``task_order`` (daisy's ``_TqdmObserver``).

    The description is ``"{task_id} {symbol} ♻={restarts}"`` with ``▶`` while running; the
    postfix shows ``⧗`` pending, ``▶`` processing, ``✔`` completed, ``✗`` failed and ``∅``
    orphaned. At finish each bar jumps to its completed count (so an all-skipped run shows
    100 %), takes the task's final symbol and is closed. ``file`` defaults to ``sys.stderr``
    as it is at each write.
    """

    def __init__(self, task_order: Sequence[str], file: IO[str] | None = None) -> None:
        self._task_order = list(task_order)
        self._file = file
        self._bars: dict[str, Any] = {}

    def _bar(self, task_id: str, state: TaskState) -> Any:
        bar = self._bars.get(task_id)
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=state.total_block_count,
                desc=self._describe(task_id, "▶", state),
                unit="block",
                leave=True,
                file=self._file if self._file is not None else StreamInForce("stderr"),
            )
            self._bars[task_id] = bar
        elif bar.total != state.total_block_count:
            bar.total = state.total_block_count
        return bar

    @staticmethod
    def _describe(task_id: str, symbol: str, state: TaskState) -> str:
        return f"{task_id} {symbol} ♻={state.worker_restart_count}"

    @staticmethod
    def _postfix(state: TaskState) -> dict[str, int]:
        return {
            "⧗": state.pending_count,
            "▶": state.processing_count,
            "✔": state.completed_count,
            "✗": state.failed_count,
            "∅": state.orphaned_count,
        }

    def _update(self, states: Mapping[str, TaskState], *, final: bool) -> None:
        for task_id in _ordered_ids(states, self._task_order):
            state = states[task_id]
            bar = self._bar(task_id, state)
            bar.n = state.completed_count
            symbol = status_symbol(state) if final else "▶"
            bar.set_description(self._describe(task_id, symbol, state), refresh=False)
            bar.set_postfix(self._postfix(state), refresh=False)
            bar.refresh()

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._update(states, final=False)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self._update(states, final=False)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        try:
            self._update(states, final=True)
        finally:
            bars, self._bars = self._bars, {}
            for bar in bars.values():
                bar.close()


@dataclass
class _PlainTaskRecord:
    emitted_at: float
    processed: int
    counters: tuple[int, ...] | None = None


class PlainProgressObserver:
    """Plain, rate-limited progress lines for logs that are not a terminal.

    ``[bellis] seg: 1200/5000 done (24.0%), 2 processing, 0 failed, 0 orphaned,
    310.5 blocks/s``. A task gets at most one line per ``min_interval_seconds`` and none when
    its counters did not change since its last line; the first line comes one interval after
    the start. At finish every task gets a last line with its status symbol and its average
    rate. The rate counts processed blocks only (skipped blocks cost nothing). Lines go to
    ``stream``, or to ``sys.stderr`` as it is at each line.
    """

    def __init__(
        self,
        task_order: Sequence[str],
        stream: IO[str] | None = None,
        min_interval_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_interval_seconds < 0:
            raise ValueError(
                f"min_interval_seconds must not be negative, got {min_interval_seconds}"
            )
        self._task_order = list(task_order)
        self._stream = stream
        self._interval = min_interval_seconds
        self._clock = clock
        self._started_at: float | None = None
        self._records: dict[str, _PlainTaskRecord] = {}

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        if stream is None:
            return
        stream.write(line + "\n")
        stream.flush()

    @staticmethod
    def _counters(state: TaskState) -> tuple[int, ...]:
        return (
            state.total_block_count,
            state.ready_count,
            state.processing_count,
            state.completed_count,
            state.skipped_count,
            state.failed_count,
            state.orphaned_count,
            state.worker_restart_count,
        )

    @staticmethod
    def _processed(state: TaskState) -> int:
        return state.completed_count - state.skipped_count + state.failed_count

    def _start_if_needed(self, states: Mapping[str, TaskState], now: float) -> None:
        if self._started_at is None:
            self._started_at = now
        for task_id, state in states.items():
            if task_id not in self._records:
                self._records[task_id] = _PlainTaskRecord(
                    emitted_at=now, processed=self._processed(state), counters=self._counters(state)
                )

    @staticmethod
    def _line(task_id: str, state: TaskState, rate: float, prefix: str = "") -> str:
        total = state.total_block_count
        percent = 100.0 * state.completed_count / total if total else 100.0
        done = f"{state.completed_count}/{total} done ({percent:.1f}%"
        if state.skipped_count:
            done += f", {state.skipped_count} skipped"
        return (
            f"[bellis] {task_id}: {prefix}{done}), {state.processing_count} processing, "
            f"{state.failed_count} failed, {state.orphaned_count} orphaned, "
            f"{rate:.1f} blocks/s"
        )

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._started_at = None
        self._records = {}
        self._start_if_needed(states, self._clock())

    def on_progress(self, states: dict[str, TaskState]) -> None:
        now = self._clock()
        self._start_if_needed(states, now)
        for task_id in _ordered_ids(states, self._task_order):
            state = states[task_id]
            record = self._records[task_id]
            counters = self._counters(state)
            if counters == record.counters or now - record.emitted_at < self._interval:
                continue
            elapsed = now - record.emitted_at
            processed = self._processed(state)
            rate = (processed - record.processed) / elapsed if elapsed > 0 else 0.0
            self._write(self._line(task_id, state, max(rate, 0.0)))
            record.emitted_at = now
            record.processed = processed
            record.counters = counters

    def on_finish(self, states: dict[str, TaskState]) -> None:
        now = self._clock()
        self._start_if_needed(states, now)
        started = self._started_at if self._started_at is not None else now
        elapsed = now - started
        for task_id in _ordered_ids(states, self._task_order):
            state = states[task_id]
            rate = self._processed(state) / elapsed if elapsed > 0 else 0.0
            prefix = f"finished {status_symbol(state)} "
            self._write(self._line(task_id, state, rate, prefix) + " on average")


class JsonProgressObserver:
    """One JSON line per task per event (SPEC §1.13), for dashboards and log scrapers.

    Each line holds ``t`` (``time.time()``), ``event`` (``start``, ``progress`` or
    ``finish``), ``task``, ``total``, ``ready``, ``processing``, ``completed``, ``skipped``,
    ``failed``, ``orphaned``, ``restarts`` and ``failures``. A ``path`` is opened for writing
    (line-buffered) at construction and closed on finish; without one the lines go to
    ``stream``, or to ``sys.stdout`` when neither is given.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        stream: IO[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if path is not None and stream is not None:
            raise ValueError("specify path OR stream, not both")
        self._path = Path(path) if path is not None else None
        self._clock = clock
        self._stream = stream
        self._owned: IO[str] | None = None
        if self._path is not None:
            self._owned = open(self._path, "w", buffering=1, encoding="utf-8")

    def _target(self) -> IO[str]:
        if self._path is not None:
            if self._owned is None or self._owned.closed:
                # a second run through the same observer appends to the first one's lines
                self._owned = open(self._path, "a", buffering=1, encoding="utf-8")
            return self._owned
        return self._stream if self._stream is not None else sys.stdout

    def _emit(self, event: str, states: Mapping[str, TaskState]) -> None:
        target = self._target()
        now = self._clock()
        for task_id, state in states.items():
            record = {
                "t": now,
                "event": event,
                "task": task_id,
                "total": state.total_block_count,
                "ready": state.ready_count,
                "processing": state.processing_count,
                "completed": state.completed_count,
                "skipped": state.skipped_count,
                "failed": state.failed_count,
                "orphaned": state.orphaned_count,
                "restarts": state.worker_restart_count,
                "failures": state.worker_failure_count,
            }
            target.write(json.dumps(record, ensure_ascii=False) + "\n")
        target.flush()

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._emit("start", states)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self._emit("progress", states)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        try:
            self._emit("finish", states)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file opened for ``path``; a no-op for streams."""
        if self._owned is not None and not self._owned.closed:
            self._owned.close()


def _is_observer(obj: object) -> bool:
    return all(callable(getattr(obj, name, None)) for name in _OBSERVER_METHODS)


def make_observer(
    progress: object, task_order: Sequence[str], stream: IO[str] | None = None
) -> ProgressObserver | None:
    """Turn ``run_blockwise``'s ``progress`` argument into an observer, or None.

    ``True`` gives progress bars when ``stream`` (default ``sys.stderr``, where progress
    goes) is a terminal and plain lines otherwise; ``False`` and ``None`` give no observer;
    an object with ``on_start``, ``on_progress`` and ``on_finish`` is used as it is.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        target = stream if stream is not None else sys.stderr
        try:
            is_tty = bool(target.isatty())
        except (AttributeError, ValueError, OSError):
            is_tty = False
        if is_tty:
            return TqdmObserver(task_order, file=stream)
        return PlainProgressObserver(task_order, stream=stream)
    if _is_observer(progress):
        return progress  # type: ignore[return-value]
    raise TypeError(
        "progress must be True, False, None or an observer with on_start(states), "
        f"on_progress(states) and on_finish(states) methods; got {type(progress).__name__}"
    )


class ProgressThrottle:
    """Decides when the run loop calls ``on_progress``: at most once per ``interval``
    seconds, and only when something changed.

    The loop calls :meth:`should_fire` every iteration with its clock and whether the
    counters changed since the last notification; when the run ends it is the caller's job
    to send one final ``on_progress`` if the state is still dirty.
    """

    def __init__(self, interval: float = 0.5) -> None:
        if interval < 0:
            raise ValueError(f"interval must not be negative, got {interval}")
        self.interval = interval
        self._last_fired: float | None = None

    def should_fire(self, now: float, dirty: bool) -> bool:
        """True when a notification is due; the call then counts as one."""
        if not dirty:
            return False
        if self._last_fired is not None and now - self._last_fired < self.interval:
            return False
        self._last_fired = now
        return True
