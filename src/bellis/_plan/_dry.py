"""The dry run: what a run would do, from the same machinery the run uses, with nothing run
and nothing written.

The run is checked as the runner checks it (:meth:`RunSettings.build`: the pipeline, the
resources, the configuration, each worker payload serialized). Each task's tracking store
that exists is opened read-only (never locked, created, migrated or reserved), and the
run's own :class:`Scheduler` is built over those stores: its bulk initialisation counts the
blocks done in the store and the masked ones, and marks what is ready, exactly as a run
starts. Nothing calls a process or check function, and no worker starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .._donemarks import BlockStore
from .._run._options import RunOptions
from .._run._provenance import check_code
from .._run._runner import RunSettings
from .._scheduling._scheduler import Scheduler
from .._scheduling._task_run import DONE, TaskRun
from .._task_params import budget_units
from .._task_spec import TaskSpec
from .._tracking import STAT_ARRAYS, layout_hash, open_readonly, store_exists
from .._tracking._disk import free_bytes, unreserved_bytes
from .._tracking._files import chunk_files
from .._tracking._layout import BASE_ARRAYS
from ..errors import CodeChangedError
from ._model import Plan, TaskOutlook

__all__ = ["DryRun", "dry_run"]


class DryRun:
    """A dry run's scheduler and stores, kept open for the forecast to read; ``close()``."""

    def __init__(self, run_plan: RunSettings) -> None:
        self.run_plan = run_plan
        self.stores: dict[str, BlockStore] = {}
        self.notes: dict[str, list[str]] = {t.task_id: [] for t in run_plan.tasks}
        #: what the real run would raise at its start (on_code_change="error"), as text
        self.warnings: list[str] = []
        try:
            for t in run_plan.specs.values():
                store = self._open_store(t) if run_plan.block_tracking else None
                if store is not None:
                    self.stores[t.task_id] = store
            #: the stores as the run's scheduler would find them, after check_code
            self.seen = {tid: s.scratch() for tid, s in self.stores.items()}
            #: blocks "rerun" clears as stale, which a run never asks the check_function about
            self.unchecked: dict[str, np.ndarray[Any, Any]] = {}
            self._check_code()
            self.scheduler = Scheduler(
                run_plan.pipeline,
                _stores=dict(self.seen),
                _unchecked=self.unchecked,
                _specs=run_plan.specs,
            )
        except BaseException:
            self.close()
            raise

    def _open_store(self, task: TaskSpec) -> BlockStore | None:
        path = task.tracking_path
        if path is None or not store_exists(path):
            return None
        store = open_readonly(path)
        if store.task_hash is not None and store.task_hash != layout_hash(task.store_layout):
            self.notes[task.task_id].append(
                f"the store at {path} belongs to another layout (another ROI or block size): "
                "a run migrates it when the volume grew, else raises LayoutMismatch; its "
                "done blocks are not counted here"
            )
            store.close()
            return None
        return store

    def _check_code(self) -> None:
        """The run's code-staleness check over the copies (see the module docstring)."""
        rp = self.run_plan
        try:
            code = check_code(
                list(rp.tasks), rp.pipeline.edges, dict(self.seen), time.time(), rp.specs
            )
        except CodeChangedError as exc:
            tid = exc.task_id or "?"
            self.warnings.append(
                f"a real run would raise CodeChangedError before running anything: task "
                f'{tid!r} (on_code_change="error") has {exc.count} stale done block(s): {exc}'
            )
            if tid in self.notes:
                self.notes[tid].append(
                    f'on_code_change="error": {exc.count} stale done block(s); a real run '
                    "raises CodeChangedError"
                )
            return
        self.unchecked = code.unchecked
        for tid, note in code.notes.items():
            self.notes[tid].append("a real run: " + note.removeprefix(f"{tid}: "))

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()

    def __enter__(self) -> DryRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the outlook ---------------------------------------------------------------------
    def left_mask(self, run: TaskRun) -> np.ndarray[Any, Any]:
        """One bool per block of ``run``'s grid: True where the block would be handed out."""
        out: np.ndarray[Any, Any] = run.state.reshape(run.geom.grid) != DONE
        return out

    def outlook(self, run: TaskRun) -> TaskOutlook:
        rp = self.run_plan
        task = run.spec
        g = run.geom
        left = self.left_mask(run) if run.total else np.zeros(0, dtype=bool)
        max_parallel = 0
        for lvl in range(g.num_levels if run.total else 0):
            max_parallel = max(max_parallel, int(np.count_nonzero(left[g.level_slices(lvl)])))
        n_left = run.total - run.skipped_done - run.skipped_mask
        failed_before = 0
        store = self.seen.get(run.task_id)
        if store is not None:
            fails, _ = run.store_view(store.failures)
            done, _ = run.store_view(store.done)
            failed_before = int(np.count_nonzero((fails != 0) & (done == 0)))
        path = task.tracking_path if rp.block_tracking else None
        reserved = to_allocate = 0
        disk_free: int | None = None
        if isinstance(path, Path):  # a URL's store reserves no local disk
            names = BASE_ARRAYS + (STAT_ARRAYS if task.resource_tracking else ())
            files = chunk_files(Path(path), task.store_layout.grid_shape, names)
            reserved = sum(n for _, n in files)
            to_allocate = unreserved_bytes(files)
            disk_free = free_bytes(_existing_parent(Path(path)))
        launcher = "serial"
        workers = 0
        if rp.distributed:
            lau = task.launcher or rp.launcher
            launcher = "local" if lau is None else lau.name
            workers = min(task.max_workers, max_parallel) if n_left else 0
            have = budget_units(rp.resources)
            for k, v in task.budget.items():
                if v > 0:
                    workers = min(workers, have.get(k, 0) // v)
        notes = list(self.notes[run.task_id])
        if run.check_function is not None and n_left:
            notes.append(
                f"a check_function runs for each of the {n_left} blocks left before it is "
                "handed out; the dry run does not call it, so fewer may run"
            )
        return TaskOutlook(
            task_id=run.task_id,
            blocks=run.total,
            done=run.skipped_done,
            masked=run.skipped_mask,
            failed_before=failed_before,
            left=n_left,
            levels=g.num_levels if run.total else 0,
            max_parallel=max_parallel,
            ready_at_start=run.ready,
            upstream=[up.task_id for _, up in run.up_edges],
            downstream=[d.task_id for d in run.downstream_tasks],
            store=None
            if path is None
            else path
            if isinstance(path, str)
            else os.path.abspath(path),
            store_exists=store is not None,
            store_reserved_bytes=reserved,
            store_to_allocate_bytes=to_allocate,
            disk_free_bytes=disk_free,
            launcher=launcher,
            max_workers=task.max_workers,
            workers=workers,
            check_function=run.check_function is not None,
            notes=notes,
        )

    def plan(self) -> Plan:
        out = Plan(self.run_plan.mode, [self.outlook(r) for r in self.scheduler.runs])
        out.warnings.extend(self.warnings)
        return out


def _existing_parent(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def dry_run(pipeline: Any, options: RunOptions) -> Plan:
    """The plan of ``run_blockwise(pipeline, ...)`` with ``options``; runs nothing."""
    rp = RunSettings.build(pipeline, replace(options, summary=False))
    with DryRun(rp) as dry:
        return dry.plan()
