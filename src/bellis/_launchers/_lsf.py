"""IBM Spectrum LSF launcher: every bellis worker is one ``bsub`` job (or job array element).

The LSF dialect of the batch-system core (``_batch``): ``bsub`` with its options on the
command line (``-J``, ``-q``, ``-P``, ``-n``, ``-R "rusage[mem=...]"``, ``-M``, ``-W``,
``-gpu``, and ``-o``/``-e`` always, else LSF mails each job's output), one ``bjobs -a -o
"..." -json`` per poll for all jobs, ``bkill``, and LSF's state table (``DONE``/``EXIT``
with the exit reasons ``TERM_MEMLIMIT``, ``TERM_RUNLIMIT``, ``TERM_OWNER``, ...).

Array elements are numbered from 1 (LSF has no index 0): the worker in slot ``n`` is element
``n + 1``, job id ``<array>[<n + 1>]``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from .._sizes import MIB, parse_size
from ..errors import ConfigurationError, WorkerStartError
from ._base import WorkerSpec
from ._batch import BatchJob, BatchLauncher, End, Ending, Row, shared_options
from ._batch_jobs import query_rows
from ._batch_text import array_ranges, parse_walltime

__all__ = ["LsfLauncher", "lsf_ending", "parse_bjobs_json"]


#: ``bjobs -o`` fields, in the order of the JSON keys read
BJOBS_FIELDS = "jobid jobindex stat exit_code exit_reason pend_reason"
#: LSF's exit reasons (``TERM_*``, as ``bjobs`` and the job report print them) by ending
_REASONS: dict[str, End] = {
    "TERM_MEMLIMIT": End.OUT_OF_MEMORY,
    "TERM_SWAP": End.OUT_OF_MEMORY,
    "TERM_RUNLIMIT": End.TIME_LIMIT,
    "TERM_DEADLINE": End.TIME_LIMIT,
    "TERM_CPULIMIT": End.TIME_LIMIT,
    "TERM_OWNER": End.CANCELLED,
    "TERM_ADMIN": End.CANCELLED,
    "TERM_FORCE_OWNER": End.CANCELLED,
    "TERM_FORCE_ADMIN": End.CANCELLED,
    "TERM_REQUEUE_OWNER": End.CANCELLED,
    "TERM_REQUEUE_ADMIN": End.CANCELLED,
    "TERM_PREEMPT": End.PREEMPTED,
    "TERM_HOST": End.NODE_FAIL,
    "TERM_LOAD": End.NODE_FAIL,
    "TERM_UNKNOWN": End.NODE_FAIL,
    "TERM_ZOMBIE": End.NODE_FAIL,
    "TERM_RMS": End.NOT_STARTED,
    "TERM_CWD_NOTEXIST": End.NOT_STARTED,
}
#: what ``bjobs -o exit_reason`` prints for some of them, in words
_REASON_WORDS: tuple[tuple[str, End], ...] = (
    ("memory usage limit", End.OUT_OF_MEMORY),
    ("memlimit", End.OUT_OF_MEMORY),
    ("run time limit", End.TIME_LIMIT),
    ("runlimit", End.TIME_LIMIT),
    ("killed by owner", End.CANCELLED),
    ("killed by the owner", End.CANCELLED),
    ("preempt", End.PREEMPTED),
)


def parse_bjobs_json(text: str) -> dict[str, Row]:
    """Rows by job id (``<id>`` or ``<array>[<index>]``) from ``bjobs -o "jobid jobindex
    stat exit_code exit_reason pend_reason" -json``; a job ``bjobs`` did not find is
    absent. Raises ``ValueError`` for text that is not that JSON."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("RECORDS", []), list):
        raise ValueError(f"not bjobs -json output: {text[:200]!r}")
    rows: dict[str, Row] = {}
    for record in data.get("RECORDS", []):
        if not isinstance(record, dict) or record.get("ERROR") or not record.get("STAT"):
            continue  # "Job <n> is not found"
        job_id = str(record.get("JOBID", ""))
        index = str(record.get("JOBINDEX", "") or "0")
        if "[" not in job_id and index not in ("0", "-", ""):
            job_id = f"{job_id}[{index}]"
        reason = str(record.get("EXIT_REASON", "") or record.get("PEND_REASON", "") or "")
        code = str(record.get("EXIT_CODE", "") or "")
        rows[job_id] = (str(record["STAT"]), reason.strip(), code.strip())
    return rows


def lsf_ending(state: str, reason: str, exit_code: str) -> Ending:
    """How a finished LSF job ended, from its ``STAT``, ``EXIT_REASON`` and ``EXIT_CODE``."""
    if state == "DONE":
        return Ending(End.EXITED, 0, "DONE")
    code = int(exit_code) if re.fullmatch(r"-?\d+", exit_code or "") else None
    term = re.search(r"TERM_[A-Z_]+", reason or "")
    end = _REASONS.get(term[0]) if term else None
    if end is None:
        lowered = (reason or "").lower()
        end = next((e for words, e in _REASON_WORDS if words in lowered), None)
    if end is not None:
        return Ending(end, code, reason)
    if code is None:
        return Ending(End.OTHER, None, f"EXIT {reason}".strip())
    # a shell reports a child killed by signal n as 128 + n
    return Ending(End.EXITED, -(code - 128) if 128 < code < 160 else code, reason)


class LsfLauncher(BatchLauncher):
    """Start workers as IBM Spectrum LSF jobs (``bsub``), one job (or array element) per worker.

    ``queue`` (``-q``), ``project`` (``-P``: sites such as Janelia refuse jobs without one),
    ``time_limit`` (``-W``; minutes, or ``"HH:MM"``), ``cpus_per_worker`` (``-n``, on one
    host), ``mem`` (``-R "rusage[mem=...]"`` and ``-M``, in MB), ``gpus_per_worker``
    (``-gpu "num=N"``). Where a site grants memory by slot and ignores ``-M`` (Janelia:
    about 15 GB a slot), pass ``mem_per_slot="15G"``: a worker then asks for as many slots
    as its memory needs (and no ``-M``), so the memory ladder grows its slots. Every job gets
    ``-o`` and ``-e`` (else LSF mails each job's output). The other parameters are those of
    :class:`~bellis.SlurmLauncher`.
    """

    name = "lsf"
    system = "LSF"
    submit_command = "bsub"
    cancel_command = "bkill"
    array_index_env = "LSB_JOBINDEX"
    array_first_index = 1
    index_token = "%I"
    script_suffix = "lsf"
    job_lists = "bjobs -a"
    finished_states = frozenset({"DONE", "EXIT"})
    pending_states = frozenset({"PEND", "PSUSP", "WAIT"})
    hard_cancel_options = ("-s", "KILL")
    #: LSF's default MAX_JOB_ARRAY_SIZE (1000 elements, indices 1-1000)
    default_max_array_size = 1001

    def __init__(
        self,
        queue: str | None = None,
        project: str | None = None,
        time_limit: int | str | None = None,
        cpus_per_worker: int = 1,
        mem: int | str | None = None,
        mem_per_slot: int | str | None = None,
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
        seconds = None if time_limit is None else parse_walltime(time_limit)
        if seconds is not None:
            seconds = 60 * math.ceil(seconds / 60)  # LSF's -W is whole minutes
        super().__init__(time_limit_seconds=seconds, **shared_options(locals()))
        self.queue = queue
        self.project = project
        self.mem_per_slot = (
            None if mem_per_slot is None else parse_size(mem_per_slot, "mem_per_slot", int_unit=MIB)
        )
        if self.mem_per_slot is not None and self.mem_per_slot < MIB:
            raise ConfigurationError(
                f"mem_per_slot={mem_per_slot!r} is below a megabyte: pass the memory one "
                "LSF slot holds, such as '15G'",
                parameter="mem_per_slot",
            )

    def slots(self, spec: WorkerSpec) -> int:
        """``-n``: the worker's CPUs, or with ``mem_per_slot`` as many slots as its memory needs."""
        cpus = self.cpus(spec)
        mem_mb = self.memory_mb(spec)
        if self.mem_per_slot is None or mem_mb is None:
            return cpus
        return max(cpus, math.ceil(mem_mb * MIB / self.mem_per_slot))

    def _resource_options(self, spec: WorkerSpec) -> list[str]:
        options = ["-n", str(self.slots(spec)), "-R", "span[hosts=1]"]
        mem_mb = self.memory_mb(spec)
        if mem_mb is not None and self.mem_per_slot is None:
            options += ["-R", f"rusage[mem={mem_mb}MB]", "-M", f"{mem_mb}MB"]
        gpus = self.gpus(spec)
        if gpus:
            options += ["-gpu", f"num={gpus}"]
        if self.limit_seconds is not None:
            minutes = self.limit_seconds // 60
            options += ["-W", f"{minutes // 60}:{minutes % 60:02d}"]
        if self.queue:
            options += ["-q", self.queue]
        if self.project:
            options += ["-P", self.project]
        return options

    def _submission(
        self, name: str, spec: WorkerSpec, indices: list[int] | None, out: str, err: str
    ) -> tuple[list[str], list[str]]:
        if indices is not None:
            name = f"{name}[{array_ranges(indices)}]{self._array_cap_suffix()}"
        options = ["-J", name, *self._resource_options(spec), "-o", out, "-e", err]
        return [], options

    def _submit_argv(self, script: Path, options: list[str]) -> list[str]:
        return ["bsub", *options, "/bin/sh", str(script)]

    def _submitted_id(self, stdout: str) -> str | None:
        m = re.search(r"Job <(\d+)> is submitted", stdout)
        return None if m is None else m[1]

    def _submit_error(self, code: int, text: str) -> WorkerStartError:
        message = f"bsub exited with code {code}: {text}"
        if code == 255 and self.project is None:
            message += (
                "\n(this site may require a project for every job: pass "
                "LsfLauncher(project=...), the -P of your bsub lines)"
            )
        # bsub refuses such a request for good (an esub's policy, a bad option): every
        # later start would fail the same way
        return WorkerStartError(message, permanent=code == 255)

    def _element_id(self, array_id: str, index: int) -> str:
        return f"{array_id}[{index}]"

    def _status_hint(self, job: BatchJob) -> str:
        return f"bjobs -l {job.job_id.split('[')[0]}"

    # -- watching -------------------------------------------------------------------------
    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        ids = list(dict.fromkeys(j.job_id.split("[")[0] for j in jobs))
        return query_rows(["bjobs", "-a", "-o", BJOBS_FIELDS, "-json", *ids], parse_bjobs_json)

    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        return lsf_ending(job.state, job.reason, job.extra.get("ExitCode", ""))
