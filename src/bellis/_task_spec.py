"""A task as a run reads it: :class:`TaskSpec`, one frozen, typed view of every setting.

A :class:`~bellis._task.Task` is the user's object: validated at construction, mutable
(``task.process_function = f``), with its internals private. A run takes one
:class:`TaskSpec` of each task at its start (``RunSettings.build``; a scheduler built on
its own takes them itself) and every folder that runs, schedules or plans reads that, never
the task's private attributes: ``run.spec.geom``, ``run.spec.budget``, ``run.spec.skip_mask``.

A new ``Task`` setting that a run reads is one field here and one line in
:meth:`TaskSpec.of` (see docs/architecture.md, "How to extend").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._donemarks import StoreLocation
from ._graph import TaskGeometry

if TYPE_CHECKING:
    from funlib.geometry import Roi

    from ._outputs._units import OutputSpec
    from ._task import Task
    from ._tracking import StoreLayout

__all__ = ["TaskSpec"]


@dataclass(frozen=True, slots=True, eq=False)
class TaskSpec:
    """One task's settings, read-only, as a run reads them (see the module docstring)."""

    task_id: str
    total_roi: Roi
    read_roi: Roi
    write_roi: Roi
    fit: str
    read_write_conflict: bool
    #: the block grid, its levels and its neighbourhoods (wider levels under
    #: ``write_safety="serialize"``)
    geom: TaskGeometry
    #: the ``StoreLayout`` the task's tracking store is opened (and checked) with
    store_layout: StoreLayout
    process_function: Callable[..., Any] | None
    check_function: Callable[[Any], Any] | None
    max_workers: int
    max_retries: int
    max_worker_restarts: int
    max_consecutive_failures: int | None
    timeout_secs: float
    stall_timeout_secs: float | None
    backup_after: float | None
    memory_limit: int | None
    memory_growth: float | None
    max_memory: int | None
    #: ``Task(requires=...)``: ints, but ``gpu`` may be a fraction of one GPU
    requires: dict[str, float]
    #: ``requires`` in the run budget's integer units (``gpu`` in shares)
    budget: dict[str, int]
    outputs: tuple[OutputSpec, ...]
    write_safety: str
    #: the outputs whose units the task's own blocks share
    shared_outputs: tuple[OutputSpec, ...]
    verify_outputs: bool | str
    #: ``Task(setup=...)``: run once per worker before its first block (None: none)
    setup: Callable[[], Any] | None
    #: the process function gets the setup's value: ``fn(block, ctx)``
    passes_context: bool
    #: ``Task(inputs=...)``: the declared inputs (their decoded chunks are cached per worker)
    inputs: tuple[OutputSpec, ...]
    #: ``Task(input_cache_bytes=...)``; None: derived from the worker's memory limit
    input_cache_bytes: int | None
    #: per output: whether its read-back checksums stored units (``owns_units``)
    verify_stored: tuple[bool, ...]
    resource_tracking: bool
    #: where the task's store lives at run start (None: not tracked)
    tracking_path: StoreLocation | None
    #: one cell per block, 1: skipped (read-only; None: no mask)
    skip_mask: np.ndarray[Any, np.dtype[np.uint8]] | None
    launcher: Any
    version: Any
    on_code_change: str

    @classmethod
    def of(cls, task: Task) -> TaskSpec:
        """``task``'s settings now (the run's start)."""
        mask = task._skip_mask
        if mask is not None:
            mask = mask.view()
            mask.flags.writeable = False
        return cls(
            task_id=task.task_id,
            total_roi=task.total_roi,
            read_roi=task.read_roi,
            write_roi=task.write_roi,
            fit=task.fit,
            read_write_conflict=task.read_write_conflict,
            geom=task._geom,
            store_layout=task._store_layout(),
            process_function=task.process_function,
            check_function=task.check_function,
            max_workers=task.max_workers,
            max_retries=task.max_retries,
            max_worker_restarts=task.max_worker_restarts,
            max_consecutive_failures=task.max_consecutive_failures,
            timeout_secs=task.timeout_secs,
            stall_timeout_secs=task.stall_timeout_secs,
            backup_after=task.backup_after,
            memory_limit=task.memory_limit,
            memory_growth=task.memory_growth,
            max_memory=task.max_memory,
            requires=task.requires,
            budget=dict(task._budget),
            outputs=task._outputs,
            write_safety=task.write_safety,
            shared_outputs=task._shared_outputs,
            verify_outputs=task.verify_outputs,
            setup=task.setup,
            passes_context=task.passes_context,
            inputs=task.inputs,
            input_cache_bytes=task.input_cache_bytes,
            verify_stored=task._verify_stored,
            resource_tracking=task.resource_tracking,
            tracking_path=task.resolved_tracking_path(),
            skip_mask=mask,
            launcher=task.launcher,
            version=task._version,
            on_code_change=task._on_code_change,
        )
