"""A worker's next batch sent *ahead*, while the last block of its batch runs, sans I/O.

A worker of fast blocks waits for the round trip to the server between two batches: on a
loaded machine, about a third of its loop on 8 ms blocks (``benchmarks/RESULTS.md``). So a
worker whose WELCOME allows it starts the last block of a batch of two or more and sends
``AHEAD`` with the others (:mod:`bellis._protocol`): its next batch travels while that block
runs. Larger batches would hide the wait too, but queue blocks behind a straggler; here one
batch at most waits behind one running block, and only where that changes no rule:

* the block a worker runs is the one its connection holds alone once the AHEAD's blocks
  are back (the message must leave exactly one); the batch sent ahead joins it in
  ``held``, so a lost connection or a passed deadline then finds a batch (each block a
  suspect, none charged), as it would have without AHEAD;
* nothing goes ahead for a task with backups, a stall watch or a memory ladder (whose
  rules treat a block out alone apart: ``TaskRecord.ahead``), while a suspect waits (it
  must run alone), to a worker of slow blocks (a batch of one: the wait is a small share
  of its block), or where fewer than two ready blocks per live worker are left (a block
  never waits behind another while a worker could take it);
* the blocks go in the connection's own locality stream, as they would a moment later;
  conflicts and dependencies are the scheduler's, as for any block handed out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ProtocolError
from ._batching import RUN_FROM

if TYPE_CHECKING:
    from ._records import Peer, TaskRecord
    from ._scheduler import Scheduler
    from ._task_run import TaskRun

__all__ = ["take_ahead"]


def take_ahead(
    scheduler: Scheduler, peer: Peer, run: TaskRun, plan: TaskRecord, stopping: bool
) -> list[int]:
    """The blocks to send ``peer`` ahead ([]: none; ``stopping``: the run is draining,
    stopping or in the middle of check_function skips). Raises :class:`ProtocolError`
    for an AHEAD its task does not allow, or one that left other than one block held."""
    if not plan.ahead:
        raise ProtocolError(f"asked ahead, which task {run.task_id} does not allow")
    if len(peer.held) != 1:
        raise ProtocolError(
            f"asked ahead holding {len(peer.held)} blocks of task {run.task_id}, "
            "not the one it runs"
        )
    want = min(peer.batch, run.ready // (2 * max(1, plan.alive)))
    if (
        want < 1
        or peer.batch < 2
        or stopping
        or plan.suspects
        or plan.gate is not None
        or (peer.worker is not None and peer.worker.mem_step)
    ):
        return []
    stream = peer.stream
    k = scheduler.acquire_index(run, stream)
    if k < 0:
        return []
    held = [k]
    if want > RUN_FROM and run.local is not None:
        scheduler.acquire_run(run, stream, held, want)
    while len(held) < want:
        k = scheduler.acquire_index(run, stream)
        if k < 0:
            break
        held.append(k)
    return held
