"""``bellis.plan()``, ``run_blockwise(..., dry_run=True)`` and a run under ``bellis plan``
(the entry points, :mod:`bellis._entrypoints`, route those here)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._run._options import RunOptions
from .._run._runner import RunSettings
from .._state import TaskState
from .._streams import print_to_stdout
from ._dry import DryRun, dry_run
from ._forecast import forecast
from ._model import Plan
from ._script import settings

__all__ = ["plan", "plan_run", "planned_states"]


def plan(
    pipeline: Any,
    *,
    multiprocessing: bool = True,
    resources: dict[str, int] | None = None,
    block_tracking: bool = True,
    launcher: Any = None,
    sample: int | bool | None = None,
    cost_hint: Any = None,
    seed: int = 0,
    show: bool = True,
) -> Plan:
    """Plan a run of ``pipeline`` (a Task, a Pipeline or a list of tasks) without running it.

    Takes ``run_blockwise``'s arguments and checks them as a run does. Per task the plan
    says how many blocks there are, how many are done in the tracking store, masked,
    failed before and left; the conflict levels and the most blocks that can run at once;
    the upstream and downstream tasks; the tracking store's disk reservation; and how many
    workers would start on which launcher. No process or check function is called, no
    worker starts and nothing is written (an existing tracking store is only read).
    ``show`` prints the plan's table to stdout. See docs/plan.md.

    ``sample=N`` (blocks per task; ``True``: 2% of the blocks left, at least 20) adds a
    forecast: a sample of the blocks left to do (neither done nor masked), spread over the
    grid, really runs on the task's launcher and is recorded done (the real run skips
    it), and from its own figures the plan predicts the rest (a resume: the blocks left
    after it), with an interval: the run's wall at ``max_workers`` and at x0.5, x2 and x4 (a
    simulation of the schedule), its core-hours, each task's peak RSS percentiles with a
    memory request that fits, and for SLURM a time limit; it warns when the settings will
    not fit. ``cost_hint`` (an array of the skip mask's shape, or a dict of them by task
    id) steers the sample to costly regions and models the cost per block; ``seed`` makes
    the sample reproducible.
    """
    options = RunOptions(
        multiprocessing=multiprocessing,
        resources=resources,
        block_tracking=block_tracking,
        launcher=launcher,
    )
    return plan_run(pipeline, options, sample=sample, cost_hint=cost_hint, seed=seed, show=show)


def plan_run(
    pipeline: Any,
    options: RunOptions,
    *,
    sample: int | bool | None = None,
    cost_hint: Any = None,
    seed: int = 0,
    show: bool = True,
) -> Plan:
    """:func:`plan` of a run with ``options`` (``run_blockwise(..., dry_run=True)``); the
    options' ``progress``, ``host``, ``summary`` and ``return_states`` play no part."""
    options = replace(options, summary=False, progress=False)
    if sample is None or sample is False:
        result = dry_run(pipeline, options)
    else:
        rp = RunSettings.build(pipeline, options)
        result = forecast(rp, sample=sample, cost_hint=cost_hint, seed=seed)
    if show:
        print_to_stdout(result.table())
    return result


def planned_states(rp: RunSettings) -> tuple[list[str], dict[str, TaskState]]:
    """A run under ``bellis plan`` (script planning, :mod:`._script`): its plan is printed
    and recorded, and the task order and states returned say what a completed run would:
    every block of every task completed (``run_blockwise`` returns True, or with
    ``return_states=True`` those states; a ``Server`` returns the states)."""
    script = settings()
    assert script is not None, "planned_states outside bellis plan"
    script.calls += 1
    if script.sample:
        result = forecast(rp, sample=script.sample)
    else:
        with DryRun(rp) as dry:
            result = dry.plan()
    result.call = script.calls
    result.assumes = list(script.not_run)
    print_to_stdout(result.table())
    script.record(result.to_json())
    script.not_run.extend(t.task_id for t in result.tasks if t.left)
    order = [t.task_id for t in result.tasks]
    states = {
        t.task_id: TaskState(
            task_id=t.task_id,
            started=True,
            total_block_count=t.blocks,
            completed_count=t.blocks,
            skipped_count=t.done + t.masked,
            skipped_done_count=t.done,
            skipped_mask_count=t.masked,
            timeout_secs=rp.specs[t.task_id].timeout_secs,
        )
        for t in result.tasks
    }
    return order, states
