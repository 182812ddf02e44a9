"""Run reports: running aggregates, ``TaskReport`` / ``RunReport``, ``runs.jsonl``.

Theory of operation
-------------------
During a run the server keeps, per task, one :class:`TaskAggregates` (a handful of
:class:`Welford` accumulators and one :class:`Trend`, O(1) memory) and one
``TimelineSet`` (``bellis._stats._timeline``). When the run ends both are folded into **one
JSON object** (:func:`task_report_json`), and that object is the single source of every
view: it is appended to ``runs.jsonl``, :class:`TaskReport` is parsed from it, and the
"Resource Utilization" panel (``bellis._report._panel``) is rendered from the reports. The object
a run returns and the record left on disk therefore cannot drift apart. The views of a
report (the panel, the notebook HTML, the HTML report) import this module, never the
other way round: the methods that show them import their view when called.

The JSON schema is versioned (``"schema": 2``; lines of schema 1 are still read) and
documented in ``docs/statistics.md``;
:func:`validate_run_line` checks a line against it. New fields are added, never
redefined, and readers ignore keys they do not know.

Per-block records (``TaskReport.block`` / ``block_records``) are not in the JSON: they
are read straight from the tracking store's arrays, read-only, through ``numpy.memmap``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import _seams
from .._block import NO_WORKER, STATS_ARRAYS, BlockStats
from .._donemarks import store_location
from .._fingerprint import version_counts
from .._tracking import is_store, open_readonly
from .._tracking._codever import code_counts
from .._tracking._layout import CACHE_ARRAYS
from ..logging import get_log_basedir, task_log_dirname
from ._aggregates import (
    Stat,
    TaskAggregates,
    Trend,
    Welford,
    _stat_from_json,
)
from ._errorlog import (
    ERRORS_FILE,
    ErrorGroupRecord,
    ErrorRecord,
    group_errors,
    read_errors,
    records_of_run,
)
from ._runlog import (
    BLOCK_STAT_KEYS,
    COUNTER_KEYS,
    EXIT_KINDS,
    MODES,
    OUTCOMES,
    SCHEMA_VERSION,
    WORKER_STAT_KEYS,
    append_run_line,
    read_last_run,
    read_runs,
    validate_run_line,
)

__all__ = [
    "COUNTER_KEYS",
    "EXIT_KINDS",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "BlockRecord",
    "BlocksSection",
    "RunReport",
    "Stat",
    "TaskAggregates",
    "TaskReport",
    "Trend",
    "Welford",
    "WorkerRecord",
    "WorkersSection",
    "append_run_line",
    "counters_from_state",
    "memory_from_state",
    "read_last_run",
    "read_runs",
    "task_report_json",
    "validate_run_line",
]


def counters_from_state(state: Any) -> dict[str, Any]:
    """The ``counters`` section from a ``TaskState``-like object."""
    return {
        "total": int(state.total_block_count),
        "completed": int(state.completed_count),
        "skipped": int(state.skipped_count),
        "failed": int(state.failed_count),
        "orphaned": int(state.orphaned_count),
        "worker_failures": int(state.worker_failure_count),
        "worker_restarts": int(state.worker_restart_count),
        "worker_starts": int(state.worker_start_count),
        "timeout_reclaims": int(state.timeout_reclaim_count),
        "stall_reclaims": int(getattr(state, "stall_reclaim_count", 0)),
        # straggler backups (Task(speculative=True)): a float for the losers' seconds
        "backups_started": int(getattr(state, "backups_started", 0)),
        "backups_won": int(getattr(state, "backups_won", 0)),
        "backups_lost": int(getattr(state, "backups_lost", 0)),
        "backup_loser_seconds": round(float(getattr(state, "backup_loser_seconds", 0.0)), 6),
        "oom_retries": int(getattr(state, "oom_retry_count", 0)),
        # how coherent the workers' streams of blocks were (``_scheduling/_locality``)
        "locality_blocks": int(getattr(state, "locality_blocks", 0)),
        "locality_local": int(getattr(state, "locality_local", 0)),
        "locality_steps": int(getattr(state, "locality_steps", 0)),
        # the same for the chunks of declared inputs (``chunk_locality``)
        "chunk_reads": int(getattr(state, "chunk_reads", 0)),
        "chunk_hits": int(getattr(state, "chunk_hits", 0)),
    }


def memory_from_state(state: Any) -> dict[str, Any] | None:
    """The ``memory`` section of a task whose blocks ran out of memory (None: none did):
    the retries per grant they ran with, the blocks that then succeeded per grant, and the
    blocks that ran out at the largest grant."""
    if not (state.oom_retry_count or state.oom_failure_count):
        return None
    return {
        "retries": dict(state.oom_retries),
        "succeeded": dict(state.oom_successes),
        "failed": int(state.oom_failure_count),
    }


def _empty_workers_json() -> dict[str, Any]:
    return {
        "count": 0,
        "unmanaged_clients": 0,
        "startup": None,
        "launch": None,
        "setup": None,
        "idle": None,
        "teardown": None,
        "exits": {},
        "records": [],
    }


def task_report_json(
    *,
    task_id: str,
    outcome: str,
    mode: str,
    run_started_at: float,
    run_finished_at: float,
    resource_tracking: bool,
    counters: Mapping[str, float],
    blocks: TaskAggregates,
    workers: Mapping[str, Any] | None = None,
    wall_seconds: float | None = None,
    first_sent_at: float | None = None,
    last_returned_at: float | None = None,
) -> dict[str, Any]:
    """Fold one task's run into its run line (the TaskReport JSON).

    ``workers`` is ``TimelineSet.to_json()``; None (serial mode) gives an empty section.
    ``wall_seconds`` defaults to ``run_finished_at − run_started_at`` (the whole run's, the
    same for every task of a pipeline); ``first_sent_at`` and ``last_returned_at`` are the
    task's own span (its first block sent, its last block returned; None: no block ran).
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    wall = run_finished_at - run_started_at if wall_seconds is None else wall_seconds
    return {
        "schema": SCHEMA_VERSION,
        "task_id": task_id,
        "run_started_at": run_started_at,
        "run_finished_at": run_finished_at,
        "outcome": outcome,
        "mode": mode,
        "wall_seconds": max(0.0, wall),
        "first_sent_at": first_sent_at,
        "last_returned_at": last_returned_at,
        "resource_tracking": bool(resource_tracking),
        "counters": {k: v if isinstance(v, float) else int(v) for k, v in counters.items()},
        "blocks": blocks.to_json(),
        "workers": dict(workers) if workers is not None else _empty_workers_json(),
    }


# ------------------------------------------------------------------------ report types


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One managed worker's lifecycle in one run (seconds; None where not reached).

    ``startup`` runs from the spawn call to the first acquire and splits into
    ``launch`` (before the worker's own clock started) and ``setup`` (what the worker
    reported). ``idle`` is over the gaps before each block, ``compute`` over each
    block's round trip (failed ones included). ``final_wait`` is the last return to
    the shutdown request; ``teardown`` (clean exits only) the shutdown to the exit.
    ``slot`` is the worker's log slot within its task and ``log_files`` its ``(stdout,
    stderr)`` files, ``worker_<slot>.out`` and ``.err``, which the workers that held the
    same slot before and after it share (each one's output follows a header line naming
    it); None in console mode.
    """

    worker_id: int
    startup: float | None
    launch: float | None
    setup: float | None
    idle: Stat
    compute: Stat
    teardown: float | None
    exit: str | None
    blocks: int
    blocks_failed: int
    final_wait: float | None
    slot: int | None = None
    log_files: tuple[str, str] | None = None
    #: the GPUs a local worker was given (its ``CUDA_VISIBLE_DEVICES``); None: none assigned
    gpus: tuple[str, ...] | None = None
    #: a worker shared between tasks: the task it came from into this one (None: it was
    #: started for this task), and the task it left this one for (None: it ended here;
    #: its ``exit`` is then "clean" for the part it spent in this task)
    moved_from: str | None = None
    moved_to: str | None = None
    #: seconds its task's setup took (``Task(setup=...)``), after the startup and before
    #: its first block, as the worker reported them; None: no setup ran
    task_setup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["idle"] = self.idle.to_dict()
        d["compute"] = self.compute.to_dict()
        d["log_files"] = None if self.log_files is None else list(self.log_files)
        d["gpus"] = None if self.gpus is None else list(self.gpus)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerRecord:
        def opt(key: str) -> float | None:
            v = d.get(key)
            return None if v is None else float(v)

        return cls(
            worker_id=int(d["worker_id"]),
            idle=_stat_from_json(d.get("idle")) or Stat.empty(),
            compute=_stat_from_json(d.get("compute")) or Stat.empty(),
            exit=d.get("exit"),
            blocks=int(d.get("blocks", 0)),
            blocks_failed=int(d.get("blocks_failed", 0)),
            slot=None if d.get("slot") is None else int(d["slot"]),
            log_files=_log_files_from_json(d.get("log_files")),
            gpus=None if d.get("gpus") is None else tuple(str(g) for g in d["gpus"]),
            moved_from=None if d.get("moved_from") is None else str(d["moved_from"]),
            moved_to=None if d.get("moved_to") is None else str(d["moved_to"]),
            **{
                k: opt(k)
                for k in ("startup", "launch", "setup", "teardown", "final_wait", "task_setup")
            },
        )


def _log_files_from_json(v: Any) -> tuple[str, str] | None:
    if isinstance(v, list | tuple) and len(v) == 2:
        return (str(v[0]), str(v[1]))
    return None


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One recorded block as the tracking store holds it.

    ``stats`` is None for a block that is done but was never measured (skipped via a
    done marker, or run without resource tracking). ``worker_id`` is None for a block
    run by no managed worker (serial mode, unmanaged clients). ``sent_at`` /
    ``returned_at`` are UNIX epoch seconds on the scheduler's clock. ``coord`` is the
    block's cell in the tracking grid.
    """

    stats: BlockStats | None
    worker_id: int | None
    sent_at: float | None
    returned_at: float | None
    coord: tuple[int, ...] = ()
    #: the memory grant in bytes the block succeeded with after it ran out of memory
    #: (``Task(memory_limit=...)``, ``SlurmLauncher(mem=...)``); None: the task's request
    memory_grant: int | None = None
    #: its failed attempts in the report's run, from ``errors.jsonl``, oldest first
    #: (:class:`~bellis._stats._errorlog.ErrorRecord`)
    attempts: tuple[ErrorRecord, ...] = ()
    #: what its worker's decoded-chunk cache did for it (a task with declared inputs:
    #: ``{"hits", "misses", "miss_bytes", "bypassed"}``); None: not recorded
    cache: dict[str, int] | None = None


class _StoreArrays:
    """The per-block arrays of one tracking store, opened read-only by ``_tracking``."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.shape: tuple[int, ...] = ()
        self.done: np.ndarray[Any, Any] | None = None
        self.flat: dict[str, np.ndarray[Any, Any]] = {}
        if not is_store(path):
            return
        store = open_readonly(path)
        self.shape = tuple(store.grid_shape)
        self.done = store.done.reshape(-1)
        for name, array in store.stats.items():
            self.flat[name] = array.reshape(-1)
        grants = store.grants()
        if grants is not None:
            self.flat["memory_grant_mb"] = grants.reshape(-1)
        cache = store.cache_counts()
        #: the per-block cache counts, in CACHE_ARRAYS order (None: none recorded)
        self.cache = None if cache is None else [cache[n].reshape(-1) for n in CACHE_ARRAYS]

    def _flat_index(self, coord: int | Sequence[int]) -> int:
        size = int(np.prod(self.shape))
        if isinstance(coord, int | np.integer):
            k = int(coord)
            if not 0 <= k < size:
                raise IndexError(f"block index {k} outside a grid of {size} cells")
            return k
        c = tuple(int(x) for x in coord)
        if len(c) != len(self.shape) or any(
            not 0 <= x < n for x, n in zip(c, self.shape, strict=True)
        ):
            raise IndexError(f"grid coordinate {c} outside the tracking grid {self.shape}")
        return int(np.ravel_multi_index(c, self.shape))

    def _record_at(self, k: int) -> BlockRecord:
        f = self.flat
        coord = tuple(int(x) for x in np.unravel_index(k, self.shape))
        if "returned_at" in f:
            measured = float(f["returned_at"][k]) > 0.0
        elif "wall_seconds" in f:
            measured = float(f["wall_seconds"][k]) > 0.0 or float(f["cpu_seconds"][k]) > 0.0
        else:
            measured = False
        grant = int(f["memory_grant_mb"][k]) << 20 if "memory_grant_mb" in f else 0
        cache = None
        if self.cache is not None:
            cache = {
                n.removeprefix("cache_"): int(a[k])
                for n, a in zip(CACHE_ARRAYS, self.cache, strict=True)
            }
        if not measured:
            return BlockRecord(None, None, None, None, coord, grant or None, (), cache)
        defaults = BlockStats().to_tuple()
        values: list[Any] = [
            f[name][k].item() if name in f else defaults[i] for i, name in enumerate(STATS_ARRAYS)
        ]
        wid = int(f["worker_id"][k]) if "worker_id" in f else NO_WORKER
        sent = float(f["sent_at"][k]) if "sent_at" in f else None
        ret = float(f["returned_at"][k]) if "returned_at" in f else None
        return BlockRecord(
            BlockStats(*values),
            None if wid == NO_WORKER else wid,
            sent,
            ret,
            coord,
            grant or None,
            (),
            cache,
        )

    def record(self, coord: int | Sequence[int]) -> BlockRecord | None:
        if self.done is None:
            return None
        k = self._flat_index(coord)
        return self._record_at(k) if self.done[k] == 1 else None

    def records(self) -> Iterator[BlockRecord]:
        if self.done is None:
            return
        for k in np.flatnonzero(self.done == 1):
            yield self._record_at(int(k))


@dataclass(frozen=True, slots=True)
class BlocksSection:
    """``TaskReport.blocks``: this run's block aggregates (a Stat is None if never sampled)."""

    count: int
    skipped: int
    failed_attempts: int
    round_trip: Stat | None
    wall: Stat | None
    cpu: Stat | None
    cpu_children: Stat | None
    peak_rss: Stat | None
    io_read: Stat | None
    io_write: Stat | None
    overhead: Stat | None
    #: GPU figures over the blocks that measured them (None: no block did)
    gpu_util: Stat | None
    gpu_mem: Stat | None
    trend: float | None


@dataclass(frozen=True, slots=True)
class WorkersSection:
    """``TaskReport.workers``: the worker timeline folded over this run's managed workers."""

    count: int
    unmanaged_clients: int
    startup: Stat | None
    launch: Stat | None
    setup: Stat | None
    idle: Stat | None
    teardown: Stat | None
    exits: dict[str, int]
    records: tuple[WorkerRecord, ...]
    #: ``Task(setup=...)``: the seconds each worker's setup took; None: no setup ran
    task_setup: Stat | None = None


class TaskReport:
    """What one run of one task cost, parsed from its run line.

    ``store_path`` is the task's tracking store, from which :meth:`block` and
    :meth:`block_records` read the per-block arrays (read-only).
    """

    def __init__(self, data: Mapping[str, Any], store_path: str | os.PathLike[str] | None = None):
        self._json: dict[str, Any] = json.loads(json.dumps(data))
        d = self._json
        self.schema = int(d.get("schema", SCHEMA_VERSION))
        self.task_id: str = str(d["task_id"])
        self.outcome: str = str(d.get("outcome", "completed"))
        self.mode: str = str(d.get("mode", "distributed"))
        self.wall_seconds = float(d.get("wall_seconds") or 0.0)
        self.run_started_at: float | None = d.get("run_started_at")
        self.run_finished_at: float | None = d.get("run_finished_at")
        #: the task's own span: its first block sent and its last block returned (UNIX
        #: seconds; None when no block ran, or in a line written before bellis kept them)
        self.first_sent_at: float | None = d.get("first_sent_at")
        self.last_returned_at: float | None = d.get("last_returned_at")
        self.resource_tracking = bool(d.get("resource_tracking", False))
        #: ints, but ``backup_loser_seconds``, a float
        self.counters: dict[str, int | float] = dict(d.get("counters") or {})
        #: out-of-memory retries per grant, successes per grant and failures at the cap
        #: (``{"retries": {"600M": 1}, "succeeded": {...}, "failed": 0}``); {}: none
        self.memory: dict[str, Any] = dict(d.get("memory") or {})
        #: an abandoned task's words (``_scheduling._abandon.describe``): ``reason``,
        #: ``rule`` (the rule that fired), ``option`` (what changes it), ``lost``,
        #: ``untried``, ``rerun`` and ``can_progress``; {}: not abandoned, or an older line
        self.abandoned: dict[str, Any] = dict(d.get("abandoned") or {})
        #: what the workers' decoded-chunk caches did for the declared inputs: chunk
        #: ``hits`` and ``misses`` (decodes), ``miss_bytes`` decoded and reads
        #: ``bypassed`` (inputs the run writes); {}: no inputs, or an older line
        self.input_cache: dict[str, int] = dict(d.get("input_cache") or {})
        b = d.get("blocks") or {}
        trend = b.get("trend_ms_per_block")
        self.blocks = BlocksSection(
            count=int(b.get("count", 0)),
            skipped=int(b.get("skipped", 0)),
            failed_attempts=int(b.get("failed_attempts", 0)),
            trend=None if trend is None else float(trend),
            **{k: _stat_from_json(b.get(k)) for k in BLOCK_STAT_KEYS},
        )
        w = d.get("workers") or {}
        records = sorted(
            (WorkerRecord.from_dict(r) for r in w.get("records") or ()),
            key=lambda r: r.worker_id,
        )
        self.workers = WorkersSection(
            count=int(w.get("count", len(records))),
            unmanaged_clients=int(w.get("unmanaged_clients", 0)),
            exits={str(k): int(v) for k, v in (w.get("exits") or {}).items()},
            records=tuple(records),
            **{k: _stat_from_json(w.get(k)) for k in WORKER_STAT_KEYS},
        )
        self._by_worker = {r.worker_id: r for r in records}
        # a URL stays a string (``store_location``): Path() would fold its //
        self.store_path = None if store_path is None else store_location(store_path)
        code = d.get("code") if isinstance(d.get("code"), dict) else {}
        #: the fingerprint of the task's code in this run (None: no tracking store, or a
        #: line written before bellis recorded it), and the index of this run's entry in
        #: the store's code-version table (None: the run made no block of the task)
        self.code_fingerprint: str | None = code.get("hash")
        self.code_index: int | None = code.get("index")

    @property
    def task_wall_seconds(self) -> float | None:
        """The task's own wall time, from its first block sent to its last block returned
        (``wall_seconds`` is the whole run's); None when unknown."""
        if self.first_sent_at is None or self.last_returned_at is None:
            return None
        return max(0.0, float(self.last_returned_at) - float(self.first_sent_at))

    @property
    def chunk_locality(self) -> float | None:
        """The share of its blocks' declared-input chunks that their worker had read
        already, for an earlier block (``counters["chunk_hits"] / counters["chunk_reads"]``,
        from the workers' chunk caches); None: no chunk of a declared input was read."""
        reads = int(self.counters.get("chunk_reads", 0))
        return int(self.counters.get("chunk_hits", 0)) / reads if reads > 0 else None

    @property
    def blocks_per_second(self) -> float | None:
        """Blocks run per second of the task's own wall time (None when unknown or 0)."""
        wall = self.task_wall_seconds
        return self.blocks.count / wall if wall else None

    @classmethod
    def from_json(
        cls, d: Mapping[str, Any], store_path: str | os.PathLike[str] | None = None
    ) -> TaskReport:
        return cls(d, store_path)

    def to_json(self) -> dict[str, Any]:
        """The run line this report was built from (a copy)."""
        out: dict[str, Any] = json.loads(json.dumps(self._json))
        return out

    def worker(self, worker_id: int) -> WorkerRecord:
        """The record of the managed worker with this id (ids restart at 0 every run)."""
        try:
            return self._by_worker[worker_id]
        except KeyError:
            raise KeyError(
                f"task {self.task_id!r} had no worker {worker_id} in this run "
                f"(ids: {sorted(self._by_worker)})"
            ) from None

    def _store(self) -> _StoreArrays | None:
        # Opened per call: a writer that replaces chunk files (zarr-python does) would
        # leave a cached mapping on the old file.
        if self.store_path is None:  # (on S3: the figures of its stats/ objects, merged)
            return None
        return _StoreArrays(self.store_path)

    def block(self, coord: int | Sequence[int]) -> BlockRecord | None:
        """The stored record of the block at ``coord`` in the tracking grid.

        ``coord`` is a grid coordinate tuple or a flat C-order index. Returns None when
        the block is not recorded as done (or the task has no store); raises IndexError
        for a coordinate outside the grid.
        """
        store = self._store()
        if store is None:
            return None
        record = store.record(coord)
        if isinstance(coord, int | np.integer):
            cell = tuple(int(x) for x in np.unravel_index(int(coord), store.shape))
        else:
            cell = tuple(int(x) for x in coord)
        attempts = tuple(r for r in self.errors() if r.coord == cell)
        if not attempts:
            return record
        if record is None:  # not done: its failed attempts
            return BlockRecord(None, None, None, None, cell, None, attempts)
        return replace(record, attempts=attempts)

    def errors_path(self) -> Path | None:
        """This task's ``errors.jsonl``: in its store, else in its log folder."""
        if isinstance(self.store_path, str):  # on S3: per-run objects, no one file
            return None
        if self.store_path is not None:
            return self.store_path / ERRORS_FILE
        base = get_log_basedir()
        return None if base is None else Path(base) / task_log_dirname(self.task_id) / ERRORS_FILE

    def errors(self, *, all_runs: bool = False) -> list[ErrorRecord]:
        """The error records of this report's run (``all_runs``: of every run), oldest
        first: one per failed attempt, up to the bound per distinct error (the rest are
        counted: :meth:`error_groups`). [] when the task has no ``errors.jsonl``."""
        lines = self._error_lines(all_runs)
        return [ErrorRecord.from_json(d) for d in lines if "count" not in d]

    def error_groups(self, *, all_runs: bool = False) -> list[ErrorGroupRecord]:
        """The distinct errors of this report's run, each with every attempt it ended."""
        return group_errors(self._error_lines(all_runs))

    def _error_lines(self, all_runs: bool) -> list[Any]:
        if isinstance(self.store_path, str):  # on S3: the runs' errors/ objects, merged
            with open_readonly(self.store_path) as store:
                lines = read_errors(store.runs_jsonl.parent)
        else:
            path = self.errors_path()
            lines = [] if path is None else read_errors(path)
        lines = [d for d in lines if d.get("task") == self.task_id]
        if all_runs or self.run_started_at is None:
            return lines
        return records_of_run(lines, self.run_started_at)

    def code_versions(self) -> list[dict[str, Any]]:
        """The done blocks of the task's store per code version, as ``bellis status``
        prints them: one dict per fingerprint in the order first seen (``version`` 1, 2,
        ..., ``hash``, ``first_seen``, ``blocks``, ``functions``, ``files``,
        ``version_value`` and the table ``indices`` of its runs), then, if any, one with
        ``version`` None for blocks of unknown code (daisy 2.0.0, older bellis). [] for a
        task without a store or with no done block."""
        if self.store_path is None or not is_store(self.store_path):
            return []
        store = open_readonly(self.store_path)
        codes = store.code_versions()
        if codes is None:
            n = int(np.count_nonzero(store.done))
            return version_counts([], {0: n} if n else {})
        return version_counts(store.code_table(), code_counts(store.done, codes))

    def block_records(self) -> Iterator[BlockRecord]:
        """Every block recorded as done, in grid (C) order."""
        store = self._store()
        if store is None:
            return iter(())
        return store.records()

    def panel(self) -> str:
        """This task's part of the Resource Utilization panel ("" if nothing to show)."""
        return _seams.render_panel([self])

    def _repr_html_(self) -> str:
        """Jupyter's view: the panel as a table and a timeline of this run (inline SVG)."""
        return _seams.task_report_html(self)

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the HTML report of this task's store (``bellis report``) to ``path``."""
        return _seams.write_report_html(self, path)

    def __repr__(self) -> str:
        return (
            f"TaskReport(task_id={self.task_id!r}, outcome={self.outcome!r}, "
            f"mode={self.mode!r}, blocks={self.blocks.count}, workers={self.workers.count})"
        )


class RunReport:
    """The whole pipeline's last run: one :class:`TaskReport` per task, in run order."""

    def __init__(self, tasks: Mapping[str, TaskReport]) -> None:
        self.tasks: dict[str, TaskReport] = dict(tasks)

    @classmethod
    def from_json(
        cls,
        d: Mapping[str, Any],
        store_paths: Mapping[str, str | os.PathLike[str] | None] | None = None,
    ) -> RunReport:
        paths = store_paths or {}
        return cls(
            {tid: TaskReport(t, paths.get(tid)) for tid, t in (d.get("tasks") or {}).items()}
        )

    def task(self, task_id: str) -> TaskReport:
        return self.tasks[task_id]

    def __getitem__(self, task_id: str) -> TaskReport:
        return self.tasks[task_id]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.tasks

    def __iter__(self) -> Iterator[str]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "tasks": {tid: t.to_json() for tid, t in self.tasks.items()},
        }

    def panel(self) -> str:
        return _seams.render_panel(list(self.tasks.values()))

    def _repr_html_(self) -> str:
        """Jupyter's view: every task's table and timeline, in run order."""
        from html import escape

        head = (
            f"<p><b>run report: {len(self.tasks)} tasks</b> ({escape(', '.join(self.tasks))})</p>"
        )
        return head + "".join(t._repr_html_() for t in self.tasks.values())

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the HTML report of every task's store (``bellis report``) to ``path``."""
        return _seams.write_report_html(self, path)

    def __repr__(self) -> str:
        return f"RunReport(tasks={list(self.tasks)})"
