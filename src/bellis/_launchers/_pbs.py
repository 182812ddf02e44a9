"""PBS Professional / OpenPBS launcher: every bellis worker is one ``qsub`` job (or subjob).

The PBS dialect of the batch-system core (``_batch``): ``qsub`` with its options on the
command line (``-N``, ``-q``, ``-A``, ``-l select=1:ncpus=..:mem=..[:ngpus=..]``, ``-l
walltime=``, ``-J`` for arrays, ``-o``/``-e``, ``-r n``, ``-V``), one ``qstat -x -f -F json
-t`` per poll for all jobs (finished ones included), ``qdel``, and PBS's exit statuses:
0-255 the script's exit code, 256 + n killed by signal n (271: SIGTERM, from ``qdel`` or a
limit), and the negative ``JOB_EXEC_*`` codes (-27 memory, -29 walltime, ...). A kill at a
limit is told from a ``qdel`` by the line MoM writes to the job's error file
(``=>> PBS: job killed: walltime 65 exceeded limit 60``).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._base import WorkerSpec
from ._batch import COMMAND_TIMEOUT_SECONDS, BatchJob, BatchLauncher, End, Ending, Row
from ._batch_text import hms, parse_walltime

__all__ = ["PbsLauncher", "parse_qstat_json", "pbs_ending"]

logger = logging.getLogger("bellis")

_PENDING = frozenset({"Q", "H", "W", "T", "M"})
_FINISHED = frozenset({"F", "X"})
#: the negative exit statuses PBS sets itself (``JOB_EXEC_*``), by ending
_EXEC_CODES: dict[int, tuple[End, str]] = {
    -1: (End.NOT_STARTED, "JOB_EXEC_FAIL1: the job could not be started"),
    -2: (End.NOT_STARTED, "JOB_EXEC_FAIL2: the job could not be started"),
    -3: (End.NOT_STARTED, "JOB_EXEC_RETRY: the job could not be started"),
    -4: (End.NOT_STARTED, "JOB_EXEC_INITABT: the job was aborted on MoM initialization"),
    -8: (End.NOT_STARTED, "JOB_EXEC_FAILUID: the user has no account on the node"),
    -10: (End.NOT_STARTED, "JOB_EXEC_FAIL_PASSWORD"),
    -13: (End.NOT_STARTED, "JOB_EXEC_FAILHOOK_RERUN: a hook refused the job"),
    -14: (End.NOT_STARTED, "JOB_EXEC_FAILHOOK_DELETE: a hook refused the job"),
    -15: (End.NODE_FAIL, "JOB_EXEC_HOOK_RERUN"),
    -16: (End.NODE_FAIL, "JOB_EXEC_HOOK_DELETE"),
    -20: (End.NODE_FAIL, "JOB_EXEC_RERUN_ON_SIS_FAIL: a sister node failed"),
    -24: (End.OTHER, "JOB_EXEC_KILL_NCPUS_BURST: killed for using more CPUs than requested"),
    -25: (End.OTHER, "JOB_EXEC_KILL_NCPUS_SUM: killed for using more CPUs than requested"),
    -26: (End.OUT_OF_MEMORY, "JOB_EXEC_KILL_VMEM"),
    -27: (End.OUT_OF_MEMORY, "JOB_EXEC_KILL_MEM"),
    -28: (End.TIME_LIMIT, "JOB_EXEC_KILL_CPUT"),
    -29: (End.TIME_LIMIT, "JOB_EXEC_KILL_WALLTIME"),
}
#: MoM's note of a limit kill in the job's error file
_KILLED = re.compile(r"PBS: job killed: (\w+)")


def parse_qstat_json(text: str) -> dict[str, Row]:
    """Rows by job id from ``qstat -x -f -F json -t``: state, comment and ``Exit_status``
    (empty while there is none). An array's own entry (``<n>[].<server>``) is left out,
    its subjobs (``<n>[<i>].<server>``) are in. Raises ``ValueError`` for other text."""
    data = json.loads(text) if text.strip() else {"Jobs": {}}
    jobs = data.get("Jobs", {}) if isinstance(data, dict) else None
    if not isinstance(jobs, dict):
        raise ValueError(f"not qstat -F json output: {text[:200]!r}")
    rows: dict[str, Row] = {}
    for job_id, attrs in jobs.items():
        if "[]" in job_id or not isinstance(attrs, dict):
            continue
        status = attrs.get("Exit_status")
        rows[job_id] = (
            str(attrs.get("job_state", "")),
            str(attrs.get("comment", "")),
            "" if status is None else str(status),
        )
    return rows


def pbs_ending(exit_status: str, error_tail: str) -> Ending:
    """How a finished PBS job ended, from its ``Exit_status`` and the end of its error file."""
    if not re.fullmatch(r"-?\d+", exit_status or ""):
        # finished without an exit status: deleted before it ran
        return Ending(End.CANCELLED, None, "deleted before it started")
    status = int(exit_status)
    if status < 0:
        end, words = _EXEC_CODES.get(status, (End.OTHER, f"JOB_EXEC code {status}"))
        return Ending(end, None, f"Exit_status={status} ({words})")
    if status < 256:
        return Ending(End.EXITED, status, f"Exit_status={status}")
    signal = status - 256
    killed = _KILLED.findall(error_tail)
    if killed:
        what = killed[-1].lower()
        if what in ("mem", "vmem", "pmem", "pvmem"):
            return Ending(End.OUT_OF_MEMORY, -signal, f"Exit_status={status} ({what} limit)")
        if what in ("walltime", "cput"):
            return Ending(End.TIME_LIMIT, -signal, f"Exit_status={status} ({what} limit)")
    if signal in (9, 15):
        return Ending(End.CANCELLED, -signal, f"Exit_status={status}")
    return Ending(End.EXITED, -signal, f"Exit_status={status}")


class PbsLauncher(BatchLauncher):
    """Start workers as PBS Professional / OpenPBS jobs (``qsub``), one job (or subjob) each.

    ``queue`` (``-q``), ``account`` (``-A``), ``time_limit`` (``-l walltime=``; minutes, or
    ``"HH:MM:SS"``), ``cpus_per_worker``, ``mem`` and ``gpus_per_worker`` (one chunk: ``-l
    select=1:ncpus=N:mem=Mmb:ngpus=G``). Jobs are not rerunnable (``-r n``) and take the
    submitting environment (``-V``). The other parameters are those of
    :class:`~bellis.SlurmLauncher`; arrays (``-J``) cover one contiguous range of slots.
    """

    name = "pbs"
    system = "PBS"
    submit_command = "qsub"
    cancel_command = "qdel"
    array_index_env = "PBS_ARRAY_INDEX"
    array_first_index = 0
    array_lists = False
    index_token = "^array_index^"
    script_suffix = "pbs"
    job_lists = "qstat -x"
    #: PBS's default max_array_size (10000 subjobs)
    default_max_array_size = 10000

    def __init__(
        self,
        queue: str | None = None,
        account: str | None = None,
        time_limit: int | str | None = None,
        cpus_per_worker: int = 1,
        mem: int | str | None = None,
        gpus_per_worker: int | None = None,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
        job_name_prefix: str = "bellis",
        poll_interval: float = 1.0,
        array_threshold: int = 4,
        array_cap: int | None = None,
        pending_warning: float = 300.0,
        walltime_margin: float | None = None,
        walltime_aware: bool = True,
        memory_growth: float | None = None,
        max_memory: int | str | None = None,
    ) -> None:
        super().__init__(
            time_limit_seconds=None if time_limit is None else parse_walltime(time_limit),
            walltime_margin=walltime_margin,
            walltime_aware=walltime_aware,
            cpus_per_worker=cpus_per_worker,
            mem=mem,
            memory_growth=memory_growth,
            max_memory=max_memory,
            gpus_per_worker=gpus_per_worker,
            extra_args=extra_args,
            python=python,
            job_name_prefix=job_name_prefix,
            poll_interval=poll_interval,
            array_threshold=array_threshold,
            array_cap=array_cap,
            pending_warning=pending_warning,
        )
        self.queue = queue
        self.account = account

    def select(self, spec: WorkerSpec) -> str:
        """The job's one chunk: ``1:ncpus=N[:mem=Mmb][:ngpus=G]``."""
        chunk = f"1:ncpus={self.cpus(spec)}"
        mem_mb = self.memory_mb(spec)
        if mem_mb is not None:
            chunk += f":mem={mem_mb}mb"
        gpus = self.gpus(spec)
        if gpus:
            chunk += f":ngpus={gpus}"
        return chunk

    def _submission(
        self, name: str, spec: WorkerSpec, indices: list[int] | None, out: str, err: str
    ) -> tuple[list[str], list[str]]:
        options = ["-N", name, "-l", f"select={self.select(spec)}"]
        if self.limit_seconds is not None:
            options += ["-l", f"walltime={hms(self.limit_seconds)}"]
        if self.queue:
            options += ["-q", self.queue]
        if self.account:
            options += ["-A", self.account]
        if indices is not None:
            cap = "" if self.array_cap is None else f"%{self.array_cap}"
            options += ["-J", f"{min(indices)}-{max(indices)}{cap}"]
        options += ["-o", out, "-e", err, "-j", "n", "-r", "n", "-V"]
        return [], options

    def _submit_argv(self, script: Path, options: list[str]) -> list[str]:
        return ["qsub", *options, str(script)]

    def _submitted_id(self, stdout: str) -> str | None:
        lines = stdout.strip().splitlines()
        return lines[-1].strip() if lines else None

    def _element_id(self, array_id: str, index: int) -> str:
        return array_id.replace("[]", f"[{index}]", 1)

    def _status_hint(self, job: BatchJob) -> str:
        return f"qstat -x -f {job.job_id}"

    # -- watching -------------------------------------------------------------------------
    def _is_finished(self, state: str) -> bool:
        return state in _FINISHED

    def _is_pending(self, state: str) -> bool:
        return state in _PENDING

    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        ids = list(dict.fromkeys(re.sub(r"\[\d+\]", "[]", j.job_id) for j in jobs))
        try:
            out = subprocess.run(
                ["qstat", "-x", "-f", "-F", "json", "-t", *ids],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.debug("qstat failed: %s", exc)
            return None
        try:
            return parse_qstat_json(out.stdout)
        except ValueError as exc:
            logger.debug("qstat exited with %d: %s %s", out.returncode, exc, out.stderr.strip())
            return None

    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        return pbs_ending(job.extra.get("ExitCode", ""), system_tail)

    def _cancel_argvs(self, ids: list[str], hard: bool) -> list[list[str]]:
        return [["qdel", "-W", "force", *ids]] if hard else [["qdel", *ids]]
