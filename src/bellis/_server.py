"""The distributed run loop: sockets, deadlines and worker health around the scheduler.

Theory of operation
-------------------
One thread owns everything: a ``selectors`` loop over a listening socket and one
non-blocking socket per worker. A worker's ``ACQUIRE`` carries its finished block and
asks for the next, so a block costs one round trip; the reply is a ``SEND`` with the
block's flat index, a ``SHUTDOWN``, or nothing yet (the request is *parked* until a
release readies a block of its task).

Every connection must answer an HMAC challenge before anything else is read from it.
Anything malformed, oversized or unauthenticated drops that connection only; the run
goes on. Blocks held by a dropped connection go back to the retry path.

A tick (every 50 ms) reclaims blocks past their deadline, polls worker processes
through their launcher, replaces dead workers within the restart budget, abandons tasks
that cannot make progress, and feeds progress observers.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from ._aggregates import STATS_DTYPE
from ._block import BlockStatus
from ._client import handle_as_before, install_handler, restore_handler
from ._protocol import (
    ACQUIRE,
    BYE,
    HANDSHAKE_FRAME_BYTES,
    HELLO,
    MAX_CLIENT_FRAME_BYTES,
    REJECT,
    SEND,
    SHUTDOWN,
    STATS_ROW,
    FrameDecoder,
    encode,
    new_nonce,
    verify_mac,
    worker_token,
)
from ._scheduler import CHECKS_PENDING, RUNNING, Scheduler, TaskRun
from ._workers._launchers import WorkerExit
from ._workers._pool import ManagedWorker, TaskPlan, WorkerPool
from .errors import ConfigurationError, ProtocolError, TrackingError

__all__ = ["RunLoop"]

logger = logging.getLogger("bellis")

_SHUTDOWN_FRAME = encode([SHUTDOWN])
_TICK_SECONDS = 0.05
#: longest stretch of check_function skips one request runs before the loop looks at its
#: sockets and the abort flag again (a resume can skip millions of blocks this way)
_CHECK_SLICE_SECONDS = 0.05
_HANDSHAKE_SECONDS = 10.0
#: connections still in their handshake beyond this many: the oldest is dropped (a flood of
#: silent connections must not use up the descriptors the run needs for workers and logs)
_MAX_HANDSHAKING = 256
#: ... unless the oldest of them connected less than this long ago: then the listener rests
_HANDSHAKE_GRACE_SECONDS = 1.0
_MAX_OUTBUF = 1 << 20
# adaptive batching: a connection gets as many ready blocks at once as fit in about this
# much time (measured per block, round trip included), so fast blocks share one round
# trip; blocks slower than this go one at a time
_BATCH_TARGET_SECONDS = 0.02
_MAX_BATCH = 64
_TIMED_OUT = 4  # wire-only status: the worker's watchdog preempted this block
_STALLED = 5  # wire-only status: the worker's watchdog found this block stalled
_CREATED: Final = int(BlockStatus.CREATED)


_ROW_BYTES: Final = STATS_ROW.size
_INF: Final = float("inf")


def _measurements(rows: Any) -> np.ndarray[Any, Any]:
    """A message's ``rows`` as a ``STATS_DTYPE`` array, checked as a whole: wall, CPU
    and child CPU finite and non-negative (the integer fields are unsigned by type; the
    GPU slots are reserved and never read)."""
    if type(rows) is not bytes or not rows or len(rows) % _ROW_BYTES:
        raise ProtocolError("malformed measurements: not a whole number of stats rows")
    seconds = np.frombuffer(rows, dtype="<f8").reshape(-1, 8)[:, _SECONDS_COLUMNS]
    if not ((seconds >= 0.0) & (seconds < _INF)).all():
        raise ProtocolError("malformed measurements: a time is negative, infinite or NaN")
    return np.frombuffer(rows, dtype=STATS_DTYPE)


_SECONDS_COLUMNS: Final = [0, 1, 7]  # wall, cpu, cpu_children in a STATS_ROW


def _unmeasured_error(conn: _Conn, run: TaskRun, k: int) -> RuntimeError:
    return RuntimeError(
        f'task "{run.task_id}" has resource_tracking enabled but worker at '
        f"{conn.addr[0]}:{conn.addr[1]} returned block {run.task_id}/{k} without "
        "measurements. Wrap the block body in `with bellis.profile_block(block):` "
        "(daisy.profile_block) — bellis's own workers do this automatically, so this "
        "usually means a custom client is bypassing bellis.Client."
    )


def _watchdog_margin(conn: _Conn) -> float:
    """How long past a block's deadline the server waits before it reclaims the block.

    The worker's own watchdog fires at the same deadline (measured from when it received
    the block, so a little later) and polls every ``min(0.5, timeout / 20)`` seconds; it
    exits with code 87 after writing why to the worker's log. The server reclaims (and
    kills) only as the backstop for a worker whose watchdog cannot run; an EOF at or after
    the deadline is accounted as the timeout either way (see ``RunLoop._close``).
    """
    timeout = conn.run.task.timeout_secs if conn.run is not None else 0.0
    return min(0.5, max(0.01, timeout / 20)) + 0.25


class _Conn:
    __slots__ = (
        "addr",
        "authed",
        "batch",
        "deadline",
        "decoder",
        "held",
        "nonce",
        "opened_at",
        "outbuf",
        "run",
        "sent_at",
        "sent_wall",
        "sock",
        "worker",
        "worker_id",
    )

    def __init__(self, sock: socket.socket, addr: Any, now: float) -> None:
        self.sock = sock
        self.addr = addr
        self.decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self.outbuf = b""
        self.authed = False
        self.nonce = new_nonce()
        self.run: TaskRun | None = None
        self.worker: ManagedWorker | None = None
        self.worker_id = -1
        self.held: list[int] = []
        self.batch = 1
        self.sent_at = 0.0
        self.sent_wall = 0.0
        self.deadline = 0.0
        self.opened_at = now


class RunLoop(WorkerPool):
    """Serve one run of a scheduler to worker processes until every task is terminal."""

    def __init__(
        self,
        scheduler: Scheduler,
        plans: dict[str, TaskPlan],
        *,
        secret: bytes,
        bind_host: str,
        worker_key: bytes | None = None,
        advertise_host: str,
        resources: dict[str, int],
        observer: Any,
        errors: Any,
        context_extra: Callable[[TaskRun, int], dict[str, str]],
        log_paths: Callable[[str, int, str, bool], tuple[Any, Any]],
        log_mode: str = "file",
        grace_seconds: float = 5.0,
    ) -> None:
        self.s = scheduler
        self.plans = plans
        self.plan_of = {p.run.index: p for p in plans.values()}
        self.secret = secret
        self.worker_key = worker_key if worker_key is not None else new_nonce()
        self.resources = dict(resources)
        self.used: dict[str, int] = {k: 0 for k in resources}
        self.observer = observer
        self.errors = errors
        self.context_extra = context_extra
        self.log_paths = log_paths
        self.log_mode = log_mode
        self.grace_seconds = grace_seconds
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((bind_host, 0), backlog=256)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.host = advertise_host
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.conns: dict[int, _Conn] = {}
        self.workers: dict[int, ManagedWorker] = {}
        #: workers whose process has ended, by id: a connection that claims one of them
        #: comes from a worker that outlived its spawn function
        self.gone: dict[int, ManagedWorker] = {}
        self.next_worker_id = 0
        self.unmanaged_clients = 0
        #: connections that have not authenticated yet, oldest first
        self.handshaking: dict[int, _Conn] = {}
        self._listening = True
        self.abort_reason: str | None = None
        self.fatal: BaseException | None = None
        self.dirty = True
        self.shutdown_started: float | None = None
        self._last_progress = 0.0
        #: tasks with a request parked in the middle of check_function skips
        self._checking: set[int] = set()
        scheduler.bound_checks(time.monotonic, _CHECK_SLICE_SECONDS)

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, abort_flag: Callable[[], str | None]) -> None:
        """Serve until every task is terminal, an abort is requested or a fatal error."""
        self._notify("on_start")
        next_tick = time.monotonic() + _TICK_SECONDS
        select = self.sel.select
        try:
            self._rebalance()
            # the workers just spawned take a while to start: create the resource arrays
            # now (an error here still shuts the workers down, in the finally below)
            for plan in self.plans.values():
                if plan.run.store is not None:
                    plan.run.store.open_stats()
            while self.fatal is None:
                if self.s.is_done():
                    break
                reason = abort_flag()
                if reason is not None:
                    self.abort_reason = reason
                    break
                timeout = 0.0 if self._checking else next_tick - time.monotonic()
                for key, _mask in select(timeout if timeout > 0 else 0):
                    conn = key.data
                    if conn is None:
                        self._accept()
                    else:
                        self._readable(conn)
                if self._checking:
                    self._continue_checks()
                now = time.monotonic()
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + _TICK_SECONDS
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._stop_workers()
        finally:
            # every launcher is closed (its jobs cancelled, its files removed), whatever
            # went wrong while the workers were stopped
            for plan in self.plans.values():
                try:
                    plan.launcher.close()
                except Exception as exc:
                    logger.error(
                        "closing the %s launcher of task '%s' failed: %s; check for workers "
                        "left running",
                        getattr(plan.launcher, "name", "?"),
                        plan.run.task_id,
                        exc,
                    )
        self._notify("on_progress")
        self._notify("on_finish")

    def _stop_workers(self) -> None:
        now = time.monotonic()
        self.shutdown_started = now
        interrupted = self.abort_reason is not None or self.fatal is not None
        for plan in self.plans.values():
            while plan.parked:
                c = plan.parked.popleft()
                self._reply(c, _SHUTDOWN_FRAME)
                if c.worker is not None:
                    c.worker.earned = True
                    c.worker.timeline.shutdown_requested(now)
        live = [w for w in self.workers.values() if w.exit is None]
        for w in live:
            w.timeline.run_shutdown(now)
        if interrupted and live:
            # let in-flight blocks finish (their releases are recorded) while workers stop
            by_launcher: dict[int, list[ManagedWorker]] = {}
            for w in live:
                by_launcher.setdefault(id(self.plan_of[w.run.index].launcher), []).append(w)
            stopper = threading.Thread(
                target=self._cancel_all, args=(by_launcher,), name="bellis-cancel", daemon=True
            )
            stopper.start()
            while stopper.is_alive():
                for key, _ in self.sel.select(0.05):
                    if key.data is None:
                        self._accept()
                    else:
                        self._readable(key.data, draining=True)
            stopper.join()
        else:
            # every block is recorded: write the stores back to disk while the workers
            # exit, rather than after (closing them later finds nothing left to write)
            for plan in self.plans.values():
                if plan.run.store is not None:
                    try:
                        plan.run.store.flush()
                    except TrackingError as exc:
                        # closing the store flushes again and reports it; the workers
                        # must still be waited for
                        logger.debug("early flush failed: %s", exc)
            for plan in self.plans.values():
                plan.launcher.shutting_down()
            deadline = time.monotonic() + max(self.grace_seconds, 5.0)
            while any(w.exit is None for w in self.workers.values()):
                for key, _ in self.sel.select(0.005):
                    if key.data is None:
                        self._accept()
                    else:
                        self._readable(key.data, draining=True)
                self._poll_workers(time.monotonic(), replace=False)
                if time.monotonic() > deadline:
                    self._cancel_all(self._group_live())
                    break
        self._poll_workers(time.monotonic(), replace=False, final=True, interrupted=interrupted)
        for c in list(self.conns.values()):
            self._close(c, lost=False)
        if self._listening:
            self.sel.unregister(self.listener)
        self.listener.close()
        self.sel.close()

    # -- sockets --------------------------------------------------------------------------
    def _accept(self) -> None:
        now = time.monotonic()
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # out of descriptors (EMFILE/ENFILE) or the like: stop listening until the
                # next tick instead of being woken for the same pending connection forever
                logger.warning("accept failed: %s; not accepting for a moment", exc)
                self._pause_listening()
                return
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError as exc:
                # a peer that connected and closed at once (a port scan) can make these
                # fail on some systems (EINVAL on macOS): that client only is dropped
                logger.warning("dropping client %s: %s", addr, exc)
                sock.close()
                continue
            conn = _Conn(sock, addr, now)
            self.conns[sock.fileno()] = conn
            self.handshaking[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self._reply(conn, encode([0, conn.nonce]))
            if len(self.handshaking) >= _MAX_HANDSHAKING:
                oldest = next(iter(self.handshaking.values()))
                if now - oldest.opened_at < _HANDSHAKE_GRACE_SECONDS:
                    # a burst (many workers starting at once): read their HELLOs first
                    self._pause_listening()
                    return
                logger.warning(
                    "dropping client %s: %d connections are in their handshake",
                    oldest.addr,
                    _MAX_HANDSHAKING,
                )
                self._close(oldest, lost=True)

    def _pause_listening(self) -> None:
        """Accept nothing more until the next tick (which listens again)."""
        if self._listening:
            self.sel.unregister(self.listener)
            self._listening = False

    def _readable(self, conn: _Conn, draining: bool = False) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn, lost=True)
            return
        try:
            msgs = conn.decoder.feed(data)
            for msg in msgs:
                if conn.sock.fileno() < 0:
                    return
                self._handle(conn, msg, draining)
        except ProtocolError as exc:
            logger.warning("dropping client %s: %s", conn.addr, exc)
            self._close(conn, lost=True)
        except Exception:
            # whatever one client sent must not end the run for everyone: log it loudly,
            # drop that client, and let its blocks take the retry path
            logger.exception("error while serving client %s; dropping it", conn.addr)
            self._close(conn, lost=True)

    def _read_what_is_left(self, conn: _Conn) -> None:
        """Handle whatever a client that has gone sent before it went, without serving it
        more blocks, so the blocks it finished count as finished instead of lost."""
        for _ in range(1024):  # bounded: an exited peer sends nothing more
            if conn.sock.fileno() < 0:
                return
            try:
                if not conn.sock.recv(1, socket.MSG_PEEK):
                    return  # EOF and nothing unread before it
            except OSError:  # nothing buffered (EAGAIN), or a reset: nothing to read
                return
            self._readable(conn, draining=True)

    def _reply(self, conn: _Conn, frame: bytes) -> None:
        if conn.outbuf:
            conn.outbuf += frame
        else:
            try:
                n = conn.sock.send(frame)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return
            if n == len(frame):
                return
            conn.outbuf = frame[n:]
        if len(conn.outbuf) > _MAX_OUTBUF:
            logger.warning("dropping client %s: it does not read its replies", conn.addr)
            self._close(conn, lost=True)
            return
        # flush the rest synchronously but bounded: replies are tiny
        try:
            conn.sock.settimeout(1.0)
            conn.sock.sendall(conn.outbuf)
            conn.outbuf = b""
        except OSError:
            self._close(conn, lost=True)
        finally:
            if conn.sock.fileno() >= 0:
                conn.sock.setblocking(False)

    def _close(self, conn: _Conn, *, lost: bool) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        if conn.held and conn.run is not None and time.monotonic() >= conn.deadline:
            # the worker's watchdog preempted a block (exit 87) before the tick saw the
            # deadline pass: account it as the timeout it is, not as a plain disconnect
            self._timeout(conn)
            return
        self.conns.pop(fd, None)
        self.handshaking.pop(fd, None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.run is not None:
            plan = self.plan_of[conn.run.index]
            if conn in plan.parked:
                plan.parked.remove(conn)
        if conn.held and conn.run is not None:
            held = conn.held
            conn.held = []
            run = conn.run
            now = time.monotonic()
            if len(held) == 1:
                k = held[0]
                sid = run.geom.spatial_id_of(k)
                logger.warning("block lost block_id=%s/%d (worker disconnected)", run.task_id, sid)
                self._release(conn, run, k, False, False, conn.sent_at, now)
            else:
                # which block of the batch was running is unknown: none of them is charged a
                # failed attempt; they go back to the queue and each runs alone next time, so
                # a block that kills its worker is then caught (and counted) on its own
                plan = self.plan_of[run.index]
                for k in held:
                    self.s.requeue_index(run, k)
                    plan.suspects.add(k)
                logger.warning(
                    "worker holding a batch of %d blocks of task %s disconnected; they run "
                    "again one at a time",
                    len(held),
                    run.task_id,
                )
        if conn.worker is not None:
            conn.worker.conn = None

    # -- messages -------------------------------------------------------------------------
    def _handle(self, conn: _Conn, msg: list[Any], draining: bool) -> None:
        op = msg[0]
        if not conn.authed:
            self._hello(conn, msg)
            return
        if op != ACQUIRE and op != BYE:
            raise ProtocolError(f"unexpected opcode {op} from an authenticated client")
        n = len(msg) - 1
        rows = None
        if n % 4 == 1:  # the blocks, then the measurement rows
            n -= 1
            rows = msg[-1]
        elif n % 4:
            raise ProtocolError(f"malformed message of {len(msg)} fields")
        run = conn.run
        assert run is not None
        if conn in self.plan_of[run.index].parked:
            # parked twice, it would be served twice and lose the first block
            raise ProtocolError("sent a request while its previous one is still pending")
        if n:
            self._returned_batch(conn, run, msg, n, rows)
            if self.fatal is not None or conn.sock.fileno() < 0:
                return
        elif rows is not None:
            raise ProtocolError("measurement rows without blocks")
        if op == BYE:
            if conn.held:
                # blocks the worker never started go back to the queue, uncounted
                for k in conn.held:
                    self.s.requeue_index(run, k)
                conn.held = []
            self._close(conn, lost=False)
            return
        if conn.held:
            raise ProtocolError(
                f"asked for blocks while holding {len(conn.held)} of task {run.task_id} "
                "without returning them"
            )
        self._serve(conn, run, draining)

    def _returned_batch(self, conn: _Conn, run: TaskRun, msg: list[Any], n: int, rows: Any) -> None:
        """Take back the blocks a message returns: ``n`` fields of (k, status, row,
        error) groups, and the measurement ``rows`` they index (None when there are none)."""
        now = time.monotonic()
        table = None if rows is None else _measurements(rows)
        nrows = 0 if table is None else len(table)
        results: list[tuple[int, int, int, Any]] = []
        held = conn.held
        held_set = set(held)
        taken: set[int] = set()
        # only a worker that stops gives blocks back unstarted; one asking for more would get
        # the same block back with a fresh deadline, again and again
        unstarted_ok = msg[0] == BYE
        # validate the whole message before taking anything back: a malformed message
        # drops the connection, and every block it held then goes to the retry path
        for i in range(1, n + 1, 4):
            k = msg[i]
            if type(k) is not int:
                raise ProtocolError(f"malformed block index {k!r}")
            if k < 0:
                continue
            if k not in held_set or k in taken:
                # a well-behaved client only returns blocks it holds (a block reclaimed on
                # timeout closes its connection first)
                raise ProtocolError(
                    f"invalid block return: block {run.task_id}/{k} is not held by it"
                )
            taken.add(k)
            status, row, error = msg[i + 1], msg[i + 2], msg[i + 3]
            if type(status) is not int:
                raise ProtocolError(f"malformed status {status!r} for block {run.task_id}/{k}")
            if status == _CREATED and not unstarted_ok:
                raise ProtocolError(
                    f"block {run.task_id}/{k} returned unstarted by a client that asks for more"
                )
            if type(row) is not int or not -1 <= row < nrows:
                raise ProtocolError(f"malformed measurements for block {run.task_id}/{k}")
            if error is not None and type(error) is not str:
                raise ProtocolError(f"malformed error text for block {run.task_id}/{k}")
            results.append((k, status, row, error))
        if not results:
            return
        processed = [r for r in results if r[1] != BlockStatus.CREATED]
        # a batch's round trip is shared equally by the blocks it carried
        step = (now - conn.sent_at) / max(1, len(processed))
        if (table is not None or run.task.resource_tracking) and not self._record_measured(
            conn, run, processed, table, step
        ):
            # the run fails on this batch: its blocks are not held any more (a close later
            # must not charge them as lost attempts)
            conn.held = [k for k in held if k not in taken]
            return
        t = conn.sent_at
        suspects = self.plan_of[run.index].suspects
        # a block stays held until it is taken back, so if anything below raises, the
        # connection is dropped with the rest of the batch still held: those go to the
        # retry path instead of staying out forever
        back: set[int] = set()
        try:
            for k, status, row, error in results:
                if suspects:
                    suspects.discard(k)
                if status == BlockStatus.CREATED:
                    self.s.requeue_index(run, k)
                elif status == _TIMED_OUT or status == _STALLED:
                    self._timed_out_block(conn, run, k, t, t + step, stalled=status == _STALLED)
                    t += step
                else:
                    self._returned(conn, run, k, status, row >= 0, error, t, t + step)
                    t += step
                # (a block whose release raised stays held too: the scheduler ignores a
                # second release or requeue of a block it already took back)
                back.add(k)
                if self.fatal is not None:
                    return
        finally:
            conn.held = [k for k in held if k not in back]
        if processed and conn.held == []:
            # aim for batches of about _BATCH_TARGET_SECONDS: grow at most 2x per round
            # trip, shrink at once when blocks get slow
            ideal = int(_BATCH_TARGET_SECONDS / step) if step > 0 else _MAX_BATCH
            if ideal > conn.batch:
                conn.batch = min(ideal, conn.batch * 2, _MAX_BATCH)
            else:
                conn.batch = max(1, ideal)

    def _record_measured(
        self,
        conn: _Conn,
        run: TaskRun,
        processed: list[tuple[int, int, int, Any]],
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
        tracking = run.task.resource_tracking
        ks: list[int] = []
        picks: list[int] = []
        slots: list[int] = []
        for i, (k, status, row, _error) in enumerate(processed):
            if status != BlockStatus.SUCCESS:
                continue
            if row >= 0:
                ks.append(k)
                picks.append(row)
                slots.append(i)
            elif tracking:
                self.fatal = _unmeasured_error(conn, run, k)
                return False
        if not ks or table is None or run.status != RUNNING:
            return True
        measured = table[picks]
        self.plan_of[run.index].aggregates.add_measured(np.full(len(ks), step), measured)
        if run.store is not None:
            sent = conn.sent_wall + np.asarray(slots, dtype=np.float64) * step
            wid = conn.worker_id if conn.worker is not None else -1
            run.record_measured(ks, measured, wid, sent, sent + step)
        return True

    def _hello(self, conn: _Conn, msg: list[Any]) -> None:
        if (
            msg[0] != HELLO
            or len(msg) not in (6, 7)
            or not verify_mac(self.secret, conn.nonce, msg[1])
        ):
            raise ProtocolError("client failed authentication (wrong or missing run secret)")
        task_id, worker_id = msg[2], msg[3]
        if not isinstance(task_id, str) or not isinstance(worker_id, int):
            raise ProtocolError("malformed hello")
        plan = self.plans.get(task_id)
        if plan is None:
            self._reply(conn, encode([REJECT, f"no task {task_id!r} in this run"]))
            self._close(conn, lost=False)
            return
        conn.authed = True
        self.handshaking.pop(conn.sock.fileno(), None)
        conn.decoder.limit(MAX_CLIENT_FRAME_BYTES)
        conn.run = plan.run
        worker = None
        # only a client that proves it holds that worker's own token is the managed worker
        # (anyone with the run's secret may connect, but only as an unmanaged client)
        if worker_id >= 0 and len(msg) == 7:
            token = worker_token(self.worker_key, worker_id)
            if verify_mac(token, conn.nonce, msg[6]):
                worker = self.workers.get(worker_id) or self.gone.get(worker_id)
        if worker is not None and worker.run is plan.run and worker.conn is None:
            if worker.exit is not None:
                self._late_worker(conn, worker.exit, worker_id, task_id)
                return
            conn.worker = worker
            conn.worker_id = worker_id
            worker.conn = conn
            first = not worker.ever_connected
            worker.ever_connected = True
            if first:
                setup = msg[5]
                worker.timeline.first_acquire(time.monotonic())
                if isinstance(setup, int | float):
                    worker.timeline.reported_setup(float(setup))
        else:
            self.unmanaged_clients += 1
            plan.timelines.unmanaged_client()
        self._reply(conn, plan.welcome)

    def _late_worker(self, conn: _Conn, exit_: WorkerExit, worker_id: int, task_id: str) -> None:
        """A managed worker connected after its exit: turned away. Seen to exit, it outlived
        its spawn function (a configuration the run cannot work with); given up for lost,
        its blocks went to others already."""
        seen = exit_.seen
        if seen:
            reason = "this worker's process already exited"
        else:
            reason = "this worker was given up for lost"
        self._reply(conn, encode([REJECT, reason]))
        self._close(conn, lost=False)
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

    def _returned(
        self,
        conn: _Conn,
        run: TaskRun,
        k: int,
        status: Any,
        measured: bool,
        error: Any,
        sent: float,
        returned: float,
    ) -> None:
        success = status == BlockStatus.SUCCESS
        if conn.worker is not None:
            conn.worker.earned = True
        if not success:
            text = error if isinstance(error, str) else "block failed"
            self._record_error(conn, run, k, text)
        self._release(conn, run, k, success, measured, sent, returned)

    def _record_error(self, conn: _Conn, run: TaskRun, k: int, text: str) -> None:
        if run.first_worker_error is None:
            run.first_worker_error = text
        run.last_worker_error = text
        sid = run.geom.spatial_id_of(k)
        log = conn.worker.log if conn.worker is not None else None
        self.errors.add(run.task_id, sid, text, log)
        logger.warning("block failed block_id=%s/%d error=%s", run.task_id, sid, text)

    def _release(
        self,
        conn: _Conn,
        run: TaskRun,
        k: int,
        success: bool,
        measured: bool,
        sent: float,
        returned: float,
    ) -> None:
        """Release block ``k``; a measured success was stored and aggregated already (see
        :meth:`_record_measured`)."""
        wall0 = conn.sent_wall + (sent - conn.sent_at)
        accepted = self.s.release_index(
            run,
            k,
            success,
            None,
            conn.worker_id if conn.worker is not None else -1,
            wall0,
            wall0 + (returned - sent),
        )
        plan = self.plan_of[run.index]
        if accepted and not (measured and success):
            # (a release the scheduler ignores, of a task that already ended, counts in
            # no block figure, like the measured ones _record_measured leaves out then)
            plan.aggregates.add_block(returned - sent, None, not success)
        if conn.worker is not None:
            tl = conn.worker.timeline
            tl.sent(sent)
            tl.returned(returned, not success)
        self.dirty = True
        # wake parked requests (this task and downstream tasks)
        if plan.parked:
            self._serve_parked(plan)
        for _edge, down in run.down_edges:
            if down.ready:
                dplan = self.plan_of[down.index]
                if dplan.parked:
                    self._serve_parked(dplan)
                if dplan.alive == 0:
                    self._rebalance()

    def _serve_parked(self, plan: TaskPlan) -> None:
        run = plan.run
        while (
            plan.parked
            and run.index not in self._checking
            and (run.ready > 0 or run.status != RUNNING or run.pending <= 0)
        ):
            c = plan.parked.popleft()
            self._serve(c, run, False)

    def _continue_checks(self) -> None:
        """Serve the requests parked by a check slice: the next slice of skips."""
        todo, self._checking = self._checking, set()
        for index in todo:
            plan = self.plan_of[index]
            if plan.parked:
                self._serve_parked(plan)

    def _serve(self, conn: _Conn, run: TaskRun, draining: bool) -> None:
        if not draining and self.abort_reason is None and self.shutdown_started is None:
            k = self.s.acquire_index(run)
            if k == CHECKS_PENDING:
                # back to the loop (Ctrl-C, other workers); it serves this request next
                self.plan_of[run.index].parked.appendleft(conn)
                self._checking.add(run.index)
                self.dirty = True
                return
            if k >= 0:
                held = [k]
                want = conn.batch
                plan = self.plan_of[run.index]
                suspects = plan.suspects
                if want > 1 and not (suspects and k in suspects):
                    # adaptive batching for fast blocks, never starving the other workers;
                    # a block lost with a batch before always travels alone
                    want = min(want, run.ready // max(1, plan.alive))
                    while len(held) < want:
                        k = self.s.acquire_index(run)
                        if k < 0:
                            break
                        if suspects and k in suspects:
                            self.s.requeue_index(run, k)
                            break
                        held.append(k)
                now = time.monotonic()
                conn.held = held
                conn.sent_at = now
                conn.sent_wall = time.time()
                conn.deadline = now + run.task.timeout_secs * len(held)
                self._reply(conn, encode([SEND, *held]))
                return
            if run.status == RUNNING and run.pending > 0:
                self.plan_of[run.index].parked.append(conn)
                return
        if conn.worker is not None:
            conn.worker.earned = True
            conn.worker.timeline.shutdown_requested(time.monotonic())
        self._reply(conn, _SHUTDOWN_FRAME)

    # -- ticks: deadlines, worker health, spawning ------------------------------------------
    def _tick(self, now: float) -> None:
        if not self._listening and self.shutdown_started is None:
            self.sel.register(self.listener, selectors.EVENT_READ, None)
            self._listening = True
        for conn in list(self.conns.values()):
            if conn.held and now > conn.deadline + _watchdog_margin(conn):
                self._timeout(conn)
            elif not conn.authed and now - conn.opened_at > _HANDSHAKE_SECONDS:
                logger.warning(
                    "dropping client %s: no handshake within %ss", conn.addr, _HANDSHAKE_SECONDS
                )
                self._close(conn, lost=True)
        self._poll_workers(now, replace=True)
        self._check_abandon()
        self._rebalance()
        for plan in self.plans.values():
            if plan.parked:
                self._serve_parked(plan)
        if self.dirty and now - self._last_progress >= 0.5:
            self._last_progress = now
            self.dirty = False
            self._notify("on_progress")

    def _timed_out_block(
        self,
        conn: _Conn,
        run: TaskRun,
        k: int,
        sent: float,
        returned: float,
        *,
        stalled: bool = False,
    ) -> None:
        """Account one block as timed out, or ``stalled`` (reclaimed), and release it to
        the retry path."""
        sid = run.geom.spatial_id_of(k)
        if stalled:
            run.stall_reclaims += 1
            kind, limit = "stalled", f"stall_timeout={run.task.stall_timeout_secs or 0.0:g}s"
            text = (
                f"block {run.task_id}/{sid} stalled: no CPU, IO or heartbeat for its "
                f"stall_timeout ({run.task.stall_timeout_secs or 0.0:g}s)"
            )
        else:
            run.timeout_reclaims += 1
            kind, limit = "timed_out", f"timeout={run.task.timeout_secs:g}s"
            text = (
                f"block {run.task_id}/{sid} exceeded the block timeout ({run.task.timeout_secs:g}s)"
            )
        logger.warning("block lost block_id=%s/%d %s=true (%s)", run.task_id, sid, kind, limit)
        self._record_error(conn, run, k, text)
        self._release(conn, run, k, False, False, sent, returned)
        worker = conn.worker
        if worker is not None and worker.exit is None:
            exit_kind = "stalled" if stalled else "timeout"
            worker.exit = WorkerExit(exit_kind, None, text)
            worker.timeline.exited(time.monotonic(), exit_kind)
            self._retire(worker)
            launcher = self.plan_of[run.index].launcher
            kill = getattr(launcher, "kill", None)
            if kill is not None:
                kill(worker.handle)

    def _timeout(self, conn: _Conn) -> None:
        """The backstop: a connection's blocks outlived their deadline."""
        run = conn.run
        assert run is not None
        held = conn.held
        conn.held = []
        now = time.monotonic()
        if len(held) == 1:
            self._timed_out_block(conn, run, held[0], conn.sent_at, now)
            self._close(conn, lost=False)
            return
        # a whole batch outlived its deadline and the worker's watchdog did not say which
        # block hung: none is charged; each runs alone next time, where a hang is caught
        plan = self.plan_of[run.index]
        for k in held:
            self.s.requeue_index(run, k)
            plan.suspects.add(k)
        text = (
            f"a batch of {len(held)} blocks of task {run.task_id} outlived its deadline; "
            "its worker was stopped and the blocks run again one at a time"
        )
        logger.warning("%s", text)
        worker = conn.worker
        if worker is not None and worker.exit is None:
            worker.exit = WorkerExit("timeout", None, text)
            worker.timeline.exited(now, "timeout")
            self._retire(worker)
            kill = getattr(plan.launcher, "kill", None)
            if kill is not None:
                kill(worker.handle)
        self._close(conn, lost=False)

    def _notify(self, method: str) -> None:
        if self.observer is None:
            return
        from ._progress import safe_notify

        safe_notify(self.observer, method, self.s.task_states)


def install_abort_handlers() -> tuple[Callable[[], str | None], Callable[[], None]]:
    """SIGINT/SIGTERM set a flag the loop polls; returns (poll, restore)."""
    flag: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        return (lambda: None), (lambda: None)

    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            # a child forked during the run (a pool started by a check_function): it ends
            # as it would have without bellis, instead of setting a flag nobody reads
            handle_as_before(signum, frame, old_int if signum == signal.SIGINT else old_term)
            return
        flag.append("SIGINT" if signum == signal.SIGINT else "SIGTERM")

    old_int = install_handler(signal.SIGINT, handler)
    old_term = install_handler(signal.SIGTERM, handler)

    def poll() -> str | None:
        return flag[0] if flag else None

    def restore() -> None:
        restore_handler(signal.SIGINT, old_int)
        restore_handler(signal.SIGTERM, old_term)

    return poll, restore
