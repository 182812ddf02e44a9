"""Event-driven exit detection for local workers: one descriptor for the run loop.

Polled once per tick, a worker's death is seen up to a tick (50 ms) late, and its
replacement starts that much later. :class:`ExitWatch` gathers in one ``epoll`` descriptor
what becomes readable when a local worker ends: the *pidfd* of each spawned worker
(readable once the process has exited, Linux 5.3+) and the fork server's control socket
(readable when the zygote reports that one of its workers ended). The run loop registers
that one descriptor in its selector, so it wakes as soon as a worker ends, and asks
:meth:`ExitWatch.ended` which workers to poll; nothing is scanned per worker or per tick.

A worker stays *due* (returned by :meth:`~ExitWatch.ended` at every call) from its exit
until :meth:`~ExitWatch.done` says its launcher reported the exit: a launcher may hold an
exit back a moment (until the tee threads of ``log_mode="both"`` have copied its last
output), and then makes the descriptor readable again with :meth:`ExitWatch.wake`.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from typing import Any

from ._zygote import ForkedProcess, ForkServer

__all__ = ["ExitWatch"]


class ExitWatch:
    """The pidfds of spawned workers and the fork servers' sockets, in one descriptor.

    Workers are named by a ``key`` of the caller's (the launcher's handle)."""

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._key_of_fd: dict[int, Any] = {}  # pidfd -> key
        self._fd_of_key: dict[Any, int] = {}  # key -> pidfd
        self._forked: dict[ForkedProcess, Any] = {}  # a zygote's worker -> key
        self._zygotes: dict[int, ForkServer] = {}  # control socket -> fork server
        self._servers: list[ForkServer] = []  # every one watched, ended ones included
        self._due: dict[Any, None] = {}  # ended, not yet reported by the launcher
        #: :meth:`wake` (any thread) makes the descriptor readable
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()  # no write once closed (its number may be reused)
        self._ep.register(self._wake_r, select.EPOLLIN)

    @staticmethod
    def supported() -> bool:
        """Whether this platform has epoll and pidfds (Linux 5.3+)."""
        if not (hasattr(select, "epoll") and hasattr(os, "pidfd_open")):
            return False
        try:
            fd = os.pidfd_open(os.getpid())
        except OSError:  # ENOSYS: a kernel older than 5.3
            return False
        os.close(fd)
        return True

    def fileno(self) -> int:
        """Readable when a watched worker may have ended (then call :meth:`ended`)."""
        return self._ep.fileno()

    def watch_spawned(self, key: Any, pid: int) -> None:
        """Watch a child process of this one (not reaped yet, so ``pid`` is still its)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self._due[key] = None  # cannot be watched: polled at every call instead
            return
        self._zygotes.pop(fd, None)  # a closed fork server's number, reused
        self._ep.register(fd, select.EPOLLIN)
        self._key_of_fd[fd] = key
        self._fd_of_key[key] = fd

    def watch_zygote(self, zygote: ForkServer) -> None:
        """Watch a fork server's reports (its workers are added with :meth:`watch_forked`)."""
        fd = zygote.fileno()
        if fd >= 0:
            self._ep.register(fd, select.EPOLLIN)
            self._zygotes[fd] = zygote
        self._servers.append(zygote)

    def watch_forked(self, key: Any, proc: ForkedProcess) -> None:
        """Watch a worker asked of a fork server that :meth:`watch_zygote` watches."""
        self._forked[proc] = key

    def ended(self) -> list[Any]:
        """The workers that ended and whose exit the launcher has not reported yet."""
        for fd, zygote in list(self._zygotes.items()):
            if zygote.fileno() != fd:  # closed: the epoll dropped it with the socket
                del self._zygotes[fd]
        for fd, _events in self._ep.poll(0):
            if fd == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(fd, 4096):
                        pass
                continue
            server = self._zygotes.get(fd)
            if server is not None:
                server.pump(0.0)  # its reports: starts, exits, or its own end
                continue
            key = self._key_of_fd.pop(fd, None)
            if key is not None:
                del self._fd_of_key[key]
                self._forget(fd)
                self._due[key] = None
        for zygote in self._servers:
            for proc in zygote.take_changed():
                key = self._forked.pop(proc, None)
                if key is None:
                    continue
                if proc.popen is not None:  # the zygote could not fork it: spawned
                    self.watch_spawned(key, proc.popen.pid)
                else:
                    self._due[key] = None
        return list(self._due)

    def wake(self) -> None:
        """Make the descriptor readable (from any thread): a worker's end that the launcher
        held back can be reported now."""
        with self._wake_lock, contextlib.suppress(OSError):  # full: a wake is pending
            if self._wake_w >= 0:
                os.write(self._wake_w, b"\0")

    def done(self, key: Any, proc: Any = None) -> None:
        """The launcher reported the exit of ``key`` (whose process object is ``proc``):
        forget it."""
        self._due.pop(key, None)
        if proc is not None:
            self._forked.pop(proc, None)
        fd = self._fd_of_key.pop(key, None)
        if fd is not None:
            del self._key_of_fd[fd]
            self._forget(fd)

    def _forget(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._ep.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        """Close every pidfd and the epoll descriptor."""
        for fd in list(self._key_of_fd):
            self._forget(fd)
        self._key_of_fd.clear()
        self._fd_of_key.clear()
        self._forked.clear()
        self._zygotes.clear()
        self._servers.clear()
        self._due.clear()
        self._ep.close()
        with self._wake_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_w = -1
