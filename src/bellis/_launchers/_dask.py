"""Dask launcher: every bellis worker is one long-running task on a ``distributed`` cluster.

The dask task starts ``python -m bellis._worker._main`` as a subprocess (so a block timeout's
``os._exit(87)`` ends only that subprocess), feeds it the payload on stdin, writes its output
to the worker's log files and returns its exit code. The subprocess dies with the dask worker
that started it (Linux parent-death signal). Stopping works through one ``distributed.Variable``
per launcher that lists the task keys asked to stop; each task checks it twice a second.
A dask worker that dies is detected from the scheduler's ``processing`` table: a task that
leaves the worker it ran on without finishing is reported as "dask worker lost".
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .._payload import write_payload_frame
from .._protocol import JOB_ID_ENV, ExitKind
from ._base import WorkerExit, WorkerHandle, WorkerLauncher, WorkerSpec, describe_exit

__all__ = ["DaskLauncher"]

logger = logging.getLogger("bellis")

#: returned by the dask task when it was asked to stop before its subprocess started
_STOPPED_BEFORE_START = -int(signal.SIGTERM)
#: the exit code of a dask task that found its worker already started once: dask runs a
#: task again when the dask worker running it dies, but that bellis worker was given up
#: for lost and replaced by the server, so a second copy must not join the run
_RAN_BEFORE = 86
_CHECK_INTERVAL_SECONDS = 0.5
_LOST_CHECK_INTERVAL_SECONDS = 1.0

#: run by the subprocess before it becomes the bellis worker: die with the thread that started
#: it (the dask task's thread, alive for the whole task), so a killed dask worker leaves nothing
_BOOT = (
    "import os, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes, signal\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "    if os.getppid() != int(sys.argv[1]):\n"
    "        os._exit(1)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'bellis._worker._main'])\n"
)


def _started_event(stop_variable: str, key: str) -> str:
    """The name of the dask ``Event`` a worker's task sets when it starts."""
    return f"{stop_variable}-started-{key}"


def _is_stopped(variable: Any, key: str) -> bool:
    try:
        stopped = variable.get(timeout=5)
    except Exception:
        # the stop list is unreadable (scheduler busy or gone): keep running; the worker
        # still stops when the bellis server closes its connection, and dies with its
        # dask worker (parent-death signal)
        return False
    return "*" in stopped or key in stopped


def _open_log(path: str | None) -> Any:
    if path is None:
        return subprocess.DEVNULL
    try:
        return open(path, "ab")
    except OSError:
        return subprocess.DEVNULL  # the log folder is not on this node's file system


def run_bellis_worker(
    python: str,
    payload: bytes,
    env: Mapping[str, str],
    out_path: str | None,
    err_path: str | None,
    stop_variable: str,
    key: str,
    grace_seconds: float,
) -> int:
    """The dask task: run one bellis worker subprocess to its end and return its exit code."""
    import distributed

    variable_class: Any = distributed.Variable
    variable = variable_class(stop_variable)
    if _is_stopped(variable, key):
        return _STOPPED_BEFORE_START
    event_class: Any = distributed.Event
    started = event_class(_started_event(stop_variable, key))
    if started.is_set():
        return _RAN_BEFORE
    started.set()
    out, err = _open_log(out_path), _open_log(err_path)
    env = dict(env)
    with contextlib.suppress(Exception):  # the Dask worker, for the error records
        env[JOB_ID_ENV] = f"dask worker {distributed.get_worker().address}"
    try:
        proc = subprocess.Popen(
            [python, "-c", _BOOT, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=dict(env),
            close_fds=True,
            start_new_session=True,
        )
    finally:
        for f in (out, err):
            if not isinstance(f, int):
                f.close()
    try:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            write_payload_frame(proc.stdin, payload)
            proc.stdin.close()
        while True:
            try:
                return proc.wait(timeout=_CHECK_INTERVAL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if _is_stopped(variable, key):
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
    finally:
        # whatever ended this task (an error, an interrupt of its thread), the worker
        # process is not left to the garbage collector: stopped and reaped here
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _is_local_address(address: str) -> bool:
    if address.startswith("inproc://"):
        return True
    host = re.sub(r"^[a-z]+://", "", address).rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _DaskJob:
    """One submitted bellis worker: its future and where the scheduler last saw it run."""

    def __init__(self, key: str, future: Any) -> None:
        self.key = key
        self.future = future
        self.seen_on: str | None = None
        self.missing_checks = 0
        self.exit: WorkerExit | None = None


class DaskLauncher(WorkerLauncher):
    """Start workers as long-running tasks on a ``distributed.Client``'s cluster.

    ``resources_per_worker`` are dask worker resources each bellis worker holds (e.g.
    ``{"GPU": 1}`` for workers started with ``--resources GPU=4``). The server binds loopback
    only when every dask worker runs on this machine's loopback address.
    """

    name = "dask"

    def __init__(
        self,
        client: Any,
        resources_per_worker: dict[str, float] | None = None,
        *,
        python: str | None = None,
        grace_seconds: float = 5.0,
    ) -> None:
        self.client = client
        self.resources_per_worker = dict(resources_per_worker or {})
        self.python = python or sys.executable
        self.grace_seconds = float(grace_seconds)
        self._begin()
        workers = client.scheduler_info().get("workers", {})
        self.is_local = bool(workers) and all(_is_local_address(a) for a in workers)

    def _begin(self) -> None:
        """Fresh per-run state: a new token (task keys) and a new, empty stop list, so a
        launcher reused for another run (``Task(launcher=...)`` rerun to resume) starts
        clean after :meth:`close` stopped everything of the last one."""
        import distributed

        variable_class: Any = distributed.Variable
        self.token = uuid.uuid4().hex[:8]
        self._stop_name = f"bellis-stop-{self.token}"
        self._stop_variable: Any = variable_class(self._stop_name, client=self.client)
        self._stopped: set[str] = set()
        self._stop_variable.set([])
        self._jobs: dict[str, _DaskJob] = {}
        self._last_lost_check = 0.0
        self._closed = False

    def task_key(self, spec: WorkerSpec) -> str:
        """The dask key of a worker: ``bellis-{run}-{task}-w{id}-{launcher token}``."""
        return (
            f"bellis-{_sanitize(spec.run_name)}-{_sanitize(spec.task_id)}-w{spec.worker_id}"
            f"-{self.token}"
        )

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        if self._closed:
            self._begin()
        key = self.task_key(spec)
        future = self.client.submit(
            run_bellis_worker,
            self.python,
            spec.payload,
            dict(spec.env),
            None if spec.out_path is None else str(spec.out_path),
            None if spec.err_path is None else str(spec.err_path),
            self._stop_name,
            key,
            self.grace_seconds,
            key=key,
            pure=False,
            resources=self.resources_per_worker or None,
        )
        job = _DaskJob(key, future)
        self._jobs[key] = job
        return WorkerHandle(spec, job)

    def _lost_exit(self, job: _DaskJob, why: str) -> WorkerExit:
        self._stop([job.key])
        try:
            self.client.cancel([job.future], force=True)
        except Exception as exc:
            logger.warning("could not cancel dask task %s: %s", job.key, exc)
        return WorkerExit(ExitKind.ERROR, None, f"dask worker lost: task {job.key} {why}")

    def _check_lost(self) -> None:
        try:
            processing: dict[str, list[str]] = self.client.processing()
        except Exception as exc:
            logger.debug("dask processing() failed: %s", exc)
            return
        where = {key: worker for worker, keys in processing.items() for key in keys}
        for job in self._jobs.values():
            if job.exit is not None or job.future.status != "pending":
                continue
            now_on = where.get(job.key)
            if job.seen_on is None:
                job.seen_on = now_on
                continue
            if now_on == job.seen_on:
                job.missing_checks = 0
                continue
            job.missing_checks += 1
            # the client learns of a finished task a moment after the scheduler: ask twice
            if now_on is not None or job.missing_checks >= 2:
                job.exit = self._lost_exit(job, f"left dask worker {job.seen_on} unfinished")

    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        job: _DaskJob = handle.native
        if job.exit is not None:
            return job.exit
        status = job.future.status
        if status == "finished":
            try:
                code = int(job.future.result(timeout=5))
            except Exception as exc:
                job.exit = WorkerExit(ExitKind.ERROR, None, f"dask task {job.key} failed: {exc!r}")
            else:
                if code == _RAN_BEFORE:
                    job.exit = self._lost_exit(
                        job,
                        "was lost with its dask worker (dask ran it again; the copy stood down)",
                    )
                else:
                    job.exit = describe_exit(code, handle.spec)
        elif status == "error":
            error = job.future.exception(timeout=5)
            job.exit = WorkerExit(
                ExitKind.ERROR, None, f"dask task {job.key} raised {error!r} (dask worker lost?)"
            )
        elif status in ("cancelled", "lost"):
            job.exit = self._lost_exit(job, f"is {status}")
        else:
            now = time.monotonic()
            if now - self._last_lost_check >= _LOST_CHECK_INTERVAL_SECONDS:
                self._last_lost_check = now
                self._check_lost()
        return job.exit

    def log_location(self, handle: WorkerHandle) -> str | None:
        job: _DaskJob = handle.native
        where = handle.spec.err_path
        return f"dask task {job.key}" + ("" if where is None else f": {where}")

    def _stop(self, keys: list[str]) -> None:
        new = set(keys) - self._stopped
        if new:
            try:
                self._stop_variable.set(sorted(self._stopped | new))
            except Exception as exc:
                # not marked stopped, so the next cancel or kill tries again
                logger.warning("could not ask dask task(s) %s to stop: %s", sorted(new), exc)
                return
            self._stopped |= new

    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        jobs = [h.native for h in handles]
        live = [j for j in jobs if not j.future.done()]
        self._stop([j.key for j in live])
        # each task polls the stop list every 0.5 s, then gives its subprocess grace_seconds
        deadline = (
            time.monotonic() + grace_seconds + self.grace_seconds + 2 * _CHECK_INTERVAL_SECONDS
        )
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [j for j in live if not j.future.done()]
        if live:
            self.client.cancel([j.future for j in live], force=True)

    def kill(self, handle: WorkerHandle) -> None:
        """Stop one worker's subprocess at once (its block timed out)."""
        job: _DaskJob = handle.native
        if not job.future.done():
            self._stop([job.key])

    def live_task_keys(self) -> list[str]:
        """Keys of this launcher's dask tasks that have not finished."""
        return [k for k, j in self._jobs.items() if not j.future.done()]

    def close(self) -> None:
        """Stop every task of this launcher, release its futures and its stop variable."""
        live = [j for j in self._jobs.values() if not j.future.done()]
        if live:
            self._stop(["*"])
            deadline = time.monotonic() + self.grace_seconds + 2.0
            while live and time.monotonic() < deadline:
                time.sleep(0.05)
                live = [j for j in live if not j.future.done()]
        try:
            self.client.cancel([j.future for j in self._jobs.values()], force=True)
        except Exception as exc:
            logger.warning(
                "could not cancel dask task(s) %s: %s", [j.key for j in live] or "(none live)", exc
            )
        keys = list(self._jobs)
        self._jobs.clear()
        # a stop variable or start events left behind (the cluster is gone) hold names only
        with contextlib.suppress(Exception):
            self._stop_variable.delete()
        with contextlib.suppress(Exception):
            import distributed

            event_class: Any = distributed.Event
            for key in keys:
                event_class(_started_event(self._stop_name, key), client=self.client).clear()
        self._closed = True
