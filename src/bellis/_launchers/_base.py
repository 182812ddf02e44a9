"""Worker launchers: how worker processes are started, watched and stopped.

A launcher never sees a block. It starts long-lived workers that connect back to the
server over TCP (the pilot-job pattern), reports how they ended, and stops them.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._payload import payload_frame, write_payload_frame
from .._protocol import (
    EXIT_BLOCK_STALLED,
    EXIT_BLOCK_TIMEOUT,
    EXIT_OUT_OF_MEMORY,
    MEMORY_LIMIT_ENV,
    ExitKind,
    WorkerExit,
    kernel_oom_message,
    memory_error_message,
)
from .._sizes import format_grant
from .._state import DEFAULT_TIMEOUT_SECONDS
from .._streams import StreamName, write_to_stream
from .._worker._gpu import load_nvml
from ._exits import ExitWatch
from ._gpus import GpuBook, check_gpus_argument, find_gpus
from ._zygote import ForkedProcess, ForkServer, choose_start, is_fork_server_supported, usable_cpus

__all__ = ["LocalLauncher", "WorkerExit", "WorkerHandle", "WorkerLauncher", "WorkerSpec"]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a launcher needs to start one worker."""

    task_id: str
    worker_id: int
    env: dict[str, str]
    payload: bytes
    out_path: Path | None
    err_path: Path | None
    requires: dict[str, float] = field(default_factory=dict)
    timeout_secs: float = DEFAULT_TIMEOUT_SECONDS
    run_name: str = "bellis"
    #: log mode ``"both"``: the worker's output goes to its log files and to the driver's
    #: terminal (launchers that cannot reach the driver's terminal write the files only)
    tee: bool = False
    #: how many workers of the launcher start together, this one and those after it
    starting: int = 1
    #: it takes the place of a worker that ended (a crash's replacement)
    restart: bool = False
    #: the most workers the run may keep on this launcher at once (0: unknown)
    expected: int = 0
    #: the size of ``err_path`` when this worker was prepared: what it writes comes after
    #: (the file is appended to across runs and workers of the same slot)
    err_offset: int = 0
    #: the worker's log slot within its task (its files are ``worker_<slot>.*``); no two
    #: live workers of a task share one. None: the worker id stands in
    slot: int | None = None
    #: the worker's memory grant in bytes (``bellis._scheduling._memory``); None: the launcher's own
    memory: int | None = None
    #: the GPUs the worker sees (its ``CUDA_VISIBLE_DEVICES``; ``_gpus``); None: not assigned
    gpus: tuple[str, ...] | None = None

    @property
    def slot_index(self) -> int:
        """:attr:`slot`, or the worker id where none was given."""
        return self.worker_id if self.slot is None else self.slot


class WorkerHandle:
    """A started worker, as its launcher knows it."""

    def __init__(self, spec: WorkerSpec, native: Any) -> None:
        self.spec = spec
        self.native = native
        self.started_at = time.monotonic()
        #: the memory cgroup's OOM-kill count when a worker with a memory grant started
        #: (:func:`oom_kill_count`; None: not watched): a rise at its exit is a kernel OOM
        self.oom_kills: int | None = None


class WorkerLauncher(ABC):
    """Start, watch and stop worker processes for one run."""

    # -- capabilities: what the run asks of every launcher (override to offer more) --------
    #: the launcher's name in messages and the dry run
    name: str = "abstract"
    #: whether workers run on this machine (the server may then bind loopback only)
    is_local: bool = True
    #: whether it gives each worker the memory grant of its spec (``WorkerSpec.memory``;
    #: ``bellis._scheduling._memory``), and the memory it asks for a worker by default (bytes; None:
    #: none of its own)
    memory_grants: bool = False
    memory_request: int | None = None
    #: the growth of a worker's memory grant after an out-of-memory death, and the largest
    #: grant (bytes); None: the task's, else the defaults of ``bellis._scheduling._memory``
    memory_growth: float | None = None
    max_memory: int | None = None
    #: whether :meth:`launch_many` starts several workers as one submission (all or none):
    #: the run then starts a batch of workers through it, not one :meth:`launch` each
    starts_many_at_once: bool = False

    @abstractmethod
    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        """Start one worker. Raise an exception if it cannot be started."""

    @abstractmethod
    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        """None while the worker runs; how it ended once it has."""

    @abstractmethod
    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        """Stop workers: a polite request, ``grace_seconds`` to finish, then a hard kill."""

    def kill(self, handle: WorkerHandle) -> None:
        """Stop one worker at once: the backstop of a block timeout, and the end of a
        backup's loser. This default cancels it with no grace period; launchers that can
        end one worker faster override it."""
        self.cancel([handle], 0.0)

    def launch_many(self, specs: Sequence[WorkerSpec]) -> list[WorkerHandle]:
        """Start several workers, all or none. This default launches them one by one and,
        should one fail, stops those it started and raises; launchers that submit them
        together override it and set :attr:`starts_many_at_once`."""
        handles: list[WorkerHandle] = []
        try:
            for spec in specs:
                handles.append(self.launch(spec))
        except BaseException:
            if handles:
                self.cancel(handles, 0.0)
            raise
        return handles

    def gpu_devices(self) -> list[str]:
        """The GPUs this launcher hands out to its workers, each its own
        ``CUDA_VISIBLE_DEVICES`` (``_gpus``). [] (this default): none; a task's ``gpu``
        is then only counted (a batch system assigns the devices itself)."""
        return []

    def take_gpus(self, task_id: str, slot: int, shares: int) -> tuple[str, ...]:
        """The GPUs for a worker of ``task_id`` in log ``slot`` that needs ``shares``
        (``GPU_SHARES`` per GPU). Called only where :meth:`gpu_devices` names some."""
        raise NotImplementedError(
            f"the {self.name} launcher names GPUs (gpu_devices()) but cannot hand them out: "
            "implement take_gpus() and release_gpus()"
        )

    def release_gpus(self, task_id: str, slot: int) -> None:  # noqa: B027 - optional hook
        """Give back the GPUs :meth:`take_gpus` gave the worker of ``task_id`` in ``slot``."""

    def log_location(self, handle: WorkerHandle) -> str | None:
        """Where this worker's output goes (a path, or a description)."""
        p = handle.spec.err_path
        return None if p is None else str(p)

    def close(self) -> None:  # noqa: B027 - optional hook, most launchers hold nothing
        """Release anything the launcher holds. Called once at the end of a run."""

    def exit_watch(self) -> int | None:
        """A descriptor that becomes readable when one of this launcher's workers may have
        ended: the run loop then polls the workers :meth:`ended` names. None (this
        default): the loop polls every worker once per tick."""
        return None

    def ended(self) -> list[WorkerHandle]:
        """With :meth:`exit_watch`: the workers that ended and whose exit :meth:`poll`
        has not reported yet."""
        return []

    def shutting_down(self) -> None:  # noqa: B027 - optional hook
        """The run told its workers to stop: they exit within seconds, so :meth:`poll`
        should notice promptly (a launcher that polls a cluster slowly polls faster)."""


def _stderr_tail(path: Path | None, lines: int = 50, start: int = 0) -> str:
    """The last ``lines`` lines (at most 16 KiB) of ``path`` from byte ``start`` on."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, start, size - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    tail = text.splitlines()[-lines:]
    return "\n".join(tail)


def describe_exit(code: int, spec: WorkerSpec) -> WorkerExit:
    """Map a worker process exit code to a :class:`WorkerExit`."""
    if code == 0:
        return WorkerExit(ExitKind.CLEAN, 0, "")
    if code == EXIT_BLOCK_TIMEOUT:
        msg = (
            f"bellis worker subprocess killed after a block exceeded timeout="
            f"{spec.timeout_secs:g}s (true preemption; the server retries the block under "
            "max_retries)"
        )
        kind = ExitKind.TIMEOUT
    elif code == EXIT_OUT_OF_MEMORY:
        grant = None if spec.memory is None else format_grant(spec.memory)
        msg, kind = memory_error_message(grant), ExitKind.ERROR
    elif code == EXIT_BLOCK_STALLED:
        msg = (
            "bellis worker subprocess killed after a block stalled: no CPU, IO or heartbeat "
            "for stall_timeout (the server retries the block under max_retries)"
        )
        kind = ExitKind.STALLED
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        msg = f"bellis worker subprocess exited with code {code} (killed by {name})"
        kind = ExitKind.ERROR
    else:
        msg = f"bellis worker subprocess exited with code {code}"
        kind = ExitKind.ERROR
    tail = _stderr_tail(spec.err_path, start=spec.err_offset)
    if tail:
        msg += "\nworker stderr tail:\n" + tail
    return WorkerExit(kind, code, msg)


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer ended in this process's memory cgroup
    (``oom_kill`` of v2 ``memory.events`` or v1 ``memory.oom_control``); None where that
    cannot be read."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths += [f"/sys/fs/cgroup{path}/memory.events", "/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):
            base = "/sys/fs/cgroup/memory"
            paths += [f"{base}{path}/memory.oom_control", f"{base}/memory.oom_control"]
    for candidate in paths:
        try:
            with open(candidate) as f:
                for entry in f:
                    key, _, value = entry.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


_WORKER_MAIN = "import sys; from bellis._worker._main import main; sys.exit(main())"


def _start_tee(
    source: Any, log: Any, stream: StreamName, name: str, on_end: Any = None
) -> threading.Thread:
    """Copy what a worker writes to ``source`` into ``log`` (None in console mode) and to
    this process's ``sys.<stream>`` as it is at each write, so that a ``redirect_stdout`` or
    a notebook cell in the driver gets it, until the worker closes it; then close both and
    call ``on_end``."""

    def copy() -> None:
        # a multi-byte character split between two reads is decoded whole
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        log_error: OSError | None = None
        try:
            while chunk := source.read1(65536):
                if log is not None and log_error is None:
                    try:
                        log.write(chunk)
                        log.flush()
                    except OSError as exc:  # a full disk: the terminal still gets it all
                        log_error = exc
                        logging.getLogger("bellis").error(
                            "could not write the worker log %s: %s; the rest of this "
                            "worker's output goes to the terminal only",
                            log.name,
                            exc,
                        )
                _echo(stream, decoder.decode(chunk))
            _echo(stream, decoder.decode(b"", final=True))
        finally:
            source.close()
            if log is not None:
                try:
                    log.close()
                except OSError as exc:
                    if log_error is None:  # else reported above: its buffered bytes failed again
                        logging.getLogger("bellis").error(
                            "could not write the worker log %s: %s", log.name, exc
                        )
            if on_end is not None:
                on_end()

    thread = threading.Thread(target=copy, name=name, daemon=True)
    thread.start()
    return thread


def _echo(stream: StreamName, text: str) -> None:
    if not text:
        return
    try:
        write_to_stream(stream, text)
    except (OSError, ValueError):
        pass  # a terminal that went away or a closed stream costs the echo only


def _stop_and_reap(proc: Any, wait_seconds: float = 10.0) -> None:
    """Kill a worker process (a ``subprocess.Popen``) and what it left in its session, if
    it still runs, and wait for it, so that it is reaped here and not left to the garbage
    collector (whose ``ResourceWarning`` a long-lived caller, a notebook, would see)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    else:
        # also what the worker left in its session, as cancel() does
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return
    try:
        proc.wait(timeout=wait_seconds)
    except subprocess.TimeoutExpired:
        logging.getLogger("bellis").error(
            "bellis worker process %d did not end within %g s of SIGKILL; it may be stuck "
            "in the kernel (a hung file system): check it with `ps -o stat,wchan -p %d`",
            proc.pid,
            wait_seconds,
            proc.pid,
        )


class LocalLauncher(WorkerLauncher):
    """Worker processes on this machine: forked from a preloaded zygote on Linux
    (``_zygote``), else subprocesses (``python -c``, the fallback).

    ``gpus``: the GPUs (indices, or ``"GPU-..."``/``"MIG-..."`` ids) handed to the workers of
    tasks with ``requires={"gpu": ...}``, each worker its own through its
    ``CUDA_VISIBLE_DEVICES`` (``_gpus``); None: the driver's ``CUDA_VISIBLE_DEVICES``, else
    the devices NVML lists."""

    name = "local"
    is_local = True
    #: it enforces a task's ``memory_limit`` (``RLIMIT_AS`` in the worker)
    memory_grants = True

    def __init__(
        self,
        python: str | None = None,
        *,
        fork_server: bool | None = None,
        gpus: Sequence[int | str] | None = None,
    ) -> None:
        self.python = python or sys.executable
        #: the GPUs its workers are given (``CUDA_VISIBLE_DEVICES`` entries) for a task with
        #: ``requires={"gpu": ...}``; None: those this machine shows (``_gpus.find_gpus``)
        self.gpus = check_gpus_argument(gpus)
        self._gpu_book: GpuBook | None = None
        #: start workers by forking a preloaded zygote (Linux; see ``_zygote``): True for
        #: every worker, False for none, None: as ``choose_start`` decides, where
        #: supported (``BELLIS_WORKER_START``: ``fork`` for every worker, ``spawn`` none)
        self.fork_server = fork_server
        self._zygote: ForkServer | None = None
        self._exits: ExitWatch | None = None
        self._live: set[WorkerHandle] = set()
        self._cpus = 0
        self._auto = False  # fork_server None, resolved: the policy decides each start
        self._tees: dict[Any, list[threading.Thread]] = {}  # by worker process object
        self._tee_deadlines: dict[Any, float] = {}
        self._tees_done: set[threading.Thread] = set()  # finished, perhaps still alive

    @staticmethod
    def find_devices() -> list[str]:
        """The GPUs this machine shows this process (``_gpus.find_gpus``)."""
        return find_gpus(os.environ, load_nvml)

    def gpu_devices(self) -> list[str]:
        """The GPUs this launcher hands out: its ``gpus=``, else :meth:`find_devices`."""
        if self._gpu_book is None:
            self._gpu_book = GpuBook(self.gpus if self.gpus is not None else self.find_devices())
        return list(self._gpu_book.devices)

    def take_gpus(self, task_id: str, slot: int, shares: int) -> tuple[str, ...]:
        """The GPUs for a worker of ``task_id`` in log ``slot`` that needs ``shares``
        (``GPU_SHARES`` per GPU): the ones its slot's last worker had, where they fit.
        They are given back when :meth:`poll` sees it end (or by :meth:`release_gpus`)."""
        self.gpu_devices()
        assert self._gpu_book is not None
        return self._gpu_book.take((task_id, slot), shares)

    def release_gpus(self, task_id: str, slot: int) -> None:
        """Give back the GPUs of the worker of ``task_id`` in ``slot``."""
        if self._gpu_book is not None:
            self._gpu_book.release((task_id, slot))

    def _wants_fork_server(self) -> bool:
        """Whether workers may be forked (then ``_launch_forked`` decides for each)."""
        if self.fork_server is None and not self._auto:
            how = os.environ.get("BELLIS_WORKER_START", "auto")
            if how == "spawn" or not is_fork_server_supported():
                self.fork_server = False
            elif how == "fork":
                self.fork_server = True
            else:
                self._auto = True
        return self.fork_server is not False

    def _wants_fork(self, spec: WorkerSpec, env: dict[str, str]) -> bool:
        """Whether to fork this worker from the zygote (which it may start)."""
        if self._auto:
            zygote = self._zygote
            if zygote is not None and zygote.dead:
                return False
            self._cpus = self._cpus or usable_cpus()
            choice = choose_start(
                zygote_running=zygote is not None,
                live=len(self._live),
                batch=spec.starting,
                restart=spec.restart,
                cpus=self._cpus,
                expected=spec.expected,
            )
            if choice.start_zygote and not choice.fork:
                self._start_zygote(env)  # for the next ones; this one is spawned
            return choice.fork
        return bool(self.fork_server)

    def _start_zygote(self, env: dict[str, str]) -> ForkServer | None:
        try:
            zygote = self._zygote = ForkServer(self.python, env, [self.python, "-c", _WORKER_MAIN])
        except OSError as exc:
            logging.getLogger("bellis").warning(
                "could not start the worker fork server (%s): workers start as "
                "subprocesses; BELLIS_WORKER_START=spawn skips the attempt",
                exc,
            )
            self.fork_server = False
            self._auto = False
            return None
        if self.exit_watch() is not None:
            assert self._exits is not None
            self._exits.watch_zygote(zygote)
        return zygote

    def exit_watch(self) -> int | None:
        if self._exits is None:
            if not ExitWatch.supported():
                return None
            self._exits = ExitWatch()
        return self._exits.fileno()

    def ended(self) -> list[WorkerHandle]:
        return [] if self._exits is None else self._exits.ended()

    def _tee_ended(self) -> None:
        """A tee thread is done (its worker's exit is held back until both are): said from
        that thread, which may not have ended yet when :meth:`poll` looks."""
        self._tees_done.add(threading.current_thread())
        exits = self._exits
        if exits is not None:
            exits.wake()

    def _launch_forked(self, spec: WorkerSpec, env: dict[str, str], echo: bool) -> Any:
        """Fork the worker from the run's zygote; None where it must be spawned instead."""
        if not self._wants_fork(spec, env):
            return None
        frame = payload_frame(spec.payload)
        zygote = self._zygote if self._zygote is not None else self._start_zygote(env)
        if zygote is None:
            return None
        if not zygote.accepts(env, len(frame)):
            return None
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        opened: list[int] = []
        logs: list[Any] = []
        try:
            if echo:
                out = open(spec.out_path, "ab") if spec.out_path else None
                logs.append(out)
                err = open(spec.err_path, "ab") if spec.err_path else None
                logs.append(err)
                out_r, out_w = os.pipe()
                opened += [out_r, out_w]
                err_r, err_w = os.pipe()
                opened += [err_r, err_w]
            else:
                assert spec.out_path is not None and spec.err_path is not None
                out_w = os.open(spec.out_path, flags, 0o666)
                opened.append(out_w)
                err_w = os.open(spec.err_path, flags, 0o666)
                opened.append(err_w)
            proc = zygote.launch(env, out_w, err_w, frame)
        except BaseException:
            for fd in opened:
                os.close(fd)
            for f in logs:
                if f is not None:
                    f.close()
            raise
        if proc is None:
            for fd in opened:
                os.close(fd)
            for f in logs:
                if f is not None:
                    f.close()
            return None
        if echo:
            self._tees[proc] = [
                _start_tee(
                    open(out_r, "rb"),
                    logs[0],
                    "stdout",
                    f"bellis-tee-{spec.worker_id}-out",
                    self._tee_ended,
                ),
                _start_tee(
                    open(err_r, "rb"),
                    logs[1],
                    "stderr",
                    f"bellis-tee-{spec.worker_id}-err",
                    self._tee_ended,
                ),
            ]
        return proc

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        if spec.memory is not None:
            env = {**spec.env, MEMORY_LIMIT_ENV: str(spec.memory)}
            before = oom_kill_count()  # a kernel OOM kill raises it (see poll)
            handle = self._launch(replace(spec, env=env))
            handle.oom_kills = before
            return handle
        if MEMORY_LIMIT_ENV in spec.env:  # inherited (a run inside a worker): not this one's
            env = {k: v for k, v in spec.env.items() if k != MEMORY_LIMIT_ENV}
            spec = replace(spec, env=env)
        return self._launch(spec)

    def _launch(self, spec: WorkerSpec) -> WorkerHandle:
        if self._wants_fork_server():
            echo = spec.tee or spec.out_path is None or spec.err_path is None
            env = spec.env
            if echo and "PYTHONUNBUFFERED" not in env:
                env = {**env, "PYTHONUNBUFFERED": "1"}
            forked = self._launch_forked(spec, env, echo)
            if forked is not None:
                return self._watch(WorkerHandle(spec, forked))
        out = open(spec.out_path, "ab") if spec.out_path else None
        err = open(spec.err_path, "ab") if spec.err_path else None
        # log mode "both" (tee) and console mode (no files): the worker's output is echoed
        # to this process's streams in force, so a redirect_stdout or a notebook cell
        # around the run gets it; unbuffered, so that it comes line by line as on a terminal
        echo = spec.tee or out is None or err is None
        env = spec.env
        if echo and "PYTHONUNBUFFERED" not in env:
            env = {**env, "PYTHONUNBUFFERED": "1"}
        try:
            proc = subprocess.Popen(
                # `-c` rather than `-m`: the same entry point without runpy's start-up cost
                [self.python, "-c", _WORKER_MAIN],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if echo else out,
                stderr=subprocess.PIPE if echo else err,
                env=env,
                close_fds=True,
                start_new_session=True,
            )
        except BaseException:
            for f in (out, err):
                if f is not None:
                    f.close()
            raise
        # from here on the process is this launcher's to reap: should anything fail (a
        # thread that cannot start, a Ctrl-C while the payload is written), it is stopped
        # and waited for before the error goes on
        owned: list[Any] = [out, err]  # the log files no tee thread has taken over
        try:
            if echo:
                assert proc.stdout is not None and proc.stderr is not None
                tees = self._tees[proc] = []
                name = f"bellis-tee-{spec.worker_id}"
                tees.append(_start_tee(proc.stdout, out, "stdout", name + "-out", self._tee_ended))
                owned[0] = None
                tees.append(_start_tee(proc.stderr, err, "stderr", name + "-err", self._tee_ended))
                owned[1] = None
            assert proc.stdin is not None
            try:
                write_payload_frame(proc.stdin, spec.payload)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the process died at once; poll() will report how
        except BaseException:
            _stop_and_reap(proc)
            self._tees.pop(proc, None)
            raise
        finally:
            for f in owned:
                if f is not None:
                    f.close()
        return self._watch(WorkerHandle(spec, proc))

    def _watch(self, handle: WorkerHandle) -> WorkerHandle:
        """Count a started worker and watch for its exit."""
        self._live.add(handle)
        if self.exit_watch() is not None:
            assert self._exits is not None
            if isinstance(handle.native, ForkedProcess):
                self._exits.watch_forked(handle, handle.native)
            else:
                self._exits.watch_spawned(handle, handle.native.pid)
        return handle

    def _ended(self, handle: WorkerHandle, proc: Any) -> None:
        """``handle``'s process ended: it no longer counts as live, and unless its tee
        threads hold its exit back, the exit watch forgets it."""
        self._live.discard(handle)
        if self._exits is not None and proc not in self._tees:
            self._exits.done(handle, proc)

    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        proc: subprocess.Popen[bytes] | ForkedProcess = handle.native
        code = proc.poll()
        if code is None:
            return None
        self._ended(handle, proc)
        if handle.spec.gpus is not None:
            self.release_gpus(handle.spec.task_id, handle.spec.slot_index)
        tees = self._tees.get(proc)
        if tees:
            # its last output reaches the log files (and the exit message's tail) first; a
            # descendant it left holding the pipes open is not waited for past a few
            # seconds. The event loop is not blocked meanwhile: the exit is reported later
            deadline = self._tee_deadlines.setdefault(proc, time.monotonic() + 3.0)
            done = self._tees_done
            if any(t.is_alive() and t not in done for t in tees) and time.monotonic() < deadline:
                return None
            done.difference_update(tees)
            if self._exits is not None:
                self._exits.done(handle, proc)  # held until now
            del self._tees[proc]
            self._tee_deadlines.pop(proc, None)
        ex = describe_exit(code, handle.spec)
        before = handle.oom_kills
        oom = None if before is None else kernel_oom_message(code, before, oom_kill_count())
        return ex if oom is None else WorkerExit(ExitKind.ERROR, code, f"{oom}\n{ex.message}")

    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        live = [h.native for h in handles if h.native.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for p in live:
            remaining = deadline - time.monotonic()
            try:
                p.wait(timeout=max(0.0, remaining))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
            else:
                # also reap anything the worker left in its session
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)

    def kill(self, handle: WorkerHandle) -> None:
        """Kill one worker at once (its block timed out). Its GPUs are given back now: the
        run has retired it, and the worker that takes its place may start before its exit
        is seen (the driver frees a killed process's device memory as it dies)."""
        if handle.spec.gpus is not None:
            self.release_gpus(handle.spec.task_id, handle.spec.slot_index)
        p = handle.native
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()

    def close(self) -> None:
        """Reap every worker process whose end the run did not see (one it killed that was
        still dying when the run ended, or one still running: killed now), then end the
        run's fork server (its workers have been stopped by now) and reap it."""
        try:
            for handle in list(self._live):
                proc = handle.native
                if isinstance(proc, ForkedProcess):
                    proc = proc.popen  # spawned instead; else the fork server's to reap
                if proc is not None:
                    _stop_and_reap(proc)
        finally:
            self._live.clear()
            zygote, self._zygote = self._zygote, None
            if zygote is not None:
                zygote.close()
            exits, self._exits = self._exits, None
            if exits is not None:
                exits.close()
            self._tees_done.clear()
            self._gpu_book = None
