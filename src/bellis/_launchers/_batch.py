"""The batch-system core: every bellis worker is one batch job (or one task of a job array).

What every batch system needs lives here once: job scripts and payload files per log slot,
job arrays (with an optional cap on how many of their tasks run at once), one status query
per ``poll_interval`` for all jobs of the launcher, cancellation at teardown with no job
left behind (and an ``atexit`` hook), the mapping of a finished job to a bellis exit kind,
the memory ladder (a bigger grant is a new job), walltime-aware workers and GPU requests.

A system is a *dialect*, a subclass that says how to submit (its submit line and how to
read the job id it prints), how to query (one command for all jobs, parsed into rows of
state, reason and exit text), how to cancel, and its state table: which states wait,
which are over, and how a finished job ended (:class:`Ending`). ``_slurm``, ``_lsf``,
``_pbs`` and ``_sge`` are the dialects. A job's record, its ending and the status commands
live in ``_batch_jobs``; the text the systems read and write in ``_batch_text``.

The job script runs ``python -m bellis._worker._main``; the worker reads its payload from a
file next to its logs (``BELLIS_PAYLOAD_FILE``) and connects back to the server over TCP.
With a time limit the script exports the job's start and limit, and a worker stops taking
blocks when too little of it is left (``bellis._worker._walltime``): its clean exit after
:data:`~bellis._worker._walltime.LEAVING_MARKER` is kind ``walltime``.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from .._protocol import CONTEXT_ENV, DAISY_CONTEXT_ENV, PAYLOAD_FILE_ENV, ExitKind
from .._sizes import MIB, parse_growth, parse_size
from .._worker._walltime import LEAVING_MARKER
from ..errors import ConfigurationError, WorkerStartError
from ..logging import task_log_dirname
from ._base import WorkerExit, WorkerHandle, WorkerLauncher, WorkerSpec, _stderr_tail
from ._batch_jobs import (
    COMMAND_TIMEOUT_SECONDS,
    BatchJob,
    End,
    Ending,
    Row,
    ending_exit,
)
from ._batch_text import (
    default_margin,
    file_size,
    hms,
    longest_run,
    redirect_line,
    sanitize,
    walltime_lines,
    write_new_private,
    write_payload,
    write_private,
)

__all__ = [
    "COMMAND_TIMEOUT_SECONDS",
    "BatchJob",
    "BatchLauncher",
    "BatchOptions",
    "End",
    "Ending",
    "Row",
    "shared_options",
]

logger = logging.getLogger("bellis")

#: how often jobs are polled once the run told them to stop (whatever poll_interval is)
_SHUTDOWN_POLL_SECONDS = 0.5


class BatchOptions(TypedDict):
    """The parameters every dialect takes and hands to :class:`BatchLauncher` as they are."""

    walltime_margin: float | None
    walltime_aware: bool
    cpus_per_worker: int
    mem: int | str | None
    memory_growth: float | None
    max_memory: int | str | None
    gpus_per_worker: int | None
    extra_args: Sequence[str]
    python: str
    job_name_prefix: str
    poll_interval: float
    array_threshold: int
    array_cap: int | None
    pending_warning: float


def shared_options(arguments: Mapping[str, Any]) -> BatchOptions:
    """The :class:`BatchOptions` among a dialect constructor's ``arguments`` (its
    ``locals()``), for ``super().__init__(**shared_options(locals()), ...)``."""
    return cast(BatchOptions, {key: arguments[key] for key in BatchOptions.__required_keys__})


class BatchLauncher(WorkerLauncher):
    """Start workers as batch jobs, one job (or array task) per worker: the shared core.

    Subclasses set the class attributes below and implement the dialect methods."""

    name = "batch"
    is_local = False
    #: it gives a worker the memory grant of its spec
    memory_grants = True
    #: several workers of a task start as one job array (``launch_many``)
    starts_many_at_once = True
    #: the job time limit as the user wrote it, for messages (None: the dialect keeps
    #: only :attr:`limit_seconds`)
    time_limit: str | None = None
    #: the system's name in messages ("SLURM", "LSF", ...)
    system = "batch"
    submit_command = "sbatch"
    cancel_command = "scancel"
    #: the environment variable that holds an array task's index in the job
    array_index_env = "SLURM_ARRAY_TASK_ID"
    #: the first array index the system allows (a slot's index is slot + this)
    array_first_index = 0
    #: whether an array may list indices (``0-3,7``); else only one contiguous range
    array_lists = True
    #: the largest array index + 1 where the system does not say
    default_max_array_size = 1001
    #: whether the job's own output and error files are the worker's logs (else the job
    #: script redirects to them and the system writes its files beside them)
    logs_via_system = False
    #: where a job is looked for (for the message of a job lost from them)
    job_lists = "the job lists"
    #: the file name suffix of job scripts
    script_suffix = "job"
    #: what stands for the array index in the system's output file names
    index_token = "%a"
    #: consecutive polls a job may be missing from the status query before it is lost
    lost_after_misses = 3
    #: the states in which a job never runs again, and those in which it waits to start
    finished_states: frozenset[str] = frozenset()
    pending_states: frozenset[str] = frozenset()
    #: the cancel command's options that kill a job at once
    hard_cancel_options: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        time_limit_seconds: int | None,
        walltime_margin: float | None,
        walltime_aware: bool,
        cpus_per_worker: int,
        mem: int | str | None,
        memory_growth: float | None,
        max_memory: int | str | None,
        gpus_per_worker: int | None,
        extra_args: Sequence[str],
        python: str,
        job_name_prefix: str,
        poll_interval: float,
        array_threshold: int,
        array_cap: int | None,
        pending_warning: float,
    ) -> None:
        if cpus_per_worker < 1:
            raise ValueError(f"cpus_per_worker must be at least 1 (got {cpus_per_worker})")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive (got {poll_interval})")
        if pending_warning <= 0:
            raise ValueError(f"pending_warning must be positive seconds (got {pending_warning})")
        if array_cap is not None and (
            isinstance(array_cap, bool) or not isinstance(array_cap, int) or array_cap < 1
        ):
            raise ConfigurationError(
                f"array_cap={array_cap!r}: pass the most array tasks that may run at once "
                "(an int >= 1), or None for no cap",
                parameter="array_cap",
            )
        #: the job time limit in seconds (None: the system's default)
        self.limit_seconds = time_limit_seconds
        #: the limit in seconds when workers watch it (None: they do not)
        self.walltime_seconds: int | None = None
        self.walltime_margin = 0.0
        if time_limit_seconds is not None and walltime_aware:
            self.walltime_seconds = time_limit_seconds
            margin = (
                default_margin(time_limit_seconds)
                if walltime_margin is None
                else float(walltime_margin)
            )
            if not 0.0 <= margin < time_limit_seconds:
                raise ValueError(
                    f"walltime_margin must be seconds >= 0 and below the time limit "
                    f"({time_limit_seconds} s), got {walltime_margin!r}"
                )
            self.walltime_margin = margin
        self.cpus_per_worker = int(cpus_per_worker)
        #: the memory ladder (``bellis._scheduling._memory``): ``mem`` in bytes, the growth per step
        #: after an out-of-memory death and the largest grant
        self.memory_request = None if mem is None else parse_size(mem, "mem", int_unit=MIB)
        self.memory_growth = None if memory_growth is None else parse_growth(memory_growth)
        self.max_memory = (
            None if max_memory is None else parse_size(max_memory, "max_memory", int_unit=MIB)
        )
        if self.max_memory is not None and (self.memory_request or 0) > self.max_memory:
            raise ConfigurationError(
                f"max_memory={max_memory!r} is below mem={mem!r}: the largest grant must be at "
                "least the request; raise max_memory",
                parameter="max_memory",
            )
        if gpus_per_worker is not None and (
            isinstance(gpus_per_worker, bool)
            or not isinstance(gpus_per_worker, int)
            or gpus_per_worker < 1
        ):
            raise ConfigurationError(
                f"gpus_per_worker={gpus_per_worker!r} is not a number of GPUs: pass an "
                "int >= 1, or None for no GPU",
                parameter="gpus_per_worker",
            )
        self.gpus_per_worker = gpus_per_worker
        self.extra_args = tuple(extra_args)
        self.python = python
        self.job_name_prefix = sanitize(job_name_prefix)
        self.poll_interval_seconds = float(poll_interval)
        self.array_threshold = max(2, int(array_threshold))
        self.array_cap = array_cap
        self.pending_warning_seconds = float(pending_warning)
        self._jobs: dict[str, BatchJob] = {}
        self._last_refresh = 0.0
        self._shutting_down = False
        self._scratch: Path | None = None
        self._atexit_registered = False
        self._max_array_size: int | None = None
        #: each array's own job script, with its tasks' jobs (removed once all have ended)
        self._array_scripts: dict[Path, list[BatchJob]] = {}

    # -- the dialect ----------------------------------------------------------------------
    @abstractmethod
    def _submission(
        self, name: str, spec: WorkerSpec, indices: list[int] | None, out: str, err: str
    ) -> tuple[list[str], list[str]]:
        """The job script's header lines (directives) and the submit command's options for
        a job named ``name`` (an array of ``indices`` if given) whose system output and
        error files are ``out`` and ``err`` (array index patterns already in them)."""

    def _submit_argv(self, script: Path, options: list[str]) -> list[str]:
        """The submit command line for ``script`` with ``options`` (extra_args included)."""
        return [self.submit_command, *options, str(script)]

    @abstractmethod
    def _submitted_id(self, stdout: str) -> str | None:
        """The job (or array) id in the submit command's output."""

    @abstractmethod
    def _element_id(self, array_id: str, index: int) -> str:
        """The id of task ``index`` of array ``array_id``."""

    @abstractmethod
    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        """Rows by job id for ``jobs``, from one status command; None when it failed."""

    def _is_finished(self, state: str) -> bool:
        """Whether a job in ``state`` never runs again."""
        return state in self.finished_states

    def _is_pending(self, state: str) -> bool:
        """Whether a job in ``state`` waits to start."""
        return state in self.pending_states

    @abstractmethod
    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        """How a finished job ended (its state table); ``system_tail`` is the end of this
        job's part of the system's error file."""

    def _cancel_argvs(self, ids: list[str], hard: bool) -> list[list[str]]:
        """The command lines that cancel ``ids``; ``hard``: kill them now."""
        options = self.hard_cancel_options if hard else ()
        return [[self.cancel_command, *options, *ids]]

    def _array_cap_suffix(self) -> str:
        """``%<array_cap>``, how most systems cap an array's running tasks ("" for none)."""
        return "" if self.array_cap is None else f"%{self.array_cap}"

    def _file(self, path: str) -> str:
        """``path`` as the system reads an output file name (escaped where it has patterns)."""
        return path

    def _pattern(self, directory: Path, stem: str) -> str:
        """The system's file name for array tasks' files ``<directory>/<stem>``, where
        ``{index}`` in ``stem`` stands for the array index (:attr:`index_token`)."""
        return self._file(str(directory)) + os.sep + stem.replace("{index}", self.index_token)

    def _hopeless(self, job: BatchJob) -> str | None:
        """Why a pending ``job`` can never start (None: it may)."""
        return None

    def _lookup_gone(self, job: BatchJob) -> bool | None:
        """A job missing from the status query: look it up elsewhere (an accounting
        record). True: found (``state`` and ``extra`` updated); False: not known yet; None:
        the system has no such job."""
        return False

    def _lost_message(self, job: BatchJob) -> str:
        """The exit message of ``job``, gone from the status query with no record of its end."""
        return (
            f"job lost: {self.system} job {job.job_id} ({job.job_name}) vanished from "
            f"{self.job_lists}"
        )

    def _submit_error(self, code: int, text: str) -> WorkerStartError:
        """The start error for a submit command that exited with ``code`` saying ``text``."""
        return WorkerStartError(f"{self.submit_command} exited with code {code}: {text}")

    def _array_size_limit(self) -> int:
        """Array indices must be below this."""
        return self.default_max_array_size

    def _status_hint(self, job: BatchJob) -> str:
        """A command the user can run to see ``job``."""
        return f"{self.submit_command} (the job {job.job_id})"

    # -- requests --------------------------------------------------------------------------
    def job_name(self, spec: WorkerSpec) -> str:
        """``{prefix}-{run}-{task}-w{worker_id}``, restricted to ``[A-Za-z0-9_.-]``."""
        return (
            f"{self.job_name_prefix}-{sanitize(spec.run_name)}-{sanitize(spec.task_id)}"
            f"-w{spec.worker_id}"
        )

    def cpus(self, spec: WorkerSpec) -> int:
        req = spec.requires
        return int(req.get("cpus", req.get("cpu", self.cpus_per_worker)))

    def memory_mb(self, spec: WorkerSpec) -> int | None:
        """The job's memory in megabytes: a grant of the memory ladder, else the task's
        ``requires`` (``mem``/``mem_mb``, megabytes), else ``mem`` (None: no request)."""
        if spec.memory is not None and spec.memory != self.memory_request:
            return -(-spec.memory // MIB)
        mem_mb = spec.requires.get("mem_mb", spec.requires.get("mem"))
        if mem_mb:
            return int(mem_mb)
        return None if self.memory_request is None else -(-self.memory_request // MIB)

    def gpus(self, spec: WorkerSpec) -> int:
        """The GPUs a worker's job asks for: a fraction of one (``requires={"gpu": 0.5}``,
        which packs workers on a GPU of this machine) is a whole GPU per job."""
        gpu = spec.requires.get("gpu")
        return math.ceil(gpu) if gpu else (self.gpus_per_worker or 0)

    # -- submission ------------------------------------------------------------------------
    def _work_dir(self, spec: WorkerSpec) -> Path:
        """Where a worker's job script and payload go: next to its logs, or (no logs) in
        a scratch folder of this launcher, one subfolder per task."""
        if spec.err_path is not None:
            return Path(spec.err_path).resolve().parent
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f".bellis-{self.name}-", dir=Path.cwd()))
        directory = self._scratch / task_log_dirname(spec.task_id)
        directory.mkdir(exist_ok=True)
        return directory

    def _worker_lines(self, spec: WorkerSpec, payload: Path) -> list[str]:
        lines = [f"export {PAYLOAD_FILE_ENV}={shlex.quote(str(payload))}"]
        for key in (CONTEXT_ENV, DAISY_CONTEXT_ENV):
            if key in spec.env:
                lines.append(f"export {key}={shlex.quote(spec.env[key])}")
        return lines

    def _exec_line(self) -> str:
        return f"exec {shlex.quote(self.python)} -m bellis._worker._main"

    def _submit(self, script: Path, spec: WorkerSpec, options: list[str]) -> str:
        if shutil.which(self.submit_command) is None:
            raise WorkerStartError(
                f"{self.submit_command} is not on PATH: {type(self).__name__} needs a "
                f"{self.system} client"
            )
        cmd = self._submit_argv(script, [*options, *self.extra_args])
        try:
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=spec.env,
                timeout=COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkerStartError(f"{self.submit_command} failed: {exc}") from exc
        if out.returncode != 0:
            raise self._submit_error(out.returncode, out.stderr.strip() or out.stdout.strip())
        job_id = self._submitted_id(out.stdout)
        if not job_id:
            raise WorkerStartError(
                f"{self.submit_command} printed no job id: {out.stdout!r} {out.stderr!r}"
            )
        self._register_atexit()
        return job_id

    def _script(self, header: list[str], body: list[str]) -> bytes:
        start = walltime_lines(self.walltime_seconds, self.walltime_margin)
        return ("\n".join(["#!/bin/sh", *header, *start, *body]) + "\n").encode()

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        name = self.job_name(spec)
        directory = self._work_dir(spec)
        stem = f"worker_{spec.slot_index}"
        payload = write_payload(directory / f"{stem}.payload", spec.payload)
        body = self._worker_lines(spec, payload)
        if self.logs_via_system:
            sys_out = "/dev/null" if spec.out_path is None else self._file(str(spec.out_path))
            sys_err_path = spec.err_path
            offset = spec.err_offset
        else:
            sys_out = self._file(str(directory / f"{stem}.{self.name}.out"))
            sys_err_path = directory / f"{stem}.{self.name}.err"
            offset = file_size(sys_err_path)
            body.append(redirect_line(spec.out_path, spec.err_path))
        sys_err = "/dev/null" if sys_err_path is None else self._file(str(sys_err_path))
        header, options = self._submission(name, spec, None, sys_out, sys_err)
        body.append(self._exec_line())
        script = directory / f"{stem}.{self.script_suffix}"
        write_private(script, self._script(header, body))
        try:
            job_id = self._submit(script, spec, options)
        except BaseException:
            payload.unlink(missing_ok=True)
            raise
        job = BatchJob(job_id, spec, name, sys_err_path, payload, system_err_offset=offset)
        self._jobs[job_id] = job
        self._check_hopeless([job])
        logger.debug("submitted %s job %s (%s)", self.system, job_id, name)
        return WorkerHandle(spec, job)

    def launch_many(self, specs: Sequence[WorkerSpec]) -> list[WorkerHandle]:
        """Start several workers of one task, all or none: one job array for those whose
        slot is a valid array index when there are enough of them, one job each for the
        others. A failed submission cancels the jobs submitted before it, which the
        caller will not watch."""
        in_array: list[WorkerSpec] = []
        if len(specs) >= self.array_threshold and len({s.task_id for s in specs}) == 1:
            slots = [spec.slot_index for spec in specs]
            if len(set(slots)) != len(slots):
                raise WorkerStartError(
                    f"the workers of one {self.system} job array need distinct log slots, "
                    f"got {slots}: start them one by one with launch()"
                )
            limit = self._array_size_limit() - self.array_first_index
            in_array = [spec for spec in specs if spec.slot_index < limit]
            if not self.array_lists:
                keep = set(longest_run([spec.slot_index for spec in in_array]))
                in_array = [spec for spec in in_array if spec.slot_index in keep]
            if len(in_array) < self.array_threshold:
                in_array = []
        handles: dict[int, WorkerHandle] = {}
        try:
            if in_array:
                for h in self._launch_array(in_array):
                    handles[id(h.spec)] = h
            for spec in specs:
                if id(spec) not in handles:
                    handles[id(spec)] = self.launch(spec)
        except BaseException:
            self._forget([h.native for h in handles.values()])
            raise
        return [handles[id(spec)] for spec in specs]

    def _array_logs(self, specs: Sequence[WorkerSpec], directory: Path) -> tuple[str, str]:
        """The stems of the system's output and error files of an array's tasks."""
        return (
            f"worker_array_{{index}}.{self.name}.out",
            f"worker_array_{{index}}.{self.name}.err",
        )

    def _launch_array(self, specs: Sequence[WorkerSpec]) -> list[WorkerHandle]:
        """``specs`` (one task, distinct slots below the array size limit) as one array."""
        first = specs[0]
        directory = self._work_dir(first)
        indices = [spec.slot_index + self.array_first_index for spec in specs]
        name = self.job_name(first) + "-array"
        out_stem, err_stem = self._array_logs(specs, directory)
        header, options = self._submission(
            name,
            first,
            indices,
            self._pattern(directory, out_stem),
            self._pattern(directory, err_stem),
        )
        body = [f'case "${self.array_index_env}" in']
        payloads: list[Path] = []
        for spec, index in zip(specs, indices, strict=True):
            payload = write_payload(directory / f"worker_{spec.slot_index}.payload", spec.payload)
            payloads.append(payload)
            body.append(f"{index})")
            body += ["    " + line for line in self._worker_lines(spec, payload)]
            body.append("    " + redirect_line(spec.out_path, spec.err_path))
            body.append("    ;;")
        body.append(f'*) echo "unknown array index ${self.array_index_env}" >&2; exit 2;;')
        body += ["esac", self._exec_line()]
        # its own script: LSF reads it when an element starts, maybe after the next array's
        script = write_new_private(
            directory, "worker_array", self.script_suffix, self._script(header, body)
        )
        sys_errs = [directory / err_stem.format(index=index) for index in indices]
        offsets = [file_size(path) for path in sys_errs]
        try:
            array_id = self._submit(script, first, options)
        except BaseException:
            for payload in payloads:
                payload.unlink(missing_ok=True)
            script.unlink(missing_ok=True)
            raise
        handles = []
        jobs = []
        for spec, index, sys_err, offset, payload in zip(
            specs, indices, sys_errs, offsets, payloads, strict=True
        ):
            job_id = self._element_id(array_id, index)
            job = BatchJob(
                job_id, spec, name, sys_err, payload, offset, index=index, array_script=script
            )
            self._jobs[job_id] = job
            jobs.append(job)
            handles.append(WorkerHandle(spec, job))
        self._array_scripts[script] = jobs
        self._check_hopeless(jobs)
        return handles

    def _release_scripts(self, teardown: bool = False) -> None:
        """Remove the script of every array none of whose tasks may still start or runs
        (at ``teardown``: none is known to live on)."""
        for script, jobs in list(self._array_scripts.items()):
            if all(
                job.exit is not None
                or self._is_finished(job.state)
                or (teardown and job.missing_count > 0)
                or job.job_id not in self._jobs
                for job in jobs
            ):
                script.unlink(missing_ok=True)
                del self._array_scripts[script]

    def _check_hopeless(self, jobs: list[BatchJob]) -> None:
        self._query(jobs)
        for job in jobs:
            why = self._hopeless(job) if self._is_pending(job.state) else None
            if why is not None:
                self._forget(jobs)
                raise WorkerStartError(
                    f"{self.system} will never start job {job.job_id} ({job.job_name}): {why}"
                )

    def _forget(self, jobs: list[BatchJob]) -> None:
        """Cancel ``jobs`` (submitted, but their start is reported failed), stop watching
        them and remove their payload files."""
        self._cancel([j.job_id for j in jobs])
        for j in jobs:
            self._jobs.pop(j.job_id, None)
            j.payload_path.unlink(missing_ok=True)
        self._release_scripts()

    # -- watching --------------------------------------------------------------------------
    def _query(self, jobs: list[BatchJob]) -> None:
        """Update ``state``/``reason`` (and, once finished, ``extra``) of ``jobs`` with one
        status command, however many there are."""
        if not jobs:
            return
        seen = self._query_rows(jobs)
        if seen is None:
            return
        for job in jobs:
            row = seen.get(job.job_id)
            if row is None:
                job.missing_count += 1
                continue
            job.state, job.reason = row[0], row[1]
            job.missing_count = 0
            if self._is_finished(job.state) and row[2] and not job.extra:
                job.extra = {"ExitCode": row[2]}

    def _refresh(self) -> None:
        live = [j for j in self._jobs.values() if j.exit is None]
        self._query(live)
        for job in live:
            why = self._hopeless(job) if self._is_pending(job.state) else None
            if self._is_finished(job.state):
                job.exit = self._finished_exit(job)
            elif why is not None:
                self._cancel([job.job_id])
                job.exit = WorkerExit(
                    ExitKind.ERROR, None, f"{self.system} job {job.job_id} can never start ({why})"
                )
            elif self._is_pending(job.state) and job.missing_count == 0:
                self._report_long_wait(job)
            elif job.missing_count > 0:
                found = self._lookup_gone(job)
                if found and self._is_finished(job.state):
                    job.exit = self._finished_exit(job)
                elif found is None or job.missing_count >= self.lost_after_misses:
                    job.exit = WorkerExit(ExitKind.ERROR, None, self._lost_message(job))
        self._release_scripts()

    def _report_long_wait(self, job: BatchJob) -> None:
        now = time.monotonic()
        waited = now - job.submitted_at
        first = job.submitted_at + self.pending_warning_seconds
        if now < max(first, job.warn_pending_at):
            return
        job.warn_pending_at = now + 9 * max(waited, self.pending_warning_seconds)
        logger.warning(
            "%s job %s (%s) is still pending after %.0f s (Reason=%s); the run waits "
            "for it. Check `%s`; cancel the run with Ctrl-C",
            self.system,
            job.job_id,
            job.job_name,
            waited,
            job.reason or "unknown",
            self._status_hint(job),
        )

    def _finished_exit(self, job: BatchJob) -> WorkerExit:
        system_tail = _stderr_tail(job.system_err, lines=20, start=job.system_err_offset)
        watched = None
        if self.walltime_seconds is not None:
            watched = f"time_limit={self._limit_text()}, walltime_margin={self.walltime_margin:g} s"
        result = ending_exit(
            self._ending(job, system_tail),
            job,
            system_tail,
            system=self.system,
            cancel_command=self.cancel_command,
            walltime=watched,
        )
        if result.kind == ExitKind.CLEAN:
            return self._walltime_exit(job) or result
        return result

    def _limit_text(self) -> str:
        return hms(self.limit_seconds or 0)

    def _walltime_exit(self, job: BatchJob) -> WorkerExit | None:
        """The exit of a worker that left before its job's time limit (it says so in its
        own stderr); None for any other clean exit."""
        spec = job.spec
        if self.walltime_seconds is None or spec.err_path is None:
            return None
        tail = _stderr_tail(spec.err_path, lines=20, start=spec.err_offset)
        for line in reversed(tail.splitlines()):
            if line.startswith(LEAVING_MARKER):
                return WorkerExit(
                    ExitKind.WALLTIME,
                    0,
                    f"{self.system} job {job.job_id} ({job.job_name}): {line}",
                )
        return None

    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        job: BatchJob = handle.native
        if job.exit is None:
            now = time.monotonic()
            interval = self.poll_interval_seconds
            if self._shutting_down:
                interval = min(interval, _SHUTDOWN_POLL_SECONDS)
            if now - self._last_refresh >= interval:
                self._last_refresh = now
                self._refresh()
        return job.exit

    def log_location(self, handle: WorkerHandle) -> str | None:
        job: BatchJob = handle.native
        where = handle.spec.err_path
        return f"{self.system} job {job.job_id}" + ("" if where is None else f": {where}")

    # -- stopping --------------------------------------------------------------------------
    def _cancel(self, job_ids: list[str], hard: bool = False) -> None:
        if not job_ids:
            return
        for argv in self._cancel_argvs(job_ids, hard):
            try:
                done = subprocess.run(
                    argv, capture_output=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                logger.warning(
                    "%s failed for %s job(s) %s: %s; check them with %s",
                    argv[0],
                    self.system,
                    " ".join(job_ids),
                    exc,
                    self._status_hint(self._jobs[job_ids[0]])
                    if job_ids[0] in self._jobs
                    else "the system's job list",
                )
                return
            if done.returncode != 0:
                # usually a job that ended meanwhile
                logger.debug(
                    "%s exited with %d: %s",
                    " ".join(argv),
                    done.returncode,
                    done.stderr.decode(errors="replace").strip(),
                )

    def _wait_gone(self, jobs: list[BatchJob], seconds: float) -> list[BatchJob]:
        deadline = time.monotonic() + seconds
        while True:
            self._query(jobs)
            jobs = [j for j in jobs if not self._is_finished(j.state) and j.missing_count == 0]
            if not jobs or time.monotonic() >= deadline:
                return jobs
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _stop(self, jobs: list[BatchJob], grace_seconds: float) -> None:
        jobs = [j for j in jobs if j.exit is None]
        if not jobs:
            return
        self._cancel([j.job_id for j in jobs])
        left = self._wait_gone(jobs, grace_seconds)
        if left:
            self._cancel([j.job_id for j in left], hard=True)
            self._wait_gone(left, 10.0)
        for job in jobs:
            if job.exit is None and job.missing_count and not self._is_finished(job.state):
                # gone from the status query (a system that lists only live jobs): its
                # accounting record says how it ended; cancelled here if it has none yet
                if not self._lookup_gone(job):
                    job.exit = WorkerExit(
                        ExitKind.ERROR,
                        None,
                        f"{self.system} job {job.job_id} ({job.job_name}) was cancelled "
                        f"({self.cancel_command} at teardown)",
                    )
            if job.exit is None and self._is_finished(job.state):
                job.exit = self._finished_exit(job)

    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        self._stop([h.native for h in handles], grace_seconds)

    def kill(self, handle: WorkerHandle) -> None:
        """Cancel one worker's job at once (its block timed out, or it lost a race)."""
        job: BatchJob = handle.native
        if job.exit is None:
            self._cancel([job.job_id], hard=True)

    def shutting_down(self) -> None:
        self._shutting_down = True

    def live_job_ids(self) -> list[str]:
        """Ids of the jobs this launcher started that have not been seen to finish."""
        return [j.job_id for j in self._jobs.values() if j.exit is None]

    def close(self) -> None:
        """Cancel every job of this launcher that has not finished; remove scratch files."""
        self._stop(list(self._jobs.values()), 0.0)
        for job in self._jobs.values():
            if job.exit is not None or self._is_finished(job.state) or job.missing_count:
                job.payload_path.unlink(missing_ok=True)
        self._release_scripts(teardown=True)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        if self._atexit_registered:
            atexit.unregister(self._cancel_at_exit)
            self._atexit_registered = False
        self._shutting_down = False  # (a launcher may serve another run)

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._cancel_at_exit)
            self._atexit_registered = True

    def _cancel_at_exit(self) -> None:
        self._cancel(self.live_job_ids())
