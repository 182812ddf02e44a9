"""Running aggregates in O(1) memory: Welford mean/std, the least-squares trend, and the
per-task block aggregates a run folds into its report."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._block import MEASURED_ARRAYS, STATS_ARRAYS, STATS_FORMAT

__all__ = ["STATS_DTYPE", "Stat", "TaskAggregates", "Trend", "Welford"]

#: A block's measurements as one numpy record: the wire's ``STATS_ROW`` (``_protocol``),
#: field for field, with the tracking store's array names as field names.
STATS_DTYPE = np.dtype(
    [(name, "<" + code) for name, code in zip(STATS_ARRAYS, STATS_FORMAT[1:], strict=True)]
)


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

    def add_repeated(self, x: float, n: int) -> None:
        """``n`` calls of :meth:`add` with ``x``, in one pairwise update."""
        if n <= 0:
            return
        if n == 1:
            self.add(x)
            return
        batch = Welford()
        batch.n = n
        batch.mean = x
        batch.min = x
        batch.max = x
        batch.total = x * n
        self.merge(batch)

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

    ``add_measured`` takes a whole batch of measured blocks at once (the server's path:
    a message's ``STATS_DTYPE`` records and their round trips).

    Per-block cost matters here (the server calls it for every block): rows are appended
    to a bounded buffer and folded into the accumulators with numpy every
    ``_FOLD_ROWS`` blocks and whenever a result is read, so memory stays O(1).
    Completion order (the trend's x axis) is kept: pending single rows are folded before
    a batch is queued, and pending batches before a single row.
    """

    _FOLD_ROWS = 4096

    __slots__ = (
        "_chunk_rows",
        "_chunks",
        "_cpu",
        "_cpu_children",
        "_gpu_mem",
        "_gpu_util",
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
        # GPU figures of the blocks that measured them (util not NaN; memory also > 0)
        self._gpu_util = Welford()
        self._gpu_mem = Welford()
        self._trend = Trend()
        self._rts: list[float] = []  # round trips of blocks without stats
        # (rt or nan, wall, cpu, rss, ior, iow, cc, gpu util or nan, gpu mem)
        self._rows: list[tuple[float, ...]] = []
        self._chunks: list[np.ndarray[Any, Any]] = []  # batches of such rows, (n, 9) arrays
        self._chunk_rows = 0

    def add_round_trips(self, round_trip_seconds: float, n: int) -> None:
        """``n`` successful blocks without statistics, each out ``round_trip_seconds``:
        ``n`` calls of ``add_block(round_trip_seconds, None, False)`` in one."""
        if n <= 0:
            return
        self.count += n
        rts = self._rts
        rts.extend([round_trip_seconds] * n)
        if len(rts) >= self._FOLD_ROWS:
            self._fold()

    def add_block(
        self,
        round_trip_seconds: float | None,
        stats: Sequence[float] | None,
        failed: bool,
    ) -> None:
        if failed:
            self.failed_attempts += 1
            return
        self.count += 1
        if stats is None:
            if round_trip_seconds is not None:
                self._rts.append(round_trip_seconds)
                if len(self._rts) >= self._FOLD_ROWS:
                    self._fold()
            return
        if self._chunks:
            self._fold()
        self._rows.append(
            (
                math.nan if round_trip_seconds is None else round_trip_seconds,
                stats[0],
                stats[1],
                stats[2],
                stats[3],
                stats[4],
                stats[7] if len(stats) > 7 else math.nan,
                stats[5] if len(stats) > 7 else math.nan,
                stats[6] if len(stats) > 7 else 0,
            )
        )
        if len(self._rows) >= self._FOLD_ROWS:
            self._fold()

    def add_measured(self, round_trips: np.ndarray[Any, Any], table: np.ndarray[Any, Any]) -> None:
        """Successful blocks in completion order: their round trips (seconds) and their
        measurements, a ``STATS_DTYPE`` array of the same length."""
        n = len(table)
        if n == 0:
            return
        if self._rows:
            self._fold()
        a = np.empty((n, 9), dtype=np.float64)
        a[:, 0] = round_trips
        for i, name in enumerate(MEASURED_ARRAYS, 1):
            a[:, i] = table[name]
        a[:, 7] = table["gpu_util_pct"]
        a[:, 8] = table["gpu_mem_bytes"]
        self.count += n
        self._chunks.append(a)
        self._chunk_rows += n
        if self._chunk_rows >= self._FOLD_ROWS:
            self._fold()

    def _fold(self) -> None:
        if self._rts:
            self._round_trip.add_many(np.asarray(self._rts, dtype=np.float64))
            self._rts = []
        if self._rows:
            a = np.asarray(self._rows, dtype=np.float64)
            self._rows = []
        elif self._chunks:
            a = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
            self._chunks = []
            self._chunk_rows = 0
        else:
            return
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
        util, mem = a[:, 7], a[:, 8]
        self._gpu_util.add_many(util[~np.isnan(util)])
        self._gpu_mem.add_many(mem[~np.isnan(util) | (mem > 0)])
        self._trend.add_many(wall * 1000.0)
        self._overhead.add_many(rt[has_rt] - wall[has_rt])

    def _folded(self, w: Welford) -> Welford:
        while self._rows or self._rts or self._chunks:
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
    gpu_util = property(lambda self: self._folded(self._gpu_util))
    gpu_mem = property(lambda self: self._folded(self._gpu_mem))

    @property
    def trend(self) -> Trend:
        self._folded(self._wall)
        return self._trend

    def add_skipped(self, n: int = 1) -> None:
        self.skipped += n

    def add_failed_attempts(self, n: int = 1) -> None:
        """Failed attempts that never came back as a block (timeout reclaims, lost blocks)."""
        self.failed_attempts += n

    def to_json(self) -> dict[str, Any]:
        """The ``blocks`` section of a run line."""
        self._folded(self._wall)
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
            "gpu_util": _stat_json(self._gpu_util),
            "gpu_mem": _stat_json(self._gpu_mem),
            "io_read_bytes": int(self._io_read.total) if measured else None,
            "io_write_bytes": int(self._io_write.total) if measured else None,
            "trend_ms_per_block": self._trend.slope if measured else None,
        }
