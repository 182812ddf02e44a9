"""The distributed run loop: the sockets, the clock and the signals around the dispatcher.

Theory of operation
-------------------
One thread owns everything: a ``selectors`` loop over a listening socket and one
non-blocking socket per worker. Every decision is the dispatcher's
(:mod:`bellis._dispatch`); this shell turns what happens into its events (a message, a
closed connection, the clock, a worker's exit) and carries out the instructions it returns
(send a frame, close a connection, start or kill workers, report progress).

Every connection must answer an HMAC challenge before anything else is read from it (at
most :data:`_HANDSHAKE_SECONDS`, and a bounded number at once). Anything malformed,
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
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ._dispatch import CLOSE, KILL, LAUNCH, PROGRESS, SEND_FRAME, Dispatcher
from ._protocol import (
    CHALLENGE,
    HANDSHAKE_FRAME_BYTES,
    MAX_CLIENT_FRAME_BYTES,
    FrameDecoder,
    encode,
    new_nonce,
)
from ._run_state import Peer, TaskPlan
from ._scheduler import Scheduler, TaskRun
from ._workers._pool import WorkerPool
from .errors import ProtocolError, TrackingError

__all__ = ["RunLoop"]

logger = logging.getLogger("bellis")

_TICK_SECONDS = 0.05
#: longest stretch of check_function skips one request runs before the loop looks at its
#: sockets and the abort flag again (a resume can skip millions of blocks this way)
_CHECK_SLICE_SECONDS = 0.05
_HANDSHAKE_SECONDS = 10.0
#: with this many connections in their handshake the server stops accepting until one
#: ends or is dropped after _HANDSHAKE_SECONDS (a flood of silent connections must not use
#: up the descriptors the run needs for workers and logs: it holds at most these and the
#: listen backlog); a burst of real workers waits in the backlog meanwhile
_MAX_HANDSHAKING = 256
_MAX_OUTBUF_BYTES = 1 << 20
# at the run's end, how long a half-closed connection waits for its peer to close its end
_LINGER_SECONDS = 0.5


class _Conn(Peer):
    """A connection: the dispatcher's record of it, with its socket and buffers."""

    __slots__ = ("decoder", "outbuf", "sock")

    def __init__(self, sock: socket.socket, addr: Any, now: float) -> None:
        super().__init__(addr, new_nonce(), now)
        self.sock = sock
        self.decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self.outbuf = b""


class _ExitWatch:
    """A launcher's exit descriptor in the selector (its key's data)."""

    __slots__ = ("fd", "launcher")

    def __init__(self, launcher: Any, fd: int) -> None:
        self.launcher = launcher
        self.fd = fd


class RunLoop:
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
        self.observer = observer
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((bind_host, 0), backlog=socket.SOMAXCONN)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.host = advertise_host
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.d = Dispatcher(
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
            context_extra=context_extra,
            log_paths=log_paths,
            log_mode=log_mode,
            grace_seconds=grace_seconds,
        )
        self.conns: dict[int, _Conn] = {}
        self._watches = [_ExitWatch(launcher, fd) for launcher, fd in self.pool.watched.values()]
        for watch in self._watches:
            self.sel.register(watch.fd, selectors.EVENT_READ, watch)
        #: connections that have not authenticated yet, oldest first
        #: accepting was paused at the handshake cap (said once per run)
        self._capped = False
        self.handshaking: dict[int, _Conn] = {}
        self._listening = True
        scheduler.bound_checks(time.monotonic, _CHECK_SLICE_SECONDS)

    @property
    def abort_reason(self) -> str | None:
        return self.d.abort_reason

    @property
    def fatal(self) -> BaseException | None:
        return self.d.fatal

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, abort_flag: Callable[[], str | None]) -> None:
        """Serve until every task is terminal, an abort is requested or a fatal error."""
        d = self.d
        self._notify("on_start")
        next_tick = time.monotonic() + _TICK_SECONDS
        select = self.sel.select
        try:
            d.sync_clock(time.monotonic(), time.time())
            d.rebalance(time.monotonic())
            self._carry_out()
            # the workers just spawned take a while to start: create the resource arrays
            # now (an error here still shuts the workers down, in the finally below)
            for plan in self.plans.values():
                if plan.run.store is not None:
                    plan.run.store.open_stats()
            while d.fatal is None:
                if self.s.is_done():
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
        d = self.d
        interrupted = d.abort_reason is not None or d.fatal is not None
        live = d.begin_shutdown(time.monotonic())
        self._carry_out()
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
        self._poll_workers(time.monotonic(), final=True, interrupted=interrupted)
        self._end_connections()
        if self._listening:
            self.sel.unregister(self.listener)
        self.listener.close()
        self.sel.close()

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
        conns = list(self.conns.values())
        for c in conns:
            self._read_what_is_left(c)
        waiting = selectors.DefaultSelector()
        for c in conns:
            if c.sock.fileno() < 0:
                continue  # closed while its last messages were read
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                continue  # already reset by its peer: nothing to wait for
            waiting.register(c.sock, selectors.EVENT_READ)
        deadline = time.monotonic() + _LINGER_SECONDS
        while waiting.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in waiting.select(left):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    waiting.unregister(sock)
        waiting.close()
        for c in conns:
            self.d.close(c, time.monotonic())
        self._carry_out()

    def _serve_draining(self, timeout_seconds: float) -> None:
        for key, _ in self.sel.select(timeout_seconds):
            if key.data is None:
                self._accept()
            elif key.data.__class__ is _ExitWatch:
                self._poll_workers(time.monotonic(), launcher=key.data.launcher)
            else:
                self._read(key.data, draining=True)

    def _unwatch(self) -> None:
        """Take the launchers' exit descriptors out of the selector."""
        for watch in self._watches:
            try:
                self.sel.unregister(watch.fd)
            except (KeyError, ValueError):
                pass
        self._watches = []

    # -- instructions ---------------------------------------------------------------------
    def _carry_out(self) -> None:
        """Carry out the dispatcher's instructions, in order (carrying one out may add more)."""
        out = self.d.out
        i = 0
        try:
            while i < len(out):
                instr = out[i]
                i += 1
                op = instr[0]
                if op == SEND_FRAME:
                    self._reply(instr[1], instr[2])
                elif op == CLOSE:
                    self._close_socket(instr[1])
                elif op == LAUNCH:
                    self._launch(instr[1], instr[2])
                elif op == KILL:
                    self.pool.kill(instr[1])
                elif op == PROGRESS:
                    self._notify("on_progress")
        finally:
            del out[:i]  # each is carried out once, even when one raised

    def _launch(self, plan: TaskPlan, bookings: list[Any]) -> None:
        for booking, handle, exc in self.pool.start(plan, bookings):
            if handle is None:
                assert exc is not None
                self.d.launch_failed(plan, booking, exc, time.monotonic())
            else:
                self.d.launched(plan, booking, handle, self.pool.log_location(plan, handle))

    def _poll_workers(
        self,
        now: float,
        *,
        final: bool = False,
        interrupted: bool = False,
        launcher: Any = None,
    ) -> bool:
        """Poll the workers that may have ended (every worker with ``final``; those of
        ``launcher`` only, where given); True if one had."""
        d = self.d
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
                conn = w.conn
                if isinstance(conn, _Conn):
                    # what it sent before exiting (its last returns) may still be unread
                    self._read_what_is_left(conn)
                d.settle_exit(w, now)
            self._carry_out()
        return ended

    def _worker_ended(self, launcher: Any) -> None:
        """A launcher's exit descriptor is readable: settle the exits, start replacements."""
        now = time.monotonic()
        if self._poll_workers(now, launcher=launcher):
            self.d.tick(now)
            self._carry_out()

    def _tick(self, now: float) -> None:
        if (
            not self._listening
            and self.d.shutdown_started is None
            and len(self.handshaking) < _MAX_HANDSHAKING
        ):
            self.sel.register(self.listener, selectors.EVENT_READ, None)
            self._listening = True
        # in the order they connected: only the too old at the front are looked at
        old = []
        for conn in self.handshaking.values():
            if now - conn.opened_at <= _HANDSHAKE_SECONDS:
                break
            old.append(conn)
        for conn in old:
            logger.warning(
                "dropping client %s: no handshake within %ss", conn.addr, _HANDSHAKE_SECONDS
            )
            self.d.close(conn, now)
        self.d.expire(now)
        self._carry_out()
        self._poll_workers(now)
        self.d.sync_clock(time.monotonic(), time.time())
        self.d.tick(now)
        self._carry_out()

    def _notify(self, method: str) -> None:
        if self.observer is None:
            return
        from ._progress import safe_notify

        safe_notify(self.observer, method, self.s.task_states)

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
            self._reply(conn, encode([CHALLENGE, conn.nonce]))
            self._carry_out()
            if len(self.handshaking) >= _MAX_HANDSHAKING:
                # a burst (many workers starting at once) or a flood: read their HELLOs
                # first; the rest wait in the listen backlog
                if not self._capped:
                    self._capped = True
                    logger.warning(
                        "not accepting for now: %d connections are in their handshake "
                        "(silent ones are dropped after %gs)",
                        _MAX_HANDSHAKING,
                        _HANDSHAKE_SECONDS,
                    )
                self._pause_listening()
                return

    def _pause_listening(self) -> None:
        """Accept nothing more until the next tick (which listens again)."""
        if self._listening:
            self.sel.unregister(self.listener)
            self._listening = False

    def _read(self, conn: _Conn, draining: bool = False) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        d = self.d
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
                self.handshaking.pop(conn.sock.fileno(), None)
                conn.decoder.limit(MAX_CLIENT_FRAME_BYTES)
            self._carry_out()

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
            self._read(conn, draining=True)

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
        if len(conn.outbuf) > _MAX_OUTBUF_BYTES:
            logger.warning("dropping client %s: it does not read its replies", conn.addr)
            self.d.close(conn, time.monotonic())
            return
        # flush the rest synchronously but bounded: replies are tiny
        try:
            conn.sock.settimeout(1.0)
            conn.sock.sendall(conn.outbuf)
            conn.outbuf = b""
        except OSError:
            self.d.close(conn, time.monotonic())
        finally:
            if conn.sock.fileno() >= 0:
                conn.sock.setblocking(False)

    def _close_socket(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self.conns.pop(fd, None)
        self.handshaking.pop(fd, None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        # bytes left unread at close() make the kernel reset the connection instead of
        # ending it: the peer would read "connection reset" rather than the end of stream
        try:
            conn.sock.setblocking(False)
            for _ in range(64):  # bounded: what is already buffered, not a peer's stream
                if not conn.sock.recv(65536):
                    break
        except OSError:
            pass  # nothing buffered (EAGAIN), or already reset
        conn.sock.close()
