"""The run's sockets: the listening socket, one non-blocking socket per connection, their
send buffers and the handshake cap, in one ``selectors`` selector.

Theory of operation
-------------------
:class:`Transport` is the socket half of the run loop (:mod:`bellis._run._server`), which owns
it and turns what it reads into the dispatcher's events. It never decides anything about
blocks or workers: it accepts (sending each new connection its challenge), sends frames,
closes sockets so that the peer reads an orderly end of stream, and drops a connection
that does not read its replies, through ``on_drop`` (the loop closes it in the
dispatcher, which then asks for its socket to be closed).

At most :data:`MAX_HANDSHAKING` connections may be in their handshake at once; at the cap
the listening socket leaves the selector (the rest wait in the listen backlog) until a
tick finds room again (:meth:`Transport.tick`). A connection that has not answered its
challenge within :data:`HANDSHAKE_SECONDS` is handed back by the tick to be dropped.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._protocol import CHALLENGE, HANDSHAKE_FRAME_BYTES, FrameDecoder, encode, new_nonce
from .._scheduling._records import Peer

__all__ = ["HANDSHAKE_SECONDS", "MAX_HANDSHAKING", "Conn", "Transport"]

logger = logging.getLogger("bellis")

HANDSHAKE_SECONDS = 10.0
#: with this many connections in their handshake the server stops accepting until one
#: ends or is dropped after HANDSHAKE_SECONDS (a flood of silent connections must not use
#: up the descriptors the run needs for workers and logs: it holds at most these and the
#: listen backlog); a burst of real workers waits in the backlog meanwhile
MAX_HANDSHAKING = 256
_MAX_OUTBUF_BYTES = 1 << 20
# at the run's end, how long a half-closed connection waits for its peer to close its end
_LINGER_SECONDS = 0.5


class Conn(Peer):
    """A connection: the dispatcher's record of it, with its socket and buffers."""

    __slots__ = ("decoder", "outbuf", "sock")

    def __init__(self, sock: socket.socket, addr: Any, now: float) -> None:
        super().__init__(addr, new_nonce(), now)
        self.sock = sock
        self.decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self.outbuf = b""


class Transport:
    """The listening socket and the connections of one run (see the module docstring)."""

    def __init__(self, bind_host: str, on_drop: Callable[[Conn], None]) -> None:
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((bind_host, 0), backlog=socket.SOMAXCONN)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self._on_drop = on_drop
        self.conns: dict[int, Conn] = {}
        #: connections that have not authenticated yet, oldest first
        self.handshaking: dict[int, Conn] = {}
        self._listening = True
        #: accepting was paused at the handshake cap (said once per run)
        self._capped = False

    # -- the selector ------------------------------------------------------------------
    def watch(self, fd: int, data: Any) -> None:
        """Have the selector report ``fd`` readable, with ``data`` as its key's data."""
        self.sel.register(fd, selectors.EVENT_READ, data)

    def unwatch(self, fd: int) -> None:
        """Take ``fd`` (registered by :meth:`watch`) out of the selector, if it is there."""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(fd)

    # -- accepting ---------------------------------------------------------------------
    def accept(self, now: float) -> Iterator[Conn]:
        """Accept what is waiting; yields each new connection once its challenge is sent."""
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # out of descriptors (EMFILE/ENFILE) or the like: stop listening until the
                # next tick instead of being woken for the same pending connection forever
                logger.warning("accept failed: %s; not accepting for a moment", exc)
                self.pause_listening()
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
            conn = Conn(sock, addr, now)
            self.conns[sock.fileno()] = conn
            self.handshaking[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self.reply(conn, encode([CHALLENGE, conn.nonce]))
            yield conn
            if len(self.handshaking) >= MAX_HANDSHAKING:
                # a burst (many workers starting at once) or a flood: read their HELLOs
                # first; the rest wait in the listen backlog
                if not self._capped:
                    self._capped = True
                    logger.warning(
                        "not accepting for now: %d connections are in their handshake "
                        "(silent ones are dropped after %gs)",
                        MAX_HANDSHAKING,
                        HANDSHAKE_SECONDS,
                    )
                self.pause_listening()
                return

    def pause_listening(self) -> None:
        """Accept nothing more until the next tick (which listens again)."""
        if self._listening:
            self.sel.unregister(self.listener)
            self._listening = False

    def authenticated(self, conn: Conn) -> None:
        """``conn`` answered its challenge: it no longer counts against the cap."""
        self.handshaking.pop(conn.sock.fileno(), None)

    def tick(self, now: float, accepting: bool) -> list[Conn]:
        """Listen again if accepting was paused and there is room (``accepting``: the run
        is not stopping); returns the connections whose handshake is overdue, to drop."""
        if not self._listening and accepting and len(self.handshaking) < MAX_HANDSHAKING:
            self.sel.register(self.listener, selectors.EVENT_READ, None)
            self._listening = True
        # in the order they connected: only the too old at the front are looked at
        old = []
        for conn in self.handshaking.values():
            if now - conn.opened_at <= HANDSHAKE_SECONDS:
                break
            old.append(conn)
            logger.warning(
                "dropping client %s: no handshake within %ss", conn.addr, HANDSHAKE_SECONDS
            )
        return old

    # -- sending and closing -----------------------------------------------------------
    def reply(self, conn: Conn, frame: bytes) -> None:
        """Send ``frame`` on ``conn``; a peer that does not read its replies is dropped."""
        if conn.outbuf:
            conn.outbuf += frame
        else:
            try:
                n = conn.sock.send(frame)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                return  # reset: reading it finds the end and closes the connection
            if n == len(frame):
                return
            conn.outbuf = frame[n:]
        if len(conn.outbuf) > _MAX_OUTBUF_BYTES:
            logger.warning("dropping client %s: it does not read its replies", conn.addr)
            self._on_drop(conn)
            return
        # flush the rest synchronously but bounded: replies are tiny
        try:
            conn.sock.settimeout(1.0)
            conn.sock.sendall(conn.outbuf)
            conn.outbuf = b""
        except OSError:
            self._on_drop(conn)
        finally:
            if conn.sock.fileno() >= 0:
                conn.sock.setblocking(False)

    def has_unread(self, conn: Conn) -> bool:
        """Whether ``conn``'s peer sent something not read yet (False at the end of its
        stream, on a reset, or when nothing is buffered)."""
        if conn.sock.fileno() < 0:
            return False
        try:
            return bool(conn.sock.recv(1, socket.MSG_PEEK))
        except OSError:  # nothing buffered (EAGAIN), or a reset: nothing to read
            return False

    def close_socket(self, conn: Conn) -> None:
        """Close ``conn``'s socket so that its peer reads the end of stream, not a reset."""
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self.conns.pop(fd, None)
        self.handshaking.pop(fd, None)
        self.unwatch(fd)
        # bytes left unread at close() make the kernel reset the connection instead of
        # ending it: the peer would read "connection reset" rather than the end of stream
        try:
            conn.sock.setblocking(False)
            for _ in range(64):  # bounded: what is already buffered, not a peer's stream
                if not conn.sock.recv(65536):
                    break
        except OSError:
            pass  # nothing buffered (EAGAIN), or already reset: nothing to drain
        conn.sock.close()

    def linger(self, conns: list[Conn]) -> None:
        """Half-close each of ``conns`` (its peer reads the end of stream after whatever
        was sent) and read and drop what its peer still sends until it closes its end, for
        at most ``_LINGER_SECONDS`` in all. The caller then closes them."""
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

    def close(self) -> None:
        """Stop listening and close the selector (the connections are closed already)."""
        if self._listening:
            self.sel.unregister(self.listener)
            self._listening = False
        self.listener.close()
        self.sel.close()
