"""Run reports: running aggregates, ``TaskReport`` / ``RunReport``, ``runs.jsonl``, the panel.

Theory of operation
-------------------
During a run the server keeps, per task, one :class:`TaskAggregates` (a handful of
:class:`Welford` accumulators and one :class:`Trend`, O(1) memory) and one
``TimelineSet`` (``bellis._timeline``). When the run ends both are folded into **one
JSON object** (:func:`task_report_json`), and that object is the single source of every
view: it is appended to ``runs.jsonl``, :class:`TaskReport` is parsed from it, and the
"Resource Utilization" panel is rendered from the reports. The object a run returns and
the record left on disk therefore cannot drift apart.

The JSON schema is versioned (``"schema": 1``) and documented in ``docs/statistics.md``;
:func:`validate_run_line` checks a line against it. New fields are added, never
redefined, and readers ignore keys they do not know.

Per-block records (``TaskReport.block`` / ``block_records``) are not in the JSON: they
are read straight from the tracking store's arrays, read-only, through ``numpy.memmap``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from ._block import NO_WORKER, STAMP_ARRAYS, STATS_ARRAYS, BlockStats
from .errors import TrackingError

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
    "format_bytes",
    "format_duration",
    "read_last_run",
    "read_runs",
    "render_panel",
    "task_report_json",
    "validate_run_line",
]

SCHEMA_VERSION: Final = 1
OUTCOMES: Final = ("completed", "failed", "interrupted", "abandoned")
MODES: Final = ("distributed", "serial")
EXIT_KINDS: Final = ("clean", "timeout", "error", "interrupted")
COUNTER_KEYS: Final = (
    "total",
    "completed",
    "skipped",
    "failed",
    "orphaned",
    "worker_failures",
    "worker_restarts",
    "worker_starts",
    "timeout_reclaims",
)
BLOCK_STAT_KEYS: Final = (
    "round_trip",
    "wall",
    "cpu",
    "cpu_children",
    "peak_rss",
    "io_read",
    "io_write",
    "overhead",
)
WORKER_STAT_KEYS: Final = ("startup", "launch", "setup", "idle", "teardown")

# --------------------------------------------------------------------- accumulators


class Welford:
    """Running count, mean, sample variance, min, max and total of a stream of floats."""

    __slots__ = ("_m2", "max", "mean", "min", "n", "total")

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.total = 0.0

    def add(self, x: float) -> None:
        n = self.n + 1
        self.n = n
        delta = x - self.mean
        mean = self.mean + delta / n
        self.mean = mean
        self._m2 += delta * (x - mean)
        self.total += x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x

    @property
    def variance(self) -> float:
        """Sample variance (n − 1); 0 when n < 2."""
        if self.n < 2:
            return 0.0
        v = self._m2 / (self.n - 1)
        return v if v > 0.0 else 0.0

    @property
    def std(self) -> float:
        """Sample standard deviation (n − 1); 0 when n < 2."""
        return math.sqrt(self.variance)

    def add_many(self, xs: np.ndarray[Any, Any]) -> None:
        """Fold a batch of values in at once (numpy, then the pairwise update)."""
        if len(xs) == 0:
            return
        batch = Welford()
        batch.n = len(xs)
        batch.mean = float(xs.mean())
        batch._m2 = float(((xs - batch.mean) ** 2).sum())
        batch.min = float(xs.min())
        batch.max = float(xs.max())
        batch.total = float(xs.sum())
        self.merge(batch)

    def merge(self, other: Welford) -> None:
        """Fold ``other`` into this accumulator (Chan et al.'s pairwise update)."""
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self._m2 = other.n, other.mean, other._m2
            self.min, self.max, self.total = other.min, other.max, other.total
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self._m2 += other._m2 + delta * delta * self.n * other.n / n
        self.mean += delta * other.n / n
        self.n = n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def __repr__(self) -> str:
        return f"Welford(n={self.n}, mean={self.mean!r}, std={self.std!r})"


class Trend:
    """Running least-squares slope of y against the sample index 0, 1, ..., n − 1.

    Kept as co-moments (mean of x, mean of y, Σ dx·dy, Σ dx²), which give the same slope
    as the textbook sums (n, Σx, Σy, Σxy, Σx²) without their cancellation on long runs.
    """

    __slots__ = ("_cxy", "_mx", "_my", "_sxx", "n")

    def __init__(self) -> None:
        self.n = 0
        self._mx = 0.0
        self._my = 0.0
        self._cxy = 0.0
        self._sxx = 0.0

    def add(self, y: float) -> None:
        x = float(self.n)
        n = self.n + 1
        self.n = n
        dx = x - self._mx
        self._mx += dx / n
        self._my += (y - self._my) / n
        self._cxy += dx * (y - self._my)
        self._sxx += dx * (x - self._mx)

    def add_many(self, ys: np.ndarray[Any, Any]) -> None:
        """The next ``len(ys)`` samples at once: batch co-moments, then a pairwise merge."""
        m = len(ys)
        if m == 0:
            return
        xs = np.arange(self.n, self.n + m, dtype=np.float64)
        mx_b = float(xs.mean())
        my_b = float(ys.mean())
        dx = xs - mx_b
        cxy_b = float((dx * (ys - my_b)).sum())
        sxx_b = float((dx * dx).sum())
        na = self.n
        n = na + m
        delta_x = mx_b - self._mx
        delta_y = my_b - self._my
        self._cxy += cxy_b + delta_x * delta_y * na * m / n
        self._sxx += sxx_b + delta_x * delta_x * na * m / n
        self._mx += delta_x * m / n
        self._my += delta_y * m / n
        self.n = n

    @property
    def slope(self) -> float:
        """The fitted slope; 0 for n < 2 or a degenerate fit."""
        if self.n < 2 or self._sxx <= 0.0:
            return 0.0
        s = self._cxy / self._sxx
        return s if math.isfinite(s) else 0.0


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class Stat:
    """Summary of one metric: count, mean, sample std (n − 1), min, max and total.

    Durations are in seconds and sizes in bytes.
    """

    n: int
    mean: float
    std: float
    min: float
    max: float
    total: float

    @classmethod
    def from_welford(cls, w: Welford) -> Stat:
        if w.n == 0:
            return cls.empty()
        return cls(w.n, w.mean, w.std, w.min, w.max, w.total)

    @classmethod
    def empty(cls) -> Stat:
        """A Stat over no samples: n = 0 and every figure 0."""
        return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "mean": _finite_or_none(self.mean),
            "std": _finite_or_none(self.std),
            "min": _finite_or_none(self.min),
            "max": _finite_or_none(self.max),
            "total": _finite_or_none(self.total),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stat:
        def num(key: str) -> float:
            v = d.get(key)
            return math.nan if v is None else float(v)

        return cls(
            int(d.get("n", 0)), num("mean"), num("std"), num("min"), num("max"), num("total")
        )


def _stat_or_none(w: Welford) -> Stat | None:
    return Stat.from_welford(w) if w.n else None


def _stat_json(w: Welford) -> dict[str, Any] | None:
    return Stat.from_welford(w).to_dict() if w.n else None


def _stat_from_json(d: Any) -> Stat | None:
    return Stat.from_dict(d) if isinstance(d, Mapping) else None


class TaskAggregates:
    """Per-task, per-run block aggregates, fed one returned block at a time.

    ``add_block`` takes the server's round trip (None in serial mode), the block's
    ``BlockStats.to_tuple()`` (None when it came back unmeasured) and whether it failed.
    A failed attempt counts only in ``failed_attempts``: it stays out of every block
    statistic and of the trend (its round trip still counts in its worker's compute,
    which the worker timeline keeps).

    Per-block cost matters here (the server calls it for every block): rows are appended
    to a bounded buffer and folded into the accumulators with numpy every
    ``_FOLD_ROWS`` blocks and whenever a result is read, so memory stays O(1).
    """

    _FOLD_ROWS = 4096

    __slots__ = (
        "_cpu",
        "_cpu_children",
        "_io_read",
        "_io_write",
        "_overhead",
        "_peak_rss",
        "_round_trip",
        "_rows",
        "_rts",
        "_trend",
        "_wall",
        "count",
        "failed_attempts",
        "skipped",
    )

    def __init__(self) -> None:
        self.count = 0
        self.skipped = 0
        self.failed_attempts = 0
        self._round_trip = Welford()
        self._wall = Welford()
        self._cpu = Welford()
        self._cpu_children = Welford()
        self._peak_rss = Welford()
        self._io_read = Welford()
        self._io_write = Welford()
        self._overhead = Welford()
        self._trend = Trend()
        self._rts: list[float] = []  # round trips of blocks without stats
        self._rows: list[tuple[float, ...]] = []  # (rt or nan, wall, cpu, rss, ior, iow, cc)

    def add_block(
        self,
        round_trip_s: float | None,
        stats: Sequence[float] | None,
        failed: bool,
    ) -> None:
        if failed:
            self.failed_attempts += 1
            return
        self.count += 1
        if stats is None:
            if round_trip_s is not None:
                self._rts.append(round_trip_s)
                if len(self._rts) >= self._FOLD_ROWS:
                    self._fold()
            return
        self._rows.append(
            (
                math.nan if round_trip_s is None else round_trip_s,
                stats[0],
                stats[1],
                stats[2],
                stats[3],
                stats[4],
                stats[7] if len(stats) > 7 else math.nan,
            )
        )
        if len(self._rows) >= self._FOLD_ROWS:
            self._fold()

    def _fold(self) -> None:
        if self._rts:
            self._round_trip.add_many(np.asarray(self._rts, dtype=np.float64))
            self._rts = []
        if not self._rows:
            return
        a = np.asarray(self._rows, dtype=np.float64)
        self._rows = []
        rt = a[:, 0]
        has_rt = ~np.isnan(rt)
        self._round_trip.add_many(rt[has_rt])
        wall = a[:, 1]
        self._wall.add_many(wall)
        self._cpu.add_many(a[:, 2])
        self._peak_rss.add_many(a[:, 3])
        self._io_read.add_many(a[:, 4])
        self._io_write.add_many(a[:, 5])
        cc = a[:, 6]
        self._cpu_children.add_many(cc[~np.isnan(cc)])
        self._trend.add_many(wall * 1000.0)
        self._overhead.add_many(rt[has_rt] - wall[has_rt])

    def _folded(self, w: Welford) -> Welford:
        if self._rows or self._rts:
            self._fold()
        return w

    round_trip = property(lambda self: self._folded(self._round_trip))
    wall = property(lambda self: self._folded(self._wall))
    cpu = property(lambda self: self._folded(self._cpu))
    cpu_children = property(lambda self: self._folded(self._cpu_children))
    peak_rss = property(lambda self: self._folded(self._peak_rss))
    io_read = property(lambda self: self._folded(self._io_read))
    io_write = property(lambda self: self._folded(self._io_write))
    overhead = property(lambda self: self._folded(self._overhead))

    @property
    def trend(self) -> Trend:
        if self._rows or self._rts:
            self._fold()
        return self._trend

    def add_skipped(self, n: int = 1) -> None:
        self.skipped += n

    def add_failed_attempts(self, n: int = 1) -> None:
        """Failed attempts that never came back as a block (timeout reclaims, lost blocks)."""
        self.failed_attempts += n

    def to_json(self) -> dict[str, Any]:
        """The ``blocks`` section of a run line."""
        self._fold()
        measured = self._wall.n > 0
        return {
            "count": self.count,
            "skipped": self.skipped,
            "failed_attempts": self.failed_attempts,
            "round_trip": _stat_json(self._round_trip),
            "wall": _stat_json(self._wall),
            "cpu": _stat_json(self._cpu),
            "cpu_children": _stat_json(self._cpu_children),
            "peak_rss": _stat_json(self._peak_rss),
            "io_read": _stat_json(self._io_read),
            "io_write": _stat_json(self._io_write),
            "overhead": _stat_json(self._overhead),
            "io_read_bytes": int(self._io_read.total) if measured else None,
            "io_write_bytes": int(self._io_write.total) if measured else None,
            "trend_ms_per_block": self._trend.slope if measured else None,
        }


def counters_from_state(state: Any) -> dict[str, int]:
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
    counters: Mapping[str, int],
    blocks: TaskAggregates,
    workers: Mapping[str, Any] | None = None,
    wall_seconds: float | None = None,
) -> dict[str, Any]:
    """Fold one task's run into its run line (the TaskReport JSON).

    ``workers`` is ``TimelineSet.to_json()``; None (serial mode) gives an empty section.
    ``wall_seconds`` defaults to ``run_finished_at − run_started_at``.
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
        "resource_tracking": bool(resource_tracking),
        "counters": {k: int(v) for k, v in counters.items()},
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

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["idle"] = self.idle.to_dict()
        d["compute"] = self.compute.to_dict()
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
            **{k: opt(k) for k in ("startup", "launch", "setup", "teardown", "final_wait")},
        )


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


def _open_store_array(store: Path, name: str) -> np.ndarray[Any, Any] | None:
    """One array of a single-chunk Zarr v3 store, memory-mapped read-only; None if absent."""
    meta_path = store / name / "zarr.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TrackingError(f"cannot read {meta_path}: {exc}", path=str(store)) from exc
    try:
        shape = tuple(int(x) for x in meta["shape"])
        dtype = np.dtype(str(meta["data_type"])).newbyteorder("<")
        chunk = meta.get("chunk_grid", {}).get("configuration", {}).get("chunk_shape", shape)
        codecs = meta.get("codecs", [{"name": "bytes"}])
    except (KeyError, TypeError, ValueError) as exc:
        raise TrackingError(
            f"invalid array metadata in {meta_path}: {exc}", path=str(store)
        ) from exc
    endian = codecs[0].get("configuration", {}).get("endian", "little") if codecs else None
    if tuple(chunk) != shape or len(codecs) != 1 or codecs[0].get("name") != "bytes":
        raise TrackingError(
            f"{meta_path}: only single-chunk arrays with the plain bytes codec can be read",
            path=str(store),
        )
    if endian != "little" and dtype.itemsize > 1:
        raise TrackingError(f"{meta_path}: big-endian arrays are not supported", path=str(store))
    chunk_path = store.joinpath(name, "c", *("0" for _ in shape))
    if not chunk_path.exists():
        fill = meta.get("fill_value", 0)
        return np.full(shape, float(fill) if isinstance(fill, str) else fill, dtype=dtype)
    expected = int(np.prod(shape)) * dtype.itemsize
    if chunk_path.stat().st_size != expected:
        raise TrackingError(
            f"{chunk_path} holds {chunk_path.stat().st_size} bytes, expected {expected}",
            path=str(store),
        )
    return np.memmap(chunk_path, dtype=dtype, mode="r", shape=shape)


class _StoreArrays:
    """The per-block arrays of one tracking store, memory-mapped read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        done = _open_store_array(path, "done")
        self.shape: tuple[int, ...] = () if done is None else tuple(done.shape)
        self.done = None if done is None else done.reshape(-1)
        self.flat: dict[str, np.ndarray[Any, Any]] = {}
        for name in (*STATS_ARRAYS, *STAMP_ARRAYS):
            a = _open_store_array(path, name) if done is not None else None
            if a is None:
                continue
            if tuple(a.shape) != self.shape:
                raise TrackingError(
                    f"array {name!r} of {path} has shape {tuple(a.shape)}, "
                    f"but 'done' has {self.shape}",
                    path=str(path),
                )
            self.flat[name] = a.reshape(-1)

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
        if not measured:
            return BlockRecord(None, None, None, None, coord)
        defaults = BlockStats().to_tuple()
        values: list[Any] = [
            f[name][k].item() if name in f else defaults[i] for i, name in enumerate(STATS_ARRAYS)
        ]
        wid = int(f["worker_id"][k]) if "worker_id" in f else NO_WORKER
        sent = float(f["sent_at"][k]) if "sent_at" in f else None
        ret = float(f["returned_at"][k]) if "returned_at" in f else None
        return BlockRecord(BlockStats(*values), None if wid == NO_WORKER else wid, sent, ret, coord)

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
        self.resource_tracking = bool(d.get("resource_tracking", False))
        self.counters: dict[str, int] = dict(d.get("counters") or {})
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
        self.store_path = None if store_path is None else Path(store_path)

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
        return None if self.store_path is None else _StoreArrays(self.store_path)

    def block(self, coord: int | Sequence[int]) -> BlockRecord | None:
        """The stored record of the block at ``coord`` in the tracking grid.

        ``coord`` is a grid coordinate tuple or a flat C-order index. Returns None when
        the block is not recorded as done (or the task has no store); raises IndexError
        for a coordinate outside the grid.
        """
        store = self._store()
        if store is None:
            return None
        return store.record(coord)

    def block_records(self) -> Iterator[BlockRecord]:
        """Every block recorded as done, in grid (C) order."""
        store = self._store()
        if store is None:
            return iter(())
        return store.records()

    def panel(self) -> str:
        """This task's part of the Resource Utilization panel ("" if nothing to show)."""
        from ._panel import render_panel

        return render_panel([self])

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
        from ._panel import render_panel

        return render_panel(list(self.tasks.values()))

    def __repr__(self) -> str:
        return f"RunReport(tasks={list(self.tasks)})"


# re-exported: runs.jsonl I/O and validation live in _runlog, the printed panel in _panel
from ._panel import format_bytes, format_duration, render_panel  # noqa: E402
from ._runlog import append_run_line, read_last_run, read_runs, validate_run_line  # noqa: E402
