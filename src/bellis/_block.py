"""Block, BlockStatus and BlockStats.

A :class:`Block` made by the scheduler is lazy: it holds its task geometry and its flat
index in the task's block grid, and builds ``funlib.geometry.Roi`` objects and the
cantor ``block_id`` only when asked. The per-block hot path therefore allocates one
small slotted object and nothing else. A block built by user code holds its ROIs.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from funlib.geometry import Roi

__all__ = [
    "MEASURED_ARRAYS",
    "NO_WORKER",
    "STAMP_ARRAYS",
    "STATS_ARRAYS",
    "STATS_FORMAT",
    "Block",
    "BlockGeometry",
    "BlockStats",
    "BlockStatus",
    "cantor_number",
    "heartbeat",
    "heartbeats",
    "stats_problem",
]

#: the tracking-store arrays that hold a BlockStats, in BlockStats constructor order
STATS_ARRAYS = (
    "wall_seconds",
    "cpu_seconds",
    "peak_rss_bytes",
    "io_read_bytes",
    "io_write_bytes",
    "gpu_util_pct",
    "gpu_mem_bytes",
    "cpu_children_seconds",
)
#: the wire and storage form of a BlockStats as a ``struct`` format, one code per
#: STATS_ARRAYS name: little-endian float64 for times, uint64 for byte counts (64 bytes)
STATS_FORMAT = "<ddQQQdQd"
#: the figures a block's measurement fills (the GPU slots are reserved: NaN and 0)
MEASURED_ARRAYS = tuple(name for name in STATS_ARRAYS if not name.startswith("gpu_"))
#: the tracking-store arrays that say who completed a block, and when
STAMP_ARRAYS = ("worker_id", "sent_at", "returned_at")
#: ``worker_id`` of a block completed outside any managed worker (serial, unmanaged)
NO_WORKER = 2**32 - 1


_beats = 0


def heartbeat() -> None:
    """Tell bellis that the running block is alive although it uses no CPU and does no IO.

    A block that legitimately waits (on a GPU kernel, a remote service, a lock held by
    another process) calls this more often than its task's ``stall_timeout``, so that
    stall detection does not reclaim it (``Task(stall_timeout=...)``, see
    ``docs/failures.md``). It costs one integer increment; without ``stall_timeout``, and
    in serial mode, nothing reads it. ``block.heartbeat()`` is the same.
    """
    global _beats
    _beats += 1


def heartbeats() -> int:
    """How many times :func:`heartbeat` was called in this process (the stall watchdog
    reads this)."""
    return _beats


class BlockGeometry(Protocol):
    """What a lazily built :class:`Block` needs from its task's geometry
    (``bellis._graph.TaskGeometry``): the block's ROIs and id from its index ``k``."""

    @property
    def task_id(self) -> str: ...

    def read_roi_of(self, k: int) -> Roi: ...

    def write_roi_of(self, k: int) -> Roi: ...

    def spatial_id_of(self, k: int) -> int: ...


class BlockStatus:
    """Integer status constants (daisy 2.0.0 uses plain ints, 1.x used an Enum)."""

    CREATED = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3


def _pyramid_volume(dims: int, edge: int) -> int:
    if edge <= 0:
        return 0
    v = 1
    for k in range(dims):
        v = v * (edge + k) // (k + 1)
    return v


def cantor_number(index: tuple[int, ...] | list[int]) -> int:
    """The pyramid-volume (generalised cantor) number of a grid index, as funlib/daisy."""
    coords = [c if c > 0 else 0 for c in index]
    n = len(coords)
    if n == 0:
        return 0
    result = coords[0]
    total = coords[0]
    for d in range(1, n):
        total += coords[d]
        result += _pyramid_volume(d + 1, total)
    return result


def cantor_index(number: int, dims: int) -> tuple[int, ...]:
    """The grid index whose :func:`cantor_number` is ``number``, in ``dims`` dimensions:
    a block id (as the summary prints it) back to its grid coordinate."""
    if number < 0 or dims < 1:
        raise ValueError(f"no {dims}-D grid index has the cantor number {number}")
    if dims == 1:
        return (number,)
    # the largest coordinate sum s with pyramid_volume(dims, s) <= number
    lo, hi = 0, 1
    while _pyramid_volume(dims, hi) <= number:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _pyramid_volume(dims, mid) <= number:
            lo = mid
        else:
            hi = mid
    head = cantor_index(number - _pyramid_volume(dims, lo), dims - 1)
    return (*head, lo - sum(head))


class BlockStats:
    """What one block cost, measured by whoever ran it. Immutable.

    ``cpu_children_seconds`` is bellis's addition: CPU of child processes the block
    started (reaped ones from ``RUSAGE_CHILDREN``, running ones sampled from /proc).
    """

    __slots__ = (
        "_cpu",
        "_cpu_children",
        "_gpu_mem",
        "_gpu_util",
        "_io_read",
        "_io_write",
        "_peak_rss",
        "_wall",
    )

    def __init__(
        self,
        wall_seconds: float = 0.0,
        cpu_seconds: float = 0.0,
        peak_rss_bytes: int = 0,
        io_read_bytes: int = 0,
        io_write_bytes: int = 0,
        gpu_util_pct: float = math.nan,
        gpu_mem_bytes: int = 0,
        cpu_children_seconds: float = 0.0,
    ) -> None:
        self._wall = float(wall_seconds)
        self._cpu = float(cpu_seconds)
        self._peak_rss = int(peak_rss_bytes)
        self._io_read = int(io_read_bytes)
        self._io_write = int(io_write_bytes)
        self._gpu_util = float(gpu_util_pct)
        self._gpu_mem = int(gpu_mem_bytes)
        self._cpu_children = float(cpu_children_seconds)

    wall_seconds = property(lambda self: self._wall)
    cpu_seconds = property(lambda self: self._cpu)
    peak_rss_bytes = property(lambda self: self._peak_rss)
    io_read_bytes = property(lambda self: self._io_read)
    io_write_bytes = property(lambda self: self._io_write)
    gpu_util_pct = property(lambda self: self._gpu_util)
    gpu_mem_bytes = property(lambda self: self._gpu_mem)
    cpu_children_seconds = property(lambda self: self._cpu_children)

    def to_tuple(self) -> tuple[float, float, int, int, int, float, int, float]:
        """The wire/storage form, in constructor order."""
        return (
            self._wall,
            self._cpu,
            self._peak_rss,
            self._io_read,
            self._io_write,
            self._gpu_util,
            self._gpu_mem,
            self._cpu_children,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockStats):
            return NotImplemented
        a, b = self.to_tuple(), other.to_tuple()
        return all((x == y) or (x != x and y != y) for x, y in zip(a, b, strict=True))

    def __hash__(self) -> int:
        return hash(self.to_tuple()[:5])

    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockStats, self.to_tuple())

    def __repr__(self) -> str:
        return (
            f"BlockStats(wall_seconds={self._wall:.6f}, cpu_seconds={self._cpu:.6f}, "
            f"peak_rss_bytes={self._peak_rss}, io_read_bytes={self._io_read}, "
            f"io_write_bytes={self._io_write})"
        )


_U64_LIMIT = 2**64


def stats_problem(stats: Any) -> str | None:
    """Why ``stats`` cannot be recorded, or None: a :class:`BlockStats` whose times are
    finite and non-negative and whose byte counts are within ``0 .. 2**64 - 1``. bellis's
    own measurements always qualify; this checks what a block function attached itself."""
    if not isinstance(stats, BlockStats):
        return (
            f"block.stats is a {type(stats).__name__}; set it to a bellis.BlockStats "
            "(bellis.profile_block does) or leave it None"
        )
    values = stats.to_tuple()
    for name, i in (("wall_seconds", 0), ("cpu_seconds", 1), ("cpu_children_seconds", 7)):
        x = values[i]
        if not 0.0 <= x < math.inf:
            return (
                f"block.stats.{name} is {x!r}; times must be finite and non-negative "
                "(bellis.profile_block measures a block)"
            )
    util = values[5]
    if not (util != util or 0.0 <= util <= 100.0):  # NaN: not measured
        return (
            f"block.stats.gpu_util_pct is {util!r}; a utilisation is a percentage, 0 .. 100, "
            "or NaN when not measured (bellis.profile_block measures a block)"
        )
    for name, i in (
        ("peak_rss_bytes", 2),
        ("io_read_bytes", 3),
        ("io_write_bytes", 4),
        ("gpu_mem_bytes", 6),
    ):
        if not 0 <= values[i] < _U64_LIMIT:
            return (
                f"block.stats.{name} is {values[i]!r}; byte counts must be within "
                "0 .. 2**64 - 1 (bellis.profile_block measures a block)"
            )
    return None


def _as_roi(value: Any, name: str) -> Roi:
    if isinstance(value, Roi):
        return value
    offset = getattr(value, "offset", None)
    if offset is None:
        offset = getattr(value, "begin", None)
    shape = getattr(value, "shape", None)
    try:
        if offset is None or shape is None:
            raise TypeError
        return Roi(tuple(int(o) for o in offset), tuple(int(s) for s in shape))
    except (TypeError, ValueError):
        raise TypeError(
            "expected a Roi (bellis.Roi, funlib.geometry.Roi, or any object with integer "
            f"`offset` and `shape`), got {type(value).__name__} for {name}"
        ) from None


class Block:
    """One unit of work: a read ROI, a write ROI, an id and a status.

    ``Block(total_roi, read_roi, write_roi, task_id=None, block_id=None)`` follows daisy
    2.0.0's positional order (1.x put ``block_id`` before ``task_id``; use keywords).
    ``block_id`` is ``(task_id, spatial_id)`` with the cantor number of the block's grid
    index relative to ``total_roi``. Equality and hashing use ``block_id`` only.
    """

    __slots__ = ("_geom", "_k", "_read_roi", "_sid", "_status", "_task_id", "_write_roi", "stats")

    def __init__(
        self,
        total_roi: Any,
        read_roi: Any,
        write_roi: Any,
        task_id: str | None = None,
        block_id: int | None = None,
    ) -> None:
        total = _as_roi(total_roi, "total_roi")
        self._read_roi: Roi | None = _as_roi(read_roi, "read_roi")
        self._write_roi: Roi | None = _as_roi(write_roi, "write_roi")
        self._task_id = "" if task_id is None else str(task_id)
        self._geom: BlockGeometry | None = None
        self._k = -1
        self._status = BlockStatus.CREATED
        self.stats: BlockStats | None = None
        if block_id is not None:
            self._sid: int | None = int(block_id)
        else:
            w = self._write_roi
            index = [
                (wo - to) // ws if ws else 0
                for wo, to, ws in zip(w.offset, total.offset, w.shape, strict=True)
            ]
            self._sid = cantor_number(index)

    @classmethod
    def _lazy(cls, geom: BlockGeometry, k: int, status: int) -> Block:
        """A scheduler block: geometry plus flat grid index, everything else on demand."""
        b = cls.__new__(cls)
        b._geom = geom
        b._k = k
        b._task_id = geom.task_id
        b._read_roi = None
        b._write_roi = None
        b._sid = None
        b._status = status
        b.stats = None
        return b

    def heartbeat(self) -> None:
        """Say that this block is alive although it uses no CPU and does no IO.

        For a block that legitimately waits (on a GPU, a remote service) longer than its
        task's ``stall_timeout``: call this more often than that, and stall detection does
        not reclaim it. The same as :func:`bellis.heartbeat`; it costs an integer
        increment, and nothing reads it without ``stall_timeout`` or in serial mode.
        """
        global _beats
        _beats += 1

    @property
    def read_roi(self) -> Roi:
        r = self._read_roi
        if r is None:
            assert self._geom is not None
            r = self._read_roi = self._geom.read_roi_of(self._k)
        return r

    @property
    def write_roi(self) -> Roi:
        r = self._write_roi
        if r is None:
            assert self._geom is not None
            r = self._write_roi = self._geom.write_roi_of(self._k)
        return r

    @property
    def task_id(self) -> str:
        return self._task_id

    @property
    def spatial_id(self) -> int:
        s = self._sid
        if s is None:
            assert self._geom is not None
            s = self._sid = self._geom.spatial_id_of(self._k)
        return s

    @property
    def block_id(self) -> tuple[str, int]:
        return (self._task_id, self.spatial_id)

    @property
    def status(self) -> int:
        return self._status

    @status.setter
    def status(self, value: int) -> None:
        if value not in (0, 1, 2, 3) or isinstance(value, bool):
            raise ValueError("invalid status value")
        self._status = int(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Block):
            return NotImplemented
        return self.block_id == other.block_id

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return f"{self._task_id}/{self.spatial_id} read={self.read_roi!r} write={self.write_roi!r}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_block,
            (
                self.read_roi,
                self.write_roi,
                self._task_id,
                self.spatial_id,
                self._status,
                self.stats,
            ),
        )


def _rebuild_block(
    read_roi: Roi,
    write_roi: Roi,
    task_id: str,
    spatial_id: int,
    status: int,
    stats: BlockStats | None,
) -> Block:
    b = Block.__new__(Block)
    b._geom = None
    b._k = -1
    b._read_roi = read_roi
    b._write_roi = write_roi
    b._task_id = task_id
    b._sid = spatial_id
    b._status = status
    b.stats = stats
    return b
