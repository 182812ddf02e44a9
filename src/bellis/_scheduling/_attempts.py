"""One failed block attempt as an error record (``errors.jsonl``), sans I/O.

:func:`attempt_record` builds the record the dispatcher hands its error collector for
every failed attempt: the block (id, block-grid index, tracking-grid cell), the attempt
number, the failure kind, the error text and what the worker said about it (its details:
host, pid, job, log offsets, exception type, message, innermost frame, traceback; see
``bellis._worker._failure``), the worker id and, for a worker that said nothing (an older
worker, a lost one, the server's own timeout), the log files the run gave its slot. The
collector stamps the time and writes it (``bellis._stats._errorlog``). Failure paths only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from .._protocol import parse_setup_report
from ..errors import ProtocolError

if TYPE_CHECKING:
    from .._stats._errorgroups import ErrorCollector
    from ._records import Peer
    from ._task_run import TaskRun

__all__ = [
    "KIND_LOST",
    "KIND_OOM",
    "KIND_RAISED",
    "KIND_SETUP",
    "KIND_SETUP_TIMEOUT",
    "KIND_STALLED",
    "KIND_STATUS",
    "KIND_TIMEOUT",
    "attempt_record",
    "block_coord",
    "record_error",
    "setup_record",
    "setup_reported",
    "setup_timed_out",
    "text_key",
]

logger = logging.getLogger("bellis")

KIND_RAISED: Final = "raised"
KIND_STATUS: Final = "status FAILED"
KIND_TIMEOUT: Final = "timeout"
KIND_STALLED: Final = "stalled"
KIND_OOM: Final = "out of memory"
KIND_LOST: Final = "lost worker"
KIND_ERROR: Final = "error"
#: ``Task(setup=...)`` raised in a worker (or in serial mode): a record that names no block
KIND_SETUP: Final = "setup failed"
#: a worker's setup outlived the task's ``timeout`` and the server killed the worker
KIND_SETUP_TIMEOUT: Final = "setup timed out"


def _summary_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return text.strip()


def block_coord(run: TaskRun, k: int) -> list[int]:
    """Block ``k``'s cell in the tracking grid (the coordinate ``bellis status --block``
    and :meth:`TaskReport.block` take), or its block-grid index without a store."""
    grid = [int(c) for c in run.geom.coords_of(k)]
    if run.store is not None and run.cell_shift:
        return [c + s for c, s in zip(grid, run.cell_shift, strict=True)]
    return grid


def attempt_record(
    peer: Peer | None,
    run: TaskRun,
    k: int,
    text: str,
    kind: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of block ``k``'s failed attempt (see the module docstring). ``kind``
    None: ``raised`` when the worker named an exception, else ``status FAILED`` or
    ``error``."""
    geom = run.geom
    grid = [int(c) for c in geom.coords_of(k)]
    coord = grid
    if run.store is not None and run.cell_shift:
        coord = [c + s for c, s in zip(grid, run.cell_shift, strict=True)]
    d = details or {}
    sid = geom.spatial_id_of(k)
    prefix = f"block {run.task_id}/{sid} "
    # the block is in the record: one error message for every block it hits
    summary = _summary_line(text)
    if summary.startswith(prefix):
        summary = summary[len(prefix) :]
    if kind is None:
        if d.get("type"):
            kind = KIND_RAISED
        elif text.startswith("block status set to FAILED"):
            kind = KIND_STATUS
        else:
            kind = KIND_ERROR
    rec: dict[str, Any] = {
        "task": run.task_id,
        "block": sid,
        "coord": coord,
        "grid": grid,
        "attempt": run.retries.get(k, 0) + 1,
        "kind": kind,
        "type": d.get("type"),
        "message": d.get("message") if d.get("message") is not None else summary,
        "where": d.get("where"),
        "traceback": d.get("traceback") or text,
    }
    worker = None if peer is None else peer.worker
    rec["worker"] = None if worker is None else peer.worker_id  # type: ignore[union-attr]
    rec["host"] = d.get("host") or (None if peer is None else str(peer.addr[0]))
    for key in ("pid", "job", "log", "log_offset", "out_log", "out_offset"):
        if d.get(key) is not None:
            rec[key] = d[key]
    files = None if worker is None else getattr(worker.timeline, "log_files", None)
    if files:
        rec.setdefault("out_log", files[0])
        rec.setdefault("log", files[1])
    return rec


def record_error(
    errors: ErrorCollector,
    peer: Peer,
    run: TaskRun,
    k: int,
    text: str,
    kind: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Block ``k`` failed with ``text``: kept for the summary, logged, and one error
    record (``kind``, the worker's ``details``), into ``errors`` (the run's
    :class:`~bellis._stats._errorgroups.ErrorCollector`)."""
    if run.first_worker_error is None:
        run.first_worker_error = text
    run.last_worker_error = text
    sid = run.geom.spatial_id_of(k)
    log = peer.worker.log if peer.worker is not None else None
    group = errors.add(run.task_id, sid, text, log, index=k, coord=block_coord(run, k))
    if kind is None and details is None and group.repeat_text == text:
        # a run whose blocks keep failing the same way: this error's full records are
        # written, and this attempt is only counted (``ErrorCount.again``, inline)
        count = group.repeat_count
        assert count is not None  # set together with repeat_text
        n = count.count = count.count + 1
        if not n & (n - 1):  # a power of two: its count line
            count.write_line()
    # a server-side kind (timeout, lost, out of memory) is rare: always recorded
    elif kind is not None or not errors.counted(run.task_id, text, details, group):
        errors.record(
            attempt_record(peer, run, k, text, kind, details),
            text_key(run.task_id, text, kind, details),
            group,
        )
    logger.warning("block failed block_id=%s/%d error=%s", run.task_id, sid, text)


def text_key(
    task_id: str, text: str, kind: str | None, details: dict[str, Any] | None
) -> str | None:
    """``text`` where an attempt's distinct error is a function of its error text alone,
    so that the error log may find the error by it (``ErrorLog.add``); else None. So it
    is without a server-side ``kind`` and without details that name the error, and when
    the text's last line names no block of ``task_id``, whose prefix the record would
    strip (see :func:`attempt_record`)."""
    if kind is not None:
        return None
    if details is not None and (
        details.get("type") or details.get("message") is not None or details.get("where")
    ):
        return None
    if _summary_line(text).startswith(f"block {task_id}/"):
        return None
    return text


def setup_record(
    peer: Peer | None,
    run: TaskRun,
    text: str,
    details: dict[str, Any] | None,
    kind: str = KIND_SETUP,
) -> dict[str, Any]:
    """The record of a setup that raised (``Task(setup=...)``, kind :data:`KIND_SETUP`)
    or outlived the task's timeout (:data:`KIND_SETUP_TIMEOUT`): as a block's, but it
    names no block (``block`` -1, no coordinate) and its attempt is the worker's start."""
    d = details or {}
    rec: dict[str, Any] = {
        "task": run.task_id,
        "block": -1,
        "coord": [],
        "grid": [],
        "attempt": run.worker_starts,
        "kind": kind,
        "type": d.get("type"),
        "message": d.get("message") if d.get("message") is not None else _summary_line(text),
        "where": d.get("where"),
        "traceback": d.get("traceback") or text,
    }
    worker = None if peer is None else peer.worker
    rec["worker"] = None if peer is None or worker is None else peer.worker_id
    rec["host"] = d.get("host") or (None if peer is None else str(peer.addr[0]))
    for key in ("pid", "job", "log", "log_offset", "out_log", "out_offset"):
        if d.get(key) is not None:
            rec[key] = d[key]
    files = None if worker is None else getattr(worker.timeline, "log_files", None)
    if files:
        rec.setdefault("out_log", files[0])
        rec.setdefault("log", files[1])
    return rec


def setup_reported(peer: Peer, msg: list[Any], now: float, errors: Any) -> None:
    """A SETUP from ``peer`` (the dispatcher's): the task's setup ran in its worker (how
    long goes on the worker's timeline), or raised: an error record of kind
    :data:`KIND_SETUP` for ``errors`` (the run's ``ErrorCollector``), which names no block,
    and the worker's error text; that worker then leaves, and its exit is charged to the
    restart budget (``_staffing``). :class:`ProtocolError` for a malformed or late one."""
    if peer.held or peer.parked:
        raise ProtocolError("sent its setup report after it asked for blocks")
    peer.setup_due = None  # it reported in time: the server's setup deadline is off
    seconds, error = parse_setup_report(msg)
    run = peer.run
    assert run is not None
    worker = peer.worker
    if worker is not None:
        worker.timeline.task_setup_done(seconds, now)
    if error is None:
        return
    text, details = error
    if run.first_worker_error is None:
        run.first_worker_error = text
    run.last_worker_error = text
    if worker is not None:
        worker.setup_error = text
    errors.record(setup_record(peer, run, text, details))
    logger.warning("%s", text.splitlines()[0])


def setup_timed_out(peer: Peer, now: float, errors: Any) -> str:
    """``peer``'s worker ran its task's setup past the task's ``timeout`` (no SETUP came):
    an error record of kind :data:`KIND_SETUP_TIMEOUT` for ``errors``, which names no
    block, and the text the worker's exit is charged with (the caller kills the worker;
    its start is then spent, as after a block timeout). Returns that text."""
    run = peer.run
    assert run is not None
    peer.setup_due = None
    limit = run.spec.timeout_secs
    text = (
        f"setup of task '{run.task_id}' timed out in worker {peer.worker_id}: Task(setup=...) "
        f"ran longer than the task's timeout ({limit:g}s) before any block; the worker was "
        "killed. Pass Task(timeout=...) to give a slow setup longer, or give what it waits "
        "on a timeout of its own"
    )
    if run.first_worker_error is None:
        run.first_worker_error = text
    run.last_worker_error = text
    worker = peer.worker
    if worker is not None:
        worker.setup_error = text
        worker.timeline.task_setup_done(limit, now)
    details = {"message": f"timed out after {limit:g}s (Task(timeout={limit:g}))"}
    errors.record(setup_record(peer, run, text, details, KIND_SETUP_TIMEOUT))
    logger.warning("%s", text)
    return text
