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
HELLO       c -> s     mac (bytes), task_id, worker_id (int, -1 unmanaged), pid, setup_seconds,
                       [worker_mac]   (the nonce signed with the worker's own token)
WELCOME     s -> c     timeout_seconds, resource_tracking (bool), geometry (dict),
                       [stall_timeout_seconds]   (a task with ``stall_timeout``; else nil
                       when the next field follows),
                       [[allow_empty, outputs]]  (``verify_outputs``: what to read back;
                       else nil when the next field follows),
                       [setup]   (``Task(setup=...)``: ``module:qualname``, or "" when it
                       cannot be imported by name: for ``bellis worker``);
                       a :class:`Welcome` (:func:`encode_welcome`, :func:`parse_welcome`)
ACQUIRE     c -> s     (k, status, row, error)*, [rows], [busy_seconds], [{"cache": ...}]
                                                 (the finished blocks)
SEND        s -> c     k*                        (the next blocks' flat grid indices)
SHUTDOWN    s -> c     (nothing)                 (no more work for this worker)
BYE         c -> s     (k, status, row, error)*, [rows], [busy_seconds], [{"cache": ...}]
                                                 (final release)
REJECT      s -> c     reason (str)
MOVE        s -> c     task_id (str)             (serve that task from now on: a shared worker,
                                                 see ``_scheduling._sharing``)
SETUP       c -> s     seconds (float), error   (``Task(setup=...)``: sent once, after the
                       worker ran its task's setup and before its first ACQUIRE; error nil,
                       or ``[text, details]`` when the setup raised: the worker then leaves)
==========  =========  ==================================================================

One round trip per batch: ``ACQUIRE`` returns the finished blocks *and* asks for the
next ones. Each returned block is a group of four fields; ``row`` is -1 for a block
without measurements, else the index of its row in ``rows``. ``rows`` (present only
when some block has one) is a single ``bytes`` of :data:`STATS_ROW` records, so a
batch's measurements cross the wire, and are checked and stored, as one array
instead of eight Python numbers per block. ``busy_seconds`` (a float, version 4; optional,
only with returned blocks) is how long the worker spent on them, from the SEND to this
message: the server sizes the next batch from it (``_scheduling._batching``), not from the round
trip, which also counts the wait behind the server's other connections. The last field,
a map ``{"cache": [hits, misses, miss_bytes, bypassed], "blocks": [k, hits, misses,
miss_bytes, bypassed, ...]}`` (optional; a worker whose task declares inputs), is what
the worker's decoded-chunk cache did since its last message: per returned block (its
reads, from its start to its end), and outside blocks (:func:`parse_cache_counts`).

A successful block of a task with ``verify_outputs`` carries its outputs' checksum in the
``error`` field (an int; ``bellis._outputs._readback``), so it travels home with the
block's status and measurement row and is stored before the block is marked done.
A failed block's ``error`` is its text, or, from a worker that knows the error records
(``errors.jsonl``), ``[text, details]``: a flat map of where and how the attempt failed
(host, pid, job, the log files and offsets of its lines, the exception's type, message,
innermost frame and traceback; ``bellis._worker._failure``). The server takes both forms, so
an older worker of the same protocol version still works with it; an older server drops
such a worker's connection at its first failure (its blocks are retried), which is why
driver and workers are meant to run the same bellis.

Besides the frames, both peers agree on the block statuses the wire alone carries
(:data:`TIMED_OUT`: the worker's watchdog preempted the block; :data:`STALLED`: it showed
no CPU, IO or heartbeat for ``stall_timeout``, see ``bellis._worker._stall``; :data:`OUT_OF_MEMORY`:
it raised ``MemoryError`` under the worker's memory limit, see ``_scheduling._memory``) and on the
exit codes a worker process ends with when it does so (:data:`EXIT_BLOCK_TIMEOUT`,
:data:`EXIT_BLOCK_STALLED`, :data:`EXIT_OUT_OF_MEMORY`); a launcher turns exit codes into
:class:`WorkerExit`.
:func:`parse_hello` and :func:`parse_returns` read a client's HELLO (a :class:`Hello`) and
the blocks an ACQUIRE or BYE returns (a :class:`Returned` per block, built as cheaply as a
plain tuple: the server reads them on its hot path).

The driver-to-worker contract
-----------------------------
What reaches a worker process, and how, is declared here once:

* its **payload** (``_payload.WorkerPayload``: the pickled process function and what the worker
  needs before it can load it), built once per task at run start and framed by
  ``_payload.write_payload_frame`` (an 8-byte little-endian length, then the bytes) onto the
  worker's stdin, a fork server's pipe or a cluster job's payload file;
  ``_payload.read_payload_frame`` reads it back. It comes from the driver, never from the network;
* its **environment** (:data:`WORKER_ENV`, one table of every variable a worker reads);
* the **task settings it runs by**, in the server's WELCOME (:class:`Welcome`), once a
  connection is authenticated.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, NamedTuple

import msgpack

from ._block import STATS_FORMAT, BlockStatus
from .errors import ProtocolError

__all__ = [
    "ACQUIRE",
    "BYE",
    "CACHE_COUNTS",
    "CHALLENGE",
    "CONTEXT_ENV",
    "DAISY_CONTEXT_ENV",
    "EXIT_BLOCK_STALLED",
    "EXIT_BLOCK_TIMEOUT",
    "EXIT_OUT_OF_MEMORY",
    "HANDSHAKE_FRAME_BYTES",
    "HELLO",
    "JOB_ID_ENV",
    "JOB_STARTED_ENV",
    "JOB_TIME_LIMIT_ENV",
    "MAX_CLIENT_FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_ITEMS",
    "MEMORY_LIMIT_ENV",
    "MOVE",
    "OOM_PREFIX",
    "OUT_OF_MEMORY",
    "PAYLOAD_FILE_ENV",
    "PROTOCOL_VERSION",
    "REJECT",
    "SEND",
    "SETUP",
    "SHUTDOWN",
    "STALLED",
    "STATS_ROW",
    "SYS_PATH_ENV",
    "TIMED_OUT",
    "WALLTIME_MARGIN_ENV",
    "WELCOME",
    "WORKER_ENV",
    "ExitKind",
    "FrameDecoder",
    "Hello",
    "Returned",
    "Welcome",
    "WorkerExit",
    "compute_mac",
    "encode",
    "encode_welcome",
    "error_parts",
    "hmac_sha256",
    "is_oom_exit",
    "kernel_oom_message",
    "memory_error_message",
    "new_nonce",
    "new_secret",
    "parse_cache_counts",
    "parse_hello",
    "parse_returns",
    "parse_setup_report",
    "parse_welcome",
    "verify_mac",
    "worker_token",
]

PROTOCOL_VERSION = 4
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: what the server accepts from a client: a returned batch with its figures and one capped
#: traceback is tens of KiB; a frame's msgpack values cost far more memory than its bytes
MAX_CLIENT_FRAME_BYTES = 1024 * 1024
#: ... and from a client that has not authenticated yet (a HELLO is well under 1 KiB)
HANDSHAKE_FRAME_BYTES = 16 * 1024
#: the most items one msgpack array or map of a frame may hold
MAX_ITEMS = 8192

CHALLENGE, HELLO, WELCOME, ACQUIRE, SEND, SHUTDOWN, BYE, REJECT, MOVE, SETUP = range(10)

#: One block's measurements, ``BlockStats.to_tuple()`` order (``_block.STATS_FORMAT``).
#: The server reads a message's rows with the matching numpy dtype
#: ``_aggregates.STATS_DTYPE``; workers do not import numpy.
STATS_ROW = struct.Struct(STATS_FORMAT)

#: a returned block's status that only the wire carries: the worker's watchdog preempted it
#: (the others are ``BlockStatus`` values)
TIMED_OUT: Final = 4
#: the wire-only status of a block the worker's watchdog found stalled
STALLED: Final = 5
#: the exit code of a worker process whose watchdog preempted a block
EXIT_BLOCK_TIMEOUT: Final = 87
#: the exit code of a worker process whose watchdog found its block stalled
EXIT_BLOCK_STALLED: Final = 88
#: the wire-only status of a block that raised ``MemoryError`` under the worker's memory
#: limit (``Task(memory_limit=...)``; see ``_scheduling._memory``)
OUT_OF_MEMORY: Final = 6
#: the exit code of a worker process that ends after such a block
EXIT_OUT_OF_MEMORY: Final = 89
#: the environment variable that carries a local worker's memory limit, in bytes
MEMORY_LIMIT_ENV: Final = "BELLIS_MEMORY_LIMIT"
#: the worker's context (``Context.to_env()``): server address, task, worker id, secret
CONTEXT_ENV: Final = "BELLIS_CONTEXT"
#: the same context under daisy's name, for user code written against daisy
DAISY_CONTEXT_ENV: Final = "DAISY_CONTEXT"
#: a cluster job's payload file (its frame), read instead of stdin
PAYLOAD_FILE_ENV: Final = "BELLIS_PAYLOAD_FILE"
#: the driver's ``sys.path``, for the fork server (``_launchers._zygote``) only: a worker
#: takes its path from its payload
SYS_PATH_ENV: Final = "BELLIS_SYS_PATH"
#: the launcher's name for the job a worker runs in (its error records name it)
JOB_ID_ENV: Final = "BELLIS_JOB_ID"
#: a cluster job's time limit, seconds (``_worker._walltime``)
JOB_TIME_LIMIT_ENV: Final = "BELLIS_JOB_TIME_LIMIT"
#: when a cluster job started, seconds since the epoch (its script's first command)
JOB_STARTED_ENV: Final = "BELLIS_JOB_STARTED"
#: how long before its job's time limit a worker stops taking blocks, seconds
WALLTIME_MARGIN_ENV: Final = "BELLIS_WALLTIME_MARGIN"

#: Every environment variable a worker process reads, and who sets it. Other settings
#: reach a worker in its payload (``_payload.WorkerPayload``) or its WELCOME (:class:`Welcome`),
#: each in one of the three only.
WORKER_ENV: Final[dict[str, str]] = {
    CONTEXT_ENV: "the run's pool (_run._pool): where the server is, which task and worker "
    "this is, the secret and the worker's token; what Context.from_env() reads",
    DAISY_CONTEXT_ENV: "the same, under daisy's name (read when BELLIS_CONTEXT is unset)",
    PAYLOAD_FILE_ENV: "a batch launcher's job script: the payload frame's file (else stdin)",
    MEMORY_LIMIT_ENV: "the launcher (Task(memory_limit=...)): RLIMIT_AS, bytes",
    SYS_PATH_ENV: "the run's pool: the driver's sys.path, for a forked worker's fork server",
    JOB_ID_ENV: "the Dask launcher: the job named in the worker's error records",
    JOB_TIME_LIMIT_ENV: "a batch job script: the job's time limit, seconds",
    JOB_STARTED_ENV: "a batch job script: when the job started (date +%s)",
    WALLTIME_MARGIN_ENV: "a batch job script: SlurmLauncher(walltime_margin=...), seconds",
    "CUDA_VISIBLE_DEVICES": "the run's pool: the GPUs of Task(gpus=...) (the GPU meter)",
    # set by the cluster, not by bellis
    "SLURM_JOB_START_TIME": "SLURM 23.02+: when the job started (else BELLIS_JOB_STARTED)",
    "SLURM_JOB_ID": "SLURM: the job named in the error records (else BELLIS_JOB_ID)",
    "SLURM_ARRAY_JOB_ID": "SLURM: with SLURM_ARRAY_TASK_ID, an array element's job",
    "SLURM_ARRAY_TASK_ID": "SLURM: an array element (its context and payload, its job)",
}
_CREATED: Final = int(BlockStatus.CREATED)  # returned unstarted
_SUCCESS: Final = int(BlockStatus.SUCCESS)
_U64: Final = 1 << 64

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


# HMAC-SHA256 (RFC 2104) over CPython's built-in SHA-256, so that a worker's handshake
# loads neither ``hashlib`` nor ``hmac``: both load OpenSSL's libcrypto (about 5 ms of CPU
# and 4 MiB of RSS per worker, test_worker_imports). Where the built-in is missing, hashlib's.
_HMAC_BLOCK = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))
_sha256_new: Any = None


def _sha256(data: bytes) -> bytes:
    global _sha256_new
    if _sha256_new is None:
        try:
            from _sha256 import sha256 as new  # CPython 3.11
        except ImportError:
            try:
                from _sha2 import sha256 as new  # CPython 3.12+
            except ImportError:
                from hashlib import sha256 as new
        _sha256_new = new
    return _sha256_new(data).digest()  # type: ignore[no-any-return]


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` under ``key``: ``hmac.digest(key, message, "sha256")``."""
    if len(key) > _HMAC_BLOCK:
        key = _sha256(key)
    key = key.ljust(_HMAC_BLOCK, b"\0")
    return _sha256(key.translate(_OPAD) + _sha256(key.translate(_IPAD) + message))


def compute_mac(secret: bytes, nonce: bytes) -> bytes:
    return hmac_sha256(secret, nonce + _AUTH_TAG)


def worker_token(worker_key: bytes, worker_id: int) -> bytes:
    """The token that proves a connection is the managed worker ``worker_id``.

    ``worker_key`` never leaves the server; each worker gets only its own token (in its
    context), so a client that knows the run's secret cannot pass for another worker.
    """
    return hmac_sha256(worker_key, b"worker:%d" % worker_id)


def verify_mac(secret: bytes, nonce: bytes, mac: Any) -> bool:
    """Constant-time check of a client's answer to ``nonce``."""
    import hmac  # the server's side only (the constant-time comparison)

    if not isinstance(mac, bytes):
        return False
    return hmac.compare_digest(compute_mac(secret, nonce), mac)


class Hello(NamedTuple):
    """A client's HELLO, authenticated."""

    task_id: str
    worker_id: int
    pid: Any
    #: seconds the worker spent starting up before it connected, as it measured them
    setup_seconds: Any
    #: the nonce signed with the worker's own token (:func:`worker_token`); None: none sent
    worker_mac: Any


def parse_hello(msg: list[Any], secret: bytes, nonce: bytes) -> Hello:
    """The HELLO ``msg`` answering ``nonce``, checked against the run's ``secret``.

    Raises :class:`ProtocolError` for anything else (another opcode, a wrong length, a
    wrong MAC, fields of the wrong type).
    """
    if msg[0] != HELLO or len(msg) not in (6, 7) or not verify_mac(secret, nonce, msg[1]):
        raise ProtocolError("client failed authentication (wrong or missing run secret)")
    task_id, worker_id = msg[2], msg[3]
    if not isinstance(task_id, str) or not isinstance(worker_id, int):
        raise ProtocolError("malformed hello")
    return Hello(task_id, worker_id, msg[4], msg[5], msg[6] if len(msg) == 7 else None)


@dataclass(frozen=True, slots=True)
class Welcome:
    """The server's WELCOME: the settings of the task a worker runs by, sent once its HELLO
    is authenticated. On the wire it is the positional list the table above describes
    (:func:`encode_welcome`), so every bellis of protocol version 4 reads it."""

    #: ``Task(timeout=...)`` in seconds (``inf``: none)
    timeout_seconds: float
    #: whether each block's measurements go home with it (``Task(resource_tracking=...)``)
    resource_tracking: bool
    #: the block template: ``total_offset``, ``total_shape``, ``read_offset``,
    #: ``read_shape``, ``write_offset``, ``write_shape`` (lists of ints), ``fit`` (str),
    #: ``conflict`` (bool)
    geometry: dict[str, Any]
    #: ``Task(stall_timeout=...)`` in seconds; None: stall detection off
    stall_timeout_seconds: float | None = None
    #: ``Task(verify_outputs=...)``: whether an empty output passes, and the outputs to
    #: read back (``_outputs._readback.wire_outputs``); None: no read-back
    verify: tuple[bool, Any] | None = None
    #: ``Task(setup=...)``: None, the task has none; else where a worker started by hand
    #: (``bellis worker``) imports it, ``module:qualname``, or "" when it cannot be
    #: imported by name (defined in the driver's script, a closure, a partial)
    setup: str | None = None


def encode_welcome(welcome: Welcome) -> bytes:
    """The WELCOME frame of ``welcome``: optional trailing fields are left out when unset
    (the stall timeout is nil when only the read-back follows)."""
    msg: list[Any] = [
        WELCOME,
        welcome.timeout_seconds,
        welcome.resource_tracking,
        welcome.geometry,
    ]
    has_setup = welcome.setup is not None
    if welcome.stall_timeout_seconds is not None or welcome.verify is not None or has_setup:
        msg.append(welcome.stall_timeout_seconds)
    if welcome.verify is not None:
        msg.append([welcome.verify[0], welcome.verify[1]])
    elif has_setup:
        msg.append(None)
    if has_setup:
        msg.append(welcome.setup)
    return encode(msg)


def _seconds(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int | float):
        raise ProtocolError(f"malformed welcome: {name} is {value!r}, not seconds or nil")
    return float(value)


def parse_welcome(msg: list[Any]) -> Welcome:
    """The WELCOME ``msg`` as a :class:`Welcome`. Raises :class:`ProtocolError` for another
    opcode, fewer than its four fields or fields of the wrong type. Fields after the known
    ones are ignored: a newer server's trailing field leaves this worker as it was."""
    if msg[0] != WELCOME:
        raise ProtocolError(f"unexpected reply to hello: opcode {msg[0]}")
    if len(msg) < 4:
        raise ProtocolError(f"malformed welcome: {len(msg)} fields, not 4 or more")
    geometry = msg[3]
    if type(geometry) is not dict:
        raise ProtocolError(f"malformed welcome: geometry is {geometry!r}, not a map")
    verify = None
    if len(msg) > 5 and msg[5] is not None:
        v = msg[5]
        if type(v) is not list or len(v) != 2:
            raise ProtocolError(
                f"malformed welcome: read-back is {v!r}, not [allow_empty, outputs]"
            )
        verify = (bool(v[0]), v[1])
    timeout = _seconds(msg[1], "timeout_seconds")
    if timeout is None:
        raise ProtocolError("malformed welcome: timeout_seconds is nil")
    return Welcome(
        timeout_seconds=timeout,
        resource_tracking=bool(msg[2]),
        geometry=geometry,
        stall_timeout_seconds=_seconds(msg[4], "stall_timeout_seconds") if len(msg) > 4 else None,
        verify=verify,
        setup=_setup_reference(msg[6]) if len(msg) > 6 else None,
    )


def _setup_reference(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise ProtocolError(f"malformed welcome: setup is {value!r}, not text or nil")
    return value


def parse_setup_report(msg: list[Any]) -> tuple[float, tuple[str, dict[str, Any] | None] | None]:
    """A SETUP ``msg``: the seconds the worker's task setup took, and ``(text, details)``
    when it raised (None: it succeeded). :class:`ProtocolError` for malformed fields."""
    if len(msg) != 3:
        raise ProtocolError(f"malformed setup report of {len(msg)} fields, not 3")
    seconds, error = msg[1], msg[2]
    if type(seconds) is not float or not seconds >= 0.0:
        raise ProtocolError(f"malformed setup report: seconds is {seconds!r}")
    if error is None:
        return seconds, None
    if type(error) is not str and not _is_detailed(error):
        raise ProtocolError("malformed setup report: error is not text or [text, details]")
    text, details = error_parts(error)
    return seconds, (str(text), details)


class Returned(NamedTuple):
    """One block an ACQUIRE or BYE returns, checked (:func:`parse_returns`)."""

    #: the block's flat grid index
    k: int
    #: a ``BlockStatus`` value, or a wire-only one (:data:`TIMED_OUT`, :data:`STALLED`,
    #: :data:`OUT_OF_MEMORY`); ``BlockStatus.CREATED``: given back unstarted
    status: int
    #: its row in the message's measurement rows; -1: none
    row: int
    #: the block's error text (None: none), or ``[text, details]``: a worker since the
    #: error records says where the failure happened (:func:`error_parts`); for a success
    #: of a task with ``verify_outputs``, its outputs' checksum (an int)
    error: Any


#: builds a :class:`Returned` from a tuple without the Python-level ``__new__`` that
#: ``NamedTuple`` generates. Measured (Python 3.11, 2-core VM): a plain tuple 36 ns a block,
#: ``Returned(...)`` 200 ns, this 129 ns; unpacking a ``Returned`` costs 44 ns against a
#: plain tuple's 13. In all, ``benchmarks/bench_dispatch_block.py`` (the dispatcher's
#: whole per-block path) went from 1.50 to 1.67 µs a block with batches, 3.60 to 3.80 µs
#: with one block a message
_new_tuple: Final = tuple.__new__


#: what a failure's details may hold (``bellis._worker._failure``): a small flat map
_DETAIL_KEYS: Final = frozenset(
    {"log", "log_offset", "out_log", "out_offset", "host", "pid", "job", "type", "message"}
    | {"where", "traceback"}
)


def _is_detailed(error: Any) -> bool:
    """``[text, details]``, details a map of known keys to strings or integers."""
    if type(error) is not list or len(error) != 2 or type(error[0]) is not str:
        return False
    details = error[1]
    if type(details) is not dict or len(details) > len(_DETAIL_KEYS):
        return False
    return all(
        key in _DETAIL_KEYS and (type(value) is str or type(value) is int or value is None)
        for key, value in details.items()
    )


def error_parts(error: Any) -> tuple[str | None, dict[str, Any] | None]:
    """A checked error field as (text, details): details None from an older worker."""
    if type(error) is list:
        return error[0], error[1]
    return error, None


#: what the worker's decoded-chunk cache reports (``_worker._chunkcache``), in order
CACHE_COUNTS: Final = ("hits", "misses", "miss_bytes", "bypassed")


def parse_cache_counts(value: Any) -> tuple[list[int], list[int]]:
    """The trailing ``{"cache": [...], "blocks": [...]}`` of an ACQUIRE or BYE: what the
    cache did outside blocks (:data:`CACHE_COUNTS`, each a count), and per block, a flat
    list of ``k`` and its :data:`CACHE_COUNTS` for each block that read through the cache
    (``"blocks"`` optional); :class:`ProtocolError` for anything else."""
    counts = value.get("cache") if type(value) is dict and 1 <= len(value) <= 2 else None
    blocks = value.get("blocks", []) if counts is not None else None
    width = len(CACHE_COUNTS) + 1
    if (
        type(counts) is not list
        or len(counts) != len(CACHE_COUNTS)
        or not all(type(c) is int and 0 <= c < _U64 for c in counts)
        or (len(value) == 2 and "blocks" not in value)
        or type(blocks) is not list
        or len(blocks) % width
        or not all(type(c) is int and 0 <= c < _U64 for c in blocks)
    ):
        raise ProtocolError(f"malformed cache counts {value!r}")
    return counts, blocks


def parse_returns(
    msg: list[Any],
    n: int,
    row_count: int,
    held: set[int],
    unstarted_ok: bool,
    task_id: str,
) -> list[Returned]:
    """The blocks an ACQUIRE or BYE ``msg`` returns, one :class:`Returned` each.

    ``msg[1 : n + 1]`` holds the groups of four fields; ``row_count`` is how many
    measurement rows came with them, ``held`` the blocks the client holds and
    ``unstarted_ok`` whether it may give blocks back unstarted (only a client that stops
    may). A negative index is a placeholder and is skipped. The whole message is checked
    before anything is returned: :class:`ProtocolError` names the first bad field.
    """
    results: list[Returned] = []
    taken: set[int] = set()
    for i in range(1, n + 1, 4):
        k = msg[i]
        if type(k) is not int:
            raise ProtocolError(f"malformed block index {k!r}")
        if k < 0:
            continue
        if k not in held or k in taken:
            # a well-behaved client only returns blocks it holds (a block reclaimed on
            # timeout closes its connection first)
            raise ProtocolError(f"invalid block return: block {task_id}/{k} is not held by it")
        taken.add(k)
        status, row, error = msg[i + 1], msg[i + 2], msg[i + 3]
        if type(status) is not int:
            raise ProtocolError(f"malformed status {status!r} for block {task_id}/{k}")
        if status == _CREATED and not unstarted_ok:
            raise ProtocolError(
                f"block {task_id}/{k} returned unstarted by a client that asks for more"
            )
        if type(row) is not int or not -1 <= row < row_count:
            raise ProtocolError(f"malformed measurements for block {task_id}/{k}")
        if error is not None:
            if status == _SUCCESS:
                # a success carries nothing, or its outputs' checksum (verify_outputs): a
                # uint64, which the server stores as it is
                if type(error) is not int or not 0 <= error < _U64:
                    raise ProtocolError(
                        f"malformed output checksum for block {task_id}/{k}: a "
                        f"{type(error).__name__} where a success carries none or an "
                        "integer 0 <= n < 2**64"
                    )
            elif type(error) is not str and not _is_detailed(error):
                raise ProtocolError(f"malformed error text for block {task_id}/{k}")
        results.append(_new_tuple(Returned, (k, status, row, error)))
    return results


class ExitKind(StrEnum):
    """How a worker process ended, as the run accounts it. Each member equals its string,
    which is what ``runs.jsonl`` (``workers.exits``, ``workers.records[].exit``), the
    summary and the report's colours spell (``_stats._runlog.EXIT_KINDS`` lists the same
    strings in the same order)."""

    #: exit code 0: the worker stopped when told to, or its function returned
    CLEAN = "clean"
    #: exit code 0, but it left before its cluster job's time limit, blocks remaining
    #: (``SlurmLauncher(walltime_margin=...)``); its start is given back like a clean one's
    WALLTIME = "walltime"
    #: a block outlived ``Task(timeout=...)``: the worker's watchdog ended it (exit code
    #: :data:`EXIT_BLOCK_TIMEOUT`), or the server reclaimed the block and killed it
    TIMEOUT = "timeout"
    #: a block showed no CPU, IO or heartbeat for ``stall_timeout`` (exit code
    #: :data:`EXIT_BLOCK_STALLED`, or the server's reclaim)
    STALLED = "stalled"
    #: anything else: a non-zero exit code, a signal, an out-of-memory end (see
    #: :func:`is_oom_exit`), a job that failed, was cancelled or lost by its launcher
    ERROR = "error"
    #: still running, or ending, when the run was aborted (Ctrl-C, a signal)
    INTERRUPTED = "interrupted"
    #: stopped by the server because the other copy of its block (a straggler backup,
    #: ``Task(speculative=True)``) finished first; no restart is charged
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended: its :class:`ExitKind`, its exit code (None: not seen to end)
    and a message for the log and the summary."""

    kind: ExitKind
    code: int | None
    message: str

    @property
    def seen(self) -> bool:
        """Whether the process was seen to end (it has an exit code), rather than given
        up for lost (a launcher that lost track of it, a cancelled or vanished job)."""
        return self.code is not None


#: how an OOM exit's message starts (the launchers write it; see :func:`is_oom_exit`)
OOM_PREFIX: Final = "out of memory"


def is_oom_exit(ex: WorkerExit | None) -> bool:
    """Whether a ``WorkerExit`` says its worker ran out of memory."""
    return ex is not None and ex.kind == ExitKind.ERROR and ex.message.startswith(OOM_PREFIX)


def memory_error_message(limit: str | None) -> str:
    """The exit message of a worker that raised ``MemoryError`` under its memory limit."""
    return (
        f"{OOM_PREFIX}: a block raised MemoryError under the worker's memory limit "
        f"(RLIMIT_AS {limit or '?'})"
    )


def kernel_oom_message(code: int | None, before: int | None, after: int | None) -> str | None:
    """The OOM message of a worker killed by SIGKILL while its cgroup's ``oom_kill`` count
    (``memory.events``) rose from ``before`` to ``after``; None for any other exit."""
    if code != -9 or before is None or after is None or after <= before:
        return None
    return f"{OOM_PREFIX}: the kernel's OOM killer ended the worker (SIGKILL; oom_kill {after})"
