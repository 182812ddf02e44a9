"""SLURM launcher: every bellis worker is one ``sbatch`` job (or one task of a job array).

The job script runs ``python -m bellis._worker._main``; the worker reads its payload from a file
next to its logs (``BELLIS_PAYLOAD_FILE``) and connects back to the server over TCP. Job
states, reasons and exit codes are read with one ``squeue`` call per ``poll_interval`` for
all jobs of the launcher, whatever their number (``scontrol show job`` only for a job gone
from ``squeue``, or where ``squeue`` cannot print exit codes).

With a ``time_limit`` the workers are walltime-aware (``bellis._worker._walltime``): the job script
exports the limit and the job's start, and a worker stops taking blocks when its job's
remaining time is below ``walltime_margin`` plus the p95 of its block walls, then exits 0
after writing :data:`~bellis._worker._walltime.LEAVING_MARKER` to its stderr; that exit is kind
``walltime`` and the server starts a replacement while blocks remain.

Files go per log slot, as the workers' logs do: the job script and payload of the worker
in slot ``n`` of a task are ``worker_<n>.sbatch`` and ``worker_<n>.payload`` next to its
``worker_<n>.out`` and ``.err`` (a replacement overwrites them: sbatch keeps its own copy
of a script, and a slot's previous job has ended). A job array's indices are the slots of
its workers, so SLURM's own messages for array task ``n`` go to ``worker_<n>.err`` too.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._protocol import ExitKind
from .._sizes import MIB, parse_growth, parse_size
from .._worker._walltime import LEAVING_MARKER
from ..errors import ConfigurationError, WorkerStartError
from ..logging import task_log_dirname
from ._base import (
    WorkerExit,
    WorkerHandle,
    WorkerLauncher,
    WorkerSpec,
    _stderr_tail,
    describe_exit,
)
from ._slurm_text import (
    array_ranges,
    default_margin,
    exit_status,
    file_size,
    format_mem,
    format_time_limit,
    parse_fields,
    sanitize,
    slurm_pattern,
    time_limit_seconds,
    write_private,
)

__all__ = ["SlurmLauncher"]

logger = logging.getLogger("bellis")

#: states after which a job never runs again (COMPLETING is not one: the job still holds its node)
_FINISHED_STATES = frozenset(
    "BOOT_FAIL CANCELLED COMPLETED DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PREEMPTED REVOKED "
    "SPECIAL_EXIT TIMEOUT".split()
)
#: pending reasons that never clear by waiting: the request does not fit the partition
_HOPELESS_REASONS = frozenset(
    {
        "BadConstraints",
        "DependencyNeverSatisfied",
        "InvalidAccount",
        "InvalidQOS",
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        # the node could not start the job, which SLURM then requeued and held: only an
        # administrator's release would start it
        "launch failed requeued held",
        "launch_failed_requeued_held",
    }
)
_OOM_MARKERS = ("Exceeded job memory limit", "oom-kill", "Out Of Memory")
_COMMAND_TIMEOUT_SECONDS = 30.0
#: squeue's columns: the array task id (``<array>_<index>``), state, reason, exit status
_SQUEUE_FIELDS = "JobArrayID:|,State:|,Reason:|,exit_code:|"
#: SLURM's default MaxArraySize, where ``scontrol show config`` does not say
_DEFAULT_MAX_ARRAY_SIZE = 1001
#: how often jobs are polled once the run told them to stop (whatever poll_interval is)
_SHUTDOWN_POLL_SECONDS = 0.5


class _FormatUnsupported(Exception):
    """squeue rejected the output format, or printed lines it does not parse."""


@dataclass
class _Job:
    """What the launcher knows about one submitted worker job."""

    job_id: str
    spec: WorkerSpec
    job_name: str
    slurm_err: Path | None
    payload_path: Path
    #: where this job's own part of ``slurm_err`` starts (a worker log is appended to)
    slurm_err_offset: int = 0
    state: str = "PENDING"
    reason: str = ""
    exit: WorkerExit | None = None
    missing_count: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    submitted_at: float = field(default_factory=time.monotonic)
    #: when a long pending wait is next reported
    warn_pending_at: float = 0.0


class SlurmLauncher(WorkerLauncher):
    """Start workers as SLURM batch jobs (``sbatch``), one job per worker.

    ``time_limit`` is minutes or ``"HH:MM:SS"``; ``mem`` is ``"4G"``-style or megabytes;
    ``gres`` e.g. ``"gpu:1"``, or ``gpus_per_worker=N`` for ``--gres=gpu:N``. A task's
    ``requires`` keys ``cpu``/``cpus``, ``mem``/``mem_mb`` (megabytes) and ``gpu`` override
    the per-worker CPUs, memory and GPU count.
    ``launch_many`` submits a job array when at least ``array_threshold`` workers start at once.
    A job still pending after ``pending_warning`` seconds is reported at WARNING with
    SLURM's reason (again every ten times as long), so a queue that never starts the job
    is visible instead of a silent wait.

    With a ``time_limit``, a worker takes no new block once its job's remaining time is
    less than ``walltime_margin`` seconds (default 5% of the limit, 10 s to 60 s) plus the
    p95 wall of its blocks so far; it exits cleanly (exit kind ``walltime``) and a new job
    takes over while blocks remain. ``walltime_aware=False`` turns this off.

    A block whose job runs out of memory runs again in a job with ``memory_growth``
    (default 2) times the memory, up to ``max_memory`` (``"64G"``, or megabytes; default
    ``mem`` × growth²); only a block that runs out at that cap fails.
    """

    name = "slurm"
    is_local = False
    #: it gives a worker the memory grant of its spec (``--mem``)
    memory_grants = True

    def __init__(
        self,
        partition: str | None = None,
        time_limit: int | str | None = None,
        cpus_per_worker: int = 1,
        mem: int | str | None = None,
        gres: str | None = None,
        gpus_per_worker: int | None = None,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
        job_name_prefix: str = "bellis",
        poll_interval: float = 1.0,
        array_threshold: int = 4,
        pending_warning: float = 300.0,
        walltime_margin: float | None = None,
        walltime_aware: bool = True,
        memory_growth: float | None = None,
        max_memory: int | str | None = None,
    ) -> None:
        if cpus_per_worker < 1:
            raise ValueError(f"cpus_per_worker must be at least 1 (got {cpus_per_worker})")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive (got {poll_interval})")
        if pending_warning <= 0:
            raise ValueError(f"pending_warning must be positive seconds (got {pending_warning})")
        self.partition = partition
        self.time_limit = None if time_limit is None else format_time_limit(time_limit)
        #: the limit in seconds when workers watch it (None: they do not)
        self.walltime_seconds: int | None = None
        self.walltime_margin = 0.0
        if self.time_limit is not None and walltime_aware:
            self.walltime_seconds = time_limit_seconds(self.time_limit)
            margin = (
                default_margin(self.walltime_seconds)
                if walltime_margin is None
                else float(walltime_margin)
            )
            if not 0.0 <= margin < self.walltime_seconds:
                raise ValueError(
                    f"walltime_margin must be seconds >= 0 and below the time limit "
                    f"({self.walltime_seconds} s), got {walltime_margin!r}"
                )
            self.walltime_margin = margin
        self.cpus_per_worker = int(cpus_per_worker)
        self.mem = None if mem is None else format_mem(mem)
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
        if gpus_per_worker is not None:
            if isinstance(gpus_per_worker, bool) or not isinstance(gpus_per_worker, int):
                raise ConfigurationError(
                    f"gpus_per_worker={gpus_per_worker!r} is not a number of GPUs: pass an "
                    "int >= 1, or None for no GPU",
                    parameter="gpus_per_worker",
                )
            if gpus_per_worker < 1 or gres is not None:
                raise ConfigurationError(
                    f"gpus_per_worker={gpus_per_worker!r} with gres={gres!r}: pass a number of "
                    "GPUs >= 1, and either gpus_per_worker (it requests --gres=gpu:N) or gres, "
                    "not both",
                    parameter="gpus_per_worker",
                )
            gres = f"gpu:{gpus_per_worker}"
        self.gres = gres
        self.extra_args = tuple(extra_args)
        self.python = python
        self.job_name_prefix = sanitize(job_name_prefix)
        self.poll_interval_seconds = float(poll_interval)
        self.array_threshold = max(2, int(array_threshold))
        self.pending_warning_seconds = float(pending_warning)
        self._jobs: dict[str, _Job] = {}
        self._last_refresh = 0.0
        self._shutting_down = False
        self._scratch: Path | None = None
        self._atexit_registered = False
        #: whether squeue prints exit codes (``-O exit_code``); False: scontrol per job end
        self._squeue_exit_codes = True
        self._max_array_size: int | None = None

    # -- submission ---------------------------------------------------------------------
    def job_name(self, spec: WorkerSpec) -> str:
        """``{prefix}-{run}-{task}-w{worker_id}``, restricted to ``[A-Za-z0-9_.-]``."""
        return (
            f"{self.job_name_prefix}-{sanitize(spec.run_name)}-{sanitize(spec.task_id)}"
            f"-w{spec.worker_id}"
        )

    def _resource_flags(self, spec: WorkerSpec) -> list[str]:
        req = spec.requires
        cpus = req.get("cpus", req.get("cpu", self.cpus_per_worker))
        flags = [f"--cpus-per-task={int(cpus)}"]
        mem_mb = req.get("mem_mb", req.get("mem"))
        mem = format_mem(int(mem_mb)) if mem_mb else self.mem
        if spec.memory is not None and spec.memory != self.memory_request:
            mem = format_mem(-(-spec.memory // MIB))  # a grant of the memory ladder
        if mem is not None:
            flags.append(f"--mem={mem}")
        gres = f"gpu:{int(req['gpu'])}" if req.get("gpu") else self.gres
        if gres:
            flags.append(f"--gres={gres}")
        if self.time_limit is not None:
            flags.append(f"--time={self.time_limit}")
        if self.partition:
            flags.append(f"--partition={self.partition}")
        return flags

    def _work_dir(self, spec: WorkerSpec) -> Path:
        """Where a worker's job script and payload go: next to its logs, or (no logs) in
        a scratch folder of this launcher, one subfolder per task."""
        if spec.err_path is not None:
            return Path(spec.err_path).resolve().parent
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=".bellis-slurm-", dir=Path.cwd()))
        directory = self._scratch / task_log_dirname(spec.task_id)
        directory.mkdir(exist_ok=True)
        return directory

    def _write_payload(self, spec: WorkerSpec, directory: Path, stem: str) -> Path:
        path = directory / f"{stem}.payload"
        tmp = path.with_suffix(".payload.tmp")
        write_private(tmp, struct.pack("<Q", len(spec.payload)) + spec.payload)
        tmp.replace(path)
        return path

    def _worker_lines(self, spec: WorkerSpec, payload: Path) -> list[str]:
        lines = [f"export BELLIS_PAYLOAD_FILE={shlex.quote(str(payload))}"]
        for key in ("BELLIS_CONTEXT", "DAISY_CONTEXT"):
            if key in spec.env:
                lines.append(f"export {key}={shlex.quote(spec.env[key])}")
        return lines

    def _walltime_lines(self) -> list[str]:
        """The job script's first commands when workers watch the time limit: the job's
        start (epoch seconds), the limit and the margin (see ``bellis._worker._walltime``)."""
        if self.walltime_seconds is None:
            return []
        return [
            "BELLIS_JOB_STARTED=$(date +%s)",
            f"export BELLIS_JOB_STARTED BELLIS_JOB_TIME_LIMIT={self.walltime_seconds} "
            f"BELLIS_WALLTIME_MARGIN={self.walltime_margin:g}",
        ]

    def _submit(self, script: Path, spec: WorkerSpec, extra: list[str]) -> str:
        if shutil.which("sbatch") is None:
            raise WorkerStartError("sbatch is not on PATH: SlurmLauncher needs a SLURM client")
        cmd = ["sbatch", "--parsable", *extra, *self.extra_args, str(script)]
        try:
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=spec.env,
                timeout=_COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkerStartError(f"sbatch failed: {exc}") from exc
        if out.returncode != 0:
            raise WorkerStartError(
                f"sbatch exited with code {out.returncode}: {out.stderr.strip() or out.stdout}"
            )
        job_id = out.stdout.strip().split(";")[0]
        if not job_id:
            raise WorkerStartError(f"sbatch printed no job id: {out.stdout!r}")
        self._register_atexit()
        return job_id

    def _script_header(self, name: str, spec: WorkerSpec) -> list[str]:
        lines = ["#!/bin/sh", f"#SBATCH --job-name={name}"]
        lines += [f"#SBATCH {flag}" for flag in self._resource_flags(spec)]
        # the server replaces a worker whose job ended; SLURM must not run it a second time
        # (after a failed launch, a node failure or a preemption)
        lines.append("#SBATCH --no-requeue")
        return lines

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        name = self.job_name(spec)
        directory = self._work_dir(spec)
        stem = f"worker_{spec.slot_index}"
        payload = self._write_payload(spec, directory, stem)
        out = slurm_pattern(spec.out_path) if spec.out_path is not None else "/dev/null"
        err = slurm_pattern(spec.err_path) if spec.err_path is not None else "/dev/null"
        lines = self._script_header(name, spec)
        # append, as local workers do: the files hold earlier runs and the driver's
        # separator line (SLURM's default open mode would truncate them)
        lines += [f"#SBATCH --output={out}", f"#SBATCH --error={err}", "#SBATCH --open-mode=append"]
        lines += self._walltime_lines()
        lines += self._worker_lines(spec, payload)
        lines.append(f"exec {shlex.quote(self.python)} -m bellis._worker._main")
        script = directory / f"{stem}.sbatch"
        write_private(script, ("\n".join(lines) + "\n").encode())
        try:
            job_id = self._submit(script, spec, [])
        except BaseException:
            payload.unlink(missing_ok=True)
            raise
        job = _Job(job_id, spec, name, spec.err_path, payload, slurm_err_offset=spec.err_offset)
        self._jobs[job_id] = job
        self._check_hopeless([job])
        logger.debug("submitted SLURM job %s (%s)", job_id, name)
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
                    f"the workers of one SLURM job array need distinct log slots, got "
                    f"{slots}: start them one by one with launch()"
                )
            limit = self._array_size_limit()
            in_array = [spec for spec in specs if spec.slot_index < limit]
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

    def _array_size_limit(self) -> int:
        """SLURM's ``MaxArraySize`` (array indices are below it), read once."""
        if self._max_array_size is None:
            self._max_array_size = _DEFAULT_MAX_ARRAY_SIZE
            try:
                out = subprocess.run(
                    ["scontrol", "show", "config"],
                    capture_output=True,
                    text=True,
                    timeout=_COMMAND_TIMEOUT_SECONDS,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                logger.debug("scontrol show config failed: %s", exc)
                return self._max_array_size
            m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out.stdout, re.M)
            if m is not None:
                self._max_array_size = int(m[1])
        return self._max_array_size

    def _launch_array(self, specs: Sequence[WorkerSpec]) -> list[WorkerHandle]:
        """``specs`` (one task, distinct slots below MaxArraySize) as one job array."""
        first = specs[0]
        directory = self._work_dir(first)
        slots = [spec.slot_index for spec in specs]
        name = self.job_name(first) + "-array"
        # the array indices are the slots: SLURM's own messages for array task n go to
        # worker_<n>.err (the worker's own log) where the logs follow that naming
        in_logs = all(
            spec.out_path is not None
            and spec.err_path is not None
            and Path(spec.out_path).resolve() == directory / f"worker_{spec.slot_index}.out"
            and Path(spec.err_path).resolve() == directory / f"worker_{spec.slot_index}.err"
            for spec in specs
        )
        err_name = "worker_%a.err" if in_logs else "worker_%a.slurm.err"
        out_name = "worker_%a.out" if in_logs else err_name
        slurm_log = directory / err_name
        lines = self._script_header(name, first)
        lines += [
            f"#SBATCH --output={slurm_pattern(directory)}{os.sep}{out_name}",
            f"#SBATCH --error={slurm_pattern(directory)}{os.sep}{err_name}",
            "#SBATCH --open-mode=append",
        ]
        lines += self._walltime_lines()
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        payloads: list[Path] = []
        for spec in specs:
            payload = self._write_payload(spec, directory, f"worker_{spec.slot_index}")
            payloads.append(payload)
            lines.append(f"{spec.slot_index})")
            lines += ["    " + line for line in self._worker_lines(spec, payload)]
            out = str(spec.out_path) if spec.out_path is not None else "/dev/null"
            err = str(spec.err_path) if spec.err_path is not None else "/dev/null"
            lines.append(f"    exec >>{shlex.quote(out)} 2>>{shlex.quote(err)}")
            lines.append("    ;;")
        lines.append('*) echo "unknown array index $SLURM_ARRAY_TASK_ID" >&2; exit 2;;')
        lines.append("esac")
        lines.append(f"exec {shlex.quote(self.python)} -m bellis._worker._main")
        script = directory / "worker_array.sbatch"
        write_private(script, ("\n".join(lines) + "\n").encode())
        slurm_errs = [Path(str(slurm_log).replace("%a", str(slot))) for slot in slots]
        offsets = [file_size(path) for path in slurm_errs]
        try:
            array_id = self._submit(script, first, [f"--array={array_ranges(slots)}"])
        except BaseException:
            for payload in payloads:
                payload.unlink(missing_ok=True)
            raise
        handles = []
        jobs = []
        for spec, slot, slurm_err, offset, payload in zip(
            specs, slots, slurm_errs, offsets, payloads, strict=True
        ):
            job = _Job(f"{array_id}_{slot}", spec, name, slurm_err, payload, offset)
            self._jobs[job.job_id] = job
            jobs.append(job)
            handles.append(WorkerHandle(spec, job))
        self._check_hopeless(jobs)
        return handles

    def _check_hopeless(self, jobs: list[_Job]) -> None:
        self._query(jobs)
        for job in jobs:
            if job.state == "PENDING" and job.reason in _HOPELESS_REASONS:
                self._forget(jobs)
                raise WorkerStartError(
                    f"SLURM will never start job {job.job_id} ({job.job_name}): "
                    f"Reason={job.reason}; the requested resources "
                    f"({' '.join(self._resource_flags(job.spec))}) do not fit the partition"
                )

    def _forget(self, jobs: list[_Job]) -> None:
        """Cancel ``jobs`` (submitted, but their start is reported failed), stop watching
        them and remove their payload files."""
        self._scancel([j.job_id for j in jobs])
        for j in jobs:
            self._jobs.pop(j.job_id, None)
            j.payload_path.unlink(missing_ok=True)

    # -- watching -----------------------------------------------------------------------
    def _query(self, jobs: list[_Job]) -> None:
        """Update ``state``/``reason`` (and, once finished, the exit code) of ``jobs`` with
        one squeue call, however many there are: an array's tasks are asked for by the
        array's id (``-r`` lists them one per line)."""
        if not jobs:
            return
        ids = ",".join(dict.fromkeys(j.job_id.split("_")[0] for j in jobs))
        try:
            seen = self._squeue(ids)
        except _FormatUnsupported:
            # a squeue that cannot print exit codes (or this -O syntax): read them with
            # scontrol once per finished job from now on
            self._squeue_exit_codes = False
            try:
                seen = self._squeue(ids)
            except _FormatUnsupported:
                seen = None
        if seen is None:
            return
        for job in jobs:
            row = seen.get(job.job_id)
            if row is None:
                job.missing_count += 1
                continue
            job.state, job.reason = row[0], row[1]
            job.missing_count = 0
            if job.state in _FINISHED_STATES and row[2] and not job.extra:
                job.extra = {"ExitCode": row[2]}

    def _squeue(self, ids: str) -> dict[str, tuple[str, str, str]] | None:
        """job id -> (state, reason, ``code:signal`` or "") for the jobs ``ids`` lists;
        None when squeue failed (nothing is known then). Raises :class:`_FormatUnsupported`
        when squeue rejects the format or prints what it does not parse."""
        if self._squeue_exit_codes:
            fmt = ["-O", _SQUEUE_FIELDS]
        else:
            fmt = ["-o", "%i|%T|%r||"]
        try:
            out = subprocess.run(
                ["squeue", "-r", "-h", "-t", "all", "-j", ids, *fmt],
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.debug("squeue failed: %s", exc)
            return None
        if "format" in out.stderr.lower():
            raise _FormatUnsupported(out.stderr.strip())
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            logger.debug("squeue exited with %d: %s", out.returncode, out.stderr.strip())
            return None
        seen: dict[str, tuple[str, str, str]] = {}
        for line in out.stdout.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 5 or not parts[0]:
                raise _FormatUnsupported(f"unexpected squeue line {line!r}")
            seen[parts[0]] = (parts[1], parts[2], exit_status(parts[3]))
        return seen

    def _scontrol(self, job_id: str) -> dict[str, str] | None:
        try:
            out = subprocess.run(
                ["scontrol", "show", "job", "-o", job_id],
                capture_output=True,
                text=True,
                timeout=_COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode != 0:
            return None if "Invalid job id" in out.stderr else {}
        for line in out.stdout.splitlines():
            fields = parse_fields(line)
            if fields.get("JobId") == job_id or (
                "ArrayTaskId" in fields
                and f"{fields.get('ArrayJobId')}_{fields['ArrayTaskId']}" == job_id
            ):
                return fields
        return {}

    def _refresh(self) -> None:
        live = [j for j in self._jobs.values() if j.exit is None]
        self._query(live)
        for job in live:
            if job.state in _FINISHED_STATES:
                job.exit = self._finished_exit(job)
            elif job.state == "PENDING" and job.reason in _HOPELESS_REASONS:
                self._scancel([job.job_id])
                job.exit = WorkerExit(
                    ExitKind.ERROR,
                    None,
                    f"SLURM job {job.job_id} can never start (Reason={job.reason})",
                )
            elif job.state == "PENDING" and job.missing_count == 0:
                self._report_long_wait(job)
            elif job.missing_count > 0:
                fields = self._scontrol(job.job_id)
                if fields is None or job.missing_count >= 3:
                    job.exit = WorkerExit(
                        ExitKind.ERROR,
                        None,
                        f"job lost: SLURM job {job.job_id} ({job.job_name}) vanished from "
                        "squeue and scontrol",
                    )
                elif fields.get("JobState") in _FINISHED_STATES:
                    job.state = fields["JobState"]
                    job.extra = fields
                    job.exit = self._finished_exit(job)

    def _report_long_wait(self, job: _Job) -> None:
        now = time.monotonic()
        waited = now - job.submitted_at
        first = job.submitted_at + self.pending_warning_seconds
        if now < max(first, job.warn_pending_at):
            return
        job.warn_pending_at = now + 9 * max(waited, self.pending_warning_seconds)
        logger.warning(
            "SLURM job %s (%s) is still pending after %.0f s (Reason=%s); the run waits "
            "for it. Check `squeue -j %s`; cancel the run with Ctrl-C",
            job.job_id,
            job.job_name,
            waited,
            job.reason or "unknown",
            job.job_id.split("_")[0],
        )

    def _finished_exit(self, job: _Job) -> WorkerExit:
        fields = job.extra or self._scontrol(job.job_id) or {}
        code_text, _, signal_text = fields.get("ExitCode", "0:0").partition(":")
        try:
            code, sig = int(code_text), int(signal_text or 0)
        except ValueError:
            code, sig = 0, 0
        spec = job.spec
        where = f"SLURM job {job.job_id} ({job.job_name})"
        state = job.state
        kind = ExitKind.ERROR  # every exit below but a clean (or walltime) one
        slurm_tail = _stderr_tail(job.slurm_err, lines=20, start=job.slurm_err_offset)
        # SLURM's own note of an OOM kill, in this job's part of its log, explains a
        # failure; a clean exit stays clean (a child of the worker may have been killed)
        oom_noted = state == "FAILED" and any(m in slurm_tail for m in _OOM_MARKERS)
        if state == "OUT_OF_MEMORY" or oom_noted:
            return WorkerExit(
                kind,
                code or -9,
                f"out of memory: {where} exceeded its memory limit; raise mem=\n{slurm_tail}",
            )
        if state == "TIMEOUT":
            if self.walltime_seconds is None:
                return WorkerExit(kind, None, f"{where}: job exceeded its SLURM time limit")
            # its worker takes no block it expects to outlast the job: the block it ran
            # alone outlasted what was left of the limit
            return WorkerExit(
                kind,
                None,
                f"{where}: a block ran longer than the job time limit allowed "
                f"(time_limit={self.time_limit}, walltime_margin={self.walltime_margin:g} s): "
                "SLURM stopped the job at its limit; raise time_limit= above the longest "
                "block's wall, or make the blocks smaller",
            )
        if state == "CANCELLED":
            return WorkerExit(kind, None, f"{where} was cancelled (scancel or preemption)")
        if state == "FAILED" and not code and not sig:
            # failed without an exit status: the job's script never ran (a failed launch)
            return WorkerExit(
                kind, None, f"{where} failed to start (Reason={job.reason or 'unknown'})"
            )
        if state in ("COMPLETED", "FAILED"):
            result = describe_exit(code if code or not sig else -sig, spec)
            if result.kind == ExitKind.CLEAN:
                return self._walltime_exit(job) or result
            return WorkerExit(result.kind, result.code, f"{where}: {result.message}")
        return WorkerExit(kind, code or None, f"{where} ended in state {state}")

    def _walltime_exit(self, job: _Job) -> WorkerExit | None:
        """The exit of a worker that left before its job's time limit (it says so in its
        own stderr); None for any other clean exit."""
        spec = job.spec
        if self.walltime_seconds is None or spec.err_path is None:
            return None
        tail = _stderr_tail(spec.err_path, lines=20, start=spec.err_offset)
        for line in reversed(tail.splitlines()):
            if line.startswith(LEAVING_MARKER):
                return WorkerExit(
                    ExitKind.WALLTIME, 0, f"SLURM job {job.job_id} ({job.job_name}): {line}"
                )
        return None

    def poll(self, handle: WorkerHandle) -> WorkerExit | None:
        job: _Job = handle.native
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
        job: _Job = handle.native
        where = handle.spec.err_path
        return f"SLURM job {job.job_id}" + ("" if where is None else f": {where}")

    # -- stopping -----------------------------------------------------------------------
    def _scancel(self, job_ids: list[str], *args: str) -> None:
        if not job_ids:
            return
        try:
            done = subprocess.run(
                ["scancel", *args, *job_ids],
                capture_output=True,
                timeout=_COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning(
                "scancel failed for SLURM job(s) %s: %s; check them with squeue",
                " ".join(job_ids),
                exc,
            )
            return
        if done.returncode != 0:
            # usually a job that ended meanwhile ("Invalid job id specified")
            logger.debug(
                "scancel %s exited with %d: %s",
                " ".join(job_ids),
                done.returncode,
                done.stderr.decode(errors="replace").strip(),
            )

    def _wait_gone(self, jobs: list[_Job], seconds: float) -> list[_Job]:
        deadline = time.monotonic() + seconds
        while True:
            self._query(jobs)
            jobs = [j for j in jobs if j.state not in _FINISHED_STATES and j.missing_count == 0]
            if not jobs or time.monotonic() >= deadline:
                return jobs
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))

    def _stop(self, jobs: list[_Job], grace_seconds: float) -> None:
        jobs = [j for j in jobs if j.exit is None]
        if not jobs:
            return
        self._scancel([j.job_id for j in jobs])
        left = self._wait_gone(jobs, grace_seconds)
        if left:
            ids = [j.job_id for j in left]
            self._scancel(ids, "--full", "--signal=KILL")
            self._scancel(ids)
            self._wait_gone(left, 10.0)
        for job in jobs:
            if job.exit is None and job.state in _FINISHED_STATES:
                job.exit = self._finished_exit(job)

    def cancel(self, handles: list[WorkerHandle], grace_seconds: float) -> None:
        self._stop([h.native for h in handles], grace_seconds)

    def kill(self, handle: WorkerHandle) -> None:
        """Cancel one worker's job at once (its block timed out)."""
        job: _Job = handle.native
        if job.exit is None:
            self._scancel([job.job_id], "--full", "--signal=KILL")
            self._scancel([job.job_id])

    def shutting_down(self) -> None:
        self._shutting_down = True

    def live_job_ids(self) -> list[str]:
        """Ids of the jobs this launcher started that have not been seen to finish."""
        return [j.job_id for j in self._jobs.values() if j.exit is None]

    def close(self) -> None:
        """Cancel every job of this launcher that has not finished; remove scratch files."""
        self._stop(list(self._jobs.values()), 0.0)
        for job in self._jobs.values():
            if job.exit is not None or job.state in _FINISHED_STATES:
                job.payload_path.unlink(missing_ok=True)
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
        self._scancel(self.live_job_ids())
