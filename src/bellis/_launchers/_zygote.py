"""A fork server for local workers (Linux): one preloaded zygote per run.

Theory of operation
-------------------
Starting a Python interpreter and importing bellis costs tens of milliseconds; forking a
small process that has already done so costs about one. :class:`ForkServer` starts one
*zygote* per run, the first time the :class:`~bellis._launchers._base.LocalLauncher`
launches a worker: ``python -c <ZYGOTE_MAIN> <fd>``, a fresh interpreter (never a fork of
the driver, so nothing of the driver is in it) that imports only what every worker imports
(the worker's ``_main`` and ``_client`` and the modules they load, ``cloudpickle``),
starts no thread, installs no signal handler, and then waits on a
``SOCK_SEQPACKET`` control socket.

Each launch sends one request: the worker's environment, the driver's working directory and
umask, and three descriptors (``SCM_RIGHTS``): the read end of a pipe that holds the payload
frame (stdin), and the worker's stdout and stderr (its log files, or the pipes of a tee). The
zygote forks; the child becomes a session leader, puts those three descriptors on 0, 1 and 2,
closes every other descriptor, takes the environment, the directory and the umask, builds
fresh ``sys.std*`` streams, and returns from :func:`serve` into ``ZYGOTE_MAIN``, which runs
``bellis._worker._main.main()`` exactly as a spawned worker does: the payload (the user's function)
is read from stdin and unpickled in the child.

The zygote answers every request in order with ``("started", pid)`` plus a *pidfd* of the
child, opened before the child can be reaped (so the driver signals the right process
whatever pids are reused), or ``("failed", reason)``. It watches its children through their
pidfds, reaps each as it ends and reports ``("exit", pid, returncode)`` (``-N`` for a signal,
as ``subprocess`` has it). The driver reads these reports when it polls, through
:class:`ForkedProcess`, which behaves as a ``subprocess.Popen`` (``poll``, ``wait``,
``send_signal``, ``kill``, ``pid``), so the launcher's code for exits, signals and the
``died of signal SIGKILL`` messages is the same for both kinds of worker.

A launch does not wait for the zygote: the request waits in the socket while the zygote
boots, so a run's first workers start while the driver goes on. Where the zygote cannot take
a worker (it failed to start, or ended, or the worker's environment differs from the
zygote's in a variable read when an interpreter starts), the worker is spawned as before
(``python -c``, the fallback that every other platform uses), with the same payload pipe and
log descriptors.

The zygote ends when its control socket closes (``close()`` at the end of the run, or the
driver's death) or when its parent changes: it then stops any worker still alive (SIGTERM,
one second, SIGKILL), reaps them and exits.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import importlib.machinery
import io
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, NamedTuple, NoReturn

from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV, SYS_PATH_ENV

__all__ = [
    "ZYGOTE_MAIN",
    "ForkServer",
    "ForkedProcess",
    "StartChoice",
    "choose_start",
    "is_fork_server_supported",
    "serve",
    "usable_cpus",
]

logger = logging.getLogger("bellis")

#: what the zygote runs; :func:`serve` returns only in a forked worker, which then runs the
#: same entry point as a spawned one (its command line names ``bellis._worker._main``, as theirs)
ZYGOTE_MAIN = (
    "import sys; from bellis._launchers._zygote import serve; serve(); "
    "from bellis._worker._main import main; sys.exit(main())"
)

#: environment variables an interpreter reads when it starts (or the dynamic loader and the
#: C library do): a worker whose values differ from the zygote's is spawned instead
_STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_", "MALLOC_")
_STARTUP_NAMES = frozenset({"LANG", "LANGUAGE"})
#: per-worker variables: not part of the zygote's own environment
_PER_WORKER = frozenset({CONTEXT_ENV, DAISY_CONTEXT_ENV, "PYTHONUNBUFFERED"})
#: the largest request (the environment, pickled) the control socket carries
_MAX_REQUEST_BYTES = 200 * 1024
#: how long the zygote waits for its workers after SIGTERM when it is told to end
_ZYGOTE_GRACE_SECONDS = 1.0


def is_fork_server_supported() -> bool:
    """Whether this platform has what the fork server needs (Linux 5.3+: pidfds)."""
    if not sys.platform.startswith("linux"):
        return False
    needed = (
        hasattr(os, "fork")
        and hasattr(os, "pidfd_open")
        and hasattr(signal, "pidfd_send_signal")
        and hasattr(socket, "send_fds")
        and hasattr(socket, "SOCK_SEQPACKET")
    )
    if not needed:
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:  # ENOSYS: a kernel older than 5.3
        return False
    os.close(fd)
    return True


class StartChoice(NamedTuple):
    """How to start one local worker: :func:`choose_start`'s answer."""

    #: fork it from the run's zygote (else spawn it: ``python -c``)
    fork: bool
    #: start the zygote now (it is not running yet)
    start_zygote: bool


def choose_start(
    *, zygote_running: bool, live: int, batch: int, restart: bool, cpus: int, expected: int = 0
) -> StartChoice:
    """The start policy of a local worker.

    ``live``: this launcher's workers running (or starting) already; ``batch``: how many
    workers, this one included, are being started together; ``restart``: it takes the
    place of a worker that ended (a crash's replacement); ``cpus``: the cores this process
    may use; ``expected``: the most workers the run may keep on this launcher at once (its
    tasks' ``max_workers``, capped by their blocks; 0: unknown).

    Starting the zygote costs one interpreter start, which comes before its first fork.
    Where every worker of the run has a core of its own, spawning them costs the same wall
    time in parallel and the zygote would only add its start in front: spawn, and start no
    zygote. Where more workers than cores run at once, or the run expects to, interpreter
    starts queue for the cores, and one zygote start plus a millisecond per fork is shorter:
    fork them all (a pipeline's downstream workers, started later, too). A
    replacement is spawned when no zygote runs yet, and the zygote is started beside it,
    so the run's next replacements are forked (a crash is seldom the last one).
    """
    if zygote_running:
        return StartChoice(fork=True, start_zygote=False)
    if live + batch > cpus or expected > cpus:
        return StartChoice(fork=True, start_zygote=True)
    return StartChoice(fork=False, start_zygote=restart)


def usable_cpus() -> int:
    """The number of cores this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES) and k not in _PER_WORKER
    }


def _current_umask() -> int | None:
    """This process's umask, read without changing it (Linux 4.7+); None where unreadable."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


# ====================================================================== the zygote side


def serve() -> None:
    """The zygote's loop. Returns only in a forked child, set up to run as a worker."""
    ctl = socket.socket(fileno=int(sys.argv[1]))
    # what every worker imports, loaded once here (never numpy: a worker imports only what
    # its user's code asks for)
    import cloudpickle  # noqa: F401

    import bellis._code_origin
    import bellis._graph
    import bellis._worker._client
    import bellis._worker._main
    import bellis.logging  # noqa: F401

    parent = os.getppid()
    poller = select.poll()
    ctl_fd = ctl.fileno()
    poller.register(ctl_fd, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        events = poller.poll(1000)
        if not events and os.getppid() != parent:
            _end_zygote(children)
        for fd, _ev in events:
            if fd != ctl_fd:
                _reap(ctl, poller, children, fd)
                continue
            try:
                data, fds, flags = _recv_fds(ctl, _MAX_REQUEST_BYTES + 4096, 3)
            except OSError:
                data, fds, flags = b"", [], 0
            if not data:  # the driver closed the socket, or died
                _end_zygote(children)
            if flags & socket.MSG_TRUNC or len(fds) != 3:
                for f in fds:
                    os.close(f)
                _send(ctl, ("failed", "malformed request"))
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                for f in fds:
                    os.close(f)
                _send(ctl, ("failed", f"fork failed: {exc}"))
                continue
            if pid == 0:
                try:
                    _become_worker(ctl, fds, pickle.loads(data))
                except BaseException:  # the child must never go on to run the zygote's loop
                    with contextlib.suppress(BaseException):
                        import traceback

                        traceback.print_exc()
                        sys.stderr.flush()
                    os._exit(1)
                return
            # the pidfd is opened before this loop can reap the child: it names this process
            pidfd = os.pidfd_open(pid)
            for f in fds:
                os.close(f)
            poller.register(pidfd, select.POLLIN)
            children[pidfd] = pid
            _send(ctl, ("started", pid), [pidfd])


def _recv_fds(
    sock: socket.socket, size: int, max_fds: int, flags: int = 0
) -> tuple[bytes, list[int], int]:
    """``socket.recv_fds`` that honours ``flags`` (Python 3.11's ignores them)."""
    fds = array.array("i")
    data, ancdata, msg_flags, _ = sock.recvmsg(size, socket.CMSG_LEN(max_fds * fds.itemsize), flags)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), msg_flags


def _send(ctl: socket.socket, msg: tuple[Any, ...], fds: list[int] | None = None) -> None:
    try:
        socket.send_fds(ctl, [pickle.dumps(msg)], fds or [])
    except OSError:
        pass  # the driver is gone: the next read of the socket ends the zygote


def _reap(ctl: socket.socket, poller: Any, children: dict[int, int], pidfd: int) -> None:
    pid = children.pop(pidfd)
    poller.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)  # it has ended (its pidfd is readable): no wait
    _send(ctl, ("exit", pid, os.waitstatus_to_exitcode(status)))


def _end_zygote(children: dict[int, int]) -> NoReturn:
    """Stop the workers still alive (SIGTERM, a grace period, SIGKILL), reap them, exit."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in children.values():
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + _ZYGOTE_GRACE_SECONDS
        while children and (sig == signal.SIGKILL or time.monotonic() < deadline):
            for pidfd, pid in list(children.items()):
                if select.select([pidfd], [], [], 0)[0]:
                    os.waitpid(pid, 0)
                    os.close(pidfd)
                    del children[pidfd]
            if children:
                time.sleep(0.01)
    # no interpreter finalization: it has nothing to flush, and the driver waits for it
    os._exit(0)


def _become_worker(ctl: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
    """In the forked child: the descriptors, session, environment and streams of a worker."""
    os.setsid()
    ctl.detach()  # closed below with every other inherited descriptor
    if min(fds) < 3:  # the zygote was started without one of 0-2: move them out of the way
        import fcntl

        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in fds]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    _close_inherited_fds()
    os.chdir(request["cwd"])
    if request["umask"] is not None:
        os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.argv[:] = ["-c"]
    _open_std_streams(unbuffered=bool(request["env"].get("PYTHONUNBUFFERED")))
    _resolve_sys_path()


def _resolve_sys_path() -> None:
    """Put the driver's ``sys.path`` in place and resolve every entry against the working
    directory now, as a spawned worker's start-up imports do: a relative entry (``"lib"``)
    then means the driver's directory, even after the user's code changes directory."""
    from bellis._worker._main import _extend_sys_path

    _extend_sys_path(os.environ.get(SYS_PATH_ENV, "").split(os.pathsep))
    # drops the finders of relative entries (resolved in the zygote's directory) and the
    # directory listings the zygote cached (the user may have written modules since)
    importlib.invalidate_caches()
    importlib.machinery.PathFinder.find_spec("_bellis_resolve_sys_path_")


def _close_inherited_fds() -> None:
    """Close every descriptor above 2 (the zygote's socket, its pidfds of other workers)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.close(fd)


def _open_std_streams(*, unbuffered: bool) -> None:
    """``sys.stdin``/``stdout``/``stderr`` over descriptors 0-2, as a starting interpreter
    makes them (``-u``/``PYTHONUNBUFFERED`` honoured; stderr line-buffered)."""
    old = sys.__stdout__ if sys.__stdout__ is not None else sys.stdout
    encoding = old.encoding if old is not None else "utf-8"
    errors = (old.errors if old is not None else None) or "strict"

    def make(
        fd: int, name: str, *, write: bool, line_buffering: bool, err: str
    ) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
        raw.name = name  # type: ignore[misc,unused-ignore]
        buf: Any
        if write:
            buf = raw if unbuffered else io.BufferedWriter(raw)
        else:
            buf = io.BufferedReader(raw)
        return io.TextIOWrapper(
            buf,
            encoding=encoding,
            errors=err,
            line_buffering=line_buffering and not unbuffered,
            write_through=write and unbuffered,
        )

    sys.stdin = make(0, "<stdin>", write=False, line_buffering=False, err=errors)
    sys.stdout = make(1, "<stdout>", write=True, line_buffering=os.isatty(1), err=errors)
    sys.stderr = make(2, "<stderr>", write=True, line_buffering=True, err="backslashreplace")
    # the originals, as a starting interpreter has them (``sys.__std*__`` are Final to mypy)
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))


# ====================================================================== the driver side


class ForkedProcess:
    """A worker forked by the zygote, with the part of ``subprocess.Popen``'s interface the
    local launcher uses. Until the zygote has forked it, its pid is not known yet; where the
    zygote cannot fork it, it is spawned and this object speaks for that process."""

    def __init__(self, server: ForkServer, fds: list[int], env: dict[str, str]) -> None:
        self._server = server
        #: the payload pipe's read end and the stdout/stderr descriptors, held until the
        #: zygote has forked (a fallback spawn uses them)
        self._fds: list[int] | None = fds
        self._env: dict[str, str] | None = env
        self._pid: int | None = None
        self.pidfd = -1
        self.returncode: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The worker's pid (waits for the zygote's answer if it has not come yet)."""
        if self.popen is not None:
            return self.popen.pid
        if self._pid is None:
            self._server.resolve(self)
        if self.popen is not None:
            return self.popen.pid
        assert self._pid is not None
        return self._pid

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        if self.returncode is None:
            self._server.pump(0.0)
            if self.popen is not None:
                return self.popen.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.popen is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                return self.popen.wait(left)
            if self.returncode is not None:
                return self.returncode
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0 or self._server.closed:
                raise subprocess.TimeoutExpired("bellis worker", timeout or 0.0)
            self._server.pump(min(left, 0.5))

    def send_signal(self, sig: int) -> None:
        if self.popen is not None:
            self.popen.send_signal(sig)
            return
        if self._pid is None:
            self._server.resolve(self)
            if self.popen is not None:
                self.popen.send_signal(sig)
                return
        if self.returncode is None and self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """The driver's end of one zygote: start it, send it requests, read its reports."""

    def __init__(self, python: str, env: dict[str, str], spawn_argv: list[str]) -> None:
        self._spawn_argv = spawn_argv
        self._env = {k: v for k, v in env.items() if k not in _PER_WORKER}
        self._startup = _startup_env(self._env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [python, "-c", ZYGOTE_MAIN, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=self._env,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ctl: socket.socket | None = ours
        self._lock = threading.RLock()
        self._pending: deque[ForkedProcess] = deque()
        self._live: dict[int, ForkedProcess] = {}  # by pid
        #: workers whose state changed since :meth:`take_changed`: ended (``returncode``
        #: set), or spawned instead (``popen`` set)
        self._changed: list[ForkedProcess] = []
        self.dead = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        """The control socket: readable when the zygote reports (a start, an exit) or
        ends; -1 once closed."""
        ctl = self._ctl
        return -1 if ctl is None else ctl.fileno()

    def take_changed(self) -> list[ForkedProcess]:
        """The workers that ended, or were spawned instead, since the last call."""
        with self._lock:
            changed, self._changed = self._changed, []
        return changed

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (nothing more is heard from the zygote)."""
        return self._ctl is None

    def accepts(self, env: dict[str, str], payload_bytes: int) -> bool:
        """Whether a worker with this environment and payload can be forked here."""
        if self.dead or self._ctl is None:
            return False
        if payload_bytes > 65536 and payload_bytes > _pipe_capacity():
            return False
        return _startup_env(env) == self._startup

    def launch(
        self, env: dict[str, str], stdout_fd: int, stderr_fd: int, frame: bytes
    ) -> ForkedProcess | None:
        """Ask the zygote for a worker. Takes over ``stdout_fd`` and ``stderr_fd``; None
        (and neither is closed) when the request could not be sent."""
        r, w = os.pipe()
        try:
            if len(frame) > 65536:
                import fcntl

                fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(frame))
            request = pickle.dumps(
                {"env": env, "cwd": os.getcwd(), "umask": _current_umask()},
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            if len(request) > _MAX_REQUEST_BYTES:
                raise OSError(f"the worker's environment is too large ({len(request)} bytes)")
            view = memoryview(frame)
            while view:  # fits in the pipe: never blocks
                view = view[os.write(w, view) :]
        except OSError:
            os.close(r)
            os.close(w)
            return None
        os.close(w)
        fds = [r, stdout_fd, stderr_fd]
        proc = ForkedProcess(self, fds, env)
        with self._lock:
            ctl = self._ctl
            if ctl is None or self.dead:
                os.close(r)
                return None
            try:
                socket.send_fds(ctl, [request], fds)
            except OSError:
                os.close(r)
                self._died()
                return None
            self._pending.append(proc)
        return proc

    def resolve(self, proc: ForkedProcess) -> None:
        """Wait (up to 30 s) for the zygote's answer about ``proc``."""
        deadline = time.monotonic() + 30.0
        while proc._pid is None and proc.popen is None and proc.returncode is None:
            left = deadline - time.monotonic()
            if left <= 0:
                with self._lock:
                    self._died()
                break
            self.pump(min(left, 0.5))

    def pump(self, timeout: float) -> None:
        """Read the zygote's reports, waiting up to ``timeout`` seconds for the first."""
        with self._lock:
            ctl = self._ctl
            if ctl is None or self.dead:
                return
            if timeout > 0 and not select.select([ctl], [], [], timeout)[0]:
                return
            while True:
                try:
                    data, fds, _flags = _recv_fds(ctl, 4096, 1, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                except OSError:
                    data, fds = b"", []
                if not data:
                    self._died()
                    return
                self._report(pickle.loads(data), fds)

    def _report(self, msg: tuple[Any, ...], fds: list[int]) -> None:
        kind = msg[0]
        if kind == "started":
            proc = self._pending.popleft()
            proc._pid = msg[1]
            proc.pidfd = fds[0]
            self._live[msg[1]] = proc
            self._release(proc)
        elif kind == "exit":
            proc = self._live.pop(msg[1])
            proc.returncode = msg[2]
            os.close(proc.pidfd)
            proc.pidfd = -1
            self._changed.append(proc)
        elif kind == "failed":
            proc = self._pending.popleft()
            self._spawn(proc, f"the worker fork server could not start it ({msg[1]})")

    def _release(self, proc: ForkedProcess) -> None:
        if proc._fds is not None:
            for fd in proc._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        proc._fds = None
        proc._env = None

    def _spawn(self, proc: ForkedProcess, why: str) -> None:
        """Start ``proc`` as a subprocess instead (the fallback), on its own descriptors."""
        assert proc._fds is not None and proc._env is not None
        r, out, err = proc._fds
        try:
            proc.popen = subprocess.Popen(
                self._spawn_argv,
                stdin=r,
                stdout=out,
                stderr=err,
                env=proc._env,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.write(err, f"bellis: {why}, and spawning it failed: {exc}\n".encode())
            proc.returncode = 1
        self._release(proc)
        self._changed.append(proc)

    def _died(self) -> None:
        """The zygote ended (or stopped answering): spawn what it had not forked, stop the
        workers it had (their exit status is no longer readable), fork nothing more."""
        if self.dead:
            return
        self.dead = True
        code = self.proc.poll()
        logger.warning(
            "the worker fork server (pid %d) %s; %d of its workers were stopped, and the "
            "next ones start as subprocesses",
            self.proc.pid,
            "stopped answering" if code is None else f"ended with code {code}",
            len(self._live),
        )
        if code is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
        while self._pending:
            self._spawn(self._pending.popleft(), "the worker fork server ended")
        for pid, proc in list(self._live.items()):
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(proc.pidfd, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            select.select([proc.pidfd], [], [], 2.0)
            os.close(proc.pidfd)
            proc.pidfd = -1
            proc.returncode = -signal.SIGKILL
            self._changed.append(proc)
        self._live.clear()
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)

    def close(self) -> None:
        """End the zygote (it stops any worker still alive) and reap it."""
        with self._lock:
            ctl, self._ctl = self._ctl, None
            if ctl is not None:
                ctl.close()
            while self._pending:
                self._release(self._pending.popleft())
            for proc in self._live.values():
                if proc.pidfd >= 0:
                    os.close(proc.pidfd)
                    proc.pidfd = -1
            self._live.clear()
            self.dead = True
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pipe_capacity() -> int:
    """The most a pipe can be made to hold (``/proc/sys/fs/pipe-max-size``)."""
    try:
        with open("/proc/sys/fs/pipe-max-size", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65536
