"""A scheduler's start, sans I/O: the tasks' edges checked and wired, and every block's
first state and dependency count, in bulk (the theory is in ``_scheduler``'s docstring).

Whole-grid work only, in numpy over the per-task arrays of :class:`._task_run.TaskRun`:
blocks done in a tracking store or masked, the dependency counts of conflict levels and
of upstream tasks, the blocks ready from the start, and the blocks that failed in an
earlier run. :class:`._scheduler.Scheduler` calls :func:`connect` then :func:`initialize`
once, at construction; what happens afterwards, block by block, is its own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .._bulk import add_product, edge_axis_counts, store_product, subtract_shifted, zeroed
from .._graph import InterTaskEdge
from .._outputs._units import TaskWrites, plan_pipeline_writes
from .._task import Task
from ..errors import ConfigurationError
from ._task_run import CHUNK, DONE, FINISHED, PENDING, READY, TaskRun, dtype_for, view

__all__ = ["connect", "initialize"]

logger = logging.getLogger("bellis")


def connect(runs: list[TaskRun], edges: Iterable[tuple[Task, Task]]) -> None:
    """Wire the pipeline's ``edges`` (upstream, downstream task) between their ``runs``,
    after checking each (:func:`_check_overlap`), and add the edges that
    ``write_safety="serialize"`` asks for between tasks that share output units."""
    by_obj = {id(r.task): r for r in runs}
    pairs = list(dict.fromkeys((by_obj[id(u)], by_obj[id(d)]) for u, d in edges))
    for up, down in pairs:
        _check_overlap(up, down)
    reaches = _write_plan(runs, [(u.index, d.index) for u, d in pairs])
    for i, j in reaches:  # write_safety="serialize" between tasks the pipeline orders
        if (runs[i], runs[j]) not in pairs:
            pairs.append((runs[i], runs[j]))
    for up, down in pairs:
        edge = InterTaskEdge(up.geom, down.geom, reaches.get((up.index, down.index)))
        up.down_edges.append((edge, down))
        down.up_edges.append((edge, up))
        up.downstream_tasks.append(down)


def initialize(runs: list[TaskRun]) -> None:
    """Per task: mark done (store) and masked blocks, count dependencies, find roots.

    Whole-grid work only, in numpy, and never a temporary wider than one byte per
    block: a 10^9-block task holds ``state`` and ``deps`` (one byte each for a
    conflict task) plus, while it resumes, one boolean per block of skipped blocks.
    """
    skipped: dict[int, np.ndarray[Any, Any]] = {}
    for run in runs:
        g = run.geom
        if run.total == 0:
            run.status = FINISHED
            continue
        grid_state = run.state.reshape(g.grid)
        skip = _skipped_blocks(run)
        if skip is not None:
            np.copyto(grid_state, DONE, where=skip)
            skipped[run.index] = skip
        if run.remaining == 0:
            # everything is done already (a resumed store): nothing to count or queue
            run.status = FINISHED
            continue
        run.failed_before = _failed_before(run)
        # dependency counts
        if run.intra and not run.up_edges and skip is None:
            # nothing resolved in bulk: count level by level as the run reaches them
            dtype = dtype_for(g.max_level_count())
            run.deps = zeroed(run.total, dtype)
            run.deps_mv = view(run.deps)
            grid_state[g.level_slices(0)] = READY
            run.levels_ready = 1
            # level 1 now: its blocks wait on the first releases, and it touches every
            # page of ``deps`` (the kernel's first-touch cost, ~3 s per GiB here),
            # which then falls on the start rather than on the first blocks
            run.init_levels(2)
            run.ready = sum(g.level_zero_count_blocks(lvl) for lvl in range(g.num_levels))
            run.roots = run._initial_ready()
            continue
        if run.intra or run.up_edges:
            edge_vecs = [edge_axis_counts(edge) for edge, _ in run.up_edges]
            bound = g.max_level_count() if run.intra else 0
            bound += sum(math.prod(int(v.max(initial=0)) for v in vecs) for vecs in edge_vecs)
            deps = zeroed(run.total, dtype_for(bound)).reshape(g.grid)
            if run.intra:
                for lvl in range(1, g.num_levels):
                    dst = deps[g.level_slices(lvl)]
                    store_product(dst, g.level_axis_counts(lvl))
                    if skip is not None:
                        subtract_shifted(g, lvl, skip, dst)
            for (edge, up), vecs in zip(run.up_edges, edge_vecs, strict=True):
                add_product(deps, vecs)
                if up.index in skipped:
                    np.subtract(
                        deps,
                        edge.done_counts(skipped[up.index]),
                        out=deps,
                        casting="unsafe",
                    )
            run.deps = deps.reshape(-1)
            run.deps_mv = view(run.deps)
            run.ready = _mark_ready(grid_state, deps)
        else:
            run.ready = _mark_ready(grid_state, None)
        run.roots = run._initial_ready()


def _skipped_blocks(run: TaskRun) -> np.ndarray[Any, Any] | None:
    """The blocks of ``run`` done in its store or masked, as one bool per block (None when
    there are none); sets the skip counters and ``completed``."""
    g = run.geom
    mask = run.spec.skip_mask
    pre: np.ndarray[Any, Any] | None = None
    n_pre = 0
    store = run.store
    if store is not None and not store.created:
        view, dst = run.store_view(store.done)
        n_pre = int(np.count_nonzero(view))
        if n_pre:
            pre = np.zeros(g.grid, dtype=bool)
            np.not_equal(view, 0, out=pre[dst])
    n_mask = 0
    if mask is not None:
        masked = np.not_equal(mask, 0)
        if pre is not None:
            np.greater(masked, pre, out=masked)  # masked and not done
        n_mask = int(np.count_nonzero(masked))
        if n_mask:
            if pre is None:
                pre = masked
            else:
                np.logical_or(pre, masked, out=pre)
        del masked
    if pre is None:
        return None
    run.skipped_done = n_pre
    run.skipped_mask = n_mask
    run.completed = n_pre + n_mask
    return pre


def _failed_before(run: TaskRun) -> set[int] | None:
    """The blocks of ``run`` that failed in an earlier run and are not done: the store's
    ``failures`` count, read slab by slab (never a grid-size temporary); None when none."""
    store = run.store
    if store is None or store.created:
        return None
    failures, dst = run.store_view(store.failures)
    if failures.size == 0:
        return None
    g = run.geom
    grid_state = run.state.reshape(g.grid)[dst]
    starts = [sl.start or 0 for sl in dst]
    rows = max(1, CHUNK // max(1, failures[0].size if failures.ndim > 1 else 1))
    found: set[int] = set()
    for r in range(0, failures.shape[0], rows):
        undone = grid_state[r : r + rows] != DONE
        if not undone.any():
            continue  # a done slab: its failure counts are not read
        hit = np.nonzero((failures[r : r + rows] != 0) & undone)
        if len(hit[0]) == 0:
            continue
        coords = [c.astype(np.int64) + starts[i] + (r if i == 0 else 0) for i, c in enumerate(hit)]
        found.update(np.ravel_multi_index(coords, g.grid).tolist())
    return found or None


def _mark_ready(grid_state: np.ndarray[Any, Any], deps: np.ndarray[Any, Any] | None) -> int:
    """PENDING blocks with no dependency left become READY; returns how many.

    Slab by slab along axis 0, so the masks are a small fraction of the grid.
    """
    flat_state = grid_state.reshape(grid_state.shape[0], -1)
    flat_deps = None if deps is None else deps.reshape(deps.shape[0], -1)
    rows = max(1, CHUNK // max(1, flat_state.shape[1]))
    ready = 0
    for r in range(0, flat_state.shape[0], rows):
        st = flat_state[r : r + rows]
        mask = st == PENDING
        if flat_deps is not None:
            mask &= flat_deps[r : r + rows] == 0
        st[mask] = READY
        ready += int(np.count_nonzero(mask))
    return ready


def _write_plan(runs: list[TaskRun], edges: list[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """The write-safety check between the tasks (``_units.plan_pipeline_writes``): raises
    on unsafe shared units, logs one WARNING for those under ``write_safety="off"``, and
    returns the reach of each edge that serializes blocks sharing units."""
    if not any(r.spec.outputs for r in runs):
        return {}
    tasks = [
        TaskWrites(r.task_id, r.geom, r.spec.outputs, r.spec.write_safety, r.spec.shared_outputs)
        for r in runs
    ]
    reaches, warnings = plan_pipeline_writes(tasks, edges)
    if warnings:
        logger.warning(
            "write safety is off: %s; zarr rewrites a whole shard (or chunk) on every write, "
            "so two blocks writing one at once can lose data (see docs/outputs.md)",
            "; ".join(warnings),
        )
    return reaches


def _check_overlap(up: TaskRun, down: TaskRun) -> None:
    """Refuse an edge whose downstream task reads nothing its upstream task writes."""
    ug, dg = up.geom, down.geom
    if ug.num_blocks == 0 or dg.num_blocks == 0:
        return
    for i in range(ug.dims):
        tw_b = ug.tw_offset[i]
        tw_e = tw_b + max(0, ug.tw_shape[i])
        _, first_e = dg.read_interval(i, 0)
        last_b, _ = dg.read_interval(i, dg.grid[i] - 1)
        if first_e <= tw_b or last_b >= tw_e:
            from funlib.geometry import Roi

            total = Roi(dg.total_offset, dg.total_shape)
            utw = Roi(ug.tw_offset, tuple(max(0, s) for s in ug.tw_shape))
            raise ConfigurationError(
                f'invalid configuration: task "{down.task_id}" has blocks (total_roi {total!r}) '
                f'that read nothing their upstream task "{up.task_id}" writes (total write roi '
                f"{utw!r}) along axis {i}; those blocks would never become ready and the run "
                "would wait forever. Shrink the downstream total_roi to the upstream write "
                "region, or grow the upstream total_roi.",
                parameter="total_roi",
            )
