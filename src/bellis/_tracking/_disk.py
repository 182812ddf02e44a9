"""What a tracking store asks of its filesystem: reserved chunk blocks and a run lock.

Reserving
=========
The chunk files are memory-mapped and written by plain stores into the mapping. A store
into a page of a *sparse* file that the filesystem cannot back (the disk is full) is not
an error the program can catch: the kernel sends SIGBUS and the process dies. So every
chunk file a run maps writable has all its blocks allocated first (:func:`reserve`):
``posix_fallocate``, or, where the filesystem does not support it, writing the file's
holes. A full disk then surfaces as :func:`disk_full_error` while the store opens.

The lock
========
A run holds an exclusive ``fcntl`` lock on ``<store>/bellis.lock`` from open to close
(:class:`StoreLock`). The kernel drops it when the process exits, however it exits, so
it never goes stale; a second run fails at once and names the holder, which writes its
pid, host and start time into the file after locking. Readers (``bellis status``, zarr)
never take the lock; ``bellis status --watch`` only *tests* it (:func:`is_run_in_progress`,
``F_OFD_GETLK`` / ``F_GETLK``), which neither takes nor disturbs it.

The lock is an open-file-description lock (``F_OFD_SETLK``, Linux) where the system has
them, else a classic POSIX record lock (``lockf``). Both are ``fcntl`` byte-range locks,
which NFS and Lustre forward to the server. The OFD kind belongs to this descriptor: other
code of the process that opens and closes the lock file (a backup copying the store)
does not drop it, which would happen to a POSIX lock. A forked child would share the
descriptor, and so the lock, so a fork closes the child's copy (``_close_in_child``);
the descriptor is close-on-exec, so programs started from here never get it. This module
never opens a lock file this process already holds (``_HELD``).
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from ..errors import TrackingError

fcntl: Any
try:
    import fcntl
except ImportError:  # not a POSIX system: no locks (StoreLock.acquire warns)
    fcntl = None

__all__ = [
    "LOCK_NAME",
    "StoreLock",
    "check_space",
    "data_ranges",
    "disk_full_error",
    "free_bytes",
    "is_no_space",
    "is_run_in_progress",
    "read_lock_holder",
    "reserve",
    "reserve_by_writing",
    "unreserved_bytes",
]

_log = logging.getLogger("bellis")

LOCK_NAME = "bellis.lock"
"""The lock file inside a store directory. It stays there after the run (removing it
would let a later run lock a new file while an earlier one still holds the old one)."""

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL)
_HOLDER_WAIT_SECONDS = 2.0
_REWRITE_STEP = 1 << 20

_HELD: dict[tuple[int, int], tuple[int, str]] = {}
"""(st_dev, st_ino) of every lock file this process holds -> (descriptor, store path)."""


def _close_in_child() -> None:
    """After a fork, in the child: drop the inherited lock descriptors (the parent keeps
    its lock; the child never held one of its own)."""
    for fd, _display in _HELD.values():
        try:
            os.close(fd)
        except OSError:
            pass  # the child closed it already
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


# -- reserving ------------------------------------------------------------------------------


def is_no_space(exc: OSError) -> bool:
    return exc.errno in _NO_SPACE


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still allocate on ``directory``'s filesystem."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def unreserved_bytes(files: list[tuple[Path, int]]) -> int:
    """Bytes that reserving ``(file, nbytes)`` pairs would still allocate (an estimate
    from ``st_blocks``: a missing file needs all of its bytes)."""
    total = 0
    for file, nbytes in files:
        try:
            allocated = os.stat(file).st_blocks * 512
        except FileNotFoundError:
            allocated = 0
        total += max(0, nbytes - allocated)
    return total


def _human(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def disk_full_error(display: str, needed: int, directory: Path) -> TrackingError:
    """The error of a store that does not fit on its filesystem."""
    while not directory.exists() and directory.parent != directory:
        directory = directory.parent
    try:
        free = free_bytes(directory)
    except OSError:
        free = 0
    return TrackingError(
        f"not enough disk space for block tracking at {display}: it needs {needed} more "
        f"bytes ({_human(needed)}) reserved for its per-block arrays, and its filesystem has "
        f"{free} bytes ({_human(free)}) free. Free space there, or pass tracking_path= (or "
        "bellis.set_tracking_basedir()) on another filesystem",
        path=display,
    )


def check_space(display: str, needed: int, directory: Path) -> None:
    """Raise :func:`disk_full_error` when ``needed`` bytes are more than are free (a
    filesystem that cannot say is left to :func:`reserve` to find out)."""
    if needed <= 0:
        return
    try:
        free = free_bytes(directory)
    except OSError:
        return
    if needed > free:
        raise disk_full_error(display, needed, directory)


def reserve(fd: int, nbytes: int) -> None:
    """Allocate every block of the first ``nbytes`` of ``fd`` without changing its content.

    Raises OSError (ENOSPC when the disk is full). Already allocated blocks cost nothing.
    """
    if nbytes <= 0:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, nbytes)
            return
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
    reserve_by_writing(fd, nbytes)


def _holes(fd: int, nbytes: int) -> list[tuple[int, int]] | None:
    """The holes of ``[0, nbytes)``, or None when the filesystem cannot say."""
    seek_hole = getattr(os, "SEEK_HOLE", None)
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_hole is None or seek_data is None:
        return None
    holes = []
    offset = 0
    try:
        while offset < nbytes:
            start = os.lseek(fd, offset, seek_hole)
            if start >= nbytes:
                break
            try:
                end = min(os.lseek(fd, start, seek_data), nbytes)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                end = nbytes  # no data after the hole
            holes.append((start, end))
            offset = end
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    return holes


def data_ranges(fd: int, nbytes: int) -> list[tuple[int, int]] | None:
    """The byte ranges of ``[0, nbytes)`` that may hold data (the complement of the
    holes; a reserved, never-written range of ext4 and XFS is a hole too), or None when
    the filesystem cannot say. A reader may take every other byte as zero."""
    holes = _holes(fd, nbytes)
    if holes is None:
        return None
    out = []
    offset = 0
    for start, end in holes:
        if start > offset:
            out.append((offset, start))
        offset = max(offset, end)
    if offset < nbytes:
        out.append((offset, nbytes))
    return out


def reserve_by_writing(fd: int, nbytes: int) -> None:
    """The fallback of :func:`reserve`: write the bytes of every hole back (zeros).

    A file whose ``st_blocks`` already covers ``nbytes`` is left alone. Where the
    filesystem reports no holes in a file that is still short of blocks (it cannot
    report them), every byte is read and written back.
    """
    if os.fstat(fd).st_blocks * 512 >= nbytes:
        return
    ranges = _holes(fd, nbytes)
    if not ranges:
        ranges = [(0, nbytes)]
    for start, end in ranges:
        offset = start
        while offset < end:
            data = os.pread(fd, min(_REWRITE_STEP, end - offset), offset)
            if not data:  # past the end of the file: zeros extend it
                data = bytes(min(_REWRITE_STEP, end - offset))
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, offset)
                offset += written
                view = view[written:]


# -- the run lock -------------------------------------------------------------------------


def _read_holder(fd: int) -> str:
    """Who holds the lock, as the holder wrote it; waits briefly for a holder that has
    just locked and not written yet."""
    deadline = time.monotonic() + _HOLDER_WAIT_SECONDS
    while True:
        raw = os.pread(fd, 4096, 0)
        try:
            info = json.loads(raw)
        except ValueError:
            info = None
        if isinstance(info, dict):
            return (
                f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, "
                f"started {info.get('started', '?')}"
            )
        if time.monotonic() >= deadline:
            return "its pid, host and start time were not written"
        time.sleep(0.05)


def _lock_exclusive(fd: int) -> None:
    """Take an exclusive, non-blocking lock on the whole of ``fd``; OSError when held
    elsewhere (EAGAIN / EACCES) or unsupported."""
    if fcntl is None:
        raise OSError(errno.ENOSYS, "this system has no fcntl locks")
    ofd = getattr(fcntl, "F_OFD_SETLK", None)
    if ofd is not None:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
        request = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(64, b"\0")
        try:
            fcntl.fcntl(fd, ofd, request)
            return
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def is_run_in_progress(root: Path) -> bool | None:
    """Whether a run holds the lock of the store at ``root``, tested without locking.

    None when it cannot be told: no lock file (no bellis run ever wrote the store, e.g.
    one written by daisy), or a system or filesystem without ``fcntl`` locks.
    """
    if fcntl is None:
        return None
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD requests). A
        # read-lock probe conflicts with the run's exclusive lock; the answer's l_type is
        # F_UNLCK when nothing conflicts.
        probe = struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0).ljust(64, b"\0")
        for command in (getattr(fcntl, "F_OFD_GETLK", None), fcntl.F_GETLK):
            if command is None:
                continue
            try:
                answer = fcntl.fcntl(fd, command, probe)
            except OSError as exc:
                if exc.errno in _NO_LOCKS:
                    continue
                raise
            (l_type,) = struct.unpack_from("h", answer)
            return bool(l_type != fcntl.F_UNLCK)
        return None
    finally:
        os.close(fd)


def read_lock_holder(root: Path) -> dict[str, Any] | None:
    """What the last run to lock the store wrote into ``bellis.lock`` (pid, host,
    started), or None when the file is missing or holds no such record."""
    try:
        raw = (root / LOCK_NAME).read_bytes()
    except FileNotFoundError:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


class StoreLock:
    """This process's exclusive lock on one store (``None`` fd: the filesystem has no locks)."""

    __slots__ = ("_fd", "_key", "_pid")

    def __init__(self, fd: int | None, key: tuple[int, int] | None) -> None:
        self._fd = fd
        self._key = key
        self._pid = os.getpid()

    @classmethod
    def acquire(cls, root: Path, display: str) -> StoreLock:
        """Lock the store at ``root`` or raise :class:`TrackingError` naming its holder."""
        file = root / LOCK_NAME
        try:
            st = os.stat(file)
        except FileNotFoundError:
            pass
        else:
            held = _HELD.get((st.st_dev, st.st_ino))
            if held is not None:
                raise TrackingError(
                    f"block tracking at {display} is already open in this process (as "
                    f"{held[1]}); two tasks of one run cannot share a tracking_path",
                    path=display,
                )
        fd = os.open(file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            try:
                _lock_exclusive(fd)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    raise TrackingError(
                        f"block tracking at {display} is in use by another run "
                        f"({_read_holder(fd)}). Two runs on one store would process every "
                        "block twice: wait for that run to end or stop it (its lock goes "
                        "when its process exits), or give this run another tracking_path=",
                        path=display,
                    ) from None
                if exc.errno not in _NO_LOCKS:
                    raise
                _log.warning(
                    "block tracking at %s: the filesystem does not support file locks (%s); "
                    "this run cannot stop a second run on the same store",
                    display,
                    exc.strerror,
                )
                os.close(fd)
                return cls(None, None)
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            }
            data = (json.dumps(info) + "\n").encode("utf-8")
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        key = (st.st_dev, st.st_ino)
        _HELD[key] = (fd, display)
        return cls(fd, key)

    def release(self) -> None:
        """Drop the lock (closing the descriptor). Releasing twice is harmless."""
        fd, self._fd = self._fd, None
        if self._pid != os.getpid():
            return  # a forked child: its copy of the descriptor was closed at the fork
        if self._key is not None:
            _HELD.pop(self._key, None)
            self._key = None
        if fd is not None:
            os.close(fd)
