"""Client and Context: the worker side of the protocol (daisy-compatible surface)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .._block import Block, BlockStatus
from .._protocol import (
    ACQUIRE,
    BYE,
    CHALLENGE,
    ENDING,
    HELLO,
    MEMORY_LIMIT_ENV,
    MOVE,
    OUT_OF_MEMORY,
    REJECT,
    SEND,
    SHUTDOWN,
    STATS_ROW,
    TIMED_OUT,
    FrameDecoder,
    compute_mac,
    encode,
    parse_welcome,
)
from .._signals import handle_as_before, install_handler
from ..errors import ConnectionLostError, ProtocolError
from . import _failure, _walltime
from ._context import Context
from ._leaving import leaving
from ._profiling import Meter, attach, attach_gpu, user_row
from ._watchdog import Watchdog

__all__ = [
    "Client",
    "Context",
    "close_clients",
    "round_trips",
]

logger = logging.getLogger("bellis")


#: the connected clients of this process. A client sends its finished blocks home with its
#: next request, so one whose owner stops asking (a worker function that returns after a
#: few blocks) still holds some: the worker entry point and an exit hook close every client
#: here, which sends them. Weak, so a dropped client can be collected (``__del__`` closes
#: it), yet not relied on: a thread or a signal handler may keep a client alive to the end.
_live: weakref.WeakSet[Client] = weakref.WeakSet()


def close_clients(*, skip_busy: bool = False) -> None:
    """Close every connected client of this process: each sends its finished blocks and
    gives back the ones it never started. ``skip_busy`` leaves those whose block is still
    running (in another thread) to the exit hook, which runs after such threads end."""
    for client in list(_live):
        if not (skip_busy and client._in_block):
            client.close()


def _forget_inherited() -> None:
    """In a forked child: the clients are the parent's connections, not this process's.
    Closing or reporting through them here would end the parent's session or count its
    blocks twice, so the child lets go of them (its requests then get no block)."""
    for client in list(_live):
        sock = client._sock
        client._sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()  # this process's descriptor only: the parent's stays open
    _live.clear()


#: how many replies this process waited for from its servers (one per round trip: the
#: challenge, the WELCOME, each answer to an ACQUIRE); :func:`round_trips`
_waits = [0]


def round_trips() -> int:
    """The round trips this process made to its servers so far (each reply it waited
    for), over all its connections: what a move or a batch costs, counted."""
    return _waits[0]


#: the SIGTERM handler _on_sigterm replaced, and the process that installed it
_sigterm_before: list[Any] = [signal.SIG_DFL, 0]


def _install_sigterm() -> None:
    """Put :func:`_on_sigterm` in place once per process (one handler for every client;
    a bound method would keep its client alive). A child forked while it is in place gets
    the replaced handler back (:func:`install_handler`)."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        return
    _sigterm_before[:] = [install_handler(signal.SIGTERM, _on_sigterm), os.getpid()]


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM: stop after the running block; with none running, report and exit now."""
    if os.getpid() != _sigterm_before[1]:
        # a child forked without the fork hooks kept this handler: it must end as it would
        # have without bellis, and leave the parent's connections alone
        handle_as_before(signum, frame, _sigterm_before[0])
        return
    clients = list(_live)
    for client in clients:
        client._stop_requested = True
    if leaving.deferred:
        leaving.came = True  # the loop ends once the teardown it is running returned
        return
    guard = leaving.guard
    if guard is not None and guard.defers(frame):
        # the setup's __enter__ returned, its teardown is not registered yet: the worker
        # leaves (with the teardown) once it is (``_setup.enter_in_worker``)
        leaving.came = True
        return
    if not any(client._in_block for client in clients):
        for client in clients:
            client.close()  # the finished blocks go home first; unstarted ones go back
        # a worker waiting for blocks (or between them) leaves its task on its own: the
        # task setup's teardown runs, once (``_setup.Warm.leave``), then it exits
        teardown, leaving.teardown = leaving.teardown, None
        if teardown is not None:
            teardown()  # once: ``Warm.leave`` runs its teardown on its first call only
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()  # what the teardown printed reaches the log
        os._exit(0)


atexit.register(close_clients)
os.register_at_fork(after_in_child=_forget_inherited)


class Client:
    """Connects to a bellis server and hands out blocks (daisy's ``Client``).

    ``Client(context=None)`` reads ``BELLIS_CONTEXT`` (or ``DAISY_CONTEXT``). Use::

        client = Client()
        while True:
            with client.acquire_block() as block:
                if block is None:
                    break
                process(block)
    """

    def __init__(self, context: Context | None = None) -> None:
        from .. import logging as blog

        if context is None:
            context = Context.from_env()
        self.context = context
        if "logdir" in context:
            blog.set_log_basedir(context["logdir"] or None)
        self.host = context["hostname"]
        self.port = int(context["port"])
        self.task_id = context["task_id"]
        self.worker_id = int(context.get("worker_id", "-1"))
        #: from the WELCOME: the context's ``resource_tracking`` is daisy's, for user code
        self.resource_tracking = False
        secret_hex = context.get("secret")
        if secret_hex is None:
            raise KeyError(
                "the context has no 'secret': a bellis worker needs the run's secret to "
                "authenticate; start it with the context the server printed or exported"
            )
        self._secret = bytes.fromhex(secret_hex)
        #: a MemoryError under the worker's memory limit is an out-of-memory death (the
        #: server retries the block with more memory), not an ordinary failure
        self._oom_status = OUT_OF_MEMORY if os.environ.get(MEMORY_LIMIT_ENV) else None
        # a managed worker's proof of its identity (absent from hand-made contexts)
        token_hex = context.get("worker_token")
        self._worker_token = bytes.fromhex(token_hex) if token_hex else None
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._results: list[Any] = []  # (k, status, row, error) per finished block
        self._failure_chars = 0  # what the pending failures carry (see _failure.fit)
        # the worker ends because its first block raised (its function may be broken): its
        # BYE says so, and the server counts the worker failure then, not at its exit
        self._ending = False
        #: the distinct errors sent home with their details (see ``_failure.Repeats``)
        self._repeats = _failure.Repeats()
        self._rows = bytearray()  # their measurements, STATS_ROW records
        self._nrows = 0
        #: the decoded-chunk cache serving this task's declared inputs (None: the task
        #: declares none), and what it did per finished block: k, then its CACHE_COUNTS
        self._chunk_cache = _chunk_cache()
        self._block_cache: list[int] = []
        #: what it did outside blocks, not yet sent (a setup's reads, say)
        self._outside_cache: list[int] | None = None
        self._queue: deque[int] = deque()
        #: when the batch in hand arrived (the next ACQUIRE reports the time since)
        self._served_at = 0.0
        self._geom: Any = None
        #: the read-back of ``Task(verify_outputs=...)`` (``_outputs._readback``); None: off
        self._verify: Any = None
        self.timeout_secs = 0.0
        self._watchdog = Watchdog(self.worker_id)
        self._watchdog.task_id = self.task_id
        self._watchdog.notify = self._timeout_notice
        self._stop_requested = False
        self._in_block = False
        #: the task's setup as the WELCOME names it (``module:qualname``; "" when it
        #: cannot be imported by name; None: the task has none): for ``bellis worker``
        self.setup_ref: str | None = None
        #: the task the server moved this worker to (a MOVE: ``_worker._shared``); None:
        #: not moved. The connection stays open for it (:meth:`rejoin`), with the WELCOME
        #: that came with the MOVE
        self.moved_to: str | None = None
        self._move_welcome: bytes | None = None
        #: the exception of the block that failed, once its traceback went to the log and
        #: the server (the caller then re-raises it)
        self.reported: BaseException | None = None
        #: the process this client's connection belongs to: a child forked from it (a
        #: ``multiprocessing`` pool, ``os.fork()``) shares the socket but must never use it
        self._owner_pid = os.getpid()
        self._connect()
        # a cluster job's time limit (SlurmLauncher(time_limit=...)): checked in _begin
        self._walltime = _walltime.from_env()
        self._walltime_at = math.inf if self._walltime is None else -math.inf

    # -- connection ---------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            # an ASCII host as bytes: getaddrinfo() then skips the idna codec (a str host
            # loads it, with unicodedata, in every worker: test_worker_imports)
            host = self.host.encode("ascii") if self.host.isascii() else self.host
            sock = socket.create_connection((host, self.port), timeout=30)  # type: ignore[arg-type]
        except ConnectionRefusedError:
            # the straggler case (a cluster job that started after the run ended) must exit
            # 0; while a run goes on, its server reports the worker that never connected
            logger.warning(
                "bellis server at %s:%s is not reachable; assuming the run has ended — this "
                "worker will exit without processing blocks",
                self.host,
                self.port,
            )
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, val in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 15), ("TCP_KEEPCNT", 4)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
        sock.settimeout(None)
        self._sock = sock
        try:
            msg = self._recv()
        except ConnectionLostError as exc:
            # closed before its challenge: the run ended while this connection waited to be
            # accepted (its listener closed), the straggler case again
            self._run_has_ended(sock, "before the handshake", exc)
            return
        if msg[0] != CHALLENGE or len(msg) < 2 or not isinstance(msg[1], bytes):
            raise ProtocolError("the server did not open with a challenge")
        from ._profiling import setup_seconds_since_start

        try:
            self._send(
                [
                    HELLO,
                    compute_mac(self._secret, msg[1]),
                    self.task_id,
                    self.worker_id,
                    os.getpid(),
                    setup_seconds_since_start(),
                    None if self._worker_token is None else compute_mac(self._worker_token, msg[1]),
                ]
            )
            reply = self._recv()
        except ConnectionLostError as exc:
            # closed (or reset) after its challenge, before any reply to the HELLO: a server
            # that runs answers a HELLO (WELCOME or REJECT) and only closes connections when
            # its run ends, so this is the straggler case too (no block was handed out)
            self._run_has_ended(sock, "during the handshake", exc)
            return
        if reply[0] == REJECT:
            self.close()
            raise ConnectionRefusedError(f"the bellis server refused this worker: {reply[1]}")
        self._welcomed(reply)
        _live.add(self)
        try:
            _install_sigterm()
        except ValueError:
            pass  # not the main thread: the default SIGTERM behaviour stays

    def _welcomed(self, reply: list[Any]) -> None:
        """Take this connection's task's settings from its WELCOME ``reply``."""
        welcome = parse_welcome(reply)
        self.timeout_secs = welcome.timeout_seconds
        self.resource_tracking = welcome.resource_tracking
        self.setup_ref = welcome.setup
        self._watchdog.stall = welcome.stall_timeout_seconds or 0.0
        if welcome.verify is not None:  # verify_outputs: read each block's outputs back
            from .._outputs._readback import ReadBack  # numpy and zarr, on first read only

            allow_empty, outputs = welcome.verify
            self._verify = ReadBack(outputs, allow_empty=allow_empty)
        from .._graph import TaskGeometry

        g = welcome.geometry
        self._geom = TaskGeometry(
            self.task_id,
            _RoiSpec(g["total_offset"], g["total_shape"]),
            _RoiSpec(g["read_offset"], g["read_shape"]),
            _RoiSpec(g["write_offset"], g["write_shape"]),
            fit=g["fit"],
            read_write_conflict=g["conflict"],
        )

    def rejoin(self, context: Context) -> None:
        """Serve the task the server moved this worker to (:attr:`moved_to`; ``context``
        names it) on this same connection: its settings from the WELCOME that came with
        the MOVE, its first blocks (if any came) queued already. No round trip: the
        connection proved the run's secret and this worker's token when it opened. The
        caller ran the old task's teardown and switched the chunk cache first."""
        welcome, self._move_welcome = self._move_welcome, None
        if welcome is None or self.moved_to is None:
            raise RuntimeError("rejoin() without a MOVE")
        msgs = FrameDecoder().feed(welcome)
        if len(msgs) != 1:
            raise ProtocolError("malformed move from the server: its welcome is not one frame")
        reply: list[Any] = msgs[0]
        self.context = context
        self.task_id = context["task_id"]
        self.moved_to = None
        self._verify = None
        # a watchdog of the new task's timeout and stall timeout (the old one's thread
        # stays disarmed)
        self._watchdog = Watchdog(self.worker_id)
        self._watchdog.task_id = self.task_id
        self._watchdog.notify = self._timeout_notice
        self._chunk_cache = _chunk_cache()
        self._block_cache = []
        self._outside_cache = None
        self._welcomed(reply)
        # the blocks that came with the MOVE are timed from now, after the old task's
        # teardown: what the worker spends on them
        self._served_at = time.monotonic()

    def _run_has_ended(self, sock: socket.socket, when: str, exc: ConnectionLostError) -> None:
        """The server closed this connection ``when`` before handing out any block: the run
        has ended; this worker will exit cleanly without blocks."""
        logger.warning(
            "bellis server at %s:%s closed the connection %s (%s); assuming the run has "
            "ended — this worker will exit without processing blocks",
            self.host,
            self.port,
            when,
            exc.__cause__ or "end of stream",
        )
        self._sock = None
        with contextlib.suppress(OSError):
            sock.close()

    def _is_forked_copy(self) -> bool:
        """True in a child forked from the worker: its copy of this client is inert."""
        return os.getpid() != self._owner_pid

    @property
    def connected(self) -> bool:
        return self._sock is not None and not self._is_forked_copy()

    def _send(self, msg: list[Any]) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(encode(msg))
        except OSError as exc:
            self._sock = None
            raise ConnectionLostError(f"lost the connection to the bellis server: {exc}") from exc

    def _recv(self) -> list[Any]:
        sock = self._sock
        assert sock is not None
        _waits[0] += 1
        while True:
            try:
                data = sock.recv(65536)
            except OSError as exc:
                self._sock = None
                raise ConnectionLostError(
                    f"lost the connection to the bellis server: {exc}"
                ) from exc
            if not data:
                self._sock = None
                raise ConnectionLostError("the bellis server closed the connection")
            msgs = self._decoder.feed(data)
            if msgs:
                if len(msgs) > 1:
                    raise ProtocolError("the server sent more than one reply")
                return msgs[0]  # type: ignore[no-any-return]

    # -- blocks ---------------------------------------------------------------------------
    def _next_index(self) -> int:
        """The next block's index: from the batch in hand, or one round trip (which also
        returns the finished blocks). -1 when there are no more blocks for this worker.

        No pid check here (a syscall per block): in a forked child the at-fork hook
        (:func:`_forget_inherited`) has already set every inherited client's socket to None.
        """
        if self._sock is None:
            return -1
        if self._stop_requested:
            self._bye()
            return -1
        queue = self._queue
        if not queue:
            msg = self._message(ACQUIRE)
            if len(msg) > 1:  # blocks go back: how long this worker spent on them
                msg.append(time.monotonic() - self._served_at)
                self._append_cache_counts(msg)
            try:
                self._send(msg)
            except ConnectionLostError:
                if len(msg) > 1:
                    raise  # finished blocks that never reached the server: a real loss
                # nothing held and nothing to report: the server closed this connection
                # (as it does when the run ends) before it read this request, as when
                # the reply below finds the connection closed
                return -1
            try:
                reply = self._recv()
            except ConnectionLostError:
                return -1
            if reply[0] == SHUTDOWN:
                self.close()
                return -1
            if reply[0] == MOVE:
                if len(reply) < 3 or type(reply[1]) is not str or type(reply[2]) is not bytes:
                    raise ProtocolError("malformed move from the server")
                # this connection serves another task from now on (:meth:`rejoin`): its
                # WELCOME came with the MOVE, and its first blocks, which wait in the
                # queue (given back unstarted if the worker ends before it rejoins)
                self.moved_to = reply[1]
                self._move_welcome = reply[2]
                queue.extend(reply[3:])
                return -1
            if reply[0] != SEND or len(reply) < 2:
                raise ProtocolError(f"unexpected reply to acquire: opcode {reply[0]}")
            queue.extend(reply[1:])
            self._served_at = time.monotonic()
        return queue.popleft()

    def _begin(self, k: int) -> Block | None:
        """Block ``k``, started; None when this worker left for its job's time limit
        instead (``k`` went back unstarted)."""
        self._watchdog.arm(self.timeout_secs, k)
        if self._watchdog.deadline > self._walltime_at and self._walltime_leaves(k):
            return None
        self._in_block = True
        return Block._lazy(self._geom, k, BlockStatus.PROCESSING)

    def _walltime_leaves(self, k: int) -> bool:
        """The job time limit check, past its threshold (see ``_walltime``): True when
        this worker gave ``k`` (and the rest of its batch) back and said goodbye."""
        guard = self._walltime
        assert guard is not None
        timeout = self.timeout_secs
        # the clock as the watchdog just read it
        now = self._watchdog.deadline - timeout if math.isfinite(timeout) else time.monotonic()
        if not guard.check(now):
            self._walltime_at = guard.next_check + timeout
            return False
        self._watchdog.disarm()
        self._queue.appendleft(k)
        sys.stderr.write(guard.leaving(now, self.worker_id) + "\n")
        sys.stderr.flush()
        with contextlib.suppress(ConnectionLostError):
            self._bye()
        return True

    def _failed(self, k: int, block: Block, exc: BaseException) -> None:
        """Record block ``k`` as failed with ``exc`` (the caller re-raises it, or, in
        :meth:`run_block_function`, goes on with the next block).

        The failure goes home with the next request, as a success does, and the worker
        stays connected: a worker function that catches the exception goes on with its next
        block (as in daisy 2.0.0). If the exception leaves the function instead, the
        worker's exit sends it (``close_clients``). An out-of-memory failure, or one after a
        SIGTERM, says goodbye at once: that worker ends.
        """
        if self._is_forked_copy():
            return  # a forked child unwinding (sys.exit in it): its parent owns the block
        self._watchdog.disarm()
        if self._chunk_cache is not None:
            self._chunk_cache.discard()  # a failed attempt's writes are never served
            self._cache_of(k)
        self._in_block = False
        block._status = BlockStatus.FAILED
        key = _failure.error_key(exc)
        detailed = self._repeats.full(key)
        offsets = _failure.log_offsets() if detailed else None  # before the lines below
        full, capped = _failure.render_traceback()
        logger.warning("block %s failed: %s", block.block_id, exc)
        sys.stderr.write(full if full.endswith("\n") else full + "\n")
        self.reported = exc
        status = BlockStatus.FAILED
        if self._oom_status is not None and isinstance(exc, MemoryError):
            status = self._oom_status
        if offsets is not None:
            field = _failure.failure_field(capped, offsets, exc, full)
        else:  # the driver has this error's records: it counts this one
            field = _failure.repeat_field(capped, key)
        self._fail(k, status, field)
        if status != BlockStatus.FAILED or self._stop_requested:
            with contextlib.suppress(ConnectionLostError):
                self._bye()

    def _cache_of(self, k: int) -> None:
        """What the chunk cache did since the last block ended: block ``k``'s reads."""
        assert self._chunk_cache is not None
        counts = self._chunk_cache.take_counts()
        if counts is not None:
            self._block_cache += (k, *counts)

    def _append_cache_counts(self, msg: list[Any]) -> None:
        """End ``msg`` with what this process's decoded-chunk cache did since this
        worker last said: per finished block, and outside blocks (``{"cache": [hits,
        misses, miss_bytes, bypassed], "blocks": [k, hits, ...]}``), when its task
        declares inputs and the cache did anything."""
        cache = self._chunk_cache
        if cache is None:
            return
        counts = cache.take_counts()
        outside = self._outside_cache
        if outside is not None:
            self._outside_cache = None
            if counts is not None:
                outside = [a + b for a, b in zip(counts, outside, strict=True)]
            counts = outside
        blocks = self._block_cache
        if blocks:
            self._block_cache = []
            msg.append({"cache": counts or [0, 0, 0, 0], "blocks": blocks})
        elif counts is not None:
            msg.append({"cache": counts})

    def _fail(self, k: int, status: int, field: Any) -> None:
        """Queue block ``k``'s failure, a ``[text, details]`` field shrunk to fit the
        frame's share (``_failure.fit``); a short text alone goes as it is."""
        if type(field) is list:
            self._failure_chars += _failure.fit(field, self._failure_chars)
        self._results += (k, status, -1, field)

    def _read_back(self, k: int, block: Block) -> int | str | None:
        """``verify_outputs``: the checksum of block ``k``'s outputs as they read back, or
        why they could not (the block then fails); None for a block that failed already."""
        if block._status not in (BlockStatus.PROCESSING, BlockStatus.SUCCESS):
            return None
        geom = self._geom
        coords = geom.coords_of(k)
        result: int | str = self._verify.checksum(
            [geom.write_interval(i, g) for i, g in enumerate(coords)]
        )
        return result

    def _finished(self, k: int, block: Block, measured: Any, checksum: Any = None) -> None:
        self._watchdog.disarm()
        cache = self._chunk_cache
        if cache is not None:
            self._cache_of(k)
        if checksum is not None and type(checksum) is str:
            logger.warning("block %s failed: %s", block.block_id, checksum)
            self._fail(k, BlockStatus.FAILED, _failure.failure_field(checksum))
        elif block._status in (BlockStatus.PROCESSING, BlockStatus.SUCCESS):
            try:
                row = self._row(block, measured)
            except ValueError as exc:
                logger.warning("block %s failed: %s", block.block_id, exc)
                text = str(exc)  # bad block.stats: the same text for the same mistake
                full = self._repeats.full(text)
                field = _failure.failure_field(text) if full else _failure.clean(text)
                self._fail(k, BlockStatus.FAILED, field)
            else:
                self._results += (k, BlockStatus.SUCCESS, row, checksum)
                if cache is not None:
                    cache.commit()  # the chunks it wrote whole (write-through)
        else:
            self._fail(k, BlockStatus.FAILED, _failure.status_failed(self._repeats))
        if cache is not None:
            cache.discard()  # a failed attempt's writes are never served
        # only now may a SIGTERM exit at once: close() sends the results home
        self._in_block = False
        if self._stop_requested:
            self._bye()

    def _row(self, block: Block, measured: Any) -> int:
        """Queue what goes home as ``block``'s measurement and return its row index, or
        -1 when there is none: ``measured``, the automatic measurement, or else the one
        the block function attached itself (``block.stats``; callers pass ``measured``
        None when there is one, since it wins)."""
        if measured is not None:
            row = _pack_row(*measured)
        elif block.stats is not None:
            row = user_row(block)
        else:
            return -1
        self._rows += row
        n = self._nrows
        self._nrows = n + 1
        return n

    def _message(self, op: int, extra: tuple[Any, ...] = ()) -> list[Any]:
        """``op``, the finished blocks' groups and ``extra`` ones, then the measurement
        rows when there are any; the finished blocks are then no longer pending."""
        msg: list[Any] = [op, *self._results, *extra]
        self._results = []
        self._failure_chars = 0
        if self._nrows:
            msg.append(self._rows)
            self._rows = bytearray()
            self._nrows = 0
        return msg

    @contextlib.contextmanager
    def acquire_block(self) -> Iterator[Block | None]:
        k = self._next_index()
        if k < 0:
            yield None
            return
        block = self._begin(k)
        if block is None:
            yield None
            return
        meter = None
        if self.resource_tracking:
            meter = Meter()
            attach_gpu(meter)
            meter.start()
        try:
            yield block
        except BaseException as exc:
            attach(block, meter)
            self._failed(k, block, exc)
            raise
        checksum = None if self._verify is None else self._read_back(k, block)
        self._finished(k, block, attach(block, meter), checksum)

    def run_block_function(self, fn: Callable[[Block], Any]) -> None:
        """Run ``fn`` on every block this worker is given, then disconnect.

        A block whose ``fn`` raises an ``Exception`` is a failed attempt: its traceback goes
        to the log and home, and once ``fn`` has returned on a block of this worker the loop
        goes on with the next block. Before that (``fn`` may be broken: daisy 2.0.0's fast
        stop) the exception ends the loop, and so the worker, whose start is then charged to
        the restart budget. A ``with acquire_block()`` loop re-raises every time, as daisy's
        does. Other exceptions (``KeyboardInterrupt``, ``SystemExit``) end the loop after
        the report.

        The loop of bellis's own workers: the same protocol, outcomes and measurements as
        ``with client.acquire_block()`` in a loop, without a generator per block. Blocks
        of one batch run back to back, so each block's measurement continues from the
        previous block's closing readings (:meth:`Meter.restart`).
        """
        meter = Meter() if self.resource_tracking else None
        if meter is not None:
            attach_gpu(meter)
        if self._chunk_cache is not None:  # reads before the first block are no block's
            self._outside_cache = self._chunk_cache.take_counts()
        queue = self._queue
        verify = self._verify
        worked = False  # fn returned on a block: it works, a failure is the block's
        try:
            while True:
                in_batch = len(queue) > 0  # no round trip before this block
                k = self._next_index()
                if k < 0:
                    return
                block = self._begin(k)
                if block is None:
                    return
                if meter is not None:
                    meter.begin(back_to_back=in_batch)
                try:
                    fn(block)
                except Exception as exc:
                    # a failed attempt of this block, not the end of this worker: it goes
                    # home with the next request and the worker goes on (the server
                    # abandons the task when its blocks keep failing, see
                    # Task(max_consecutive_failures=...)), unless fn never returned on a
                    # block here (it may be broken: the worker ends, as daisy's does) or
                    # the failure said goodbye (out of memory under the memory limit, a
                    # SIGTERM)
                    self._failed(k, block, exc)
                    if not worked or self._sock is None or self._is_forked_copy():
                        self._ending = not worked
                        raise
                    self.reported = None  # its frames (and the block's data) go now
                    continue
                except BaseException as exc:
                    self._failed(k, block, exc)
                    raise
                worked = True
                # the read-back is part of the block: measured and under its timeout
                checksum = None if verify is None else self._read_back(k, block)
                if meter is None:
                    self._finished(k, block, None, checksum)
                else:
                    measured = meter.finish()
                    self._finished(k, block, measured if block.stats is None else None, checksum)
        finally:
            if self.moved_to is None:
                self.close()  # a moved worker's connection goes on (:meth:`rejoin`)

    def _final_frame(self, extra: tuple[Any, ...] = ()) -> bytes:
        """BYE with every finished block, ``extra`` and the unstarted ones (status CREATED)."""
        groups = list(extra)
        for k in self._queue:
            groups += (k, BlockStatus.CREATED, -1, None)
        self._queue.clear()
        msg = self._message(BYE, tuple(groups))
        self._append_cache_counts(msg)
        if self._ending:
            msg.append(ENDING)
        return encode(msg)

    def _timeout_notice(self, k: int, text: Any, status: int = TIMED_OUT) -> None:
        """Called by the watchdog thread just before it kills this process: block ``k``
        ends with ``status`` (timed out or stalled)."""
        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.settimeout(1.0)
            sock.sendall(self._final_frame((k, status, -1, text)))

    def _bye(self) -> None:
        sock = self._sock
        if sock is None or self._is_forked_copy():
            return
        frame = self._final_frame()
        try:
            sock.sendall(frame)
        except OSError as exc:
            self._sock = None
            raise ConnectionLostError(f"lost the connection to the bellis server: {exc}") from exc
        finally:
            self.close()

    def close(self) -> None:
        """Send finished blocks home (and give back unstarted ones), then disconnect.

        In a child forked from the worker this does nothing: the connection and the blocks
        belong to the parent, which is still using them.
        """
        sock = self._sock
        if sock is None or self._is_forked_copy():
            return
        _live.discard(self)
        if self._results or self._queue:
            with contextlib.suppress(OSError):
                sock.sendall(self._final_frame())
        self._sock = None
        with contextlib.suppress(OSError):
            sock.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


_pack_row = STATS_ROW.pack


def _chunk_cache() -> Any:
    """The decoded-chunk cache serving this process's task's declared inputs
    (``_chunkcache``), or None: the task declares none (nothing was ever cached here,
    or a shared worker moved to a task without inputs)."""
    module = sys.modules.get("bellis._worker._chunkcache")
    inst = None if module is None else module.active()
    return None if inst is None or not (inst.inputs or inst.writes) else inst.cache


class _RoiSpec:
    """Offset/shape pair accepted wherever a Roi is (avoids building funlib objects)."""

    __slots__ = ("offset", "shape")

    def __init__(self, offset: list[int], shape: list[int]) -> None:
        self.offset = tuple(offset)
        self.shape = tuple(shape)
