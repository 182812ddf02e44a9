"""Straggler backups, sans I/O: when a task has no ready block left and one of its workers
is idle, a block that has been out much longer than the task's blocks usually take runs a
second time on that worker, and the first copy to succeed wins.

Opt in with ``Task(speculative=True)`` (factor 3) or
``Task(backup_after=factor)``; off, a task's plan has no :class:`Backups` and the dispatcher
pays one attribute test per idle request and per returned batch, nothing per block.

The rules (the dispatcher calls the functions below from its hooks):

* **Which block.** A block held *alone* by a connection of one of the task's managed
  workers, out for longer than ``factor`` × the median of the task's finished blocks (the
  server-side time each was out, a block of a batch counting its share of the round trip;
  the median of the last :data:`SAMPLE` of them, once :data:`MIN_FINISHED` have finished),
  and never backed up before: the oldest such block goes to the idle worker, alone (a block
  gets one copy at most, so one that fails every time is not copied forever). A block
  out in a batch is not backed up (which block of the batch is slow is unknown), nor is a
  block of an unmanaged client (``bellis worker``, a hand-made client), and no unmanaged
  client is given a copy: the run could not stop that client's copy when the other one wins.
* **Who waits.** A request that finds nothing ready, no block waiting for its dependencies
  and no copy to make yet waits (:attr:`Backups.idle`) while the task has blocks out alone
  that may become stragglers; otherwise it is told to stop, as without backups. The tick
  offers copies to the waiting requests (:func:`offer`).
* **The pair.** The scheduler knows nothing of copies: the block stays *processing* until
  one copy comes back with a success, so read/write conflicts hold for the copy as for the
  original. Both copies' connections hold the block; :attr:`Backups.copies` pairs them.
* **First success wins** (:func:`settle_returns`): its figures are recorded and the block is
  released, once. The other copy leaves its connection's ``held`` at once, and its worker is
  stopped (KILL) with exit kind ``preempted``: its start is given back (no restart is
  charged) and nothing counts in ``failures``. Counted: backups started, won (the copy
  finished first), lost (the original did), and the seconds the losers were out.
* **A copy that ends without a result** (it failed, timed out or stalled, came back
  unstarted, its deadline passed or its connection ended) while its twin still runs only
  drops out (:func:`drop_lost`): the block is neither released nor charged, and the twin
  goes on alone (a failure is logged). What happens to that copy's *worker* is what would
  happen without backups (a timed-out worker is stopped and replaced, a dead one is a
  worker failure). Should the twin then fail too, that one failure is charged, once.
"""

from __future__ import annotations

import logging
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any, Final

from .._block import BlockStatus
from .._protocol import STALLED, TIMED_OUT, ExitKind, Returned
from ._records import ManagedWorker, Peer, TaskBackups, TaskRecord
from ._task_run import RUNNING

if TYPE_CHECKING:
    from ._ports import DispatcherPort

__all__ = [
    "MIN_FINISHED",
    "SAMPLE",
    "Backups",
    "drop_lost",
    "offer",
    "settle_returns",
]

logger = logging.getLogger("bellis")

#: no backups before this many of the task's blocks have finished (the median means little)
MIN_FINISHED: Final = 20
#: the median is taken over the last this many finished blocks
SAMPLE: Final = 1024

_SUCCESS: Final = int(BlockStatus.SUCCESS)


class Backups:
    """One task's straggler backups: the finished walls, the pairs out, who waits, and the
    decisions on them (see the module docstring)."""

    __slots__ = (
        "_median",
        "backed_up",
        "copies",
        "ended",
        "factor",
        "finished",
        "idle",
        "plan",
        "walls",
    )

    def __init__(self, plan: TaskRecord, factor: float) -> None:
        self.plan = plan
        self.factor = factor
        #: the last :data:`SAMPLE` finished walls, and how many blocks finished in all
        self.walls: deque[float] = deque(maxlen=SAMPLE)
        self.finished = 0
        self._median: float | None = None
        #: block -> (the original's connection, the copy's): both hold the block
        self.copies: dict[int, tuple[Peer, Peer]] = {}
        plan.run.racing = self.copies  # the live page draws the races still going
        #: every block that had a copy: it gets no second one (a copy that failed is not
        #: charged, so a block that fails every time would otherwise be copied forever)
        self.backed_up: set[int] = set()
        #: requests that wait for a straggler (each peer's ``parked`` flag is set; an
        #: entry whose flag is clear is stale, skipped)
        self.idle: deque[Peer] = deque()
        #: races settled in the batch being taken back, for the live page: posted to the
        #: run's ``races`` only after the batch's releases (:meth:`post_races`), so a page
        #: that shows a race also shows its winner's block (it copies races, then blocks)
        self.ended: list[tuple[int, int, float, int, float, float, bool]] = []

    # -- the median --------------------------------------------------------------------
    def add_finished(self, seconds: float, n: int) -> None:
        """``n`` blocks finished after ``seconds`` out each."""
        self.finished += n
        self.walls.extend(repeat(seconds, min(n, SAMPLE)))
        self._median = None

    def threshold(self) -> float | None:
        """How long a block may be out before it is a straggler (None: too few finished).
        The sort runs only when a request is idle and blocks finished since the last."""
        if self.finished < MIN_FINISHED:
            return None
        if self._median is None:
            s = sorted(self.walls)
            m = len(s) // 2
            self._median = s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
        return self.factor * self._median

    # -- which block -------------------------------------------------------------------
    def _open(self) -> list[Peer]:
        """The connections of the task's live managed workers holding one block alone
        that never had a copy."""
        out = []
        for w in self.plan.workers:
            if w.exit is not None:
                continue
            for c in w.conns:
                if not c.closed and len(c.held) == 1 and c.held[0] not in self.backed_up:
                    out.append(c)
        return out

    def stragglers(self, now: float) -> list[Peer]:
        """The connections whose block is a straggler now, oldest first."""
        thr = self.threshold()
        if thr is None:
            return []
        late = [c for c in self._open() if now - c.sent_at > thr]
        late.sort(key=lambda c: c.sent_at)
        return late

    def copy_for(self, peer: Peer, now: float) -> int:
        """The block to send ``peer`` (whose request found nothing ready) as a copy, paired
        already, or -1. The caller sends it alone."""
        run = self.plan.run
        if peer.worker is None or run.status != RUNNING:
            return -1
        for c in self.stragglers(now):
            if c is not peer:
                k = c.held[0]
                self.copies[k] = (c, peer)
                self.backed_up.add(k)
                run.backups_started += 1
                logger.warning(
                    "block %s/%d has been out %.3gs (> %g x the median %.3gs): a backup copy "
                    "starts on worker %d",
                    run.task_id,
                    run.geom.spatial_id_of(k),
                    now - c.sent_at,
                    self.factor,
                    self._median or 0.0,
                    peer.worker.worker_id,
                )
                return k
        return -1

    def wait(self, peer: Peer) -> bool:
        """Park ``peer``'s request (nothing ready, nothing pending) if a block may yet
        become a straggler it could copy; False: it is told to stop (so it is when too few
        blocks are left for the median ever to be known)."""
        run = self.plan.run
        if peer.worker is None or run.status != RUNNING:
            return False
        if self.finished + run.processing < MIN_FINISHED or not self._open():
            return False
        self.idle.append(peer)
        peer.parked = True
        return True

    # -- the pair ------------------------------------------------------------------------
    def unpair(self, k: int, peer: Peer) -> Peer | None:
        """``peer``'s copy of ``k`` came back or ended: the pair ends. Returns the other
        copy's connection (None: ``k`` had no other copy)."""
        pair = self.copies.get(k)
        if pair is None or (pair[0] is not peer and pair[1] is not peer):
            return None
        del self.copies[k]
        return pair[1] if pair[0] is peer else pair[0]

    def won(self, k: int, winner: Peer, loser: Peer, copy: bool, now: float) -> None:
        """Count a race: ``winner``'s copy of ``k`` succeeded first (``copy``: the winner
        is the backup copy, not the original)."""
        run = self.plan.run
        if copy:
            run.backups_won += 1
            who = "the backup copy"
        else:
            run.backups_lost += 1
            who = "the original"
        run.backup_loser_seconds += max(0.0, now - loser.sent_at)
        if run.races is not None:  # the live page marks both copies on its lanes (rare)
            ended = loser.sent_wall + (now - loser.sent_at)
            self.ended.append(
                (
                    k,
                    winner.worker_id,
                    winner.sent_wall,
                    loser.worker_id,
                    loser.sent_wall,
                    ended,
                    copy,
                )
            )
        logger.info(
            "block %s/%d: %s finished first; the other copy is stopped",
            run.task_id,
            run.geom.spatial_id_of(k),
            who,
        )

    def post_races(self) -> None:
        """The batch's releases are done: its settled races go to the run's ``races``."""
        if self.ended:
            races = self.plan.run.races
            if races is not None:
                races.extend(self.ended)
            self.ended.clear()


# -- the dispatcher's hooks ---------------------------------------------------------------
def settle_returns(
    d: DispatcherPort, bk: TaskBackups, peer: Peer, results: list[Returned], now: float
) -> list[Returned]:
    """Before a returned batch is recorded: feed the median, let a first success win
    (stopping the other copy), and drop the copies that ended without a result while
    their twin runs on. Returns the results to record and release as usual."""
    ok = sum(1 for r in results if r.status == _SUCCESS)
    if ok:
        processed = sum(1 for r in results if r.status != int(BlockStatus.CREATED))
        bk.add_finished((now - peer.sent_at) / max(1, processed), ok)
    if not bk.copies:
        return results
    keep = []
    for r in results:
        k, status = r.k, r.status
        pair = bk.copies.get(k)
        other = bk.unpair(k, peer)
        if other is None:
            keep.append(r)
        elif status == _SUCCESS:
            assert pair is not None
            bk.won(k, peer, other, pair[1] is peer, now)
            _stop_loser(d, bk, other, k, now)
            keep.append(r)
        else:
            _drop_copy(d, bk, peer, k, status, r.error, other, now)
    return keep


def drop_lost(d: DispatcherPort, bk: TaskBackups, peer: Peer, why: str, now: float) -> bool:
    """``peer``'s blocks end without a result (``why``): the copies among them whose twin
    runs on leave its ``held`` uncharged; the others stay for the caller's usual path.
    True when it dropped a copy and ``peer`` holds nothing any more."""
    dropped = False
    if bk.copies:
        for k in list(peer.held):
            if bk.unpair(k, peer) is not None:
                peer.held.remove(k)
                _log_dropped(bk, k, why)
                dropped = True
    return dropped and not peer.held


def _drop_copy(
    d: DispatcherPort,
    bk: TaskBackups,
    peer: Peer,
    k: int,
    status: int,
    error: Any,
    other: Peer,
    now: float,
) -> None:
    """``peer``'s copy of ``k`` came back without a success while ``other`` runs on."""
    peer.held.remove(k)
    if status == TIMED_OUT or status == STALLED:
        kind = ExitKind.STALLED if status == STALLED else ExitKind.TIMEOUT
        _log_dropped(bk, k, f"its copy {'stalled' if status == STALLED else 'timed out'}")
        text = f"a copy of block {bk.plan.run.task_id}/{bk.plan.run.geom.spatial_id_of(k)} {kind}"
        d.stop_worker(peer.worker, text, now, kind)
    elif status == int(BlockStatus.CREATED):
        _log_dropped(bk, k, "its copy came back unstarted")
    else:
        first = error.splitlines()[0] if isinstance(error, str) and error else "block failed"
        _log_dropped(bk, k, f"its copy failed: {first}")


def _log_dropped(bk: TaskBackups, k: int, why: str) -> None:
    run = bk.plan.run
    logger.warning(
        "block %s/%d: %s; its other copy goes on (not counted as a failed attempt)",
        run.task_id,
        run.geom.spatial_id_of(k),
        why,
    )


def _stop_loser(d: DispatcherPort, bk: TaskBackups, loser: Peer, k: int, now: float) -> None:
    """The other copy of ``k`` won: ``loser`` lets go of it and its worker is stopped at
    once, exit kind ``preempted``, its start given back."""
    loser.held.remove(k)
    w: ManagedWorker | None = loser.worker
    if w is not None and w.exit is None:
        run = bk.plan.run
        text = f"stopped: the other copy of block {run.task_id}/{run.geom.spatial_id_of(k)} won"
        d.stop_worker(w, text, now, ExitKind.PREEMPTED)
        bk.plan.free_starts += 1  # a preempted worker is no restart
    d.close(loser, now)


def offer(d: DispatcherPort, bk: TaskBackups, now: float) -> None:
    """The tick: offer copies of the stragglers to the requests that wait (the idle ones,
    then those parked for blocks still waiting for their dependencies); send the idle ones
    that can no longer get one the usual way (a block, or the word to stop)."""
    plan, run = bk.plan, bk.plan.run
    idle = [c for c in bk.idle if c.parked and not c.closed]
    bk.idle.clear()
    if run.status != RUNNING or run.ready > 0:
        plan.parked.extend(idle)
        d.serve_parked(plan, now)
        return
    n = len(bk.stragglers(now)) if idle or plan.parked else 0
    while n > 0:
        c = idle.pop(0) if idle else _take_parked(plan)
        if c is None:
            break
        c.parked = False
        d.serve(c, run, False, now)
        n -= 1
    for c in idle:
        if not bk.wait(c):
            c.parked = False
            d.serve(c, run, True, now)  # draining: the word to stop


def _take_parked(plan: TaskRecord) -> Peer | None:
    """A managed request parked on the task (for blocks waiting on their dependencies),
    taken out of the queue (so it is never there twice)."""
    for c in plan.parked:
        if c.parked and c.worker is not None:
            plan.parked.remove(c)
            return c
    return None
