"""SLURM launcher: every bellis worker is one ``sbatch`` job (or one task of a job array).

The SLURM dialect of the batch-system core (``_batch``): ``#SBATCH`` lines, ``sbatch
--parsable``, one ``squeue`` call per ``poll_interval`` for all jobs of the launcher
(``scontrol show job`` only for a job gone from ``squeue``, or where ``squeue`` cannot print
exit codes), ``scancel``, and SLURM's state table.

Files go per log slot, as the workers' logs do: the job script and payload of the worker
in slot ``n`` of a task are ``worker_<n>.sbatch`` and ``worker_<n>.payload`` next to its
``worker_<n>.out`` and ``.err`` (a replacement overwrites them: sbatch keeps its own copy
of a script, and a slot's previous job has ended). A job array's indices are the slots of
its workers, so SLURM's own messages for array task ``n`` go to ``worker_<n>.err`` too.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigurationError
from ._base import WorkerSpec
from ._batch import (
    COMMAND_TIMEOUT_SECONDS,
    BatchJob,
    BatchLauncher,
    End,
    Ending,
    Row,
    shared_options,
)
from ._batch_jobs import run_command
from ._batch_text import array_ranges
from ._slurm_text import (
    exit_status,
    format_mem,
    format_time_limit,
    parse_fields,
    slurm_pattern,
    time_limit_seconds,
)

__all__ = ["SlurmLauncher"]

logger = logging.getLogger("bellis")

#: a submitted job, as the core knows it (the name the SLURM tests use)
_Job = BatchJob

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
#: squeue's columns: the array task id (``<array>_<index>``), state, reason, exit status
_SQUEUE_FIELDS = "JobArrayID:|,State:|,Reason:|,exit_code:|"
#: SLURM's state table: the states whose ending is not read from the exit code
_ENDS = {
    "OUT_OF_MEMORY": End.OUT_OF_MEMORY,
    "TIMEOUT": End.TIME_LIMIT,
    "DEADLINE": End.TIME_LIMIT,
    "CANCELLED": End.CANCELLED,
    "PREEMPTED": End.PREEMPTED,
    "NODE_FAIL": End.NODE_FAIL,
    "BOOT_FAIL": End.NOT_STARTED,
}


class _FormatUnsupported(Exception):
    """squeue rejected the output format, or printed lines it does not parse."""


class SlurmLauncher(BatchLauncher):
    """Start workers as SLURM batch jobs (``sbatch``), one job per worker.

    ``time_limit`` is minutes or ``"HH:MM:SS"``; ``mem`` is ``"4G"``-style or megabytes;
    ``gres`` e.g. ``"gpu:1"``, or ``gpus_per_worker=N`` for ``--gres=gpu:N``. A task's
    ``requires`` keys ``cpu``/``cpus``, ``mem``/``mem_mb`` (megabytes) and ``gpu`` override
    the per-worker CPUs, memory and GPU count.
    ``launch_many`` submits a job array when at least ``array_threshold`` workers start at once
    (at most ``array_cap`` of its tasks running at once: ``--array=...%k``).
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
    system = "SLURM"
    submit_command = "sbatch"
    cancel_command = "scancel"
    array_index_env = "SLURM_ARRAY_TASK_ID"
    index_token = "%a"
    script_suffix = "sbatch"
    logs_via_system = True
    job_lists = "squeue and scontrol"
    finished_states = _FINISHED_STATES
    pending_states = frozenset({"PENDING"})
    #: SLURM's default MaxArraySize, where ``scontrol show config`` does not say
    default_max_array_size = 1001

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
        array_cap: int | None = None,
    ) -> None:
        self.time_limit = None if time_limit is None else format_time_limit(time_limit)
        if gpus_per_worker is not None and gres is not None:
            raise ConfigurationError(
                f"gpus_per_worker={gpus_per_worker!r} with gres={gres!r}: pass a number of "
                "GPUs >= 1, and either gpus_per_worker (it requests --gres=gpu:N) or gres, "
                "not both",
                parameter="gpus_per_worker",
            )
        super().__init__(
            time_limit_seconds=(
                None if self.time_limit is None else time_limit_seconds(self.time_limit)
            ),
            **shared_options(locals()),
        )
        self.partition = partition
        self.mem = None if mem is None else format_mem(mem)
        self.gres = f"gpu:{gpus_per_worker}" if gpus_per_worker is not None else gres
        #: whether squeue prints exit codes (``-O exit_code``); False: scontrol per job end
        self._squeue_exit_codes = True

    # -- submission -----------------------------------------------------------------------
    def _resource_flags(self, spec: WorkerSpec) -> list[str]:
        req = spec.requires
        flags = [f"--cpus-per-task={self.cpus(spec)}"]
        mem_mb = req.get("mem_mb", req.get("mem"))
        mem = format_mem(int(mem_mb)) if mem_mb else self.mem
        if spec.memory is not None and spec.memory != self.memory_request:
            mem = format_mem(self.memory_mb(spec) or 1)  # a grant of the memory ladder
        if mem is not None:
            flags.append(f"--mem={mem}")
        gres = f"gpu:{self.gpus(spec)}" if req.get("gpu") else self.gres
        if gres:
            flags.append(f"--gres={gres}")
        if self.time_limit is not None:
            flags.append(f"--time={self.time_limit}")
        if self.partition:
            flags.append(f"--partition={self.partition}")
        return flags

    def _submission(
        self, name: str, spec: WorkerSpec, indices: list[int] | None, out: str, err: str
    ) -> tuple[list[str], list[str]]:
        lines = [f"#SBATCH --job-name={name}"]
        lines += [f"#SBATCH {flag}" for flag in self._resource_flags(spec)]
        # the server replaces a worker whose job ended; SLURM must not run it a second time
        # (after a failed launch, a node failure or a preemption)
        lines.append("#SBATCH --no-requeue")
        # append, as local workers do: the files hold earlier runs and the driver's
        # separator line (SLURM's default open mode would truncate them)
        lines += [f"#SBATCH --output={out}", f"#SBATCH --error={err}", "#SBATCH --open-mode=append"]
        options = []
        if indices is not None:
            options.append(f"--array={array_ranges(indices)}{self._array_cap_suffix()}")
        return lines, options

    def _file(self, path: str) -> str:
        # SLURM reads ``%`` as the start of a replacement symbol (task directories can
        # hold ``%25``-style escapes)
        return slurm_pattern(path)

    def _array_logs(self, specs: Sequence[WorkerSpec], directory: Path) -> tuple[str, str]:
        # the array indices are the slots: SLURM's own messages for array task n go to
        # worker_<n>.err (the worker's own log) where the logs follow that naming
        in_logs = all(
            spec.out_path is not None
            and spec.err_path is not None
            and Path(spec.out_path).resolve() == directory / f"worker_{spec.slot_index}.out"
            and Path(spec.err_path).resolve() == directory / f"worker_{spec.slot_index}.err"
            for spec in specs
        )
        err_name = "worker_{index}.err" if in_logs else "worker_{index}.slurm.err"
        out_name = "worker_{index}.out" if in_logs else err_name
        return out_name, err_name

    def _submit_argv(self, script: Path, options: list[str]) -> list[str]:
        return ["sbatch", "--parsable", *options, str(script)]

    def _submitted_id(self, stdout: str) -> str | None:
        return stdout.strip().split(";")[0] or None

    def _element_id(self, array_id: str, index: int) -> str:
        return f"{array_id}_{index}"

    def _array_size_limit(self) -> int:
        """SLURM's ``MaxArraySize`` (array indices are below it), read once."""
        if self._max_array_size is None:
            self._max_array_size = self.default_max_array_size
            out = run_command(["scontrol", "show", "config"], "scontrol show config")
            if out is None:
                return self._max_array_size
            m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out.stdout, re.M)
            if m is not None:
                self._max_array_size = int(m[1])
        return self._max_array_size

    def _hopeless(self, job: BatchJob) -> str | None:
        if job.reason not in _HOPELESS_REASONS:
            return None
        return (
            f"Reason={job.reason}; the requested resources "
            f"({' '.join(self._resource_flags(job.spec))}) do not fit the partition"
        )

    def _status_hint(self, job: BatchJob) -> str:
        return f"squeue -j {job.job_id.split('_')[0]}"

    def _limit_text(self) -> str:
        return str(self.time_limit)

    # -- watching -------------------------------------------------------------------------
    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        """One squeue call, however many jobs: an array's tasks are asked for by the
        array's id (``-r`` lists them one per line)."""
        ids = ",".join(dict.fromkeys(j.job_id.split("_")[0] for j in jobs))
        try:
            return self._squeue(ids)
        except _FormatUnsupported:
            # a squeue that cannot print exit codes (or this -O syntax): read them with
            # scontrol once per finished job from now on
            self._squeue_exit_codes = False
            try:
                return self._squeue(ids)
            except _FormatUnsupported:
                return None

    def _squeue(self, ids: str) -> dict[str, Row] | None:
        """job id -> (state, reason, ``code:signal`` or "") for the jobs ``ids`` lists;
        None when squeue failed (nothing is known then). Raises :class:`_FormatUnsupported`
        when squeue rejects the format or prints what it does not parse."""
        if self._squeue_exit_codes:
            fmt = ["-O", _SQUEUE_FIELDS]
        else:
            fmt = ["-o", "%i|%T|%r||"]
        out = run_command(["squeue", "-r", "-h", "-t", "all", "-j", ids, *fmt])
        if out is None:
            return None
        if "format" in out.stderr.lower():
            raise _FormatUnsupported(out.stderr.strip())
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            logger.debug("squeue exited with %d: %s", out.returncode, out.stderr.strip())
            return None
        seen: dict[str, Row] = {}
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
                timeout=COMMAND_TIMEOUT_SECONDS,
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

    def _lookup_gone(self, job: BatchJob) -> bool | None:
        fields = self._scontrol(job.job_id)
        if fields is None:
            return None
        if fields.get("JobState") in _FINISHED_STATES:
            job.state = fields["JobState"]
            job.extra = fields
            return True
        return False

    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        fields = job.extra or self._scontrol(job.job_id) or {}
        code_text, _, signal_text = fields.get("ExitCode", "0:0").partition(":")
        try:
            code, sig = int(code_text), int(signal_text or 0)
        except ValueError:
            code, sig = 0, 0
        state = job.state
        # SLURM's own note of an OOM kill, in this job's part of its log, explains a
        # failure; a clean exit stays clean (a child of the worker may have been killed)
        oom_noted = state == "FAILED" and any(m in system_tail for m in _OOM_MARKERS)
        if oom_noted:
            return Ending(End.OUT_OF_MEMORY, code or None)
        if state in _ENDS:
            return Ending(_ENDS[state], code or None, state)
        if state == "FAILED" and not code and not sig:
            # failed without an exit status: the job's script never ran (a failed launch)
            return Ending(End.NOT_STARTED, None, f"Reason={job.reason or 'unknown'}")
        if state in ("COMPLETED", "FAILED"):
            return Ending(End.EXITED, code if code or not sig else -sig, state)
        return Ending(End.OTHER, code or None, state)

    # -- stopping -------------------------------------------------------------------------
    def _cancel_argvs(self, ids: list[str], hard: bool) -> list[list[str]]:
        if hard:
            return [["scancel", "--full", "--signal=KILL", *ids], ["scancel", *ids]]
        return [["scancel", *ids]]
