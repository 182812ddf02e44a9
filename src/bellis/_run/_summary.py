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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bellis._donemarks import BlockStore
from bellis._scheduling._abandon import is_broken_reason
from bellis._state import DEFAULT_TIMEOUT_SECONDS, TaskState
from bellis._stats._errorgroups import (
    MAX_BLOCK_IDS_PER_GROUP,
    ErrorCollector,
    ErrorGroup,
    error_summary_line,
)
from bellis._stats._errorlog import ERRORS_FILE, ErrorLog, format_messages
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

#: Block ids printed per error group in the summary.
SHOWN_BLOCK_IDS = 10
#: Error groups printed in full (with their traceback) per task in the summary.
SHOWN_GROUPS = 5
#: Blocks named per error group in the line of blocks done after a retry.
SHOWN_RETRIED_IDS = 5

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


def settle_errors(errors: ErrorCollector, runs: Sequence[Any]) -> None:
    """Tell ``errors`` how each block of each task run (``TaskRun``) ended, so that the
    summary lists only blocks that failed for good as failed."""
    # here, not at the top: a worker reaches this module through ``JsonProgressObserver``,
    # and ``_task_run`` loads numpy (workers import none unless the user's code does)
    from bellis._scheduling._task_run import DONE, FAILED

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
