"""The sans-I/O scheduler: which block may run next, and what a release unlocks.

Theory of operation
-------------------
A block is ``(task index, k)`` with ``k`` its flat C-order index in the task's block
grid. Per task, two numpy arrays carry all per-block state:

* ``state`` (uint8): PENDING, READY (initially ready), QUEUED (readied later, in the
  FIFO), PROCESSING, DONE, FAILED or ORPHANED;
* ``deps`` (smallest unsigned dtype that fits): how many upstream blocks, in this task
  (conflict levels) or in upstream tasks (read/write overlap), have not succeeded yet.

A block waiting to be handed out with ``deps == 0`` is READY (ready from the start) or
QUEUED (readied later). Per-block reads and writes go through ``memoryview``s of the
arrays (tens of nanoseconds, no numpy scalar objects); whole-grid work (initial
dependency counts, blocks already done in a tracking store, skip masks) is numpy over
the arrays, never a Python loop per block; it is done once, at construction, by
``_startup`` (which also checks and wires the edges between the tasks).

Each task has a ready queue: a lazy generator over the initially ready blocks, in level
order then cartesian order, drained before a FIFO of blocks readied by releases and of
retries. Blocks that failed in an earlier run (the store's ``failures`` count, not done)
are put off to a third queue, ``later``, served only when the other two are empty: a
resume runs every block never tried before it retries known-bad ones, so a rerun after
an abandonment gets further. A block's failed attempt feeds the task's broken-function
rule (:class:`._abandon.FailureStreak`, ``Task(max_consecutive_failures=...)``), which
abandons the task when it fires. A permanent failure walks every transitive downstream
block, across tasks, and orphans it. Terminal task states are sticky; late releases for
them are ignored.

No sockets, threads or clocks live here; the caller passes times in, and may inject a
clock (:meth:`Scheduler.bound_checks`) so that a long run of ``check_function`` skips is
cut into slices: ``acquire_index`` then returns :data:`CHECKS_PENDING` between two
blocks, and the caller gets control back (to poll for Ctrl-C, serve sockets) before it
calls again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._block import Block, BlockStatus
from .._donemarks import BlockStore
from .._state import TaskState
from .._task import Pipeline, Task, topological_order
from .._task_spec import TaskSpec
from ._abandon import broken_reason
from ._locality import MAX_LOCALITY_BLOCKS, LocalityOrder, Stream
from ._startup import connect, initialize
from ._task_run import (
    ABANDONED,
    DONE,
    FAILED,
    FINISHED,
    ORPHANED,
    PENDING,
    PROCESSING,
    QUEUED,
    READY,
    RUNNING,
    TaskRun,
    view,
)

__all__ = ["CHECKS_PENDING", "Scheduler"]

logger = logging.getLogger("bellis")

#: ``acquire_index``: a check slice ran out before a block to hand out was found; call again
CHECKS_PENDING = -2
#: check_function calls between two looks at the injected clock
_CHECKS_PER_CLOCK = 32


class Scheduler:
    """Hands out blocks in dependency order and takes them back (daisy's ``Scheduler``).

    ``Scheduler(pipeline_or_task)``. No tracking store is opened here; the runner passes
    the stores it opened (``_stores``), and their done blocks are resolved in bulk at
    construction. ``_unchecked``: per task id, a boolean array over the block grid of the
    blocks whose ``check_function`` is not called (they run: ``_run/_provenance``).
    ``_specs``: per task id, the settings the run took at its start (``RunSettings``);
    a task without one has its :class:`~bellis._task_spec.TaskSpec` taken here.
    """

    def __init__(
        self,
        pipeline: Any,
        *,
        _stores: Mapping[str, BlockStore] | None = None,
        _unchecked: dict[str, np.ndarray[Any, Any]] | None = None,
        _specs: Mapping[str, TaskSpec] | None = None,
    ) -> None:
        if isinstance(pipeline, Task):
            pipeline = Pipeline.from_task(pipeline)
        if not isinstance(pipeline, Pipeline):
            raise TypeError(
                f"Scheduler expects a Pipeline or a Task; got {type(pipeline).__name__}"
            )
        pipeline.validate()
        order = topological_order(pipeline.tasks, pipeline.edges)
        self.task_order = [t.task_id for t in order]
        specs = _specs or {}
        self.runs: list[TaskRun] = [
            TaskRun(i, t, specs.get(t.task_id)) for i, t in enumerate(order)
        ]
        self.by_id: dict[str, TaskRun] = {r.task_id: r for r in self.runs}
        connect(self.runs, pipeline.edges)
        for run in self.runs:
            if _stores and run.task_id in _stores and _stores[run.task_id] is not None:
                run.attach_store(_stores[run.task_id])
            if _unchecked and run.task_id in _unchecked and run.check_function is not None:
                run.unchecked = view(
                    np.ascontiguousarray(_unchecked[run.task_id], np.uint8).reshape(-1)
                )
        self._first_running = 0
        self._check_clock: Callable[[], float] | None = None
        self._check_slice_seconds = 0.0
        initialize(self.runs)
        self.dependency_graph = _PipelineGraph(self)

    # -- queries -----------------------------------------------------------------------
    @property
    def task_states(self) -> dict[str, TaskState]:
        return {r.task_id: r.snapshot() for r in self.runs}

    def is_done(self) -> bool:
        """True when no task is running. Amortised O(1): terminal states are sticky, so
        the scan resumes at the first task that was still running last time (the server
        asks on every turn of its loop, and a pipeline may have hundreds of tasks)."""
        runs = self.runs
        i = self._first_running
        while i < len(runs) and runs[i].status != RUNNING:
            i += 1
        self._first_running = i
        return i == len(runs)

    def bound_checks(self, clock: Callable[[], float], slice_seconds: float) -> None:
        """Let one ``acquire_index`` call spend about ``slice_seconds`` (read on ``clock``)
        in ``check_function`` skips before it returns :data:`CHECKS_PENDING`."""
        self._check_clock = clock
        self._check_slice_seconds = slice_seconds

    def order_by_locality(self, run: TaskRun) -> bool:
        """Hand out ``run``'s ready blocks in Morton order (:mod:`._locality`), each
        ``acquire_index(run, stream)`` near ``stream``'s last block. False: it keeps the FIFO
        order (finished, started, over :data:`MAX_LOCALITY_BLOCKS` blocks, or shuffled)."""
        if run.local is not None:
            return True
        if run.status != RUNNING or run.order_fixed or run.started:
            return False
        if not 0 < run.total <= MAX_LOCALITY_BLOCKS:
            return False
        if run.levels_ready < run.geom.num_levels:
            run.init_levels(run.geom.num_levels)  # every level's first ready blocks now
        local = LocalityOrder(run.geom.grid)
        local.fill(run.state == READY)
        run.local = local
        run.roots = None
        return True

    # -- the hot path: integer API -------------------------------------------------------
    def acquire_index(self, run: TaskRun, stream: Stream | None = None) -> int:
        """Pop the next block of ``run`` to dispatch; -1 when none is ready, and
        :data:`CHECKS_PENDING` when a bounded slice of check_function skips ran out.
        ``stream``: the caller's place in a task ordered by locality (its next block is
        near its last one); ignored in FIFO order."""
        if run.status != RUNNING:
            return -1
        state_mv = run.state_mv
        roots = run.roots
        later = run.failed_before
        local = run.local
        if local is not None and stream is None:
            stream = local.default
        checks = 0
        until = 0.0
        while True:
            if local is not None:
                # the stream's next ready block, then the FIFO (retries, blocks given back
                # unstarted), then blocks that failed in an earlier run: as below
                assert stream is not None
                c = stream.cursor
                bits = local.bits
                if c < stream.limit and bits[c]:  # ``LocalityOrder.take``'s common case
                    bits[c] = 0
                    stream.cursor = c + 1
                    k = local.k_at[c]
                else:
                    k = local.take(stream)
                if k >= 0:
                    st = state_mv[k]
                    if st != READY and st != QUEUED:
                        continue  # taken another way meanwhile (a memory grant's wait)
                    if later is not None and k in later:
                        run.later.append(k)
                        continue
                elif run.fifo:
                    k = run.fifo.popleft()
                    if state_mv[k] != QUEUED:
                        continue
                    if later is not None and k in later:
                        run.later.append(k)
                        continue
                elif run.later:
                    k = run.later.popleft()
                    if state_mv[k] != READY and state_mv[k] != QUEUED:
                        continue
                else:
                    return -1
            elif roots is not None:
                k = next(roots, -1)
                if k < 0:
                    run.roots = roots = None
                    continue
                if state_mv[k] != READY:
                    continue
                if later is not None and k in later:
                    run.later.append(k)  # failed in an earlier run: after the untried ones
                    continue
            elif run.fifo:
                k = run.fifo.popleft()
                if state_mv[k] != QUEUED:
                    continue
                if later is not None and k in later:
                    run.later.append(k)
                    continue
            elif run.later:
                k = run.later.popleft()
                if state_mv[k] != READY and state_mv[k] != QUEUED:
                    continue
            else:
                return -1
            run.started = True
            run.ready -= 1
            if run.check_function is not None and self._precheck(run, k):
                if run.status != RUNNING:
                    return -1
                clock = self._check_clock
                if clock is not None:
                    if checks == 0:
                        until = clock() + self._check_slice_seconds
                    elif checks % _CHECKS_PER_CLOCK == 0 and clock() >= until:
                        return CHECKS_PENDING
                    checks += 1
                continue
            state_mv[k] = PROCESSING
            run.processing += 1
            return k

    def acquire_run(self, run: TaskRun, stream: Stream, held: list[int], want: int) -> None:
        """Append to ``held`` (up to ``want`` blocks in all) the ready blocks at ``stream``'s
        cursor in ``run``'s locality order, in a few C calls and a state check each. Only
        with no check_function and no block failed before (nothing to put first); it may
        append none, and :meth:`acquire_index` takes the rest one by one."""
        local = run.local
        if local is None or run.status != RUNNING or run.check_function is not None:
            return
        if run.failed_before is not None:
            return
        c = stream.cursor
        end = min(stream.limit, c + want - len(held))
        if c >= end:
            return
        bits = local.bits
        e = bits.find(0, c, end)
        ks = local.k_at[c : end if e < 0 else e].tolist()
        state_mv = run.state_mv
        n = 0
        for k in ks:
            st = state_mv[k]
            if st != READY and st != QUEUED:
                break  # a stale entry: acquire_index skips it
            state_mv[k] = PROCESSING
            n += 1
        if n == 0:
            return
        bits[c : c + n] = bytes(n)
        held.extend(ks if n == len(ks) else ks[:n])
        stream.cursor = c + n
        run.started = True
        run.ready -= n
        run.processing += n

    def _precheck(self, run: TaskRun, k: int) -> bool:
        """Run the check_function; on a truthy answer release ``k`` as a skip."""
        fn = run.check_function
        assert fn is not None
        unchecked = run.unchecked
        if unchecked is not None and unchecked[k]:
            return False  # made by other code and cleared by on_code_change="rerun": it runs
        block = run.geom.block(k, BlockStatus.PROCESSING)
        try:
            done = bool(fn(block))
        except Exception as exc:
            if not run.check_warned:
                run.check_warned = True
                logger.warning(
                    "check_function for task '%s' raised; treating block %s as not done, so "
                    "it will be (re)processed. Further check failures for this task will not "
                    "be logged: %r",
                    run.task_id,
                    block.block_id,
                    exc,
                )
            return False
        if not done:
            return False
        run.state_mv[k] = PROCESSING
        run.processing += 1
        run.skipped_check += 1
        if run.store is not None:  # done, but the code that made it stays as recorded
            cell = run.cell_of(k)
            if cell >= 0:
                run.store.record_skip(cell)
        self._succeed(run, k, None, -1, 0.0, 0.0, record=False)
        return True

    def release_index(
        self,
        run: TaskRun,
        k: int,
        success: bool,
        stats: Any = None,
        worker_id: int = -1,
        sent_at: float = 0.0,
        returned_at: float = 0.0,
        lost: bool = False,
    ) -> bool:
        """Take block ``k`` back. Returns False if the release was ignored (stale).

        ``lost``: a failed attempt because the block's worker went away (a crash, a killed
        job, a node failure), not because the function failed on it: it is charged to the
        block, but the broken-function rule does not count it (the restart budget does)."""
        if run.status != RUNNING or not 0 <= k < run.total or run.state_mv[k] != PROCESSING:
            return False
        if sent_at > 0.0:  # the task's own span (TaskRun.note_span, inline: per block)
            if sent_at < run.first_sent_at:
                run.first_sent_at = sent_at
            if returned_at > run.last_returned_at:
                run.last_returned_at = returned_at
            lanes = run.recent
            if lanes is not None:  # the live page's lanes (dashboard on): a bounded deque
                lanes.append((worker_id, sent_at, returned_at, k, success))
        if success:
            self._succeed(run, k, stats, worker_id, sent_at, returned_at, record=True)
        else:
            self._fail(run, k, worker_id, sent_at, returned_at, lost)
        return True

    def requeue_index(self, run: TaskRun, k: int) -> None:
        """Put a dispatched block that never started back at the head of its queue.

        Not a failed attempt: nothing ran (a worker returned part of a batch unprocessed).
        """
        if run.status != RUNNING or run.state_mv[k] != PROCESSING:
            return
        run.state_mv[k] = QUEUED
        run.processing -= 1
        run.ready += 1
        run.fifo.appendleft(k)

    def take_queued_index(self, run: TaskRun, k: int) -> bool:
        """Take queued block ``k`` out of the queue as if it were handed out (a block that
        waits for a larger memory grant, ``_memory``). Its entry in the queue stays,
        and is skipped. False: ``k`` was not queued."""
        if run.status != RUNNING or run.state_mv[k] != QUEUED:
            return False
        run.state_mv[k] = PROCESSING
        run.ready -= 1
        run.processing += 1
        return True

    def _succeed(
        self,
        run: TaskRun,
        k: int,
        stats: Any,
        worker_id: int,
        sent_at: float,
        returned_at: float,
        *,
        record: bool,
    ) -> None:
        run.state_mv[k] = DONE
        run.processing -= 1
        run.completed += 1
        if record and run.streak is not None:
            run.streak.count = 0  # FailureStreak.succeeded, inline: per block
        if record and run.store is not None:
            fast = run.done_fast
            if fast is not None and stats is None:
                code = run.code_fast
                if code is not None:  # the block's fingerprint first: done names its code
                    code[k] = run.code_index
                fast[k] = 1
            else:
                cell = run.cell_of(k)
                if cell >= 0:
                    run.store.record_success(cell, stats, worker_id, sent_at, returned_at)
        if run.intra:
            lvl, blocks = run.geom.downstream_with_level(k)
            if run.levels_ready < lvl + 2:
                run.init_levels(lvl + 2)
            self._unlock(run, blocks)
        for edge, down in run.down_edges:
            if down.status == RUNNING:
                self._unlock(down, edge.downstream_of(k))
        if run.completed + run.failed + run.orphaned == run.total:
            run.status = FINISHED

    @staticmethod
    def _unlock(run: TaskRun, blocks: list[int]) -> None:
        deps = run.deps_mv
        state = run.state_mv
        assert deps is not None
        local = run.local  # if any, a block is readied where it lies in its order
        for n in blocks:
            c = deps[n] - 1
            deps[n] = c
            if c == 0 and state[n] == PENDING:
                state[n] = QUEUED
                if local is None:
                    run.fifo.append(n)
                else:
                    local.bits[local.pos_of[n]] = 1
                run.ready += 1

    def _fail(
        self,
        run: TaskRun,
        k: int,
        worker_id: int,
        sent_at: float,
        returned_at: float,
        lost: bool = False,
    ) -> None:
        run.failed_attempts += 1
        run.processing -= 1
        if run.store is not None:
            cell = run.cell_of(k)
            if cell >= 0:
                run.store.record_failure(cell, worker_id, sent_at, returned_at)
        attempts = run.retries.get(k, 0)
        streak = run.streak
        broken = (
            not lost
            and streak is not None
            and streak.failed(
                attempts == 0, run.failed_before is not None and k in run.failed_before
            )
        )
        if attempts < run.max_retries:
            run.retries[k] = attempts + 1
            run.state_mv[k] = QUEUED
            run.fifo.append(k)
            run.ready += 1
        else:
            run.retries.pop(k, None)
            run.state_mv[k] = FAILED
            run.failed += 1
            self._orphan_downstream(run, k)
            self._finalize_all()
        if broken and run.status == RUNNING:
            assert streak is not None
            hit = self.abandon(run, broken_reason(streak.limit))
            logger.warning(
                "task '%s' abandoned: %d blocks failed in a row with no block done in "
                "between, so its function looks broken (Task(max_consecutive_failures=%d) "
                "sets the rule; None turns it off); its %d remaining blocks are not run",
                run.task_id,
                streak.limit,
                streak.limit,
                run.lost_on_abandon,
            )
            for r in hit[1:]:
                logger.warning(
                    "downstream task '%s' abandoned: upstream input will never arrive, "
                    "accounting remaining blocks as orphaned",
                    r.task_id,
                )

    def _orphan_downstream(self, run: TaskRun, k: int) -> None:
        stack: list[tuple[TaskRun, int]] = [(run, k)]
        while stack:
            r, b = stack.pop()
            nexts: list[tuple[TaskRun, list[int]]] = []
            if r.intra:
                nexts.append((r, r.geom.downstream_of(b)))
            for edge, down in r.down_edges:
                nexts.append((down, edge.downstream_of(b)))
            for dr, blocks in nexts:
                st = dr.state_mv
                for n in blocks:
                    if st[n] == PENDING:
                        st[n] = ORPHANED
                        if dr.status == RUNNING:
                            dr.orphaned += 1
                        stack.append((dr, n))

    def _finalize_all(self) -> None:
        for r in self.runs:
            if r.status == RUNNING and r.completed + r.failed + r.orphaned == r.total:
                r.status = FINISHED

    def abandon(self, run: TaskRun, reason: str) -> list[TaskRun]:
        """Give up on a task (and, transitively, its downstream tasks). Returns them."""
        hit = []
        todo = [(run, reason)]
        while todo:
            r, why = todo.pop()
            if r.status != RUNNING:
                continue
            r.lost_on_abandon = r.remaining
            r.untried_on_abandon = _untried(r)
            r.orphaned += r.remaining
            r.ready = 0
            r.processing = 0
            r.status = ABANDONED
            r.abandon_reason = why
            r.roots = None
            r.fifo.clear()
            r.later.clear()
            hit.append(r)
            for d in r.downstream_tasks:
                todo.append((d, "upstream task abandoned"))
        return hit

    # -- the public Block API ----------------------------------------------------------
    def acquire_block(self, task_id: str) -> Block | None:
        run = self.by_id.get(task_id)
        if run is None:
            raise KeyError(f"no task {task_id!r} in this scheduler")
        k = self.acquire_index(run)
        if k < 0:
            return None
        return Block._lazy(run.geom, k, BlockStatus.CREATED)

    def release_block(self, block: Block) -> None:
        run = self.by_id.get(block._task_id)
        if run is None:
            raise KeyError(f"block {block.block_id} belongs to no task of this scheduler")
        k = block._k if block._geom is run.geom else run.geom.index_of_block(block)
        if k < 0:
            raise ValueError(f"block {block!r} is not a block of task {run.task_id!r}")
        # bellis fix: a non-terminal status is a failure, never a crash
        stats = block.stats
        self.release_index(
            run,
            k,
            block._status == BlockStatus.SUCCESS,
            None if stats is None else stats.to_tuple(),
        )


def _untried(run: TaskRun) -> int:
    """Of ``run``'s blocks still to do, how many were never tried, in this run (no failed
    attempt) or an earlier one (``failed_before``)."""
    state = run.state
    todo = int(np.count_nonzero(state == PENDING))
    todo += int(np.count_nonzero(state == READY)) + int(np.count_nonzero(state == QUEUED))
    todo += int(np.count_nonzero(state == PROCESSING))
    tried = set(run.retries)
    if run.failed_before is not None:
        tried |= run.failed_before
    st = run.state_mv
    seen = sum(1 for k in tried if st[k] in (PENDING, READY, QUEUED, PROCESSING))
    return todo - seen


class _PipelineGraph:
    """``Scheduler.dependency_graph``: upstream/downstream blocks across tasks."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    def _locate(self, block: Block) -> tuple[TaskRun, int]:
        run = self._s.by_id[block.task_id]
        k = run.geom.index_of_block(block)
        if k < 0:
            raise ValueError(f"block {block!r} is not a block of task {run.task_id!r}")
        return run, k

    def upstream(self, block: Block) -> list[Block]:
        run, k = self._locate(block)
        out: list[Block] = []
        for edge, up in run.up_edges:
            out.extend(up.geom.block(u) for u in edge.upstream_of(k))
        if run.intra:
            out.extend(run.geom.block(u) for u in run.geom.upstream_of(k))
        return sorted(out, key=_sort_key)

    def downstream(self, block: Block) -> list[Block]:
        run, k = self._locate(block)
        out: list[Block] = []
        if run.intra:
            out.extend(run.geom.block(d) for d in run.geom.downstream_of(k))
        for edge, down in run.down_edges:
            out.extend(down.geom.block(d) for d in edge.downstream_of(k))
        return sorted(out, key=_sort_key)


def _sort_key(b: Block) -> tuple[str, int]:
    return (b.task_id, b.spatial_id)
