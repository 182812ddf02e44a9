"""Per-block measurement: ``profile_block(block)`` and the worker's own start-up clock.

Theory of operation
-------------------
Whoever runs a block measures it, around the call, with :class:`profile_block`. Every
figure is **process-wide**, because a block hands work to other threads (zarr codec
threads, user thread pools) and per-thread counters would miss it:

``wall_seconds``
    ``time.perf_counter()`` delta.
``cpu_seconds``
    ``getrusage(RUSAGE_SELF)`` user + system delta: every thread of this process, live
    or finished. Child processes are *not* in it.
``cpu_children_seconds``
    CPU of the child processes (and their descendants) that ran during the block; see
    :func:`_descendant_cpu_ticks` and ``docs/statistics.md`` for the exact accounting.
``io_read_bytes`` / ``io_write_bytes``
    ``rchar`` / ``wchar`` deltas of ``/proc/self/io``: bytes through the syscall layer,
    page-cache hits included.
``peak_rss_bytes``
    Linux: ``5`` is written to ``/proc/self/clear_refs`` when the block starts (this
    resets the kernel's resident high-water mark, Linux 4.0+) and ``VmHWM`` is read
    from ``/proc/self/status`` when it ends, so the figure is the process's peak while
    this block ran (a block that took no page fault skips that read: see
    :class:`Meter`). Where the reset is unavailable the figure falls back to
    ``ru_maxrss``, the process's peak so far.
``gpu_util_pct`` / ``gpu_mem_bytes``
    From NVML when the process can measure them (see :mod:`bellis._worker._gpu`): the mean SM
    utilisation attributed to the process and its children during the block, and its peak
    device memory. Without a device, NVML or ``bellis[gpu]``: NaN and 0, never a made-up
    measurement.

Deltas saturate at zero. An unsupported platform reports zeros and never raises.

The ``/proc`` files are opened once and read with ``os.pread`` (no per-call open or
seek); a fork drops the cached descriptors in the child, since ``/proc/self`` was
resolved to the parent's pid when they were opened.

Child processes
---------------
Every process's CPU is counted exactly once by the sum

    ``RUSAGE_CHILDREN`` (children this process reaped)
    + Σ over live descendants of ``utime + stime + cutime + cstime`` from
    ``/proc/<pid>/stat`` (a live process, plus what it reaped of its own children).

``cpu_children_seconds`` is that sum at exit minus the sum at enter, saturated at 0. A
child that already existed at enter contributes only what it burned during the block;
one still running at exit contributes what it burned so far; one reaped during the
block contributes through ``RUSAGE_CHILDREN``. The ``/proc`` scan is skipped when the
process has no children at all, which one ``waitid(P_ALL, WNOHANG | WNOWAIT)`` call
tells without reaping anything. ``/proc`` readings have the kernel's ``SC_CLK_TCK``
resolution (usually 10 ms); ``RUSAGE_CHILDREN`` has microseconds. A child reaped during
the walk would be in neither part: the walk is repeated until ``RUSAGE_CHILDREN`` is the
same after it as before (:func:`_with_live_descendants`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from .._block import BlockStats, stats_problem
from .._protocol import STATS_ROW

if TYPE_CHECKING:
    from .._block import Block
    from ._gpu import GpuMeter

try:
    import resource as _resource
except ImportError:  # pragma: no cover - Windows
    _resource = None  # type: ignore[assignment]

__all__ = [
    "PROCESS_START",
    "SETUP_ORIGIN",
    "Meter",
    "attach",
    "attach_gpu",
    "live_descendant_pids",
    "process_gpu_meter",
    "profile_block",
    "setup_seconds_since_start",
    "user_row",
]

_IS_LINUX: Final = sys.platform.startswith("linux")
_perf_counter = time.perf_counter
_pread = os.pread
_NAN: Final = math.nan
_NO_GPU: Final = (_NAN, 0)  # the seed's figures where the GPU is not measured

# ru_maxrss is KiB on Linux and the BSDs, bytes on macOS.
_MAXRSS_UNIT: Final = 1 if sys.platform == "darwin" else 1024

try:
    _CLK_TCK: int = int(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _CLK_TCK = 100
_SECONDS_PER_TICK: Final = 1.0 / _CLK_TCK if _CLK_TCK > 0 else 0.01

_HAS_WAITID: Final = hasattr(os, "waitid") and hasattr(os, "WNOWAIT") and _IS_LINUX
_WAITID_FLAGS: Final = (
    (os.WEXITED | os.WNOHANG | os.WNOWAIT) if _HAS_WAITID else 0  # type: ignore[attr-defined, unused-ignore]
)


# --------------------------------------------------------------------------- /proc files


class _ProcFiles:
    """Descriptors of ``/proc/self`` files, opened once per process (tests swap in
    descriptors that fail, to drive the refusal paths).

    A descriptor that cannot be opened is recorded as ``-2`` (unavailable) so the
    failure costs one ``open`` per process, not one per block.
    """

    __slots__ = ("clear_refs_fd", "io_fd", "opened", "statm_fd", "status_fd")

    def __init__(self) -> None:
        self.opened = False
        self.io_fd = -2
        self.status_fd = -2
        self.statm_fd = -2
        self.clear_refs_fd = -2

    def open(self) -> None:
        self.opened = True
        if not _IS_LINUX:
            return
        self.io_fd = _open_or_unavailable("/proc/self/io", os.O_RDONLY)
        self.status_fd = _open_or_unavailable("/proc/self/status", os.O_RDONLY)
        self.statm_fd = _open_or_unavailable("/proc/self/statm", os.O_RDONLY)
        self.clear_refs_fd = _open_or_unavailable("/proc/self/clear_refs", os.O_WRONLY)

    def forget(self) -> None:
        """Drop the descriptors (after a fork they describe the parent process)."""
        for fd in (self.io_fd, self.status_fd, self.statm_fd, self.clear_refs_fd):
            if fd >= 0:
                # EBADF means some post-fork cleanup closed it already: nothing to undo.
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.opened = False
        self.io_fd = self.status_fd = self.statm_fd = self.clear_refs_fd = -2


def _open_or_unavailable(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -2


_files = _ProcFiles()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_files.forget)


def _read_io(fd: int) -> tuple[int, int, int]:
    """``(rchar, wchar, bytes this read added to rchar)``; ``(0, 0, -1)`` where unreadable."""
    if fd < 0:
        return (0, 0, -1)
    try:
        data = _pread(fd, 512, 0)
        # b"rchar: <n>\nwchar: <n>\n..." (a fixed layout since Linux 2.6.20)
        fields = data.split(None, 4)
        return (int(fields[1]), int(fields[3]), len(data))
    except (OSError, ValueError, IndexError):
        return (0, 0, -1)


def _read_hwm_bytes(fd: int) -> tuple[int, int]:
    """``(VmHWM in bytes or -1 where unreadable, bytes this read added to rchar)``."""
    if fd < 0:
        return (-1, 0)
    try:
        text = _pread(fd, 4096, 0)
    except OSError:
        return (-1, 0)
    i = text.find(b"VmHWM:")
    if i < 0:
        return (-1, len(text))
    j = text.find(b"kB", i)
    try:
        return (int(text[i + 6 : j]) * 1024, len(text))
    except ValueError:
        return (-1, len(text))


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# how far ru_maxrss may sit above the resident size right after a reset and still be
# taken as the reset high-water mark (pages touched between the two reads)
_MAXRSS_SLACK_BYTES = 256 * 1024


def _resident_bytes(fd: int) -> tuple[int, int]:
    """``(resident set size from /proc/self/statm or -1, bytes this read added to rchar)``."""
    if fd < 0:
        return (-1, 0)
    try:
        data = _pread(fd, 256, 0)
    except OSError:
        return (-1, 0)
    try:
        return (int(data.split(None, 2)[1]) * _PAGE_BYTES, len(data))
    except (IndexError, ValueError):
        return (-1, len(data))


def _reset_hwm() -> int:
    """Reset the resident high-water mark; returns the bytes written (1), or 0 where refused.

    A refusal disables the reset for the rest of this process's life.
    """
    fd = _files.clear_refs_fd
    if fd < 0:
        return 0
    try:
        return os.write(fd, b"5")
    except OSError:
        # Kernel older than 4.0 (EINVAL) or a restricted /proc (EPERM/EACCES): fall back
        # to ru_maxrss for the rest of this process's life.
        os.close(fd)
        _files.clear_refs_fd = -2
        return 0


# ------------------------------------------------------------------- child processes


def _has_children() -> bool:
    """Whether this process has any child (running or unreaped); reaps nothing."""
    if not _HAS_WAITID:
        return False
    try:
        os.waitid(os.P_ALL, 0, _WAITID_FLAGS)  # type: ignore[attr-defined, unused-ignore]
    except OSError:  # ECHILD: no children at all
        return False
    return True


class _NoChildrenFiles(Exception):
    """The kernel has no ``/proc/<pid>/task/<tid>/children`` (``CONFIG_PROC_CHILDREN``)."""


#: Bytes the descendant walk has read from /proc, all told: a measurement subtracts what
#: it read itself from the block's ``io_read_bytes`` (``rchar`` counts every ``read``).
_walk_bytes = [0]

# None: not probed yet; then whether the per-thread children files exist.
_children_files: bool | None = None


def _children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from ``/proc/<pid>/task/<tid>/children``.

    Threads or processes that exit while they are read contribute nothing.
    """
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return []  # the process exited; its children were reparented away from us
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"{base}/{tid}/children", "rb") as f:
                data = f.read()
            _walk_bytes[0] += len(data)
        except FileNotFoundError:
            if os.path.isdir(f"{base}/{tid}"):
                raise _NoChildrenFiles from None
            continue  # the thread exited between listdir and open
        except OSError:
            continue  # ESRCH and friends: the thread is gone
        out.extend(int(x) for x in data.split())
    return out


def _descendants_by_ppid_scan(root: int) -> list[int]:
    """Every descendant of ``root`` from a full ``/proc`` scan (kernels without children files)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            _walk_bytes[0] += len(data)
        except OSError:
            continue  # the process exited while /proc was listed
        rest = data[data.rfind(b")") + 2 :].split()
        if len(rest) > 1:
            children.setdefault(int(rest[1]), []).append(int(name))
    out: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def live_descendant_pids() -> list[int]:
    """Pids of every live descendant of this process (children, grandchildren, ...).

    Empty where ``/proc`` is unavailable. A process that exits during the walk is left
    out, and so are its children (the kernel reparents them away from this process).
    """
    global _children_files
    if not _IS_LINUX:
        return []
    own = os.getpid()
    if _children_files is not False:
        try:
            out: list[int] = []
            stack = _children_of(own)
            while stack:
                pid = stack.pop()
                out.append(pid)
                stack.extend(_children_of(pid))
            _children_files = True
            return out
        except _NoChildrenFiles:
            _children_files = False
    try:
        return _descendants_by_ppid_scan(own)
    except OSError:
        return []  # /proc not mounted: nothing to read, as on other platforms


def _stat_cpu_ticks(pid: int) -> int:
    """``utime + stime + cutime + cstime`` of ``pid`` in clock ticks; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        _walk_bytes[0] += len(data)
    except OSError:
        return 0
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        # fields 14..17 of proc(5) are rest[11..14] (rest starts at field 3, the state)
        return int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    except (ValueError, IndexError):
        return 0


def _descendant_cpu_ticks() -> int:
    """Σ ``utime + stime + cutime + cstime`` over every live descendant, in ticks."""
    total = 0
    for pid in live_descendant_pids():
        total += _stat_cpu_ticks(pid)
    return total


#: walks of /proc at most per reading while children are reaped during each walk
_CONSISTENT_TRIES: Final = 4


def _reaped_seconds() -> float:
    """``RUSAGE_CHILDREN`` user + system: the CPU of the children this process reaped."""
    assert _resource is not None
    ru = _resource.getrusage(_resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


def _with_live_descendants(reaped: float) -> tuple[float, float]:
    """``reaped`` (``RUSAGE_CHILDREN``, just read) plus the CPU of the live descendants,
    as one reading; returns (that sum, ``RUSAGE_CHILDREN`` as of it).

    A child reaped during the ``/proc`` walk (by another thread, or at a garbage
    collection: a ``Popen`` dropped in a reference cycle reaps its child) would be in
    neither ``reaped`` nor the walk, and the sum would drop by all its CPU. So
    ``RUSAGE_CHILDREN`` is read again after the walk, and the walk repeated until no child
    was reaped during it. (Should every try see a reap, the last walk is taken with the
    later reading: a child reaped after the walk read it then counts twice, not never.)"""
    live = 0.0
    for _ in range(_CONSISTENT_TRIES):
        live = _descendant_cpu_ticks() * _SECONDS_PER_TICK
        after = _reaped_seconds()
        if after == reaped:
            break
        reaped = after
    return reaped + live, reaped


def _children_cpu_seconds() -> float:
    """CPU of reaped children (``RUSAGE_CHILDREN``) plus live descendants so far."""
    if _resource is None:
        return 0.0
    reaped = _reaped_seconds()
    if _has_children():
        return _with_live_descendants(reaped)[0]
    return reaped


# ---------------------------------------------------------------------- the meter

_getrusage = _resource.getrusage if _resource is not None else None
_RUSAGE_SELF: Final = _resource.RUSAGE_SELF if _resource is not None else 0
_RUSAGE_CHILDREN: Final = _resource.RUSAGE_CHILDREN if _resource is not None else 0
_waitid: Any = getattr(os, "waitid", None)
_P_ALL: Final = getattr(os, "P_ALL", 0)

#: the wire form of a measurement: ``BlockStats.to_tuple()`` order
WireStats = list[Any]


class Meter:
    """Boundary snapshots of this process's counters; what a block costs is the difference.

    :meth:`start` opens a measurement and :meth:`finish` closes it, returning the
    figures in wire order (``BlockStats.to_tuple()``). A loop that runs blocks back to
    back, with nothing but bellis's own bookkeeping between them, opens the next one with
    :meth:`restart` instead: the ``/proc/self/io`` and child-process readings taken by
    :meth:`finish` are reused as the next block's starting point (the bytes of bellis's
    own ``/proc`` reads in between are subtracted exactly), so a block costs one reading
    of each instead of two. CPU, page faults and wall are always read afresh at the
    block's start.

    Peak RSS (the seed's ``clear_refs`` reset, then ``VmHWM``): the resident size at the
    start comes from the cheap ``statm``, and the mark is reset only when it could differ
    from that size (see :meth:`_open`). The resident set grows only through
    page faults, which ``getrusage`` counts for every thread, so a block during which
    the process took no fault peaked at that size (to within a page that reading it may
    touch), and the costlier ``/proc/self/status`` is read only after a block that
    faulted.

    Child processes: after a check that found none, the next check is skipped while the
    process takes no page fault and no voluntary context switch, since creating a process
    does one or the other (see :meth:`finish` and ``docs/statistics.md``). (A transparent huge
    page collapsed by ``khugepaged`` during a fault-free block is the one growth without
    a fault of this process; it is not seen.)
    """

    __slots__ = (
        "_chain_child",
        "_chain_io_ok",
        "_chain_rchar",
        "_chain_wchar",
        "_child0",
        "_childless",
        "_cpu0",
        "_flt0",
        "_io_ok",
        "_kid_csw",
        "_kid_flt",
        "_kid_reaped",
        "_mark_flt",
        "_mark_rss",
        "_rchar0",
        "_reset",
        "_rss0",
        "_ru_tracks",
        "_t0",
        "_wchar0",
        "gpu",
        "started",
    )

    def __init__(self) -> None:
        self._chain_child = 0.0
        self._mark_rss = self._mark_flt = -2  # the high-water mark was never reset
        self._childless = False  # no child check yet
        self._kid_flt = self._kid_csw = -1
        self._kid_reaped = 0.0
        self._chain_io_ok = False
        self._io_ok = False
        self._chain_rchar = 0
        self._chain_wchar = 0
        self._t0 = 0.0
        #: whether a measurement was ever opened (so :meth:`restart` has readings to reuse)
        self.started = False
        #: this process's GPU figures (:func:`attach_gpu`); None: the seed's NaN and 0
        self.gpu: GpuMeter | None = None

    def start(self) -> None:
        """Snapshot every counter: a block starts now."""
        files = _files
        if not files.opened:
            files.open()
        child = _children_cpu_seconds()
        rchar, wchar, own = _read_io(files.io_fd)
        self._io_ok = own >= 0
        self._open(rchar + own, wchar, child)
        self.started = True

    def begin(self, back_to_back: bool) -> None:
        """:meth:`restart` when this block follows the last one back to back (and there
        is a last one), else :meth:`start`."""
        if back_to_back and self.started:
            self.restart()
        else:
            self.start()

    def restart(self) -> None:
        """Like :meth:`start`, continuing from the readings of the last :meth:`finish`."""
        # a block whose closing IO reading failed leaves no starting point: no IO figure
        self._io_ok = self._chain_io_ok
        self._open(self._chain_rchar, self._chain_wchar, self._chain_child)

    def _open(self, rchar: int, wchar: int, child: float) -> None:
        """The readings every opening takes afresh: resident size, CPU, page faults, wall.

        The high-water mark is reset only when it could differ from the resident size:
        after a page fault since the last reset (memory that faulted in and was freed
        again leaves the mark above the resident size), or when the resident size changed
        since then (``munmap`` shrinks it without a fault). Without either, the mark still
        equals the resident size, as a reset would leave it.
        """
        files = _files
        rss = -1
        if files.clear_refs_fd >= 0:
            rss, own = _resident_bytes(files.statm_fd)
            rchar += own
        # after the statm reading: a fault in between shows in this count
        if _getrusage is not None:
            ru = _getrusage(_RUSAGE_SELF)
            flt = ru.ru_minflt + ru.ru_majflt
            cpu = ru.ru_utime + ru.ru_stime
            maxrss = ru.ru_maxrss * _MAXRSS_UNIT
        else:
            flt = 0
            cpu = 0.0
            maxrss = -1
        if files.clear_refs_fd >= 0 and (rss != self._mark_rss or flt != self._mark_flt or rss < 0):
            written = _reset_hwm()
            wchar += written
            self._mark_rss = rss if written else -2
            self._mark_flt = flt
        self._reset = files.clear_refs_fd >= 0  # (a refused reset closes it)
        self._rss0 = rss
        self._rchar0 = rchar
        self._wchar0 = wchar
        self._child0 = child
        self._flt0 = flt
        # ru_maxrss is max(the kernel's high-water mark, a maximum kept from exec and
        # exited threads). When it is no larger than the resident size, that second term
        # cannot dominate during this block, so the exit's ru_maxrss is the block's peak
        # even after faults. (Read before a reset, it can only be larger: on the safe side.)
        self._ru_tracks = 0 <= rss and 0 <= maxrss <= rss + _MAXRSS_SLACK_BYTES
        self._cpu0 = cpu
        if self.gpu is not None:
            self.gpu.begin(_gpu_now_us())
        self._t0 = _perf_counter()

    def finish(self) -> WireStats:
        """Close the measurement: ``[wall, cpu, peak_rss, io_read, io_write, gpu_util,
        gpu_mem, cpu_children]``, every delta saturated at zero."""
        wall = _perf_counter() - self._t0
        cpu = 0.0
        maxrss = 0
        faulted = True
        flt = csw = -1
        if _getrusage is not None:
            ru = _getrusage(_RUSAGE_SELF)
            cpu = ru.ru_utime + ru.ru_stime - self._cpu0
            maxrss = ru.ru_maxrss * _MAXRSS_UNIT
            flt = ru.ru_minflt + ru.ru_majflt
            csw = ru.ru_nvcsw
            faulted = flt != self._flt0
        # the IO snapshot comes before any /proc reading of bellis's own below; what
        # those read is added to ``own`` and so charged to no block
        files = _files
        rchar, wchar, own = _read_io(files.io_fd)
        read_ok = own >= 0
        if not read_ok:
            own = 0
        children = 0.0
        if self._childless and flt == self._kid_flt and csw == self._kid_csw:
            # The last check found no child, and since the getrusage before it the process
            # took neither a page fault nor a voluntary context switch. Creating a process
            # does one or the other: fork write-protects the parent's memory, so its next
            # write faults, and vfork / posix_spawn sleep until the child has started. So
            # there is still no child, none was reaped, and both readings are skipped.
            children = self._kid_reaped
        elif _getrusage is not None:
            children = reaped = _reaped_seconds()
            childless = False
            if _HAS_WAITID:
                try:
                    _waitid(_P_ALL, 0, _WAITID_FLAGS)
                except ChildProcessError:
                    childless = True  # no child at all: nothing live to sample
                except OSError:
                    pass
                else:
                    walked = _walk_bytes[0]
                    children, reaped = _with_live_descendants(reaped)
                    own += _walk_bytes[0] - walked
            self._childless = childless
            self._kid_flt = flt
            self._kid_csw = csw
            self._kid_reaped = reaped
        peak = maxrss
        if self._reset:
            if not faulted and self._rss0 >= 0:
                peak = self._rss0
            elif not self._ru_tracks:
                hwm, read = _read_hwm_bytes(files.status_fd)
                own += read
                if hwm >= 0:
                    peak = hwm
        self._chain_rchar = rchar + own
        self._chain_wchar = wchar
        self._chain_io_ok = read_ok
        self._chain_child = children
        if read_ok and self._io_ok:
            rd = rchar - self._rchar0
            wr = wchar - self._wchar0
        else:
            rd = wr = 0  # a reading is missing at one end: no figure rather than a wrong one
        children -= self._child0
        gpu_util, gpu_mem = _NO_GPU if self.gpu is None else self.gpu.finish()
        return [
            wall if wall > 0.0 else 0.0,
            cpu if cpu > 0.0 else 0.0,
            peak,
            rd if rd > 0 else 0,
            wr if wr > 0 else 0,
            gpu_util,
            gpu_mem,
            children if children > 0.0 else 0.0,
        ]


# ---------------------------------------------------------------------- profile_block


class profile_block:  # lower case: daisy's public name
    """Measure what a block costs and attach it as ``block.stats``.

    ``with profile_block(block): ...`` snapshots the counters on enter and, on exit,
    sets ``block.stats`` to a :class:`~bellis.BlockStats` of the deltas, but only if
    ``block.stats`` is still None: the first measurement attached wins, so a narrower
    ``profile_block`` inside a block function beats the automatic one around it. The
    measurement is kept when the body raises, and the exception propagates. ``stats``
    holds this scope's own measurement either way.
    """

    __slots__ = ("_block", "_meter", "stats")

    def __init__(self, block: Block) -> None:
        self._block = block
        self._meter = Meter()
        self.stats: BlockStats | None = None

    def __enter__(self) -> profile_block:
        self._meter.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        stats = BlockStats(*self._meter.finish())
        self.stats = stats
        block = self._block
        if block.stats is None:
            block.stats = stats
        return False


# ----------------------------------------------------------------- worker start-up clock

#: ``time.perf_counter()`` when this module was imported (or this process was forked).
PROCESS_START: float = _perf_counter()


# ---------------------------------------------------------------------- GPU figures

_gpu_state: list[Any] = []  # [GpuMeter | None] once this process has looked


def _gpu_now_us() -> int:
    return time.time_ns() // 1000  # NVML's timebase: wall clock, µs since the epoch


def process_gpu_meter() -> GpuMeter | None:
    """This process's :class:`~bellis._worker._gpu.GpuMeter`, opened on first use; None when there
    is no NVIDIA device to measure (then nothing GPU-related was imported). A forked child
    looks again: NVML handles do not survive a fork."""
    if not _gpu_state or _gpu_state[1] != os.getpid():
        from ._gpu import open_gpu_meter

        _gpu_state[:] = [open_gpu_meter(_own_pids), os.getpid()]
    meter: GpuMeter | None = _gpu_state[0]
    return meter


def _own_pids() -> list[int]:
    return [os.getpid(), *live_descendant_pids()]


def attach_gpu(meter: Meter) -> None:
    """Let ``meter`` fill the GPU figures when this process can measure them."""
    meter.gpu = process_gpu_meter()


def _process_age_at_import() -> float | None:
    """Seconds from this process's creation (fork) to now, from ``/proc/self/stat``.

    Field 22 is the start time in clock ticks since boot; ``CLOCK_BOOTTIME`` is the same
    clock (time namespaces are applied by the kernel to both). None where unavailable.
    """
    if not _IS_LINUX or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    try:
        with open("/proc/self/stat", "rb") as f:
            data = f.read()
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        start = int(data[data.rfind(b")") + 2 :].split()[19]) * _SECONDS_PER_TICK
    except (OSError, ValueError, IndexError):
        return None
    age = now - start
    return age if age > 0.0 else 0.0


_AGE_AT_IMPORT = _process_age_at_import()


def _restart_clock() -> None:
    """In a forked child (a worker forked from the fork server): this process began now."""
    global PROCESS_START, _AGE_AT_IMPORT
    PROCESS_START = _perf_counter()
    if _AGE_AT_IMPORT is not None:
        _AGE_AT_IMPORT = 0.0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_clock)

#: What :func:`setup_seconds_since_start` counts from: ``"process"`` (the process's
#: creation, read from /proc, so interpreter start-up and imports are included) or
#: ``"import"`` (the import of this module, where /proc is unavailable).
SETUP_ORIGIN: Final[Literal["process", "import"]] = (
    "import" if _AGE_AT_IMPORT is None else "process"
)


def setup_seconds_since_start() -> float:
    """Seconds this process has existed, on its own clocks.

    A worker calls it just before its first acquire and reports the value as its setup
    duration. With ``SETUP_ORIGIN == "process"`` it counts from the process's creation
    (10 ms kernel tick resolution for the origin, then ``perf_counter``), so interpreter
    start-up, imports and the user's set-up code are all in it. Otherwise it counts from
    the import of ``bellis``. A forked process (a worker forked from the fork server)
    counts from its fork.
    """
    since_import = _perf_counter() - PROCESS_START
    if _AGE_AT_IMPORT is None:
        return since_import
    return _AGE_AT_IMPORT + since_import


def user_row(block: Block) -> bytes:
    """``block.stats`` (set by the block function) as a wire row; ValueError with the
    reason when the figures cannot be recorded."""
    stats = block.stats
    problem = stats_problem(stats)
    if problem is not None:
        raise ValueError(f"block {block.block_id}: {problem}")
    assert isinstance(stats, BlockStats)
    return STATS_ROW.pack(*stats.to_tuple())


def attach(block: Block, meter: Meter | None) -> Any:
    """Close ``meter`` and, as ``profile_block`` does, attach the figures as
    ``block.stats`` unless the block function attached its own (which then win).

    Returns the automatic measurement when it is the one that goes home, else None.
    """
    if meter is None:
        return None
    measured = meter.finish()
    if block.stats is not None:
        return None
    block.stats = BlockStats(*measured)
    return measured
