"""The failed attempts of each task, grouped by distinct error: what the dispatcher
records as blocks fail, and what the execution summary and the reports list.

An error is one exception type raised at one line (``_errorlog.group_key``), or, without
a frame, one error text. The groups are bounded: at most :data:`MAX_GROUPS_PER_TASK` per
task (the rest fold into one), :data:`MAX_BLOCK_IDS_PER_GROUP` block ids per group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errorlog import ErrorCount, frame_of_traceback, group_key

__all__ = [
    "MAX_BLOCK_IDS_PER_GROUP",
    "MAX_GROUPS_PER_TASK",
    "MAX_MESSAGES_PER_GROUP",
    "OTHER_ERRORS_SUMMARY",
    "ErrorCollector",
    "ErrorGroup",
    "error_summary_line",
]

#: Block ids kept per error group; further blocks are only counted.
MAX_BLOCK_IDS_PER_GROUP = 1000
#: Distinct errors kept per task; further distinct errors are folded into one group.
MAX_GROUPS_PER_TASK = 100
#: Messages counted per error group; further messages are counted under one.
MAX_MESSAGES_PER_GROUP = 100
#: Summary line of the group that collects errors beyond :data:`MAX_GROUPS_PER_TASK`.
OTHER_ERRORS_SUMMARY = "(further distinct errors, not listed individually)"


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
