"""What a returned batch does, sans I/O: the blocks an ACQUIRE or BYE gives back, taken
back by the dispatcher.

:func:`take_back` owns one message's returns, from the checked fields to each block's
path. The whole message is checked first (:func:`bellis._protocol.parse_returns`: only
blocks the connection holds, well-formed fields, a success's checksum an integer that
``output_checksum`` holds), so a malformed one takes nothing back: the connection is
dropped, as that worker's protocol error, and its blocks take the retry path.
Then, in order:

* straggler backups settle their pairs (:func:`._backups.settle_returns`, a task with
  backups only): the first success of two copies wins;
* the batch's measurement rows are checked, aggregated and stored at once, before any
  release marks a block done (:func:`_record_measured`): a done block always has its
  figures; a task with resource tracking whose success came without a row fails the run;
* each block goes its way: requeued (given back unstarted), timed out or stalled
  (:func:`._lost.time_out_block`), up the memory ladder (:func:`._memory.climb`), or
  released, its error recorded (:func:`_take_returned`);
* the connection's next batch is sized from the worker's busy time (or the round trip).

A batch's round trip is shared equally by the blocks it carried. A block stays in the
connection's ``held`` until it is taken back, so whatever raises midway leaves the rest
held, for the retry path. The dispatcher is reached through
:class:`._ports.DispatcherPort`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import numpy as np

from .._block import BlockStatus
from .._protocol import (
    BYE,
    OUT_OF_MEMORY,
    STALLED,
    TIMED_OUT,
    Returned,
    error_parts,
    parse_returns,
)
from . import _memory
from ._attempts import KIND_OOM
from ._backups import settle_returns
from ._batching import measured_rows, measurements, next_batch, unmeasured_error
from ._lost import time_out_block
from ._task_run import RUNNING

if TYPE_CHECKING:
    from ._ports import DispatcherPort
    from ._records import Peer, TaskRecord
    from ._task_run import TaskRun

__all__ = ["take_back"]

_CREATED: Final = int(BlockStatus.CREATED)
_SUCCESS: Final = int(BlockStatus.SUCCESS)


def take_back(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    msg: list[Any],
    n: int,
    rows: Any,
    busy: float | None,
    now: float,
) -> None:
    """Take back the blocks a message returns: ``n`` fields of (k, status, row,
    error) groups, the measurement ``rows`` they index (None when there are none), and
    the seconds the worker was ``busy`` with them (None: not reported)."""
    table = None if rows is None else measurements(rows)
    held = peer.held
    # validate the whole message before taking anything back: a malformed message
    # drops the connection, and every block it held then goes to the retry path. Only
    # a worker that stops gives blocks back unstarted; one asking for more would get
    # the same block back with a fresh deadline, again and again
    results = parse_returns(
        msg, n, 0 if table is None else len(table), set(held), msg[0] == BYE, run.task_id
    )
    backups = d.plan_of[run.index].backups
    if backups is None:
        _take_all(d, peer, run, results, table, held, busy, now)
        return
    # first success of a block's two copies wins; the races it settles reach the live
    # page after the winners' releases
    results = settle_returns(d, backups, peer, results, now)
    try:
        _take_all(d, peer, run, results, table, held, busy, now)
    finally:
        backups.post_races()


def _take_all(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    results: list[Returned],
    table: np.ndarray[Any, Any] | None,
    held: list[int],
    busy: float | None,
    now: float,
) -> None:
    """Take back the checked (and settled) ``results`` of one message."""
    if not results:
        return
    # per block: r[1] is r.status (a NamedTuple field read costs 3x an index)
    processed = [r for r in results if r[1] != _CREATED]
    # a batch's round trip is shared equally by the blocks it carried
    step = (now - peer.sent_at) / max(1, len(processed))
    if (table is not None or run.spec.resource_tracking) and not _record_measured(
        d, peer, run, processed, table, step
    ):
        # the run fails on this batch: its blocks are not held any more (a close later
        # must not charge them as lost attempts)
        taken = {r.k for r in results}
        peer.held = [k for k in held if k not in taken]
        return
    t = peer.sent_at
    plan = d.plan_of[run.index]
    suspects = plan.suspects
    if (
        table is None
        and not suspects
        and plan.backups is None
        and plan.memory is None
        and all(r[1] == _SUCCESS and r[3] is None for r in results)
    ):
        _release_all(d, peer, run, plan, [r[0] for r in results], t, step, now)
        if peer.held == []:
            pace = step if busy is None else busy / len(processed)
            peer.batch = next_batch(peer.batch, pace)
        return
    # a block stays held until it is taken back, so if anything below raises, the
    # connection is dropped with the rest of the batch still held: those go to the
    # retry path instead of staying out forever
    back: set[int] = set()
    try:
        for k, status, row, error in results:
            if suspects:
                suspects.discard(k)
            if status == _CREATED:
                d.scheduler.requeue_index(run, k)
            elif status == TIMED_OUT or status == STALLED:
                details = error_parts(error)[1] if error is not None else None
                time_out_block(
                    d, peer, run, k, t, t + step, now, stalled=status == STALLED, details=details
                )
                t += step
            elif status == OUT_OF_MEMORY and d.plan_of[run.index].memory is not None:
                _memory.climb(d, peer, run, k, t, t + step, now)
                t += step
            else:
                _take_returned(d, peer, run, k, status, row >= 0, error, t, t + step, now)
                t += step
            # (a block whose release raised stays held too: the scheduler ignores a
            # second release or requeue of a block it already took back)
            back.add(k)
            if d.fatal is not None:
                return
    finally:
        peer.held = [k for k in held if k not in back]
    if processed and peer.held == []:
        pace = step if busy is None else busy / len(processed)
        peer.batch = next_batch(peer.batch, pace)


def _release_all(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    plan: TaskRecord,
    ks: list[int],
    t: float,
    step: float,
    now: float,
) -> None:
    """The common batch, taken back in one: every block a success without a measurement,
    an error or a checksum, in a task without backups, suspects or memory grants. The
    same outcome as :func:`_take_returned` per block (the scheduler's release of each,
    in order), with the figures and the worker's timeline added once for the batch and
    parked requests woken once after it (per block, these were a third of the server's
    time per block on ``dist_noop_w2``)."""
    release = d.scheduler.release_index
    worker = peer.worker
    wid = peer.worker_id if worker is not None else -1
    wall = peer.sent_wall + (t - peer.sent_at)
    accepted = 0
    held = peer.held
    back: set[int] = set()
    try:
        for k in ks:
            if release(run, k, True, None, wid, wall, wall + step, False):
                accepted += 1
            wall += step
            back.add(k)
    finally:
        peer.held = [k for k in held if k not in back]
        plan.aggregates.add_round_trips(step, accepted)
        if worker is not None:
            worker.earned = True
            worker.timeline.ran_batch(t, step, len(back))
    d.released(plan, run, now)


def _record_measured(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    processed: list[Returned],
    table: np.ndarray[Any, Any] | None,
    step: float,
) -> bool:
    """Aggregate and store the measurements of a batch's successful blocks at once,
    before their releases mark them done (so a done block always has its figures).

    ``processed`` is the batch without its unstarted blocks, in order: block ``i`` of
    it was out from ``sent_at + i * step`` to ``sent_at + (i + 1) * step``. Returns
    False, recording nothing, when a task with resource tracking got a success without
    measurements: the run then fails on it.
    """
    picked = measured_rows(processed, run.spec.resource_tracking)
    if isinstance(picked, int):
        d.fatal = unmeasured_error(f"{peer.addr[0]}:{peer.addr[1]}", run.task_id, picked)
        return False
    ks, picks, slots = picked
    if not ks or table is None or run.status != RUNNING:
        return True
    measured = table[picks]
    d.plan_of[run.index].aggregates.add_measured(np.full(len(ks), step), measured)
    if run.store is not None:
        sent = peer.sent_wall + np.asarray(slots, dtype=np.float64) * step
        wid = peer.worker_id if peer.worker is not None else -1
        run.record_measured(ks, measured, wid, sent, sent + step)
    return True


def _take_returned(
    d: DispatcherPort,
    peer: Peer,
    run: TaskRun,
    k: int,
    status: int,
    measured: bool,
    error: Any,
    sent: float,
    returned: float,
    now: float,
) -> None:
    """``error``: the checked error field, ``text`` or ``[text, details]``
    (:func:`error_parts`)."""
    success = status == _SUCCESS
    if peer.worker is not None:
        peer.worker.earned = True
    if not success:
        # error_parts(error), inlined: a run whose blocks all fail takes this per block
        if type(error) is list:
            text, details = error
        else:
            text, details = error, None
        kind = KIND_OOM if status == OUT_OF_MEMORY else None
        d.record_error(peer, run, k, text if text is not None else "block failed", kind, details)
    elif error is not None and run.store is not None:
        # the outputs' checksum (verify_outputs), stored before the release marks it done
        cell = run.cell_of(k)
        if cell >= 0:
            run.store.record_checksum(cell, error)
    d.release(peer, run, k, success, measured, sent, returned, now)
