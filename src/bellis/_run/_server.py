"""The distributed run loop: the sockets, the clock and the signals around the dispatcher.

Theory of operation
-------------------
One thread owns everything: a ``selectors`` loop over a listening socket and one
non-blocking socket per worker (at the end, a thread writes the stores back while this
one waits for the workers to exit). Every decision is the dispatcher's
(:mod:`bellis._scheduling._dispatch`); this shell turns what happens into its events (a message, a
closed connection, the clock, a worker's exit) and carries out the instructions it returns
(send a frame, close a connection, start or kill workers, report progress).

Every connection must answer an HMAC challenge before anything else is read from it (at
most :data:`~bellis._run._transport.HANDSHAKE_SECONDS`, and a bounded number at once; the
sockets, buffers and that cap are :mod:`bellis._run._transport`'s). Anything malformed,
oversized or unauthenticated drops that connection only; the run goes on.

A tick (every 50 ms) reclaims blocks past their deadline, polls worker processes through
their launchers, then lets the dispatcher replace workers, abandon tasks and report
progress. A launcher that offers an exit descriptor (``exit_watch``: the local launcher's
pidfds and fork-server socket in one epoll) has it in the selector: the loop wakes as soon
as one of its workers ends, polls the workers it names and lets the dispatcher replace them
at once, instead of at the next tick; its other workers are not polled at all.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from .._launchers._base import WorkerLauncher
from .._protocol import MAX_CLIENT_FRAME_BYTES, new_nonce
from .._scheduling._dispatch import Dispatcher
from .._scheduling._instructions import CLOSE, KILL, LAUNCH, PROGRESS, SEND_FRAME
from .._scheduling._records import TaskRecord
from .._scheduling._scheduler import Scheduler
from .._scheduling._task_run import TaskRun
from .._stats._errorgroups import ErrorCollector
from ..errors import ProtocolError, TrackingError
from ._pool import WorkerPool
from ._transport import Conn, Transport

__all__ = ["RunLoop"]

logger = logging.getLogger("bellis")

_TICK_SECONDS = 0.05
#: longest stretch of check_function skips one request runs before the loop looks at its
#: sockets and the abort flag again (a resume can skip millions of blocks this way)
_CHECK_SLICE_SECONDS = 0.05


class _ExitWatch:
    """A launcher's exit descriptor in the selector (its key's data)."""

    __slots__ = ("fd", "launcher")

    def __init__(self, launcher: WorkerLauncher, fd: int) -> None:
        self.launcher = launcher
        self.fd = fd


class RunLoop:
    """Serve one run of a scheduler to worker processes until every task is terminal."""

    def __init__(
        self,
        scheduler: Scheduler,
        plans: dict[str, TaskRecord],
        launchers: dict[str, WorkerLauncher],
        *,
        secret: bytes,
        bind_host: str,
        worker_key: bytes | None = None,
        advertise_host: str,
        resources: dict[str, int],
        observer: Any,
        errors: ErrorCollector,
        context_extra: Callable[[TaskRun, int], dict[str, str]],
        log_paths: Callable[[str, int, str, bool], tuple[Any, Any]],
        log_mode: str = "file",
        grace_seconds: float = 5.0,
        while_workers_start: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        #: run-start work that can wait until the first workers are launched (the code
        #: versions of the run: no block can come back before the loop reads one)
        self._while_workers_start = while_workers_start
        self.plans = plans
        self.observer = observer
        self.net = Transport(bind_host, self._drop)
        self.port = self.net.port
        self.host = advertise_host
        self.dispatcher = Dispatcher(
            scheduler,
            plans,
            secret=secret,
            worker_key=worker_key if worker_key is not None else new_nonce(),
            resources=resources,
            errors=errors,
            address=(advertise_host, self.port),
        )
        self.pool = WorkerPool(
            plans,
            launchers,
            context_extra=context_extra,
            log_paths=log_paths,
            log_mode=log_mode,
            grace_seconds=grace_seconds,
        )
        self._watches = [_ExitWatch(launcher, fd) for launcher, fd in self.pool.watched.values()]
        for watch in self._watches:
            self.net.watch(watch.fd, watch)
        scheduler.bound_checks(time.monotonic, _CHECK_SLICE_SECONDS)

    @property
    def abort_reason(self) -> str | None:
        return self.dispatcher.abort_reason

    @property
    def fatal(self) -> BaseException | None:
        return self.dispatcher.fatal

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, abort_flag: Callable[[], str | None]) -> None:
        """Serve until every task is terminal, an abort is requested or a fatal error."""
        d = self.dispatcher
        self._notify("on_start")
        next_tick = time.monotonic() + _TICK_SECONDS
        select = self.net.sel.select
        try:
            d.sync_clock(time.monotonic(), time.time())
            d.rebalance(time.monotonic())
            self._carry_out()
            # the workers just spawned take a while to start: create the resource arrays
            # now (an error here still shuts the workers down, in the finally below)
            for plan in self.plans.values():
                if plan.run.store is not None:
                    plan.run.store.open_stats()
            if self._while_workers_start is not None:
                self._while_workers_start()
            while d.fatal is None:
                if self.scheduler.is_done():
                    break
                reason = abort_flag()
                if reason is not None:
                    d.abort(reason)
                    break
                timeout = 0.0 if d.checking else next_tick - time.monotonic()
                for key, _mask in select(timeout if timeout > 0 else 0):
                    conn = key.data
                    if conn is None:
                        self._accept()
                    elif conn.__class__ is _ExitWatch:
                        self._worker_ended(conn.launcher)
                    else:
                        self._read(conn)
                if d.checking:
                    d.continue_checks(time.monotonic())
                    self._carry_out()
                now = time.monotonic()
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + _TICK_SECONDS
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        try:
            self._stop_workers()
        finally:
            # every launcher is closed (its jobs cancelled, its files removed), whatever
            # went wrong while the workers were stopped
            self.pool.close()
        self._notify("on_progress")
        self._notify("on_finish")

    def _stop_workers(self) -> None:
        d = self.dispatcher
        interrupted = d.abort_reason is not None or d.fatal is not None
        live = d.begin_shutdown(time.monotonic())
        self._carry_out()
        #: an error of the flusher thread below other than a store's own
        flushed: list[BaseException] = []
        if interrupted:
            # the launchers are polled once all are stopped (the final poll below)
            self._unwatch()
        if interrupted and live:
            # let in-flight blocks finish (their releases are recorded) while workers stop
            stopper = threading.Thread(
                target=self.pool.cancel, args=(live,), name="bellis-cancel", daemon=True
            )
            stopper.start()
            while stopper.is_alive():
                self._serve_draining(0.05)
            stopper.join()
        else:
            # every block is recorded: write the stores back while the workers exit, in a
            # thread of its own (an S3 store's writes are round trips), joined once they
            # have exited (closing the stores later finds nothing left to write)
            flusher = threading.Thread(
                target=self._flush_stores, args=(flushed,), name="bellis-flush", daemon=True
            )
            flusher.start()
            try:
                self.pool.shutting_down()
                deadline = time.monotonic() + max(self.pool.grace_seconds, 5.0)
                # watched exits wake the select; the others are polled every 5 ms
                wait = 0.005 if self.pool.unwatched else _TICK_SECONDS
                # the workers whose exit is yet to be seen (no scan over the workers)
                while any(plan.alive > 0 for plan in self.plans.values()):
                    self._serve_draining(wait)
                    self._poll_workers(time.monotonic())
                    if time.monotonic() > deadline:
                        self.pool.cancel([w for w in d.workers.values() if w.exit is None])
                        break
                self._unwatch()
            finally:
                flusher.join()
                if flushed and sys.exc_info()[1] is not None:
                    # another error unwinds (this loop's, or the run's that called this
                    # at its end): that one is raised, this one said
                    logger.error("writing the tracking stores back failed: %r", flushed[0])
                    flushed.clear()
        self._poll_workers(time.monotonic(), final=True, interrupted=interrupted)
        self._end_connections()
        self.net.close()
        if flushed:  # once the connections are closed
            raise flushed[0]

    def _flush_stores(self, failed: list[BaseException]) -> None:
        """Each store's flush (the flusher thread of :meth:`_stop_workers`); an error
        other than the store's own is handed back in ``failed``."""
        try:
            for plan in self.plans.values():
                if plan.run.store is not None:
                    try:
                        plan.run.store.flush()
                    except TrackingError as exc:
                        # closing the store flushes again and reports it
                        logger.debug("early flush failed: %s", exc)
        except BaseException as exc:  # raised by the driver's thread once joined
            failed.append(exc)

    def _end_connections(self) -> None:
        """Close every connection at the end of the run so that each peer sees an orderly
        end of stream, not a reset.

        A socket closed while it holds bytes it never read (a straggler's HELLO, a request
        that crossed the SHUTDOWN) makes the kernel send a TCP reset instead of a FIN, and
        bytes that arrive after the close are answered with a reset too. So: the requests
        already here are answered (a SHUTDOWN: the run is draining), then each connection
        is half-closed (its peer reads the end of stream after whatever was sent) and what
        its peer still sends is read and dropped until it closes its end, for at most
        ``_LINGER_SECONDS``; only then is it closed.
        """
        conns = list(self.net.conns.values())
        for c in conns:
            self._read_what_is_left(c)
        self.net.linger(conns)
        for c in conns:
            self.dispatcher.close(c, time.monotonic())
        self._carry_out()

    def _serve_draining(self, timeout_seconds: float) -> None:
        for key, _ in self.net.sel.select(timeout_seconds):
            if key.data is None:
                self._accept()
            elif key.data.__class__ is _ExitWatch:
                self._poll_workers(time.monotonic(), launcher=key.data.launcher)
            else:
                self._read(key.data, draining=True)

    def _unwatch(self) -> None:
        """Take the launchers' exit descriptors out of the selector."""
        for watch in self._watches:
            self.net.unwatch(watch.fd)
        self._watches = []

    # -- instructions ---------------------------------------------------------------------
    def _carry_out(self) -> None:
        """Carry out the dispatcher's instructions, in order (carrying one out may add more)."""
        out = self.dispatcher.out
        i = 0
        try:
            while i < len(out):
                instr = out[i]
                i += 1
                # (every peer the dispatcher names is a Conn: this shell made each one)
                if instr.op == SEND_FRAME:
                    self.net.reply(cast(Conn, instr.peer), instr.frame)
                elif instr.op == CLOSE:
                    self.net.close_socket(cast(Conn, instr.peer))
                elif instr.op == LAUNCH:
                    self._launch(instr.plan, instr.bookings)
                elif instr.op == KILL:
                    self.pool.kill(instr.worker)
                elif instr.op == PROGRESS:
                    self._notify("on_progress")
        finally:
            del out[:i]  # each is carried out once, even when one raised

    def _launch(self, plan: TaskRecord, bookings: list[Any]) -> None:
        for booking, handle, exc in self.pool.start(plan, bookings):
            if handle is None:
                assert exc is not None
                self.dispatcher.launch_failed(plan, booking, exc, time.monotonic())
            else:
                self.dispatcher.launched(
                    plan, booking, handle, self.pool.log_location(plan, handle)
                )

    def _poll_workers(
        self,
        now: float,
        *,
        final: bool = False,
        interrupted: bool = False,
        launcher: WorkerLauncher | None = None,
    ) -> bool:
        """Poll the workers that may have ended (every worker with ``final``; those of
        ``launcher`` only, where given); True if one had."""
        d = self.dispatcher
        ended = False
        polled = (
            self.pool.poll(d.workers.values()) if final else self.pool.poll_due(d.workers, launcher)
        )
        for w, ex in polled:
            if ex is None:
                if final:
                    d.worker_running_at_end(w, now)
                continue
            ended = True
            if d.worker_exited(w, ex, interrupted):
                for conn in list(w.conns):
                    if isinstance(conn, Conn):
                        # what it sent before exiting (its last returns) may still be unread
                        self._read_what_is_left(conn)
                d.settle_exit(w, now)
            self._carry_out()
        return ended

    def _worker_ended(self, launcher: WorkerLauncher) -> None:
        """A launcher's exit descriptor is readable: settle the exits, start replacements."""
        now = time.monotonic()
        if self._poll_workers(now, launcher=launcher):
            self.dispatcher.tick(now)
            self._carry_out()

    def _tick(self, now: float) -> None:
        for conn in self.net.tick(now, accepting=self.dispatcher.shutdown_started is None):
            self.dispatcher.close(conn, now)
        self.dispatcher.expire(now)
        self._carry_out()
        self._poll_workers(now)
        self.dispatcher.sync_clock(time.monotonic(), time.time())
        self.dispatcher.tick(now)
        self._carry_out()

    def _notify(self, method: str) -> None:
        if self.observer is None:
            return
        from ._progress import safe_notify

        safe_notify(self.observer, method, self.scheduler.task_states)

    # -- sockets (bellis._run._transport's) ------------------------------------------------------
    def _accept(self) -> None:
        for _conn in self.net.accept(time.monotonic()):
            self._carry_out()  # (its challenge may have failed: it is closed)

    def _drop(self, conn: Conn) -> None:
        """The transport gave up on ``conn`` (it does not read its replies)."""
        self.dispatcher.close(conn, time.monotonic())

    def _read(self, conn: Conn, draining: bool = False) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        d = self.dispatcher
        if not data:
            d.close(conn, time.monotonic())
            self._carry_out()
            return
        try:
            msgs = conn.decoder.feed(data)
        except ProtocolError as exc:
            logger.warning("dropping client %s: %s", conn.addr, exc)
            d.close(conn, time.monotonic())
            self._carry_out()
            return
        authed = conn.authed
        for msg in msgs:
            if conn.closed:
                break
            d.receive(conn, msg, time.monotonic(), draining)
            if conn.authed and not authed:
                authed = True
                self.net.authenticated(conn)
                conn.decoder.limit(MAX_CLIENT_FRAME_BYTES)
            self._carry_out()

    def _read_what_is_left(self, conn: Conn) -> None:
        """Handle whatever a client that has gone sent before it went, without serving it
        more blocks, so the blocks it finished count as finished instead of lost."""
        for _ in range(1024):  # bounded: an exited peer sends nothing more
            if not self.net.has_unread(conn):
                return
            self._read(conn, draining=True)
