"""Where a task's last run report lives, and how ``task.report()`` finds it.

A run appends its report line to the task's store (``runs.jsonl``), else to the task's
log folder; with neither (no store, file logging off) only this process keeps it, in
memory. A line that could not be appended (a full disk) is also kept here, so that this
process's ``task.report()`` returns the newest run, not the file's older last line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .. import logging as blog
from .._tracking import is_s3_url, open_readonly, s3_url
from ._reports import TaskReport
from ._runlog import append_run_line, read_last_run

__all__ = ["append_report", "load_task_report", "read_report", "remember_report"]

logger = logging.getLogger("bellis")

#: run lines of runs in this process, for tasks whose report has nowhere else to live
_MEMORY_REPORTS: dict[str, dict[str, Any]] = {}
#: the newest run line of each runs.jsonl this process failed to append to, by path: what
#: ``task.report()`` returns in this process instead of the file's older last line
_UNWRITTEN: dict[str, dict[str, Any]] = {}


def remember_report(task_id: str, data: dict[str, Any]) -> None:
    """Keep the run line of ``task_id``'s run in this process (its last resort)."""
    _MEMORY_REPORTS[task_id] = data


def append_report(path: Path, data: dict[str, Any]) -> None:
    """Append a run line; a file that cannot be written costs the report on disk, not the
    run's outcome (which is being returned or raised): the error is logged, and this
    process's ``task.report()`` still returns the line."""
    try:
        append_run_line(path, data)
    except OSError as exc:
        _UNWRITTEN[str(path)] = data
        logger.error(
            "could not append this run's report to %s: %s. task.report() returns it in "
            "this process only",
            path,
            exc,
        )
    else:
        _UNWRITTEN.pop(str(path), None)


def read_report(path: Path) -> dict[str, Any] | None:
    """The newest run line for ``path``: one this process failed to append, else the
    file's last line."""
    unwritten = _UNWRITTEN.get(str(path))
    if unwritten is not None:
        return unwritten
    return read_last_run(path) if path.exists() else None


def load_task_report(task: Any) -> TaskReport | None:
    """The last run line of ``task``: from its store, else from its log folder, else (no
    store and file logging off) from the copy a run in this process kept in memory."""

    path = task.resolved_tracking_path()
    if path is not None and is_s3_url(path):  # the runs' objects, merged (docs/cloud.md)
        with open_readonly(path) as store:
            data = read_report(Path(store.runs_jsonl))
        return None if data is None else TaskReport(data, s3_url(path))
    if path is not None:
        data = read_report(path / "runs.jsonl")
        return None if data is None else TaskReport(data, path)
    base = blog.get_log_basedir()
    if base is not None and blog.get_log_mode() != "console":
        data = read_report(Path(base) / blog.task_log_dirname(task.task_id) / "runs.jsonl")
        return None if data is None else TaskReport(data, None)
    data = _MEMORY_REPORTS.get(task.task_id)
    return None if data is None else TaskReport(data, None)
