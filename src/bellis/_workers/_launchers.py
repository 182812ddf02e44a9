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
import struct
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._state import DEFAULT_TIMEOUT_SECONDS
from .._streams import StreamName, write_to_stream

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
    requires: dict[str, int] = field(default_factory=dict)
    timeout_secs: float = DEFAULT_TIMEOUT_SECONDS
    run_name: str = "bellis"
    #: log mode ``"both"``: the worker's output goes to its log files and to the driver's
    #: terminal (launchers that cannot reach the driver's terminal write the files only)
    tee: bool = False
    #: the size of ``err_path`` when this worker was prepared: what it writes comes after
    #: (the file is appended to across runs and workers of the same slot)
    err_offset: int = 0
    #: the worker's log slot within its task (its files are ``worker_<slot>.*``); no two
    #: live workers of a task share one. None: the worker id stands in
    slot: int | None = None

    @property
    def slot_index(self) -> int:
        """:attr:`slot`, or the worker id where none was given."""
        return self.worker_id if self.slot is None else self.slot


@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended. ``kind`` is ``clean``, ``timeout``, ``error`` or ``interrupted``."""

    kind: str
    code: int | None
    message: str

    @property
    def seen(self) -> bool:
        """Whether the process was seen to end (it has an exit code), rather than given
        up for lost (a launcher that lost track of it, a cancelled or vanished job)."""
        return self.code is not None


class WorkerHandle:
    """A started worker, as its launcher knows it."""

    def __init__(self, spec: WorkerSpec, native: Any) -> None:
        self.spec = spec
        self.native = native
        self.started_at = time.monotonic()


class WorkerLauncher(ABC):
    """Start, watch and stop worker processes for one run."""

    name = "abstract"
    #: whether workers run on this machine (the server may then bind loopback only)
    is_local = True

    @abstractmethod
    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        """Start one worker. Raise an exception if it cannot be started."""

    @abstractmethod
    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        """None while the worker runs; how it ended once it has."""

    @abstractmethod
    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        """Stop workers: a polite request, ``grace_seconds`` to finish, then a hard kill."""

    def log_location(self, handle: WorkerHandle) -> str | None:
        """Where this worker's output goes (a path, or a description)."""
        p = handle.spec.err_path
        return None if p is None else str(p)

    def close(self) -> None:  # noqa: B027 - optional hook, most launchers hold nothing
        """Release anything the launcher holds. Called once at the end of a run."""

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
    from .._client import EXIT_BLOCK_TIMEOUT

    if code == 0:
        return WorkerExit("clean", 0, "")
    if code == EXIT_BLOCK_TIMEOUT:
        msg = (
            f"bellis worker subprocess killed after a block exceeded timeout="
            f"{spec.timeout_secs:g}s (true preemption; the server retries the block under "
            "max_retries)"
        )
        kind = "timeout"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        msg = f"bellis worker subprocess exited with code {code} (killed by {name})"
        kind = "error"
    else:
        msg = f"bellis worker subprocess exited with code {code}"
        kind = "error"
    tail = _stderr_tail(spec.err_path, start=spec.err_offset)
    if tail:
        msg += "\nworker stderr tail:\n" + tail
    return WorkerExit(kind, code, msg)


_WORKER_MAIN = "import sys; from bellis._worker import main; sys.exit(main())"


def _start_tee(source: Any, log: Any, stream: StreamName, name: str) -> threading.Thread:
    """Copy what a worker writes to ``source`` into ``log`` (None in console mode) and to
    this process's ``sys.<stream>`` as it is at each write, so that a ``redirect_stdout`` or
    a notebook cell in the driver gets it, until the worker closes it; then close both."""

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


class LocalLauncher(WorkerLauncher):
    """Worker subprocesses on this machine (``python -m bellis._worker``)."""

    name = "local"
    is_local = True

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable
        self._tees: dict[int, list[threading.Thread]] = {}  # by worker pid
        self._tee_deadlines: dict[int, float] = {}

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
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
        if echo:
            assert proc.stdout is not None and proc.stderr is not None
            self._tees[proc.pid] = [
                _start_tee(proc.stdout, out, "stdout", f"bellis-tee-{spec.worker_id}-out"),
                _start_tee(proc.stderr, err, "stderr", f"bellis-tee-{spec.worker_id}-err"),
            ]
        else:
            for f in (out, err):
                if f is not None:
                    f.close()
        assert proc.stdin is not None
        try:
            proc.stdin.write(struct.pack("<Q", len(spec.payload)) + spec.payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the process died at once; poll() will report how
        return WorkerHandle(spec, proc)

    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        proc: subprocess.Popen[bytes] = handle.native
        code = proc.poll()
        if code is None:
            return None
        tees = self._tees.get(proc.pid)
        if tees:
            # its last output reaches the log files (and the exit message's tail) first; a
            # descendant it left holding the pipes open is not waited for past a few
            # seconds. The event loop is not blocked meanwhile: the exit is reported later
            deadline = self._tee_deadlines.setdefault(proc.pid, time.monotonic() + 3.0)
            if any(t.is_alive() for t in tees) and time.monotonic() < deadline:
                return None
            del self._tees[proc.pid]
            self._tee_deadlines.pop(proc.pid, None)
        return describe_exit(code, handle.spec)

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
        """Kill one worker at once (its block timed out)."""
        p = handle.native
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
