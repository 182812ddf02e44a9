"""One task's run state inside the :class:`~bellis._scheduling._scheduler.Scheduler`: the per-block
``state`` and ``deps`` arrays (see the scheduler's theory of operation), the task's
counters, its tracking store's cells, and its lazy queue of initially ready blocks.

The block states and the task states are defined here; the scheduler decides on them.
Not thread-safe; no sockets, threads or clocks.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._bulk import block_view, store_product, zeroed
from .._donemarks import BlockStore, CellWriter
from .._graph import InterTaskEdge, TaskGeometry
from .._state import TaskState
from .._task import Task
from .._task_spec import TaskSpec
from ._abandon import FailureStreak
from ._locality import Coherence, LocalityOrder

__all__ = [
    "ABANDONED",
    "CHUNK",
    "DONE",
    "FAILED",
    "FINISHED",
    "ORPHANED",
    "PENDING",
    "PROCESSING",
    "QUEUED",
    "READY",
    "RUNNING",
    "TaskRun",
    "dtype_for",
    "view",
]

logger = logging.getLogger("bellis")

PENDING, READY, PROCESSING, DONE, FAILED, ORPHANED = 0, 1, 2, 3, 4, 5
# ready, and queued in the FIFO (readied by a release or a retry); READY blocks are the
# initial ones the lazy root generator hands out, so it never picks up a queued block
QUEUED = 6
RUNNING, FINISHED, ABANDONED = 0, 1, 2

CHUNK = 1 << 16


def view(arr: np.ndarray[Any, Any]) -> memoryview[int]:
    """A typed memoryview of a 1-D unsigned array: element access without numpy scalars."""
    raw: Any = arr.data
    view: memoryview[int] = raw.cast("B").cast(arr.dtype.char)
    return view


def dtype_for(max_count: int) -> type[np.unsignedinteger[Any]]:
    if max_count < 1 << 8:
        return np.uint8
    if max_count < 1 << 16:
        return np.uint16
    return np.uint32


class TaskRun:
    """Run state of one task inside a :class:`Scheduler`. Not thread-safe."""

    def __init__(self, index: int, task: Task, spec: TaskSpec | None = None) -> None:
        self.index = index
        #: the user's task (its identity: the pipeline's edges name it)
        self.task = task
        #: what this run reads of the task: its settings, taken at run start
        self.spec: TaskSpec = TaskSpec.of(task) if spec is None else spec
        spec = self.spec
        self.task_id = spec.task_id
        self.geom: TaskGeometry = spec.geom
        g = self.geom
        self.total = g.num_blocks
        self.max_retries = spec.max_retries
        self.check_function = spec.check_function
        self.status = RUNNING
        self.abandon_reason: str | None = None
        self.state = zeroed(self.total, np.uint8)
        self.state_mv = view(self.state)
        self.deps: np.ndarray[Any, Any] | None = None
        self.deps_mv: memoryview[int] | None = None
        self.intra = g.num_levels > 1  # read/write conflicts or write_safety="serialize"
        # conflict levels below this one have their dependency counts; the rest are filled
        # in when first needed (lazy: a 10^8-block task starts in milliseconds)
        self.levels_ready = g.num_levels
        self.down_edges: list[tuple[InterTaskEdge, TaskRun]] = []
        self.up_edges: list[tuple[InterTaskEdge, TaskRun]] = []
        self.downstream_tasks: list[TaskRun] = []
        self.roots: Iterator[int] | None = None
        self.fifo: deque[int] = deque()
        #: blocks that failed in an earlier run (``failures`` > 0 in the store, not done):
        #: they run after every block never tried (None: there are none)
        self.failed_before: set[int] | None = None
        #: ready blocks of ``failed_before`` put off until the roots and the FIFO are empty
        self.later: deque[int] = deque()
        self.retries: dict[int, int] = {}
        #: the ready blocks in Morton order, a coherent stream per connection
        #: (``Scheduler.order_by_locality``); None: the queues above, in FIFO order
        self.local: LocalityOrder | None = None
        #: the hand-out order was fixed (``_gate.shuffle_roots``): no locality order
        self.order_fixed = False
        #: how coherent each worker's stream of blocks was (the dispatcher notes it)
        self.coherence: Coherence | None = None
        #: the broken-function rule (``Task(max_consecutive_failures=...)``; None: off)
        limit = spec.max_consecutive_failures
        self.streak: FailureStreak | None = None if limit is None else FailureStreak(limit)
        self.started = False
        #: what the workers' decoded-chunk caches did for this task's declared inputs:
        #: ``_protocol.CACHE_COUNTS`` (hits, misses, miss_bytes, bypassed)
        self.input_cache = [0, 0, 0, 0]
        #: the chunks its blocks read through those caches, and those of them their
        #: worker held already (read for an earlier block): the chunk-level locality
        self.chunk_reads = 0
        self.chunk_hits = 0
        self.ready = 0
        self.processing = 0
        self.completed = 0
        self.skipped_done = 0
        self.skipped_mask = 0
        self.skipped_check = 0
        self.failed = 0
        self.orphaned = 0
        self.failed_attempts = 0
        #: the task's own span (UNIX seconds): its first block sent, its last returned
        #: (inf and 0 until a block came back with its times; the scheduler widens them on
        #: the per-block path, inline: see :meth:`note_span`; the snapshot says None)
        self.first_sent_at = math.inf
        self.last_returned_at = 0.0
        #: blocks still to do when the task was abandoned: lost with it (``orphaned``
        #: counts them too, with the blocks orphaned by failed upstream blocks)
        self.lost_on_abandon = 0
        #: of those, the blocks never tried, in this run or an earlier one
        self.untried_on_abandon = 0
        self.check_warned = False
        #: per block, 1: the check_function is not called (a block cleared as made by
        #: other code, ``Scheduler(_unchecked=...)``); None: every block is checked
        self.unchecked: memoryview[int] | None = None
        # worker bookkeeping, owned by the server but reported in TaskState
        self.worker_starts = 0
        self.worker_restarts = 0
        self.worker_failures = 0
        self.first_worker_error: str | None = None
        self.last_worker_error: str | None = None
        self.timeout_reclaims = 0
        self.stall_reclaims = 0
        # straggler backups (_backups): copies started, won, lost, losers' seconds
        self.backups_started = 0
        self.backups_won = 0
        self.backups_lost = 0
        self.backup_loser_seconds = 0.0
        #: the live page's lanes (``run_blockwise(dashboard=...)`` sets them; None: off):
        #: the latest blocks released, ``(worker_id, sent, returned, k, ok)`` in UNIX
        #: seconds, and the latest races of a block's two copies (``_backups``), bounded
        self.recent: deque[tuple[int, float, float, int, bool]] | None = None
        self.races: deque[tuple[int, int, float, int, float, float, bool]] | None = None
        #: the races still going: block -> (the original's connection, the copy's), the
        #: straggler backups' own pairs (``Backups.copies``, shared, never copied here);
        #: None: the task makes no backups
        self.racing: dict[int, tuple[Any, Any]] | None = None
        #: out-of-memory retries per grant they run with, blocks that finally succeeded on a
        #: larger grant (per grant), and blocks that ran out at the largest
        self.oom_retries: dict[str, int] = {}
        self.oom_successes: dict[str, int] = {}
        self.oom_failures = 0
        # tracking
        self.store: BlockStore | None = None
        self.cell_identity = True
        #: the store's hot-path writer (``BlockStore.hot_writer``), as three fields read per
        #: block: the done markers, where a done block's code index goes, and the index
        self.done_fast: CellWriter | None = None
        self.code_fast: CellWriter | None = None
        self.code_index = 0
        self.cell_shift: tuple[int, ...] = ()
        self.cell_grid: tuple[int, ...] = ()
        self.cell_strides: tuple[int, ...] = ()

    # -- counters ----------------------------------------------------------------------
    def note_span(self, sent_at: float, returned_at: float) -> None:
        """Widen the task's own span to a block out from ``sent_at`` to ``returned_at``."""
        if sent_at < self.first_sent_at:
            self.first_sent_at = sent_at
        if returned_at > self.last_returned_at:
            self.last_returned_at = returned_at

    @property
    def skipped(self) -> int:
        return self.skipped_done + self.skipped_mask + self.skipped_check

    @property
    def is_running(self) -> bool:
        return self.status == RUNNING

    @property
    def remaining(self) -> int:
        return self.total - self.completed - self.failed - self.orphaned

    @property
    def pending(self) -> int:
        return self.remaining - self.ready - self.processing

    def snapshot(self) -> TaskState:
        locality = (0, 0, 0) if self.coherence is None else self.coherence.counts()
        return TaskState(
            task_id=self.task_id,
            started=self.started,
            total_block_count=self.total,
            ready_count=self.ready,
            processing_count=self.processing,
            completed_count=self.completed,
            skipped_count=self.skipped,
            failed_count=self.failed,
            orphaned_count=self.orphaned,
            worker_failure_count=self.worker_failures,
            worker_restart_count=self.worker_restarts,
            worker_start_count=self.worker_starts,
            abandoned=self.status == ABANDONED,
            abandon_reason=self.abandon_reason,
            first_worker_error=self.first_worker_error,
            last_worker_error=self.last_worker_error,
            timeout_reclaim_count=self.timeout_reclaims,
            timeout_secs=self.spec.timeout_secs,
            skipped_done_count=self.skipped_done,
            skipped_mask_count=self.skipped_mask,
            skipped_check_count=self.skipped_check,
            failed_attempt_count=self.failed_attempts,
            stall_reclaim_count=self.stall_reclaims,
            stall_timeout_secs=self.spec.stall_timeout_secs,
            backups_started=self.backups_started,
            backups_won=self.backups_won,
            backups_lost=self.backups_lost,
            backup_loser_seconds=self.backup_loser_seconds,
            locality_blocks=locality[0],
            locality_local=locality[1],
            locality_steps=locality[2],
            chunk_reads=self.chunk_reads,
            chunk_hits=self.chunk_hits,
            oom_retry_count=sum(self.oom_retries.values()),
            first_sent_at=None if self.first_sent_at == math.inf else self.first_sent_at,
            last_returned_at=self.last_returned_at or None,
            oom_retries=tuple(sorted(self.oom_retries.items(), key=_by_size)),
            oom_successes=tuple(sorted(self.oom_successes.items(), key=_by_size)),
            oom_failure_count=self.oom_failures,
        )

    # -- tracking cells ----------------------------------------------------------------
    def attach_store(self, store: BlockStore) -> None:
        g = self.geom
        self.store = store
        self.cell_shift = g.sid_shift
        self.cell_grid = tuple(store.grid_shape)
        strides = [1] * g.dims
        for i in range(g.dims - 2, -1, -1):
            strides[i] = strides[i + 1] * self.cell_grid[i + 1]
        self.cell_strides = tuple(strides)
        self.cell_identity = all(s == 0 for s in self.cell_shift) and self.cell_grid == g.grid
        self.take_writer()

    def take_writer(self) -> None:
        """Take the store's hot-path writer again (after ``BlockStore.use_code``): blocks
        that return without measurements mark their cell done through it, where a block is
        its cell; the others go through ``record_success``."""
        writer = self.store.hot_writer() if self.store is not None else None
        if writer is None or not self.cell_identity:
            self.done_fast, self.code_fast, self.code_index = None, None, 0
        else:
            self.done_fast, self.code_fast = writer.done, writer.code
            self.code_index = writer.code_index

    def cell_of(self, k: int) -> int:
        """Flat index of block ``k`` in the tracking grid, or -1 if not addressable."""
        if self.cell_identity:
            return k
        cell = 0
        for c, s, n, st in zip(
            self.geom.coords_of(k), self.cell_shift, self.cell_grid, self.cell_strides, strict=True
        ):
            c += s
            if c >= n:
                return -1
            cell += c * st
        return cell

    def record_measured(
        self,
        ks: list[int],
        table: np.ndarray[Any, Any],
        worker_id: int,
        sent_at: np.ndarray[Any, Any],
        returned_at: np.ndarray[Any, Any],
    ) -> None:
        """Store the measurements of blocks ``ks`` (one ``table`` record each) before
        their release marks them done; blocks outside the tracking grid are left out."""
        store = self.store
        if store is None:
            return
        if self.cell_identity:
            cells = np.asarray(ks, dtype=np.intp)
        else:
            cells = np.fromiter((self.cell_of(k) for k in ks), dtype=np.intp, count=len(ks))
            inside = cells >= 0
            if not inside.all():
                cells, table = cells[inside], table[inside]
                sent_at, returned_at = sent_at[inside], returned_at[inside]
        store.record_measured(cells, table, worker_id, sent_at, returned_at)

    def record_cache(self, held: list[int], per_block: list[int]) -> None:
        """Add what the worker's chunk cache did for each returned block to the task's
        totals (:attr:`input_cache`) and store it with the block (``cache_*`` arrays):
        ``per_block`` is the flat ``k, hits, misses, miss_bytes, bypassed, ...`` of a
        worker's message; blocks its connection does not hold (``held``) are ignored,
        as are blocks outside the tracking grid."""
        totals = self.input_cache
        store = self.store
        mine = set(held)
        for i in range(0, len(per_block), 5):
            k = per_block[i]
            if k not in mine:
                continue
            counts = per_block[i + 1 : i + 5]
            for j in range(4):
                totals[j] += counts[j]
            self.chunk_hits += counts[0]
            self.chunk_reads += counts[0] + counts[1]
            if store is not None and self.status == RUNNING:
                cell = self.cell_of(k)
                if cell >= 0:
                    store.record_cache(cell, counts)

    def store_view(
        self, arr: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], tuple[slice, ...]]:
        """The part of a tracking-grid array that covers this task's block grid.

        Returns the view and the block-grid slices it covers (blocks past the tracking
        grid, possible with ``overhang``, are not addressable).
        """
        return block_view(self.geom, arr.reshape(self.cell_grid))

    def init_levels(self, upto: int) -> None:
        """Fill in the dependency counts of conflict levels below ``upto`` (lazy path).

        In place on the level's strided view of ``deps``, as a product of per-axis
        vectors: a few passes over one byte per block, no temporaries of the level's size.
        """
        g = self.geom
        grid_state = self.state.reshape(g.grid)
        assert self.deps is not None
        grid_deps = self.deps.reshape(g.grid)
        while self.levels_ready < min(upto, g.num_levels):
            lvl = self.levels_ready
            sl = g.level_slices(lvl)
            dst = grid_deps[sl]
            axes = g.level_axis_counts(lvl)
            store_product(dst, axes)
            # blocks with no in-grid upstream start ready: a count is a product of the
            # axes' entries, so those blocks are the planes where an axis entry is 0
            sub = grid_state[sl]
            for i, c in enumerate(axes):
                for j in np.flatnonzero(c == 0).tolist():
                    plane = sub[(slice(None),) * i + (j,)]
                    plane[plane == PENDING] = READY
            self.levels_ready = lvl + 1

    # -- the ready queue -----------------------------------------------------------------
    def _initial_ready(self) -> Iterator[int]:
        """Initially READY blocks, level by level, cartesian order, chunked through numpy."""
        g = self.geom
        grid_state = self.state.reshape(g.grid)
        strides = np.asarray(g.axis_strides, dtype=np.int64)
        for lvl in range(g.num_levels):
            if self.levels_ready <= lvl:
                self.init_levels(lvl + 1)
            sl = g.level_slices(lvl)
            sub = grid_state[sl]
            if sub.size == 0:
                continue
            off = np.asarray(g.level_offsets[lvl], dtype=np.int64)
            step = np.asarray(g.level_stride, dtype=np.int64)
            row_size = max(1, sub[0].size) if sub.ndim > 1 else 1
            chunk = 1024  # small first chunk: the first block comes quickly
            r0 = 0
            while r0 < sub.shape[0]:
                rows = max(1, chunk // row_size)
                chunk = min(CHUNK, chunk * 4)
                part = sub[r0 : r0 + rows]
                coords = np.nonzero(part == READY)
                base_row = r0
                r0 += rows
                if len(coords[0]) == 0:
                    continue
                flat = np.zeros(len(coords[0]), dtype=np.int64)
                for i, c in enumerate(coords):
                    base = c.astype(np.int64) + (base_row if i == 0 else 0)
                    flat += (base * step[i] + off[i]) * strides[i]
                yield from flat.tolist()


def _by_size(item: tuple[str, int]) -> float:
    """Sort key of ``("600M", n)``: the grant's size."""
    text = item[0]
    return float(text[:-1]) * 1024.0 ** "KMGT".find(text[-1])
