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
    this block ran. Where the reset is unavailable the figure falls back to
    ``ru_maxrss``, the process's peak so far.
``gpu_util_pct`` / ``gpu_mem_bytes``
    Reserved: NaN and 0, never a made-up measurement.

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
resolution (usually 10 ms); ``RUSAGE_CHILDREN`` has microseconds.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal

from ._block import BlockStats

if TYPE_CHECKING:
    from ._block import Block

try:
    import resource as _resource
except ImportError:  # pragma: no cover - Windows
    _resource = None  # type: ignore[assignment]

__all__ = [
    "PROCESS_START",
    "SETUP_ORIGIN",
    "live_descendant_pids",
    "profile_block",
    "setup_seconds_since_start",
]

_IS_LINUX: Final = sys.platform.startswith("linux")
_perf_counter = time.perf_counter
_pread = os.pread
_NAN: Final = math.nan

# ru_maxrss is KiB on Linux and the BSDs, bytes on macOS.
_MAXRSS_UNIT: Final = 1 if sys.platform == "darwin" else 1024

try:
    _CLK_TCK: int = int(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _CLK_TCK = 100
_SECONDS_PER_TICK: Final = 1.0 / _CLK_TCK if _CLK_TCK > 0 else 0.01

_HAS_WAITID: Final = hasattr(os, "waitid") and hasattr(os, "WNOWAIT") and _IS_LINUX
_WAITID_FLAGS: Final = (
    (os.WEXITED | os.WNOHANG | os.WNOWAIT) if _HAS_WAITID else 0  # type: ignore[attr-defined]
)


# --------------------------------------------------------------------------- /proc files


class _ProcFiles:
    """Descriptors of ``/proc/self`` files, opened once per process.

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
    """``(rchar, wchar, bytes this read added to rchar)``; zeros where unreadable."""
    if fd < 0:
        return (0, 0, 0)
    try:
        data = _pread(fd, 512, 0)
        # b"rchar: <n>\nwchar: <n>\n..." (a fixed layout since Linux 2.6.20)
        i = data.index(b"\n")
        j = data.index(b"\n", i + 1)
        return (int(data[6:i]), int(data[i + 8 : j]), len(data))
    except (OSError, ValueError, IndexError):
        return (0, 0, 0)


def _read_hwm_bytes(fd: int) -> int:
    """``VmHWM`` of this process in bytes, or -1 where unreadable."""
    if fd < 0:
        return -1
    try:
        text = _pread(fd, 4096, 0)
    except OSError:
        return -1
    i = text.find(b"VmHWM:")
    if i < 0:
        return -1
    j = text.find(b"kB", i)
    try:
        return int(text[i + 6 : j]) * 1024
    except ValueError:
        return -1


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# how far ru_maxrss may sit above the resident size right after a reset and still be
# taken as the reset high-water mark (pages touched between the two reads)
_MAXRSS_SLACK_BYTES = 256 * 1024


def _resident_bytes(fd: int) -> int:
    """Resident set size from ``/proc/self/statm`` (a cheap read), or -1."""
    if fd < 0:
        return -1
    try:
        fields = _pread(fd, 256, 0).split()
        return int(fields[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return -1


def _reset_hwm() -> bool:
    """Reset the resident high-water mark; False (and disabled for good) where refused."""
    fd = _files.clear_refs_fd
    if fd < 0:
        return False
    try:
        os.write(fd, b"5")
    except OSError:
        # Kernel older than 4.0 (EINVAL) or a restricted /proc (EPERM/EACCES): fall back
        # to ru_maxrss for the rest of this process's life.
        os.close(fd)
        _files.clear_refs_fd = -2
        return False
    return True


def _maxrss_bytes() -> int:
    if _resource is None:
        return 0
    return int(_resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss) * _MAXRSS_UNIT


# ------------------------------------------------------------------- child processes


def _has_children() -> bool:
    """Whether this process has any child (running or unreaped); reaps nothing."""
    if not _HAS_WAITID:
        return False
    try:
        os.waitid(os.P_ALL, 0, _WAITID_FLAGS)  # type: ignore[attr-defined]
    except OSError:  # ECHILD: no children at all
        return False
    return True


class _NoChildrenFiles(Exception):
    """The kernel has no ``/proc/<pid>/task/<tid>/children`` (``CONFIG_PROC_CHILDREN``)."""


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


def _children_cpu_seconds() -> float:
    """CPU of reaped children (``RUSAGE_CHILDREN``) plus live descendants so far."""
    if _resource is None:
        return 0.0
    ru = _resource.getrusage(_resource.RUSAGE_CHILDREN)
    reaped = ru.ru_utime + ru.ru_stime
    if _has_children():
        return reaped + _descendant_cpu_ticks() * _SECONDS_PER_TICK
    return reaped


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

    __slots__ = (
        "_block",
        "_child0",
        "_cpu0",
        "_hwm_reset",
        "_rchar0",
        "_ru_tracks",
        "_t0",
        "_wchar0",
        "stats",
    )

    def __init__(self, block: Block) -> None:
        self._block = block
        self.stats: BlockStats | None = None

    def __enter__(self) -> profile_block:
        files = _files
        if not files.opened:
            files.open()
        # Order: the costly parts first, so that they stay out of the wall, CPU and IO
        # deltas; the bytes of the /proc/self/io read itself are subtracted.
        self._hwm_reset = _reset_hwm()
        self._child0 = _children_cpu_seconds()
        self._ru_tracks = False
        if _resource is not None:
            ru = _resource.getrusage(_resource.RUSAGE_SELF)
            self._cpu0 = ru.ru_utime + ru.ru_stime
            if self._hwm_reset:
                # ru_maxrss is max(the kernel's reset high-water mark, a maximum kept from
                # exec and exited threads). When right after the reset it is no larger than
                # the resident size, that second term cannot dominate during this block,
                # so the exit's ru_maxrss is the block's peak and the costlier VmHWM read
                # of /proc/self/status can be skipped.
                rss = _resident_bytes(files.statm_fd)
                self._ru_tracks = 0 <= ru.ru_maxrss * _MAXRSS_UNIT <= rss + _MAXRSS_SLACK_BYTES
        else:
            self._cpu0 = 0.0
        # the /proc/self/io read comes last: nothing read after it counts as the block's
        rchar, wchar, own = _read_io(files.io_fd)
        self._rchar0 = rchar + own
        self._wchar0 = wchar
        self._t0 = _perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        wall = _perf_counter() - self._t0
        cpu = 0.0
        maxrss = 0
        if _resource is not None:
            ru = _resource.getrusage(_resource.RUSAGE_SELF)
            cpu = ru.ru_utime + ru.ru_stime - self._cpu0
            maxrss = ru.ru_maxrss * _MAXRSS_UNIT
        files = _files
        rchar, wchar, _ = _read_io(files.io_fd)
        children = _children_cpu_seconds() - self._child0
        if self._hwm_reset and not self._ru_tracks:
            peak = _read_hwm_bytes(files.status_fd)
            if peak < 0:
                peak = maxrss
        else:
            peak = maxrss
        rd = rchar - self._rchar0
        wr = wchar - self._wchar0
        stats = BlockStats(
            wall if wall > 0.0 else 0.0,
            cpu if cpu > 0.0 else 0.0,
            peak,
            rd if rd > 0 else 0,
            wr if wr > 0 else 0,
            _NAN,
            0,
            children if children > 0.0 else 0.0,
        )
        self.stats = stats
        block = self._block
        if block.stats is None:
            block.stats = stats
        return False


# ----------------------------------------------------------------- worker start-up clock

#: ``time.perf_counter()`` when this module was imported.
PROCESS_START: Final[float] = _perf_counter()


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


_AGE_AT_IMPORT: Final = _process_age_at_import()

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
    the import of ``bellis``.
    """
    since_import = _perf_counter() - PROCESS_START
    if _AGE_AT_IMPORT is None:
        return since_import
    return _AGE_AT_IMPORT + since_import
