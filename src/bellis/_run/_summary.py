"""What a run prints when it ends: the execution summary, its error groups and the resume
notice.

Everything here works on :class:`~bellis._state.TaskState` snapshots and never touches the
scheduler. The server feeds an :class:`ErrorCollector` with every failed attempt and at the
end prints :func:`format_summary` to ``sys.stdout`` as it is then (:mod:`bellis._streams`);
the runner logs :func:`resume_message` for a task that skipped blocks. The progress
observers, which report while the run goes, are in :mod:`bellis._run._progress`.

Status symbols (one per task, in the summary and on the progress bars):

* ``✗``: at least one block failed permanently;
* ``∅``: otherwise, at least one block was orphaned by an upstream failure;
* ``…``: otherwise, some block is still pending, ready or processing (daisy 2.0.0 ignored
  ``ready`` here, so an interrupted run could show ``✔``);
* ``✔``: every block completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bellis._donemarks import BlockStore
from bellis._scheduling._abandon import is_broken_reason
from bellis._scheduling._task_run import DONE, FAILED
from bellis._state import DEFAULT_TIMEOUT_SECONDS, TaskState
from bellis._stats._errorlog import (
    ERRORS_FILE,
    ErrorCount,
    ErrorLog,
    format_messages,
    frame_of_traceback,
    group_key,
)
from bellis.logging import get_log_basedir, get_log_mode, task_log_dirname

__all__ = [
    "ErrorCollector",
    "ErrorGroup",
    "error_logs",
    "error_summary_line",
    "format_summary",
    "ordered_task_ids",
    "resume_message",
    "settle_errors",
    "status_symbol",
]

#: Block ids kept per error group; further blocks are only counted.
MAX_BLOCK_IDS_PER_GROUP = 1000
#: Distinct errors kept per task; further distinct errors are folded into one group.
MAX_GROUPS_PER_TASK = 100
#: Block ids printed per error group in the summary.
SHOWN_BLOCK_IDS = 10
#: Error groups printed in full (with their traceback) per task in the summary.
SHOWN_GROUPS = 5
#: Messages counted per error group; further messages are counted under one.
MAX_MESSAGES_PER_GROUP = 100
#: Blocks named per error group in the line of blocks done after a retry.
SHOWN_RETRIED_IDS = 5
#: Summary line of the group that collects errors beyond :data:`MAX_GROUPS_PER_TASK`.
OTHER_ERRORS_SUMMARY = "(further distinct errors, not listed individually)"

_INDENT = "    "
_DETAIL_INDENT = "      "
_UPSTREAM_ABANDONED = "upstream task abandoned"
_SKIP_KINDS = ("done markers", "skip mask", "check function")


# --------------------------------------------------------------------------------------------
# status and order (the progress bars show them too)


def status_symbol(state: TaskState) -> str:
    """Return the task's status symbol (see the module docstring)."""
    if state.failed_count > 0:
        return "✗"
    if state.orphaned_count > 0:
        return "∅"
    if state.pending_count > 0 or state.ready_count > 0 or state.processing_count > 0:
        return "…"
    return "✔"


def ordered_task_ids(states: Mapping[str, TaskState], task_order: Sequence[str]) -> list[str]:
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
    """Every failed attempt of one task that ended with one error: one exception type
    raised at one line (``_errorlog.group_key``: the innermost frame of the traceback), or,
    without a frame, one error text.

    ``summary`` is the first error's last non-empty line (exception type and message),
    ``traceback`` the first traceback seen, ``block_ids`` the distinct blocks it hit in the
    order first seen (at most :data:`MAX_BLOCK_IDS_PER_GROUP`), ``count`` every failed
    attempt, ``log_path`` the worker log the first one was recorded in, ``messages`` each
    message's failed attempts, ``where`` the raising frame. After :meth:`ErrorCollector.
    settle`, ``done_ids`` holds the blocks that were done after all (a later attempt
    succeeded) and ``open_ids`` those neither done nor failed (an interrupted or
    abandoned run): the rest of ``block_ids`` failed for good.
    """

    summary: str
    traceback: str
    block_ids: list[int] = field(default_factory=list)
    count: int = 0
    log_path: str | None = None
    #: the error text (no details) of this group's last error that its task's error log
    #: only counts now, and that error's count there (``ErrorLog``; its ``counting`` is
    #: True for good): the next attempt with the same text, no details and no server-side
    #: kind is counted from here (:meth:`ErrorCollector.counted`, and the dispatcher's
    #: ``record_error`` inline)
    repeat_text: str | None = field(default=None, repr=False, compare=False)
    repeat_count: ErrorCount | None = field(default=None, repr=False, compare=False)
    type: str = field(default="", compare=False)
    where: str | None = field(default=None, compare=False)
    messages: dict[str, int] = field(default_factory=dict, compare=False)
    #: per kept block: its tracking-grid coordinate (where known) and its failed attempts
    coords: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    attempts: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    indices: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    done_ids: set[int] = field(default_factory=set, repr=False, compare=False)
    open_ids: set[int] = field(default_factory=set, repr=False, compare=False)

    #: per kept block, its messages and their failed attempts
    block_messages: dict[int, dict[str, int]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def title(self) -> str:
        """The summary line of its one message, else ``ValueError (12 distinct messages)``."""
        return self.title_of(list(self.messages.items()))

    def title_of(self, messages: list[tuple[str, int]]) -> str:
        """The title of some of its attempts, whose ``messages`` are given."""
        if self.summary == OTHER_ERRORS_SUMMARY or not messages:
            return self.summary
        if len(messages) == 1:
            message = messages[0][0]
            return f"{self.type}: {message}" if self.type and message else self.type or message
        at_least = "at least " if len(self.messages) >= MAX_MESSAGES_PER_GROUP else ""
        return f"{self.type or 'error'} ({at_least}{len(messages)} distinct messages)"

    def messages_of(self, ids: Sequence[int]) -> list[tuple[str, int]]:
        """The messages of the failed attempts of blocks ``ids``, with their counts, in the
        order first seen (all of the group's where it hit more blocks than it keeps)."""
        if len(self.block_ids) >= MAX_BLOCK_IDS_PER_GROUP:
            return list(self.messages.items())
        counts: dict[str, int] = {}
        for sid in ids:
            for message, n in self.block_messages.get(sid, {}).items():
                counts[message] = counts.get(message, 0) + n
        return [(m, counts[m]) for m in self.messages if m in counts]

    def unfinished(self) -> bool:
        """Whether any of its blocks is not done (or its blocks are not all known)."""
        return len(self.done_ids) < len(self.block_ids) or (
            len(self.block_ids) >= MAX_BLOCK_IDS_PER_GROUP
        )


def _split_summary(summary: str) -> tuple[str, str]:
    """``("ValueError", "bad data")`` of ``"ValueError: bad data"``; ``("", text)`` for a
    line that names no exception type."""
    head, sep, rest = summary.partition(": ")
    if sep and head and all(part.isidentifier() for part in head.split(".")):
        return head, rest
    if summary and all(part.isidentifier() for part in summary.split(".")):
        return summary, ""
    return "", summary


def error_summary_line(traceback_text: str) -> str:
    """Return the last non-empty line of a traceback: ``"ValueError: boom"``."""
    # per failed attempt: the last line found without splitting the whole text, when it
    # holds no other line boundary than "\n" (isprintable: none of splitlines' others)
    last = traceback_text.rstrip().rpartition("\n")[2]
    if last and last.isprintable():
        return last.strip()
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
        #: each task's error record appender (``bellis._stats._errorlog.ErrorLog``)
        self.sinks: dict[str, Any] = {}

    def record(
        self, record: dict[str, Any], text: str | None = None, group: ErrorGroup | None = None
    ) -> None:
        """One failed attempt's error record (``bellis._scheduling._attempts``): stamped
        and appended to its task's ``errors.jsonl``, where the task has one. ``text``:
        the error text its error is known by, if by its text alone (``ErrorLog.add``);
        ``group``: the attempt's group (:meth:`add`), which keeps that text for
        :meth:`counted` once the error is only counted."""
        sink = self.sinks.get(record.get("task", ""))
        if sink is not None:
            record.setdefault("time", round(time.time(), 6))
            count = sink.add(record, text)
            if group is not None and text is not None and count is not None:
                group.repeat_text, group.repeat_count = text, count

    def counted(
        self,
        task_id: str,
        text: str,
        details: dict[str, Any] | None,
        group: ErrorGroup | None = None,
    ) -> bool:
        """True when a failed attempt of ``task_id`` needs no record built: the task
        keeps none, or its error is only counted now and this counted it
        (``ErrorLog.repeat``). Else the caller builds the record for :meth:`record`.

        ``group``: the attempt's group, from :meth:`add` just before. A run whose blocks
        keep failing the same way finds its error there, by its text: the per-attempt
        path touches the group, which :meth:`add` just did, and the count."""
        if details is None and group is not None and group.repeat_text == text:
            count = group.repeat_count
            if count is not None:
                return count.again()
        sink = self.sinks.get(task_id)
        return sink is None or sink.repeat(text, details)

    def close_sinks(self) -> None:
        """Write the final counts of the error records and close their files."""
        for task_id, sink in self.sinks.items():
            sink.close(task_id)
        self.sinks = {}

    def add(
        self,
        task_id: str,
        spatial_id: int,
        traceback_text: str,
        log_path: str | Path | None = None,
        *,
        index: int | None = None,
        coord: Sequence[int] | None = None,
    ) -> ErrorGroup:
        """Record one failed attempt of block ``spatial_id`` (its index ``index`` in the
        task's block grid, for :meth:`settle`; ``coord`` its tracking-grid coordinate, for
        the summary to name it by); return its group."""
        summary = error_summary_line(traceback_text)
        type_, message = _split_summary(summary)
        where = frame_of_traceback(traceback_text)
        key = "\0".join(group_key(type_, message, where))
        groups = self._groups.get(task_id)
        if groups is None:
            groups = self._groups[task_id] = {}
        group = groups.get(key)
        if group is None:
            if len(groups) >= self._max_groups:
                key = summary = OTHER_ERRORS_SUMMARY
                type_, where = "", None
                group = groups.get(key)
            if group is None:
                text = "" if summary == OTHER_ERRORS_SUMMARY else traceback_text.rstrip("\n")
                group = ErrorGroup(summary=summary, traceback=text, type=type_, where=where)
                groups[key] = group
        group.count += 1
        if message in group.messages or len(group.messages) < MAX_MESSAGES_PER_GROUP:
            group.messages[message] = group.messages.get(message, 0) + 1
        if group.log_path is None and log_path is not None:
            group.log_path = str(log_path)
        if len(group.block_ids) < MAX_BLOCK_IDS_PER_GROUP:  # else: no set work per attempt
            seen = self._block_sets.setdefault((task_id, key), set())
            if spatial_id not in seen:
                seen.add(spatial_id)
                group.block_ids.append(spatial_id)
                if coord is not None:
                    group.coords[spatial_id] = tuple(int(c) for c in coord)
                if index is not None:
                    group.indices[spatial_id] = index
            group.attempts[spatial_id] = group.attempts.get(spatial_id, 0) + 1
        elif spatial_id in group.attempts:
            group.attempts[spatial_id] += 1
        if spatial_id in group.attempts and message in group.messages:
            per = group.block_messages.setdefault(spatial_id, {})
            per[message] = per.get(message, 0) + 1
        return group

    def settle(self, task_id: str, outcome: Callable[[int], str]) -> None:
        """Sort each group's blocks by how they ended: ``outcome(index)`` is ``"done"``,
        ``"failed"`` or anything else (not finished). A block of unknown index stays
        counted as failed."""
        for group in self._groups.get(task_id, {}).values():
            group.done_ids.clear()
            group.open_ids.clear()
            for sid in group.block_ids:
                k = group.indices.get(sid)
                if k is None:
                    continue
                end = outcome(k)
                if end == "done":
                    group.done_ids.add(sid)
                elif end != "failed":
                    group.open_ids.add(sid)

    def groups(self, task_id: str) -> list[ErrorGroup]:
        """The task's groups in the order their errors first occurred."""
        return list(self._groups.get(task_id, {}).values())

    def task_ids(self) -> list[str]:
        """Ids of the tasks with at least one recorded error."""
        return list(self._groups)

    def as_dict(self) -> dict[str, list[ErrorGroup]]:
        """``{task_id: groups}`` as :func:`format_summary` takes it."""
        return {task_id: self.groups(task_id) for task_id in self._groups}


def settle_errors(errors: ErrorCollector, runs: Sequence[Any]) -> None:
    """Tell ``errors`` how each block of each task run (``TaskRun``) ended, so that the
    summary lists only blocks that failed for good as failed."""
    for run in runs:
        state = run.state_mv

        def outcome(k: int, state: Any = state) -> str:
            code = state[k]
            return "done" if code == DONE else "failed" if code == FAILED else "open"

        errors.settle(run.task_id, outcome)


def error_logs(
    order: Sequence[Any], stores: Mapping[str, BlockStore], run: float
) -> dict[str, Any]:
    """Each task's ``errors.jsonl`` appender: in its store, else in its log folder (none
    in console mode without a store). The files are made at the first failure only."""
    logs: dict[str, Any] = {}
    base = get_log_basedir()
    for t in order:
        store = stores.get(t.task_id)
        if store is not None:
            path = Path(store.runs_jsonl).with_name(ERRORS_FILE)
        elif base is not None and get_log_mode() != "console":
            path = Path(base) / task_log_dirname(t.task_id) / ERRORS_FILE
        else:
            continue
        logs[t.task_id] = ErrorLog(path, run)
    return logs


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
    abandoned: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """Render the Execution Summary (SPEC §6.1); the text has no trailing newline.

    ``abandoned``: per abandoned task, ``_scheduling._abandon.describe``'s words (the rule
    that fired, the option that changes it, whether a rerun gets further).

    ``log_dir`` is the worker-log base directory, or None when no log files were written.
    ``worker_log_dirs`` maps a task to its log directory where it is not
    ``<log_dir>/<task_id>``. ``errors`` comes from :meth:`ErrorCollector.as_dict`; without it
    a failed task shows its ``first_worker_error`` as daisy does.
    """
    ordered = ordered_task_ids(states, task_order)
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
        said = abandoned.get(task_id) if abandoned is not None else None
        section = _failure_section(task_id, states[task_id], groups, said)
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
        backups = _backups_line(task_id, states[task_id])
        if backups:
            lines += ["", backups]
        memory = _memory_line(task_id, states[task_id])
        if memory:
            lines += ["", memory]

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


def _failure_section(
    task_id: str,
    state: TaskState,
    groups: list[ErrorGroup],
    said: Mapping[str, Any] | None = None,
) -> list[str]:
    lines: list[str] = []
    if state.abandoned:
        line = f"{_INDENT}Task '{task_id}' was abandoned"
        if state.abandon_reason:
            line += f" ({state.abandon_reason})"
        if is_broken_reason(state.abandon_reason):
            line += f": {_plural(state.failed_attempt_count, 'failed block attempt')}"
        elif _is_cap_abandoned(state):
            line += (
                f": workers failed {_plural(state.worker_failure_count, 'time')}, "
                f"{_plural(state.worker_restart_count, 'restart')} performed"
            )
        lines.append(line + ".")
        if said is not None and state.abandon_reason != _UPSTREAM_ABANDONED:
            lines.append(f"{_DETAIL_INDENT}The rule that fired: {said['rule']}.")
            lines.append(f"{_DETAIL_INDENT}To change it: {said['option']}.")
            rerun = str(said["rerun"])
            lines.append(f"{_DETAIL_INDENT}{rerun[:1].upper()}{rerun[1:]}.")
    # the errors of blocks that were done after all are not failures: a line of their own
    retried = _retried_lines(task_id, groups)
    if not _has_trouble(state):
        return lines + retried
    listed = [group for group in groups if group.unfinished()]
    if listed:
        lines += _group_lines(task_id, state, listed)
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
    if retried:
        lines += ["", *retried]
    return lines


def _block_name(group: ErrorGroup, block_id: int) -> str:
    """``17 (2, 3)``: the block's id and its tracking-grid coordinate (what ``bellis status
    --block`` takes and the report shows), where known."""
    coord = group.coords.get(block_id)
    if coord is None:
        return str(block_id)
    return f"{block_id} (" + ", ".join(str(c) for c in coord) + ")"


def _retried_lines(task_id: str, groups: list[ErrorGroup]) -> list[str]:
    """``24 blocks done after a retry in task 't':`` and one line per error they had."""
    with_done = [group for group in groups if group.done_ids]
    if not with_done:
        return []
    blocks = set().union(*(group.done_ids for group in with_done))
    capped = any(len(group.block_ids) >= MAX_BLOCK_IDS_PER_GROUP for group in with_done)
    n = ("at least " if capped else "") + _plural(len(blocks), "block")
    lines = [f"{_INDENT}{n} done after a retry in task '{task_id}':"]
    for group in with_done:
        ids = [b for b in group.block_ids if b in group.done_ids]
        attempts = sum(group.attempts.get(b, 0) for b in ids)
        shown = ", ".join(_block_name(group, b) for b in ids[:SHOWN_RETRIED_IDS])
        if len(ids) > SHOWN_RETRIED_IDS:
            shown += f", … and {len(ids) - SHOWN_RETRIED_IDS} more"
        where = f" at {group.where}" if group.where else ""
        lines.append(
            f"{_DETAIL_INDENT}{group.title_of(group.messages_of(ids))}{where} "
            f"({_plural(attempts, 'failed attempt')}; {'block' if len(ids) == 1 else 'blocks'} "
            f"{shown})"
        )
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
        failing = [b for b in group.block_ids if b not in group.done_ids]
        lines.append(_INDENT + group.title_of(group.messages_of(failing)))
        lines += [_DETAIL_INDENT + line for line in _group_detail(group)]
        if group.traceback and group.traceback.strip() != group.summary:
            lines += _indent_block(group.traceback, _DETAIL_INDENT)
    hidden = groups[SHOWN_GROUPS:]
    if hidden:
        attempts = sum(_failed_attempts(group) for group in hidden)
        lines.append("")
        lines.append(
            f"{_INDENT}… and {_plural(len(hidden), 'more distinct error')} "
            f"({_plural(attempts, 'failed attempt')}) — see worker logs"
        )
    return lines


def _failed_attempts(group: ErrorGroup) -> int:
    """The group's failed attempts, less those of its blocks that were done after all."""
    return group.count - sum(group.attempts.get(b, 0) for b in group.done_ids)


def _group_detail(group: ErrorGroup) -> list[str]:
    ids = [b for b in group.block_ids if b not in group.done_ids]
    count = _failed_attempts(group)
    capped = len(group.block_ids) >= MAX_BLOCK_IDS_PER_GROUP
    shown = ", ".join(_block_name(group, block_id) for block_id in ids[:SHOWN_BLOCK_IDS])
    text = ("block " if len(ids) == 1 else "blocks ") + shown
    if len(ids) > SHOWN_BLOCK_IDS or capped:
        rest = len(ids) - SHOWN_BLOCK_IDS
        at_least = "at least " if capped else ""
        text += f", … and {at_least}{max(rest, 0)} more"
    if count != len(ids) or capped:
        text += f" ({_plural(count, 'failed attempt')})"
    out = [text]
    messages = group.messages_of(ids)
    if len(messages) > 1:
        out.append("messages: " + format_messages(messages))
    if group.log_path is not None:
        out.append(f"first recorded in {group.log_path}")
    return out


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


def _backups_line(task_id: str, state: TaskState) -> str | None:
    if state.backups_started <= 0:
        return None
    return (
        f"{_INDENT}{state.backups_started} straggler backup(s) in task '{task_id}': "
        f"{state.backups_won} won (the copy finished first), {state.backups_lost} lost; "
        f"the losing copies ran {state.backup_loser_seconds:.1f}s before they were stopped"
    )


def _memory_line(task_id: str, state: TaskState) -> str | None:
    if state.oom_retry_count <= 0 and state.oom_failure_count <= 0:
        return None
    per = ", ".join(f"{n} with {grant}" for grant, n in state.oom_retries) or "none"
    won = ", ".join(f"{n} with {grant}" for grant, n in state.oom_successes) or "none"
    text = (
        f"{_INDENT}{state.oom_retry_count} block attempt(s) in task '{task_id}' ran out of "
        f"memory and ran again with more ({per}); succeeded after it: {won}"
    )
    if state.oom_failure_count:
        text += (
            f"; {state.oom_failure_count} block(s) ran out at the largest grant and failed "
            "(raise max_memory)"
        )
    return text


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
