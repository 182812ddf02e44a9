"""The bellis wire protocol, sans I/O.

Frames are ``u32 big-endian length`` + ``version byte`` + msgpack payload, where the
length counts the version byte and the payload. Nothing received is ever unpickled:
msgpack decodes to plain lists, ints, floats, strings and bytes only.

A connection starts with an HMAC challenge-response: the server sends a random nonce,
the client answers ``HMAC-SHA256(secret, nonce + b"bellis-auth-v1")`` with its hello,
and the server compares in constant time before it serves anything.

Messages are msgpack arrays whose first element is an opcode:

==========  =========  ==================================================================
opcode      direction  fields
==========  =========  ==================================================================
CHALLENGE   s -> c     nonce (bytes)
HELLO       c -> s     mac (bytes), task_id, worker_id (int, -1 unmanaged), pid, setup_s,
                       [worker_mac]   (the nonce signed with the worker's own token)
WELCOME     s -> c     timeout_s, resource_tracking (bool), geometry (dict), [stall_s]
ACQUIRE     c -> s     (k, status, row, error)*, [rows]   (the finished blocks)
SEND        s -> c     k*                        (the next blocks' flat grid indices)
SHUTDOWN    s -> c     (nothing)                 (no more work for this worker)
BYE         c -> s     (k, status, row, error)*, [rows]   (final release, then close)
REJECT      s -> c     reason (str)
==========  =========  ==================================================================

One round trip per batch: ``ACQUIRE`` returns the finished blocks *and* asks for the
next ones. Each returned block is a group of four fields; ``row`` is -1 for a block
without measurements, else the index of its row in ``rows``. ``rows`` (present only
when some block has one) is a single ``bytes`` of :data:`STATS_ROW` records, so a
batch's measurements cross the wire, and are checked and stored, as one array
instead of eight Python numbers per block.

Besides the ``BlockStatus`` values, a worker's watchdog sends ``status`` 4 (the block
timed out) or 5 (it stalled, see ``bellis._stall``) just before it exits. ``stall_s`` is
sent only for a task with ``stall_timeout``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Any

import msgpack

from ._block import STATS_FORMAT
from .errors import ProtocolError

__all__ = [
    "ACQUIRE",
    "BYE",
    "CHALLENGE",
    "HANDSHAKE_FRAME_BYTES",
    "HELLO",
    "MAX_CLIENT_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_ITEMS",
    "PROTOCOL_VERSION",
    "REJECT",
    "SEND",
    "SHUTDOWN",
    "STATS_ROW",
    "WELCOME",
    "FrameDecoder",
    "compute_mac",
    "encode",
    "new_nonce",
    "new_secret",
    "verify_mac",
    "worker_token",
]

PROTOCOL_VERSION = 3
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: what the server accepts from a client: a returned batch with its figures and one capped
#: traceback is tens of KiB; a frame's msgpack values cost far more memory than its bytes
MAX_CLIENT_FRAME_BYTES = 1024 * 1024
#: ... and from a client that has not authenticated yet (a HELLO is well under 1 KiB)
HANDSHAKE_FRAME_BYTES = 16 * 1024
#: the most items one msgpack array or map of a frame may hold
MAX_ITEMS = 8192

CHALLENGE, HELLO, WELCOME, ACQUIRE, SEND, SHUTDOWN, BYE, REJECT = range(8)

#: One block's measurements, ``BlockStats.to_tuple()`` order (``_block.STATS_FORMAT``).
#: The server reads a message's rows with the matching numpy dtype
#: ``_aggregates.STATS_DTYPE``; workers do not import numpy.
STATS_ROW = struct.Struct(STATS_FORMAT)

_HEADER = struct.Struct(">IB")
_AUTH_TAG = b"bellis-auth-v1"
_packb = msgpack.Packer(use_bin_type=True).pack


def encode(message: Any) -> bytes:
    """One complete frame for ``message`` (a list whose first item is the opcode)."""
    payload: bytes = _packb(message)
    if len(payload) + 1 > MAX_FRAME_BYTES:
        raise ProtocolError(
            f"message of {len(payload)} bytes exceeds the frame cap of {MAX_FRAME_BYTES} bytes"
        )
    return _HEADER.pack(len(payload) + 1, PROTOCOL_VERSION) + payload


class FrameDecoder:
    """Feed it bytes as they arrive; it returns the complete messages they finish.

    Raises :class:`ProtocolError` on an oversized or empty frame, a version mismatch or
    a payload that is not valid msgpack. After an error the decoder must be dropped.
    """

    __slots__ = ("_buf", "_max")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def limit(self, max_frame_bytes: int) -> None:
        """Accept frames up to ``max_frame_bytes`` from now on (the server raises a
        client's limit once it has authenticated)."""
        self._max = max_frame_bytes

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length, version = _HEADER.unpack_from(buf, pos)
            if length == 0 or length > self._max:
                raise ProtocolError(
                    f"frame length {length} is outside 1..{self._max}; the peer does not speak "
                    "the bellis protocol or sent an oversized message"
                )
            if version != PROTOCOL_VERSION:
                raise ProtocolError(
                    f"bellis protocol version mismatch: peer speaks {version}, this build "
                    f"speaks {PROTOCOL_VERSION}. Run the workers with the same bellis version "
                    "as the driver."
                )
            end = pos + 4 + length
            if end > n:
                break
            try:
                msg = msgpack.unpackb(
                    bytes(buf[pos + 5 : end]),
                    raw=False,
                    strict_map_key=True,
                    use_list=True,
                    max_array_len=MAX_ITEMS,
                    max_map_len=MAX_ITEMS,
                )
            except Exception as exc:
                raise ProtocolError(f"malformed frame payload: {exc}") from exc
            if not isinstance(msg, list) or not msg or not isinstance(msg[0], int):
                raise ProtocolError("a frame must hold a non-empty array starting with an opcode")
            out.append(msg)
            pos = end
        if pos:
            del buf[:pos]
        return out


def new_secret() -> bytes:
    """A fresh per-run secret (32 random bytes)."""
    return os.urandom(32)


def new_nonce() -> bytes:
    return os.urandom(32)


def compute_mac(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce + _AUTH_TAG, hashlib.sha256).digest()


def worker_token(worker_key: bytes, worker_id: int) -> bytes:
    """The token that proves a connection is the managed worker ``worker_id``.

    ``worker_key`` never leaves the server; each worker gets only its own token (in its
    context), so a client that knows the run's secret cannot pass for another worker.
    """
    return hmac.new(worker_key, b"worker:%d" % worker_id, hashlib.sha256).digest()


def verify_mac(secret: bytes, nonce: bytes, mac: Any) -> bool:
    """Constant-time check of a client's answer to ``nonce``."""
    if not isinstance(mac, bytes):
        return False
    return hmac.compare_digest(compute_mac(secret, nonce), mac)
