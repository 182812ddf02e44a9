"""When a task is given up, and what is said about it, sans I/O.

Theory of operation
-------------------
A block's exception is one failed attempt of that block: the block is retried (within
``Task(max_retries=...)``) and the worker goes on with its next block, once the function
has returned on a block of that worker (a worker whose first block raises ends, as daisy
2.0.0's do: ``bellis._worker._client``). A task is given up (*abandoned*) for one of three
reasons, each named by its own rule:

* **The function looks broken** (``Task(max_consecutive_failures=N)``, default 10,
  ``_task_params.DEFAULT_MAX_CONSECUTIVE_FAILURES``): ``N`` blocks in a row failed, with no block
  done in between. Each block counts once, on its first failed attempt of the run (its
  retries neither count nor break the streak), and a block that already failed in an
  earlier run does not count (a rerun that retries a few known-bad blocks is not a broken
  function). Any block done resets the count. A block lost with its worker (a crash, a
  killed job, a node failure) is a failed attempt of that block but does not count: dead
  workers are the restart cap's to judge. :class:`FailureStreak` keeps that count; the
  scheduler feeds it. ``None`` turns the rule off.
* **The worker restart cap** (``Task(max_worker_restarts=...)``): workers kept dying (a
  crash, a timeout, an exception that left a worker function, a worker's first block
  raising) until no start was left. Staffing decides it (``_staffing``).
* **Upstream task abandoned**: a task it reads from was abandoned.

:func:`describe` turns an abandoned task's run state into the words every place uses (the
``TaskAbandonedError``, the summary, the run line of ``runs.jsonl`` and the report's
advice): the rule that fired, the option that changes it, and whether a rerun can get
further. A rerun runs the blocks never tried before the blocks that failed before
(``Scheduler``), so it gets further exactly when blocks were left that were never tried.
"""

from __future__ import annotations

from typing import Any, Final

# imports nothing of bellis: the summary (which a worker that touches the progress
# observers loads) reads these words, and a worker imports no numpy

__all__ = [
    "RESTART_CAP",
    "UPSTREAM",
    "FailureStreak",
    "broken_reason",
    "describe",
    "is_broken_reason",
]

#: ``TaskState.abandon_reason`` when the restart budget ran out (daisy's words)
RESTART_CAP: Final = "worker restart cap exhausted"
#: ``TaskState.abandon_reason`` of a task downstream of an abandoned one (daisy's words)
UPSTREAM: Final = "upstream task abandoned"
_BROKEN_SUFFIX: Final = " blocks failed in a row"


def broken_reason(limit: int) -> str:
    """``TaskState.abandon_reason`` when ``limit`` blocks failed in a row."""
    return f"{limit}{_BROKEN_SUFFIX}"


def is_broken_reason(reason: str | None) -> bool:
    """Whether ``reason`` says the task's blocks failed in a row (the broken-function rule)."""
    return reason is not None and reason.endswith(_BROKEN_SUFFIX)


class FailureStreak:
    """The broken-function rule of one task (see the module docstring): how many blocks
    failed in a row. Pure: the scheduler tells it each block's outcome."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: blocks failed in a row so far (the scheduler zeroes it on a done block, inline)
        self.count = 0

    def succeeded(self) -> None:
        """A block was done: the function works."""
        self.count = 0

    def failed(self, first_in_run: bool, failed_before: bool) -> bool:
        """A block attempt failed: ``first_in_run``, the block's first failed attempt of
        this run; ``failed_before``, the block failed in an earlier run. True when the rule
        fires (the task is to be abandoned)."""
        if not first_in_run or failed_before:
            return False
        self.count += 1
        return self.count >= self.limit


def describe(run: Any) -> dict[str, Any]:
    """What is said about abandoned ``run`` (a ``TaskRun``), as plain values (the run
    line keeps them):

    ``reason`` (``TaskState.abandon_reason``), ``rule`` (the rule that fired, in words),
    ``option`` (what changes it), ``lost`` (blocks left undone), ``untried`` (of those, the
    blocks never tried, in this run or an earlier one), ``rerun`` (whether and how a rerun
    gets further) and ``can_progress`` (True when a rerun has blocks never tried).
    """
    reason = run.abandon_reason or ""
    lost = run.lost_on_abandon
    untried = run.untried_on_abandon
    task = run.spec
    if reason == UPSTREAM:
        rule = "a task it reads from was abandoned"
        option = "the upstream task's options"
        rerun = "a rerun runs it once its upstream task gets further"
        return _said(reason, rule, option, lost, untried, rerun)
    if is_broken_reason(reason):
        n = task.max_consecutive_failures
        rule = (
            f"{n} blocks failed in a row with no block done in between "
            f"(Task(max_consecutive_failures={n}): the function looks broken)"
        )
        option = (
            "Task(max_consecutive_failures=...) (a larger number, or None to turn the rule off)"
        )
    else:
        rule = (
            f"its workers kept failing until no start was left (Task(max_workers="
            f"{task.max_workers}) starts and Task(max_worker_restarts="
            f"{task.max_worker_restarts}) restarts)"
        )
        option = "Task(max_worker_restarts=...)"
    tried = lost - untried
    if untried > 0:
        rerun = (
            f"a rerun can get further: it runs the {untried} block(s) never tried first"
            + (f", and the {tried} that failed before after them" if tried > 0 else "")
            + "; it stops the same way if the function fails on them too"
        )
    elif lost > 0:
        rerun = (
            f"a rerun cannot get further unless the cause is fixed: every one of the {lost} "
            "block(s) left failed in this run or an earlier one"
        )
    else:
        rerun = "no block was left undone"
    return _said(reason, rule, option, lost, untried, rerun)


def _said(
    reason: str, rule: str, option: str, lost: int, untried: int, rerun: str
) -> dict[str, Any]:
    return {
        "reason": reason,
        "rule": rule,
        "option": option,
        "lost": lost,
        "untried": untried,
        "rerun": rerun,
        "can_progress": untried > 0,
    }
