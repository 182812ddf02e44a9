"""A block or a batch lost to its deadline: the dispatcher's timeout path.

:func:`time_out_block` accounts one block as timed out or stalled (the worker's watchdog
said so, or the backstop found it), records the error, releases the block to the retry
path and stops its worker; :func:`reclaim` is the backstop for a connection whose blocks
outlived their deadline and the watchdog's margin (``Dispatcher.expire``): one block is
timed out, a whole batch runs again one block at a time, a straggler's copy is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from .._protocol import ExitKind
from ._backups import drop_lost
from ._ports import DispatcherPort
from ._records import Peer
from ._task_run import TaskRun

__all__ = ["reclaim", "time_out_block"]

logger = logging.getLogger("bellis")


def time_out_block(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    k: int,
    sent: float,
    returned: float,
    now: float,
    *,
    stalled: bool = False,
    details: dict[str, Any] | None = None,
) -> None:
    """Account one block as timed out, or ``stalled`` (reclaimed), and release it to
    the retry path; ``details``: what the worker's watchdog said (:mod:`._attempts`)."""
    sid = run.geom.spatial_id_of(k)
    # ``flag`` is the log line's key (``timed_out=true``, ``stalled=true``: a format
    # people grep), ``kind`` the worker's exit kind
    if stalled:
        run.stall_reclaims += 1
        stall = run.spec.stall_timeout_secs or 0.0
        kind, flag, limit = ExitKind.STALLED, "stalled", f"stall_timeout={stall:g}s"
        text = (
            f"block {run.task_id}/{sid} stalled: no CPU, IO or heartbeat for its "
            f"stall_timeout ({stall:g}s)"
        )
    else:
        run.timeout_reclaims += 1
        kind, flag, limit = ExitKind.TIMEOUT, "timed_out", f"timeout={run.spec.timeout_secs:g}s"
        text = f"block {run.task_id}/{sid} exceeded the block timeout ({run.spec.timeout_secs:g}s)"
    logger.warning("block lost block_id=%s/%d %s=true (%s)", run.task_id, sid, flag, limit)
    d.record_error(peer, run, k, text, str(kind), details)
    d.release(peer, run, k, False, False, sent, returned, now)
    d.stop_worker(peer.worker, text, now, kind)


def reclaim(d: DispatcherPort, peer: Peer, now: float) -> None:
    """The backstop: a connection's blocks outlived their deadline."""
    run = peer.run
    assert run is not None
    backups = d.plan_of[run.index].backups
    if backups is not None and drop_lost(d, backups, peer, "its copy timed out", now):
        text = f"a copy of a block of task {run.task_id} outlived its deadline"
        d.stop_worker(peer.worker, text, now)
        d.close(peer, now)
        return
    held = peer.held
    peer.held = []
    if len(held) == 1:
        time_out_block(d, peer, run, held[0], peer.sent_at, now, now)
        d.close(peer, now)
        return
    # a whole batch outlived its deadline and the worker's watchdog did not say which
    # block hung: none is charged; each runs alone next time, where a hang is caught
    plan = d.plan_of[run.index]
    for k in held:
        d.scheduler.requeue_index(run, k)
        plan.suspects.add(k)
    text = (
        f"a batch of {len(held)} blocks of task {run.task_id} outlived its deadline; "
        "its worker was stopped and the blocks run again one at a time"
    )
    logger.warning("%s", text)
    d.stop_worker(peer.worker, text, now)
    d.close(peer, now)
