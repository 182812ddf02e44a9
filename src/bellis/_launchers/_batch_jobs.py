"""What the batch core (``_batch``) and its dialects know of one job: how it ended
(:class:`End`, :class:`Ending`) and what that means for its worker (:func:`ending_exit`),
what a status query says of it (:data:`Row`), the launcher's record of it
(:class:`BatchJob`), and how a status command runs (:func:`run_command`: the output as
text, a timeout, a failure logged rather than raised; :func:`query_rows`: its rows).
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from .._protocol import OOM_PREFIX, ExitKind
from ._base import WorkerExit, WorkerSpec, describe_exit

__all__ = [
    "COMMAND_TIMEOUT_SECONDS",
    "BatchJob",
    "End",
    "Ending",
    "Row",
    "ending_exit",
    "query_rows",
    "run_command",
]

logger = logging.getLogger("bellis")

#: how long a submit, status or cancel command may take
COMMAND_TIMEOUT_SECONDS = 30.0


class End(StrEnum):
    """How a batch job ended, in bellis's words (each dialect maps its states to these)."""

    #: the job's script ran and exited: its exit code (or signal) tells the rest
    EXITED = "exited"
    OUT_OF_MEMORY = "out_of_memory"
    TIME_LIMIT = "time_limit"
    NODE_FAIL = "node_fail"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    #: the system could not start the job's script
    NOT_STARTED = "not_started"
    #: a state the table does not know
    OTHER = "other"


@dataclass(frozen=True)
class Ending:
    """A finished job: how it ended, its exit code (negative: killed by that signal; None:
    none known) and the system's own words for it (a state, an exit reason)."""

    end: End
    code: int | None = None
    detail: str = ""


#: one job as a status query saw it: state, reason (why pending, why ended), exit text
Row = tuple[str, str, str]


@dataclass
class BatchJob:
    """What the launcher knows about one submitted worker job."""

    job_id: str
    spec: WorkerSpec
    job_name: str
    #: the file the batch system writes its own messages for this job to (None: none)
    system_err: Path | None
    payload_path: Path
    #: where this job's own part of ``system_err`` starts (a log is appended to)
    system_err_offset: int = 0
    state: str = "PENDING"
    reason: str = ""
    exit: WorkerExit | None = None
    missing_count: int = 0
    #: the dialect's fields of a finished job (an exit code, an exit reason)
    extra: dict[str, str] = field(default_factory=dict)
    submitted_at: float = field(default_factory=time.monotonic)
    #: when a long pending wait is next reported
    warn_pending_at: float = 0.0
    #: the array task index (None: a job of its own)
    index: int | None = None
    #: the job script of the array this task belongs to (None: a job of its own)
    array_script: Path | None = None


def run_command(
    argv: list[str], what: str | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run a status command with its output as text; None (logged at DEBUG, as ``what``
    or the command's name) where it could not run or ran past the command timeout."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("%s failed: %s", what or argv[0], exc)
        return None


def query_rows(
    argv: list[str], parse: Callable[[str], dict[str, Row]], *, need_success: bool = False
) -> dict[str, Row] | None:
    """Rows by job id from the status command ``argv``'s output, read by ``parse`` (which
    raises ``ValueError`` for what it cannot read); None when the command failed (with
    ``need_success``, also when it exited with other than 0), logged at DEBUG."""
    out = run_command(argv)
    if out is None:
        return None
    if need_success and out.returncode != 0:
        logger.debug("%s exited with %d: %s", argv[0], out.returncode, out.stderr.strip())
        return None
    try:
        return parse(out.stdout)
    except ValueError as exc:
        logger.debug("%s exited with %d: %s %s", argv[0], out.returncode, exc, out.stderr.strip())
        return None


def ending_exit(
    ending: Ending,
    job: BatchJob,
    system_tail: str,
    *,
    system: str,
    cancel_command: str,
    walltime: str | None,
) -> WorkerExit:
    """The exit of ``job``'s worker, a ``system`` job that ended as ``ending``;
    ``system_tail`` is the end of its part of the system's error file, ``walltime`` the
    limit its worker watched (``time_limit=..., walltime_margin=... s``; None: none). A
    clean exit is the worker's own: the launcher tells a walltime leave from it."""
    where = f"{system} job {job.job_id} ({job.job_name})"
    kind = ExitKind.ERROR  # every exit below but a clean (or walltime) one
    end, code = ending.end, ending.code
    if end == End.OUT_OF_MEMORY:
        return WorkerExit(
            kind,
            code or -9,
            f"out of memory: {where} exceeded its memory limit; raise mem=\n{system_tail}",
        )
    if end == End.TIME_LIMIT:
        if walltime is None:
            return WorkerExit(kind, None, f"{where}: job exceeded its {system} time limit")
        # its worker takes no block it expects to outlast the job: the block it ran
        # alone outlasted what was left of the limit
        return WorkerExit(
            kind,
            None,
            f"{where}: a block ran longer than the job time limit allowed ({walltime}): "
            f"{system} stopped the job at its limit; raise time_limit= above the longest "
            "block's wall, or make the blocks smaller",
        )
    if end == End.CANCELLED:
        return WorkerExit(kind, None, f"{where} was cancelled ({cancel_command} or preemption)")
    if end == End.PREEMPTED:
        return WorkerExit(kind, None, f"{where} was preempted by {system}")
    if end == End.NOT_STARTED:
        return WorkerExit(
            kind, None, f"{where} failed to start ({ending.detail or 'reason unknown'})"
        )
    if end == End.EXITED and code is not None:
        result = describe_exit(code, job.spec)
        if result.kind == ExitKind.CLEAN:
            return result
        if result.message.startswith(OOM_PREFIX):
            # a MemoryError under an address-space limit: still out of memory
            rest = result.message[len(OOM_PREFIX) :].lstrip(": ")
            return WorkerExit(result.kind, result.code, f"{OOM_PREFIX}: {where}: {rest}")
        return WorkerExit(result.kind, result.code, f"{where}: {result.message}")
    return WorkerExit(kind, code, f"{where} ended in state {ending.detail or job.state}")
