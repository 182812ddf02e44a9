"""PBS Professional / OpenPBS launcher: every bellis worker is one ``qsub`` job (or subjob).

The PBS dialect of the batch-system core (``_batch``): ``qsub`` with its options on the
command line (``-N``, ``-q``, ``-A``, ``-l select=1:ncpus=..:mem=..[:ngpus=..]``, ``-l
walltime=``, ``-J`` for arrays, ``-o``/``-e``, ``-r n``, ``-V``), one ``qstat -x -f -F json
-t`` per poll for all jobs (finished ones included), ``qdel``, and PBS's exit statuses:
0-255 the script's exit code, 256 + n killed by signal n (271: SIGTERM, from ``qdel`` or a
limit), and the negative ``JOB_EXEC_*`` codes (-27 memory, -29 walltime, ...). A kill at a
limit is told from a ``qdel`` by the line MoM writes to the job's error file
(``=>> PBS: job killed: walltime 65 exceeded limit 60``).

PBS keeps finished jobs for ``qstat -x`` only where the server's ``job_history_enable`` is
True, and its default is False: there a job leaves ``qstat`` when it ends, with its
``Exit_status``. So the job script does not ``exec`` the worker: it waits for it and writes
its exit code to ``worker_<slot>.<job number>.exit`` next to the payload (then ends the
way the worker did, a signal included). A job gone from ``qstat -x`` (or a subjob shown
finished without an ``Exit_status``) ends as that file and MoM's note in the job's error
file say: a kill at the memory or walltime limit still reaches the memory ladder. A job
that left neither (deleted before it ran, its node lost) is reported lost.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ._base import WorkerSpec, _stderr_tail
from ._batch import BatchJob, BatchLauncher, End, Ending, Row, shared_options
from ._batch_jobs import query_rows
from ._batch_text import hms, parse_walltime

__all__ = ["PbsLauncher", "parse_qstat_json", "pbs_ending"]

logger = logging.getLogger("bellis")

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


def pbs_ending(exit_status: str, error_tail: str, script_exit: str = "") -> Ending:
    """How a finished PBS job ended, from its ``Exit_status`` and the end of its error file;
    without an ``Exit_status`` (a server that keeps no job history), from the exit code
    its job script wrote (``script_exit``, as ``$?``: 128 + n for a signal) or MoM's note."""
    if re.fullmatch(r"-?\d+", exit_status or ""):
        status = int(exit_status)
    elif re.fullmatch(r"\d+", script_exit or ""):
        code = int(script_exit)
        status = 256 + code - 128 if 128 < code < 160 else code
    else:
        killed = _KILLED.findall(error_tail)
        what = killed[-1].lower() if killed else ""
        if what in ("mem", "vmem", "pmem", "pvmem"):
            return Ending(End.OUT_OF_MEMORY, -9, f"killed at its {what} limit (no Exit_status)")
        if what in ("walltime", "cput"):
            return Ending(End.TIME_LIMIT, -9, f"killed at its {what} limit (no Exit_status)")
        # finished without an exit status: deleted before it ran
        return Ending(End.CANCELLED, None, "deleted before it started")
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
    finished_states = frozenset({"F", "X"})
    pending_states = frozenset({"Q", "H", "W", "T", "M"})
    hard_cancel_options = ("-W", "force")
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
            **shared_options(locals()),
        )
        self.queue = queue
        self.account = account
        #: whether a job was seen to leave ``qstat -x`` (the server keeps no job history)
        self.history_off = False

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
            options += ["-J", f"{min(indices)}-{max(indices)}{self._array_cap_suffix()}"]
        options += ["-o", out, "-e", err, "-j", "n", "-r", "n", "-V"]
        return [], options

    def _exec_line(self) -> str:
        """Run the worker and write its exit code where the launcher finds it when the
        server keeps no history; then end as it did (256 + n in ``Exit_status`` for a
        signal, as if the worker were the job's top process). A ``TERM`` from ``qdel`` or
        a limit goes to the whole job: the shell waits for the worker's own answer to it."""
        return "\n".join(
            [
                "trap : TERM",
                f"{shlex.quote(self.python)} -m bellis._worker._main",
                "code=$?",
                'exit_file="${BELLIS_PAYLOAD_FILE%.payload}.${PBS_JOBID%%.*}.exit"',
                'echo "$code" >"$exit_file.tmp" && mv -f "$exit_file.tmp" "$exit_file"',
                "trap - TERM",
                'if [ "$code" -gt 128 ] && [ "$code" -lt 160 ]; then kill -$((code - 128)) $$; fi',
                'exit "$code"',
            ]
        )

    @staticmethod
    def exit_file(job: BatchJob) -> Path:
        """Where ``job``'s script writes its worker's exit code."""
        number = job.job_id.split(".")[0]
        return job.payload_path.with_name(f"{job.payload_path.stem}.{number}.exit")

    def _script_exit(self, job: BatchJob) -> str:
        """The exit code ``job``'s script wrote ("" if none yet); the file is read once."""
        if "ScriptExit" not in job.extra:
            path = self.exit_file(job)
            try:
                text = path.read_text().strip()
            except OSError:
                return ""
            job.extra["ScriptExit"] = text
            path.unlink(missing_ok=True)
        return job.extra["ScriptExit"]

    def _lookup_gone(self, job: BatchJob) -> bool | None:
        """A job gone from ``qstat -x``: the server keeps no job history. Its end is what
        its exit file or MoM's note in its error file says (False: neither, yet)."""
        if not self.history_off:
            self.history_off = True
            logger.warning(
                "PBS job %s ended and left `qstat -x`: this PBS server keeps no job history "
                "(job_history_enable=False, its default). bellis reads how jobs ended from "
                "the exit files their scripts write and MoM's notes in their error files; "
                "a job that left neither is reported lost. Ask the administrators to set "
                "job_history_enable=True for PBS's own exit statuses",
                job.job_id,
            )
        tail = _stderr_tail(job.system_err, lines=20, start=job.system_err_offset)
        if not self._script_exit(job) and not _KILLED.search(tail):
            return False
        job.state = "F"
        return True

    def _lost_message(self, job: BatchJob) -> str:
        return (
            f"job lost: PBS job {job.job_id} ({job.job_name}) left qstat -x with no exit "
            "status (the server keeps no job history: job_history_enable=False, or the "
            f"job's expired), wrote no exit file ({self.exit_file(job).name}) and has no "
            "MoM note in its error file: deleted before it ran, or its node failed"
        )

    def close(self) -> None:
        super().close()
        for job in self._jobs.values():
            if job.exit is not None:
                self.exit_file(job).unlink(missing_ok=True)

    def _submitted_id(self, stdout: str) -> str | None:
        lines = stdout.strip().splitlines()
        return lines[-1].strip() if lines else None

    def _element_id(self, array_id: str, index: int) -> str:
        return array_id.replace("[]", f"[{index}]", 1)

    def _status_hint(self, job: BatchJob) -> str:
        return f"qstat -x -f {job.job_id}"

    # -- watching -------------------------------------------------------------------------
    def _query_rows(self, jobs: list[BatchJob]) -> dict[str, Row] | None:
        ids = list(dict.fromkeys(re.sub(r"\[\d+\]", "[]", j.job_id) for j in jobs))
        return query_rows(["qstat", "-x", "-f", "-F", "json", "-t", *ids], parse_qstat_json)

    def _ending(self, job: BatchJob, system_tail: str) -> Ending:
        status = job.extra.get("ExitCode", "")
        return pbs_ending(status, system_tail, "" if status else self._script_exit(job))
