"""The run's decisions, sans I/O: which block goes to which connection, and what happens
to workers, blocks and tasks when something arrives, ends or runs late.

Theory of operation
-------------------
:class:`Dispatcher` owns the scheduler, one :class:`Peer` per connection and one
:class:`ManagedWorker` per worker started. Its inputs are events, each a method call:
a connection's message (:meth:`~Dispatcher.receive`; its first is the HELLO), the loss of a
connection (:meth:`~Dispatcher.close`), the clock (:meth:`~Dispatcher.expire` and
:meth:`~Dispatcher.tick`), a worker's exit (:meth:`~Dispatcher.worker_exited`, then
:meth:`~Dispatcher.settle_exit`), a launch that worked or failed (:meth:`~Dispatcher.launched`,
:meth:`~Dispatcher.launch_failed`), an abort and the shutdown. Its outputs are instructions
appended to :attr:`~Dispatcher.out`, named tuples (:mod:`._instructions`) that the shell
(``_server.py``) carries out in order: ``SendFrame(SEND_FRAME, peer, frame)``,
``Close(CLOSE, peer)``, ``Launch(LAUNCH, plan, bookings)``, ``Kill(KILL, worker)`` and
``Progress(PROGRESS)``. Time comes in as an argument (``now``, monotonic
seconds; the wall clock as the offset :meth:`~Dispatcher.tick` is given): nothing here reads a
clock, a socket or a process. The only I/O reached from here is through objects handed in:
the task stores (which buffer the records), the error collector and the log.

Invariants:

* **Exactly-once hand-out.** A block the scheduler hands out is in exactly one peer's
  ``held`` list until it comes back: returned (released or requeued unstarted), reclaimed at
  its deadline, or lost with its connection. Each of these takes it out of ``held`` first,
  so no path gives it back twice; a peer that returns a block it does not hold is dropped
  (:func:`~bellis._protocol.parse_returns`). A peer with a request parked is in its task's
  ``parked`` queue (or the backups' ``idle`` queue) once, and a second request while it
  waits drops the peer. The one exception is a *backup* (``Task(speculative=True)``,
  :mod:`._backups`): a straggler held alone may be in a second peer's ``held`` too,
  the two paired in ``Backups.copies``. The first success is released; the other copy
  leaves its ``held`` at once and its worker is stopped (``preempted``, no restart), and a
  copy that ends any other way leaves ``held`` unreleased while its twin runs on.
* **When a block is charged.** A block is charged a failed attempt when it comes back
  failed, when it alone outlived its deadline, or when its worker's connection ended while
  it alone was out. A block out with others in a *batch* is never charged for a lost
  connection or an expired deadline (which block was at fault is unknown): the batch goes
  back to the queue and each of its blocks is a *suspect*, which is sent alone from then
  on, so a block that kills its worker is caught and charged by itself. One of a backup's
  two copies is never charged: only the last copy out that fails is. A block whose
  worker ran out of memory while it held it alone is not charged: it waits for a worker
  with a larger memory grant (:mod:`._memory`, which decides for tasks with a memory
  request; the hooks here only call it).
* **The restart budget** (kept by :mod:`bellis._scheduling._staffing`, with the workers and the
  resources). A task with work left, no worker alive and no start left is abandoned, and
  its downstream tasks with it.

:mod:`._backups` and :mod:`._memory` decide for the tasks that opted in, and
:mod:`._returns` takes back what a message returns; the hooks here call them, and they
call back through the public methods (:meth:`serve`, :meth:`serve_parked`,
:meth:`release`, :meth:`record_error`, :meth:`lose_held`,
:meth:`stop_worker`, :meth:`close`) and attributes, typed as
:class:`._ports.DispatcherPort`. The instructions are :mod:`._instructions`' named tuples.

A connection's *batch* (how many ready blocks it gets at once) aims at about
:data:`BATCH_TARGET_SECONDS` of work, paced by the busy time its worker reports (else by
the round trip; see :mod:`bellis._scheduling._batching`), and never takes more than the connection's
share of the ready blocks.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from .._protocol import (
    ACQUIRE,
    BYE,
    MOVE,
    REJECT,
    SEND,
    SETUP,
    SHUTDOWN,
    ExitKind,
    WorkerExit,
    encode,
    is_ending,
    parse_cache_counts,
    parse_hello,
)
from .._stats._errorgroups import ErrorCollector
from ..errors import ConfigurationError, ProtocolError
from . import _lost, _memory, _sharing
from ._abandon import RESTART_CAP
from ._attempts import (
    KIND_LOST,
    attempt_record,
    record_error,
    setup_reported,
    setup_timed_out,
)
from ._backups import Backups, drop_lost, offer
from ._batching import BATCH_TARGET_SECONDS, MAX_BATCH, busy_seconds
from ._deadlines import DeadlineHeap, watchdog_margin_seconds
from ._instructions import (
    CLOSE,
    KILL,
    LAUNCH,
    PROGRESS,
    SEND_FRAME,
    Close,
    Instruction,
    Kill,
    Launch,
    Progress,
    SendFrame,
)
from ._locality import FOLD_BLOCKS, Coherence
from ._records import Booking, ManagedWorker, Peer, TaskRecord
from ._returns import take_back
from ._scheduler import CHECKS_PENDING, Scheduler
from ._staffing import Staffing
from ._task_run import RUNNING, TaskRun

__all__ = [
    "BATCH_TARGET_SECONDS",
    "CLOSE",
    "KILL",
    "LAUNCH",
    "MAX_BATCH",
    "PROGRESS",
    "SEND_FRAME",
    "Dispatcher",
    "watchdog_margin_seconds",
]

logger = logging.getLogger("bellis")

#: builds a :class:`SendFrame`, the instruction of every batch sent, without the
#: Python-level ``__new__`` that ``NamedTuple`` generates (see ``_protocol._new_tuple``)
_new_tuple: Final = tuple.__new__

#: how often progress observers hear of a change at most
_PROGRESS_SECONDS: Final = 0.5

SHUTDOWN_FRAME: Final = encode([SHUTDOWN])

#: batches of more blocks than this take their run of ready blocks at once
#: (``Scheduler.acquire_run``)
_RUN_FROM: Final = 4


class Dispatcher:
    """Every decision of one distributed run, driven by events (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        plans: dict[str, TaskRecord],
        *,
        secret: bytes,
        worker_key: bytes,
        resources: dict[str, int],
        errors: ErrorCollector,
        address: tuple[str, int] = ("?", 0),
    ) -> None:
        self.scheduler = scheduler
        self.plans = plans
        self.plan_of = {p.run.index: p for p in plans.values()}
        self.secret = secret
        self.worker_key = worker_key
        #: the managed workers, their starts and the run's resources (bellis._scheduling._staffing);
        #: ``workers``, ``gone``, ``resources`` and ``used`` below are its own dicts
        self.staff = Staffing(plans, resources)
        self.resources = self.staff.resources
        self.used = self.staff.used
        self.errors = errors
        #: where workers reach the server (named when a worker never connected)
        self.address = address
        #: instructions for the shell, oldest first; it empties the list as it carries them out
        self.out: list[Instruction] = []
        self.workers = self.staff.workers
        #: workers whose process has ended, by id: a connection that claims one of them
        #: comes from a worker that outlived its spawn function
        self.gone = self.staff.gone
        self.unmanaged_clients = 0
        self.abort_reason: str | None = None
        self.fatal: BaseException | None = None
        self.dirty = True
        self.shutdown_started: float | None = None
        self._last_progress = 0.0
        #: wall clock minus monotonic clock, as of the last :meth:`sync_clock`
        self._wall_offset = 0.0
        #: tasks with a request parked in the middle of check_function skips
        self.checking: set[int] = set()
        #: (due, seq, peer): when a peer's blocks are to be reclaimed, at most one live
        #: entry per peer (the one equal to ``peer.due``); others are stale, skipped
        self._deadlines = DeadlineHeap()
        for run in scheduler.runs:
            # each connection a spatially coherent stream of blocks (``_locality``), and
            # the figure of how coherent the workers' streams were
            scheduler.order_by_locality(run)
            run.coherence = Coherence(run.geom.grid)
        for p in plans.values():  # straggler backups (bellis._scheduling._backups), opt-in per task
            p.backups = (
                None if p.run.spec.backup_after is None else Backups(p, p.run.spec.backup_after)
            )

    # -- connections ----------------------------------------------------------------------
    def receive(self, peer: Peer, msg: list[Any], now: float, draining: bool = False) -> None:
        """A message from ``peer`` (its first is the HELLO). ``draining``: the run is
        stopping, or its worker is gone; what it returns is taken back, nothing is sent.
        A malformed or unexpected message closes that connection only."""
        try:
            if not peer.authed:
                self._greet(peer, msg, now)
                return
            self._handle(peer, msg, now, draining)
        except ProtocolError as exc:
            logger.warning("dropping client %s: %s", peer.addr, exc)
            self.close(peer, now)
        except Exception:
            # whatever one client sent must not end the run for everyone: log it loudly,
            # drop that client, and let its blocks take the retry path
            logger.exception("error while serving client %s; dropping it", peer.addr)
            self.close(peer, now)

    def close(self, peer: Peer, now: float) -> None:
        """``peer``'s connection ends (or is to be ended): the blocks it held go back."""
        if peer.closed:
            return
        if peer.held and peer.run is not None and now >= peer.deadline:
            # the worker's watchdog preempted a block (exit 87) before the tick saw the
            # deadline pass: account it as the timeout it is, not as a plain disconnect
            _lost.reclaim(self, peer, now)
            return
        peer.closed = True
        self.out.append(Close(CLOSE, peer))
        run = peer.run
        backups = None if run is None else self.plan_of[run.index].backups
        if peer.held and backups is not None:
            drop_lost(self, backups, peer, "its connection ended", now)
        peer.parked = False  # its entry in the parked queue, if any, is skipped
        if run is not None and self.plan_of[run.index].memory is not None:
            _memory.close_held(self, peer, run, now)
        if peer.held and run is not None:
            held = peer.held
            peer.held = []
            self.lose_held(peer, run, held, now)
        if peer.worker is not None and peer in peer.worker.conns:
            peer.worker.conns.remove(peer)
        if run is not None and run.local is not None:
            run.local.drop(peer.stream)  # its region is left to the next stream
        if peer.trail is not None and run is not None and run.coherence is not None:
            run.coherence.retire(peer.trail)
            peer.trail = None

    def lose_held(self, peer: Peer, run: TaskRun, held: list[int], now: float) -> None:
        """The blocks ``held`` went with ``peer``'s connection: one alone is charged a failed
        attempt; a batch goes back to the queue uncharged, each block a suspect."""
        if len(held) == 1:
            k = held[0]
            sid = run.geom.spatial_id_of(k)
            logger.warning("block lost block_id=%s/%d (worker disconnected)", run.task_id, sid)
            text = f"block {run.task_id}/{sid} lost: its worker disconnected"
            self.errors.record(attempt_record(peer, run, k, text, KIND_LOST))
            self.release(peer, run, k, False, False, peer.sent_at, now, now, lost=True)
        else:
            # which block of the batch was running is unknown: none of them is charged a
            # failed attempt; they go back to the queue and each runs alone next time, so
            # a block that kills its worker is then caught (and counted) on its own
            plan = self.plan_of[run.index]
            for k in held:
                self.scheduler.requeue_index(run, k)
                plan.suspects.add(k)
            logger.warning(
                "worker holding a batch of %d blocks of task %s disconnected; they run "
                "again one at a time",
                len(held),
                run.task_id,
            )

    def _send(self, peer: Peer, frame: bytes) -> None:
        self.out.append(_new_tuple(SendFrame, (SEND_FRAME, peer, frame)))

    def _greet(self, peer: Peer, msg: list[Any], now: float) -> None:
        hello = parse_hello(msg, self.secret, peer.nonce)
        task_id, worker_id = hello.task_id, hello.worker_id
        plan = self.plans.get(task_id)
        if plan is None:
            self._send(peer, encode([REJECT, f"no task {task_id!r} in this run"]))
            self.close(peer, now)
            return
        peer.authed = True
        peer.run = plan.run
        if plan.run.coherence is not None:
            peer.trail = plan.run.coherence.trail()
        worker = self.staff.identify(hello, peer.nonce, self.worker_key, plan.run)
        if worker is not None:
            if worker.exit is not None:
                self._turn_away_late_worker(peer, worker.exit, worker_id, task_id, now)
                return
            peer.worker = worker
            peer.worker_id = worker_id
            first = not worker.ever_connected
            self.staff.connected(worker, peer, hello.setup_seconds, now)
            if first and plan.run.spec.setup is not None:
                # its setup runs now (the one after a move: ``move_worker``), under the
                # task's timeout: a hung one is killed. timeout alone: a
                # setup reports no sign of life, and stall_timeout bounds blocks only
                # (docs/warm_workers.md, "stall_timeout and the setup")
                peer.setup_due = now + plan.run.spec.timeout_secs
                self._deadlines.watch(peer, peer.setup_due)
        else:
            self.unmanaged_clients += 1
            plan.timelines.unmanaged_client()
        self._send(peer, plan.welcome)

    def _turn_away_late_worker(
        self, peer: Peer, exit_: WorkerExit, worker_id: int, task_id: str, now: float
    ) -> None:
        """A managed worker connected after its exit: turned away. Seen to exit, it outlived
        its spawn function (a configuration the run cannot work with); given up for lost,
        its blocks went to others already."""
        seen = exit_.seen
        if seen:
            reason = "this worker's process already exited"
        else:
            reason = "this worker was given up for lost"
        self._send(peer, encode([REJECT, reason]))
        self.close(peer, now)
        if not seen:
            logger.warning(
                "worker %d of task '%s' connected after it was given up for lost; refused",
                worker_id,
                task_id,
            )
            return
        self.fatal = ConfigurationError(
            f"invalid configuration: worker {worker_id} for task {task_id!r} connected "
            "after its spawn function had already returned. 0-arg spawn functions must "
            "block until their worker exits (e.g. `sbatch --wait`, `srun`, "
            "`subprocess.run`)"
        )

    # -- blocks ---------------------------------------------------------------------------
    def _handle(self, peer: Peer, msg: list[Any], now: float, draining: bool) -> None:
        op = msg[0]
        if op == SETUP:  # Task(setup=...) ran, or raised, in peer's worker
            setup_reported(peer, msg, now, self.errors)
            return
        if op != ACQUIRE and op != BYE:
            raise ProtocolError(f"unexpected opcode {op} from an authenticated client")
        n = len(msg) - 1
        run = peer.run
        assert run is not None
        if op == BYE and n and is_ending(msg[n]):
            # its first block raised: counted now, before that block's failure may end the
            # run (a worker exit seen after the run ended counts for nothing)
            n -= 1
            if peer.worker is not None:
                self.staff.ending_reported(peer.worker)
        if n and type(msg[n]) is dict and "cache" in msg[n]:  # what its input cache did
            counts, per_block = parse_cache_counts(msg[n])
            run.input_cache = [a + b for a, b in zip(run.input_cache, counts, strict=True)]
            if per_block:  # per block, stored before the blocks below are marked done
                run.record_cache(peer.held, per_block)
            n -= 1
        # the blocks, then the measurement rows (bytes), then the busy time (a float)
        busy = busy_seconds(msg[n]) if n and type(msg[n]) is float else None
        if busy is not None:
            n -= 1
        rows = None
        if n % 4 == 1:
            rows = msg[n]
            n -= 1
        elif n % 4:
            raise ProtocolError(f"malformed message of {len(msg)} fields")
        if peer.parked:
            # parked twice, it would be served twice and lose the first block
            raise ProtocolError("sent a request while its previous one is still pending")
        if n:
            take_back(self, peer, run, msg, n, rows, busy, now)
            if self.fatal is not None or peer.closed:
                return
        elif rows is not None or busy is not None:
            raise ProtocolError("measurement rows or a busy time without blocks")
        if op == BYE:
            backups = self.plan_of[run.index].backups
            if peer.held and backups is not None:
                drop_lost(self, backups, peer, "its copy came back unstarted", now)
            if peer.held:
                # blocks the worker never started go back to the queue, uncounted
                for k in peer.held:
                    self.scheduler.requeue_index(run, k)
                peer.held = []
            self.close(peer, now)
            return
        if peer.held:
            raise ProtocolError(
                f"asked for blocks while holding {len(peer.held)} of task {run.task_id} "
                "without returning them"
            )
        self.serve(peer, run, draining, now)

    def record_error(
        self,
        peer: Peer,
        run: TaskRun,
        k: int,
        text: str,
        kind: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Block ``k`` failed with ``text``: kept for the summary, logged, and one error
        record (``kind``, the worker's ``details``: :func:`._attempts.record_error`)."""
        record_error(self.errors, peer, run, k, text, kind, details)

    def release(
        self,
        peer: Peer,
        run: TaskRun,
        k: int,
        success: bool,
        measured: bool,
        sent: float,
        returned: float,
        now: float,
        lost: bool = False,
    ) -> None:
        """Release block ``k``; a measured success was stored and aggregated already (see
        :func:`._returns._record_measured`). ``lost``: it failed because its worker went
        away (``Scheduler.release_index``)."""
        wall0 = peer.sent_wall + (sent - peer.sent_at)
        accepted = self.scheduler.release_index(
            run,
            k,
            success,
            None,
            peer.worker_id if peer.worker is not None else -1,
            wall0,
            wall0 + (returned - sent),
            lost,
        )
        plan = self.plan_of[run.index]
        if plan.memory is not None and k in plan.memory.need and peer.worker is not None:
            plan.memory.returned(self.scheduler, k, success, peer.worker.mem_step)
        if accepted and not (measured and success):
            # (a release the scheduler ignores, of a task that already ended, counts in
            # no block figure, like the measured ones _record_measured leaves out then)
            plan.aggregates.add_block(returned - sent, None, not success)
        if peer.worker is not None:
            tl = peer.worker.timeline
            tl.sent(sent)
            tl.returned(returned, not success)
        self.released(plan, run, now)

    def released(self, plan: TaskRecord, run: TaskRun, now: float) -> None:
        """After one or more releases of ``run``'s blocks: wake the requests parked on it
        and on its downstream tasks."""
        self.dirty = True
        if plan.parked:
            self.serve_parked(plan, now)
        for _edge, down in run.down_edges:
            if down.ready:
                dplan = self.plan_of[down.index]
                if dplan.parked:
                    self.serve_parked(dplan, now)
                if dplan.alive == 0:
                    # only the task that just got ready blocks: O(1) in the number of tasks
                    self._rebalance(now, (dplan,))

    def serve_parked(self, plan: TaskRecord, now: float) -> None:
        """Serve the requests parked on ``plan``'s task while it has ready blocks."""
        run = plan.run
        if plan.gate is not None and self._gate_holds(plan, now):
            return
        while (
            plan.parked
            and run.index not in self.checking
            and (run.ready > 0 or run.status != RUNNING or run.pending <= 0)
        ):
            c = plan.parked.popleft()
            if c.parked:
                c.parked = False
                self.serve(c, run, False, now)

    def continue_checks(self, now: float) -> None:
        """Serve the requests parked by a check slice: the next slice of skips."""
        todo, self.checking = self.checking, set()
        for index in todo:
            plan = self.plan_of[index]
            if plan.parked:
                self.serve_parked(plan, now)

    def serve(self, peer: Peer, run: TaskRun, draining: bool, now: float) -> None:
        """Answer ``peer``'s request: blocks, a park, or the word to stop (``draining``)."""
        if peer.worker is not None and peer.worker.mem_step:
            k = _memory.take_for(self, peer.worker, run, draining)
            if k >= 0:
                self._send_held(peer, run, [k], now)
                return
            draining = True  # nothing for a big worker: it is told to stop
        if not draining and self.abort_reason is None and self.shutdown_started is None:
            plan = self.plan_of[run.index]
            if plan.gate is not None and self._gate_holds(plan, now):
                plan.parked.append(peer)  # a plan's sample run: until its workers are here
                peer.parked = True
                return
            stream = peer.stream
            k = self.scheduler.acquire_index(run, stream)
            if k == CHECKS_PENDING:
                # back to the loop (Ctrl-C, other workers); it serves this request next
                plan.parked.appendleft(peer)
                peer.parked = True
                self.checking.add(run.index)
                self.dirty = True
                return
            if k < 0 and plan.backups is not None:
                k = plan.backups.copy_for(peer, now)  # a straggler's copy
            if k >= 0:
                held = [k]
                want = peer.batch
                suspects = plan.suspects
                if want > 1 and not (suspects and k in suspects):
                    # adaptive batching for fast blocks, never starving the other workers;
                    # a block lost with a batch before always travels alone
                    want = min(want, run.ready // max(1, plan.alive))
                    if want > _RUN_FROM and not suspects and run.local is not None:
                        # the run of ready blocks after the first, in a few C calls (for
                        # a block or two, the calls cost more than the blocks one by one)
                        self.scheduler.acquire_run(run, stream, held, want)
                    while len(held) < want:
                        k = self.scheduler.acquire_index(run, stream)
                        if k < 0:
                            break
                        if suspects and k in suspects:
                            self.scheduler.requeue_index(run, k)
                            break
                        held.append(k)
                self._send_held(peer, run, held, now)
                return
            if plan.shares_with and _sharing.movable(peer.worker):
                dst = _sharing.move_target(plan)  # a shared worker: another task's blocks
                if dst is not None:
                    self.move_worker(peer, plan, dst, now)
                    return
            if run.status == RUNNING and run.pending > 0:
                plan.parked.append(peer)
                peer.parked = True
                return
            backups = plan.backups
            if backups is not None and backups.wait(peer):
                return  # waits for a straggler to copy
        if peer.worker is not None:
            peer.worker.earned = True
            peer.worker.timeline.shutdown_requested(now)
        self.out.append(_new_tuple(SendFrame, (SEND_FRAME, peer, SHUTDOWN_FRAME)))

    def move_worker(self, peer: Peer, src: TaskRecord, dst: TaskRecord, now: float) -> None:
        """Move ``peer``'s worker from ``src``'s task to ``dst``'s (``_sharing``), in one
        reply on the same connection: ``MOVE``, ``dst``'s WELCOME and, when the worker has
        no teardown or setup to run first, its first block (a batch of one, as a new
        connection's first request gets). The connection serves ``dst`` from now on."""
        worker = peer.worker
        assert worker is not None
        self.staff.move(worker, src, dst, now)
        run = dst.run
        _sharing.rebind(peer, src.run, run)
        if run.spec.setup is not None:
            # its setup, after the old task's teardown, is bounded by the new task's
            # timeout from now
            peer.setup_due = now + run.spec.timeout_secs
            self._deadlines.watch(peer, peer.setup_due)
        head = [MOVE, run.task_id, dst.welcome]
        self.dirty = True
        if (
            src.run.spec.setup is None
            and run.spec.setup is None
            and self.abort_reason is None
            and self.shutdown_started is None
        ):
            k = self.scheduler.acquire_index(run, peer.stream)
            if k >= 0:
                self._send_held(peer, run, [k], now, head)
                return
        self._send(peer, encode(head))

    def _feed_starved(self, now: float) -> None:
        """Tasks with ready blocks and no worker, that cannot start one, take a worker
        waiting on a compatible task (``_sharing.starved``)."""
        for plan in self.plans.values():
            if plan.shares_with and _sharing.starved(plan, self.staff.eligible(plan)):
                donor = _sharing.parked_donor(plan)
                if donor is not None:
                    src, peer = donor
                    peer.parked = False  # its entry in src's queue is skipped
                    self.move_worker(peer, src, plan, now)

    def _gate_holds(self, plan: TaskRecord, now: float) -> bool:
        """Whether ``plan``'s start gate (:mod:`._gate`) still holds its requests; once it
        opens it is dropped, and the requests it held are served."""
        gate = plan.gate
        if gate is None:
            return False
        if gate.holds(plan.workers, plan.alive, self.staff.eligible(plan), now):
            return True
        plan.gate = None
        self.serve_parked(plan, now)
        return False

    def _send_held(
        self, peer: Peer, run: TaskRun, held: list[int], now: float, head: list[Any] | None = None
    ) -> None:
        """Send ``held`` to ``peer``, due back ``timeout`` seconds per block from now; in a
        SEND, or after ``head`` (a MOVE's fields)."""
        wall = now + self._wall_offset
        if peer.sent_at:
            # never before the end of its last batch, whatever the clock sync did
            # in between: one worker's blocks do not overlap in time
            last_end = peer.sent_wall + (now - peer.sent_at)
            if wall < last_end:
                wall = last_end
        peer.held = held
        peer.sent_at = now
        peer.sent_wall = wall
        peer.deadline = now + run.spec.timeout_secs * len(held)
        self._deadlines.watch(peer, peer.deadline + watchdog_margin_seconds(run))
        trail = peer.trail
        if trail is not None:  # ``Coherence.note``, inline: per batch
            trail += held
            if len(trail) > FOLD_BLOCKS and run.coherence is not None:
                run.coherence.fold(trail)
        msg = [SEND, *held] if head is None else [*head, *held]
        self.out.append(_new_tuple(SendFrame, (SEND_FRAME, peer, encode(msg))))

    # -- deadlines ------------------------------------------------------------------------
    def expire(self, now: float) -> None:
        """Reclaim the blocks of the connections that outlived their deadline and the
        watchdog's margin. Only the connections whose entry in the deadline heap fell due
        are looked at: O(expired + log N), whatever the number of connections."""
        for peer in self._deadlines.due(now):
            if peer.closed:
                continue
            if peer.setup_due is not None:  # its setup has not reported yet
                if now > peer.setup_due:
                    text = setup_timed_out(peer, now, self.errors)
                    self.stop_worker(peer.worker, text, now)
                    self.close(peer, now)
                else:
                    self._deadlines.watch(peer, peer.setup_due)
                continue
            if not peer.held:
                continue
            real = peer.deadline + watchdog_margin_seconds(peer.run)
            if now > real:
                _lost.reclaim(self, peer, now)
            else:
                # a later batch with a later deadline: look again then
                self._deadlines.watch(peer, real)

    def stop_worker(
        self,
        worker: ManagedWorker | None,
        text: str,
        now: float,
        kind: ExitKind = ExitKind.TIMEOUT,
    ) -> None:
        """Kill ``worker`` (if it is still running) and retire it with exit ``kind``."""
        if worker is not None and worker.exit is None:
            worker.exit = WorkerExit(kind, None, text)
            self.plan_of[worker.home.index].retired_unseen += 1
            worker.timeline.exited(now, kind)
            self.staff.retire(worker)
            self.out.append(Kill(KILL, worker))

    # -- the clock ------------------------------------------------------------------------
    def sync_clock(self, now: float, wall_now: float) -> None:
        """The wall clock reads ``wall_now`` at monotonic ``now``, both read at once (the
        wall times of blocks sent from then on follow it; the shell syncs on every tick)."""
        self._wall_offset = wall_now - now

    def tick(self, now: float) -> None:
        """The periodic tick, after :meth:`expire` and the worker poll: abandon tasks that
        cannot go on, start workers, serve parked requests, report progress."""
        self._check_abandon(now)
        self._rebalance(now)
        self._feed_starved(now)
        for plan in self.plans.values():
            if plan.parked:
                self.serve_parked(plan, now)
            if plan.backups is not None and (plan.backups.idle or plan.parked):
                offer(self, plan.backups, now)
            if plan.memory is not None and plan.memory.lost:
                _memory.expire_lost(self, plan, now)
        if self.dirty and now - self._last_progress >= _PROGRESS_SECONDS:
            self._last_progress = now
            self.dirty = False
            self.out.append(Progress(PROGRESS))

    def abort(self, reason: str) -> None:
        """The run is interrupted (a signal): nothing more is handed out or started."""
        self.abort_reason = reason

    def begin_shutdown(self, now: float) -> list[ManagedWorker]:
        """The run stops: parked requests are told to shut down. Returns the live workers."""
        self.shutdown_started = now
        for plan in self.plans.values():
            if plan.backups is not None:  # requests waiting for a straggler stop too
                plan.parked.extend(plan.backups.idle)
                plan.backups.idle.clear()
            while plan.parked:
                c = plan.parked.popleft()
                if not c.parked:
                    continue
                c.parked = False
                self.out.append(SendFrame(SEND_FRAME, c, SHUTDOWN_FRAME))
                if c.worker is not None:
                    c.worker.earned = True
                    c.worker.timeline.shutdown_requested(now)
        live = [w for w in self.workers.values() if w.exit is None]
        for w in live:
            w.timeline.run_shutdown(now)
        return live

    # -- workers (the bookkeeping is _staffing's) ------------------------------------
    def worker_running_at_end(self, worker: ManagedWorker, now: float) -> None:
        """The final poll found ``worker`` still running: it was interrupted."""
        worker.timeline.exited(now, ExitKind.INTERRUPTED)

    def worker_exited(
        self, worker: ManagedWorker, ex: WorkerExit, interrupted: bool = False
    ) -> bool:
        """A worker's process ended (or its launcher lost it), as ``ex`` says.

        True when the exit is news (the worker was not retired already, after a timeout):
        the shell then reads what the worker sent before it exited and may still be unread
        on each of ``worker.conns`` (as :meth:`receive` with ``draining``), and calls
        :meth:`settle_exit`. ``interrupted``: the final poll of an aborted run.
        """
        return self.staff.exited(worker, ex, interrupted)

    def settle_exit(self, worker: ManagedWorker, now: float) -> None:
        """Account the exit :meth:`worker_exited` recorded: close its connections, and
        give its start back or charge the restart budget."""
        assert worker.exit is not None
        for conn in list(worker.conns):
            self.close(conn, now)
        worker.timeline.exited(now, worker.exit.kind)
        self.staff.retire(worker)
        if self.plan_of[worker.run.index].memory is not None:
            _memory.settle_exit(self, worker, now)
        self.staff.account_exit(worker, self.address)

    def _check_abandon(self, now: float) -> None:
        for plan in self.plans.values():
            if not self.staff.stranded(plan):
                continue
            run = plan.run
            hit = self.scheduler.abandon(run, RESTART_CAP)
            for r in hit:
                if r is run:
                    logger.warning(
                        "task '%s' abandoned: worker restart cap reached; its %d remaining "
                        "blocks are lost (counted as orphaned)",
                        r.task_id,
                        r.lost_on_abandon,
                    )
                else:
                    logger.warning(
                        "downstream task '%s' abandoned: upstream input will never arrive, "
                        "accounting remaining blocks as orphaned",
                        r.task_id,
                    )
                p = self.plan_of[r.index]
                while p.parked:
                    c = p.parked.popleft()
                    if c.parked:
                        c.parked = False
                        self.serve(c, r, True, now)
            self.dirty = True

    def rebalance(self, now: float) -> None:
        """Book new workers where tasks can use them (at the start of the run)."""
        self._rebalance(now)

    def _rebalance(self, now: float, plans: Any = None) -> None:
        """Book workers where tasks can use them: in ``plans``, or in every task."""
        if plans is None:
            plans = _sharing.by_need(self.plans.values(), self.resources)  # the neediest first
        if (
            self.abort_reason is not None
            or self.fatal is not None
            or self.shutdown_started is not None
        ):
            return
        batches: dict[str, list[Booking]] = {}
        grew = True
        while grew:  # round robin: one worker per eligible task per pass
            grew = False
            for plan in plans:
                if self.staff.eligible(plan):
                    batches.setdefault(plan.run.task_id, []).append(self.staff.book(plan, now))
                    grew = True
        for plan in plans:
            if plan.memory is not None and plan.memory.held_back:
                _memory.book_big(self, plan, now, batches)
        for task_id, bookings in batches.items():
            self.out.append(Launch(LAUNCH, self.plans[task_id], bookings))

    def launched(self, plan: TaskRecord, booking: Booking, handle: Any, log: str | None) -> None:
        """The shell started the booked worker: ``handle`` is its launcher's handle."""
        self.staff.launched(plan, booking, handle, log)

    def launch_failed(self, plan: TaskRecord, booking: Booking, exc: Exception, now: float) -> None:
        """The booked worker could not be started (its log files, or its launcher, failed):
        the launcher will report nothing on it, so the booking is undone; the start it used
        stays spent."""
        self.staff.launch_failed(plan, booking, exc, now)
