"""Grid Engine launcher (Son of Grid Engine, OGS, Univa/Altair GE): every bellis worker is
one ``qsub`` job (or array task).

The Grid Engine dialect of the batch-system core (``_batch``): ``qsub -terse`` with its
options on the command line (``-N``, ``-q``, ``-P``, ``-pe``, ``-l h_vmem=``, ``-l h_rt=``,
``-t`` and ``-tc`` for arrays, ``-o``/``-e``, ``-r n``, ``-V``), one ``qstat -xml`` per poll
for all jobs, ``qacct -j`` for a job that left ``qstat`` (finished jobs are only in the
accounting file), and ``qdel``.

``h_vmem`` is an address-space limit (``setrlimit``), so a worker over it sees a
``MemoryError`` rather than a kill: the job script exports the grant as
``BELLIS_MEMORY_LIMIT``, and the worker reports such a block as out of memory (the memory
ladder then runs it again in a bigger job). A job killed at ``h_rt`` (SIGKILL) or by
``qdel`` is told apart by its wall clock against the limit.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from .._protocol import MEMORY_LIMIT_ENV
from .._sizes import MIB
from ._base import WorkerSpec
from ._batch import BatchJob, BatchLauncher, End, Ending, Row, shared_options
from ._batch_jobs import query_rows, run_command
from ._batch_text import hms, parse_walltime

__all__ = ["SgeLauncher", "parse_qacct", "parse_qstat_xml", "sge_ending"]


#: the state the launcher gives a job it found in the accounting file
DONE = "done"


def _expand_tasks(text: str) -> list[int]:
    """``1,3-5:1`` -> [1, 3, 4, 5]."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if m is None:
            continue
        lo, hi, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        out += range(lo, hi + 1, step)
    return out


def parse_qstat_xml(text: str) -> dict[str, Row]:
    """Rows by job id (``<job>`` or ``<job>.<task>``) from ``qstat -xml``: the state
    (``qw``, ``r``, ``Eqw``, ...), no reason, no exit text. A pending array's ``tasks``
    range is one row per task. Raises ``ValueError`` for text that is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not qstat -xml output: {exc}") from exc
    rows: dict[str, Row] = {}
    for job in root.iter("job_list"):
        number = (job.findtext("JB_job_number") or "").strip()
        state = (job.findtext("state") or "").strip()
        tasks = (job.findtext("tasks") or "").strip()
        if not number:
            continue
        if not tasks:
            rows[number] = (state, "", "")
            continue
        for task in _expand_tasks(tasks):
            rows[f"{number}.{task}"] = (state, "", "")
    return rows


def parse_qacct(text: str, task: int | None) -> dict[str, str] | None:
    """The last accounting record of a job (of its array task ``task``) in ``qacct -j``'s
    output, as its fields; None if there is none."""
    record: dict[str, str] = {}
    found: dict[str, str] | None = None
    for line in [*text.splitlines(), "=" * 10]:
        if line.startswith("=========="):
            if record and (task is None or record.get("taskid") == str(task)):
                found = record
            record = {}
            continue
        key, _, value = line.partition(" ")
        if key:
            record[key] = value.strip()
    return found


def sge_ending(fields: dict[str, str], limit_seconds: int | None) -> Ending:
    """How a finished Grid Engine job ended, from its accounting record."""
    failed_text = fields.get("failed", "0")
    failed = int(failed_text.split(":")[0].strip() or 0) if failed_text else 0
    status_text = fields.get("exit_status", "0").split()[0]
    status = int(status_text) if re.fullmatch(r"-?\d+", status_text) else 0
    words = f"failed={failed_text or 0}, exit_status={status}"
    if 0 < failed < 100 and failed != 37:
        return Ending(End.NOT_STARTED, None, f"qacct: {words}")
    wall = float(re.sub(r"[^\d.]", "", fields.get("ru_wallclock", "0")) or 0)
    if failed == 37 or (status > 128 and limit_seconds is not None and wall >= limit_seconds - 1):
        return Ending(End.TIME_LIMIT, -(status - 128) if status > 128 else None, words)
    if status > 128:
        signal = status - 128
        if signal in (9, 15):
            return Ending(End.CANCELLED, -signal, words)
        return Ending(End.EXITED, -signal, words)
    return Ending(End.EXITED, status, words)


class SgeLauncher(BatchLauncher):
    """Start workers as Grid Engine jobs (``qsub``), one job (or array task) per worker.

    ``queue`` (``-q``), ``project`` (``-P``), ``time_limit`` (``-l h_rt=``; minutes, or
    ``"HH:MM:SS"``), ``mem`` (``-l h_vmem=``, per slot: a worker with several CPUs asks
    ``mem / cpus`` per slot), ``cpus_per_worker`` (``-pe <parallel_environment> N``; the
    environment is site-specific, often ``smp``), ``gpus_per_worker`` (``-l gpu=N``, the
    usual name of the consumable; ``gpu_resource`` renames it). Jobs are not rerunnable
    (``-r n``) and take the submitting environment (``-V``). Arrays (``-t``, ``-tc`` for
    ``array_cap``) cover one contiguous range of slots, numbered from 1. The other parameters
    are those of :class:`~bellis.SlurmLauncher`.
    """

    name = "sge"
    system = "Grid Engine"
    submit_command = "qsub"
    cancel_command = "qdel"
    array_index_env = "SGE_TASK_ID"
    array_first_index = 1
    array_lists = False
    index_token = "$TASK_ID"
    script_suffix = "sge"
    job_lists = "qstat and qacct"
    hard_cancel_options = ("-f",)
    #: SGE's default max_aj_tasks (75000)
    default_max_array_size = 75001
    #: a finished job reaches the accounting file within seconds of leaving qstat
    lost_after_misses = 60

    def __init__(
        self,
        queue: str | None = None,
        project: str | None = None,
        time_limit: int | str | None = None,
        cpus_per_worker: int = 1,
        mem: int | str | None = None,
        gpus_per_worker: int | None = None,
        parallel_environment: str = "smp",
        gpu_resource: str = "gpu",
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
            **shared_options(locals()),
        )
        self.queue = queue
        self.project = project
        self.parallel_environment = parallel_environment
        self.gpu_resource = gpu_resource

    def _resource_options(self, spec: WorkerSpec) -> list[str]:
        options: list[str] = []
        cpus = self.cpus(spec)
        if cpus > 1:
            options += ["-pe", self.parallel_environment, str(cpus)]
        mem_mb = self.memory_mb(spec)
        if mem_mb is not None:
            options += ["-l", f"h_vmem={-(-mem_mb // cpus)}M"]
        if self.limit_seconds is not None:
            options += ["-l", f"h_rt={hms(self.limit_seconds)}"]
        gpus = self.gpus(spec)
        if gpus:
            options += ["-l", f"{self.gpu_resource}={gpus}"]
        if self.queue:
            options += ["-q", self.queue]
        if self.project:
            options += ["-P", self.project]
        return options

    def _worker_lines(self, spec: WorkerSpec, payload: Path) -> list[str]:
        lines = super()._worker_lines(spec, payload)
        mem_mb = self.memory_mb(spec)
        if mem_mb is not None:
            # h_vmem is an address-space limit: a MemoryError under it is out of memory
            lines.append(f"export {MEMORY_LIMIT_ENV}={mem_mb * MIB}")
        return lines

    def _submission(
        self, name: str, spec: WorkerSpec, indices: list[int] | None, out: str, err: str
    ) -> tuple[list[str], list[str]]:
        options = ["-terse", "-N", name, *self._resource_options(spec)]
        if indices is not None:
            options += ["-t", f"{min(indices)}-{max(indices)}"]
            if self.array_cap is not None:
                options += ["-tc", str(self.array_cap)]
        options += ["-o", out, "-e", err, "-j", "n", "-r", "n", "-V", "-S", "/bin/sh"]
        return [], options

    def _submitted_id(self, stdout: str) -> str | None:
        m = re.match(r"\s*(\d+)", stdout)
        return None if m is None else m[1]

    def _element_id(self, array_id: str, index: int) -> str:
        return f"{array_id}.{index}"

    def _status_hint(self, job: BatchJob) -> str:
        return f"qstat -j {job.job_id.split('.')[0]}"

    # -- watching -------------------------------------------------------------------------
    def _is_finished(self, state: str) -> bool:
        return state == DONE

    def _is_pending(self, state: str) -> bool:
        return "w" in state and "r" not in state and "t" not in state

    def _hopeless(self, job: BatchJob) -> str | None:
        if "E" not in job.state:
            return None
        return (
            f"state {job.state} (the job is in error; `qstat -j "
            f"{job.job_id.split('.')[0]}` says why)"
        )

    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        return query_rows(["qstat", "-xml"], parse_qstat_xml, need_success=True)

    def _lookup_gone(self, job: BatchJob) -> bool | None:
        number, _, task = job.job_id.partition(".")
        out = run_command(["qacct", "-j", number])
        if out is None:
            return False
        fields = parse_qacct(out.stdout, int(task) if task else None)
        if fields is None:
            return False  # not in the accounting file yet
        job.state = DONE
        job.extra = fields
        return True

    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        return sge_ending(job.extra, self.limit_seconds)
