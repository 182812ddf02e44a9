"""The driver-to-worker payload: what a worker process gets from its driver besides its
environment, and its one framing.

A :class:`WorkerPayload` is built once per task at run start (``_run._runner``) and reaches
each of the task's workers unchanged: msgpack, whose only pickle is the cloudpickled process
function (and the setup and shared tasks' functions), which comes from the driver and never
from the network. :func:`write_payload_frame` puts it on a worker's stdin, a fork server's
pipe or a cluster job's payload file (an 8-byte little-endian length, then the bytes);
:func:`read_payload_frame` reads it back in the worker. A worker that moves between the
tasks of a run (``_worker._shared``) gets each task's function as a :class:`SharedFunction`.

The rest of what the two sides agree on (frames, opcodes, the environment table, the
WELCOME) is ``_protocol``'s; this module is its payload half, split off for size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import msgpack

from .errors import ProtocolError

__all__ = [
    "PAYLOAD_FORMAT",
    "SharedFunction",
    "WorkerPayload",
    "payload_frame",
    "read_payload_frame",
    "write_payload_frame",
]

_packb = msgpack.Packer(use_bin_type=True).pack


#: the payload's own format number (its first field): a worker refuses any other
#: (2: the task's setup, and arity 2)
PAYLOAD_FORMAT: Final = 2
_PAYLOAD_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class WorkerPayload:
    """What a worker process gets from its driver besides its environment: built once per
    task at run start (``_run._runner``), the same bytes for each of its workers.

    It is msgpack (:meth:`to_bytes`), so a worker reads it without unpickling anything; the
    one pickle is :attr:`function`, which the worker unpickles (``_worker._main``) only
    after :attr:`sys_path` is in place, so a function from a module that only the driver's
    path can find loads by reference.
    """

    #: the process function, cloudpickled (``cloudpickle.dumps``)
    function: bytes
    #: 1: a block function, called once per block; 2: one called ``fn(block, ctx)`` with
    #: what the task's setup made; 0: a worker function, called once
    arity: int
    #: the driver's ``sys.path`` (empty entries dropped)
    sys_path: tuple[str, ...]
    #: the driver's logging settings (``bellis.logging.export_settings``)
    log_settings: dict[str, Any]
    #: where the code shipped by value came from: ``(name, first line, file)`` each
    #: (``_code_origin.collect``)
    code_origins: tuple[tuple[str, int, str], ...] = ()
    #: ``Task(setup=...)``, cloudpickled (None: the task has none); run once per worker
    #: before its first block (``_worker._setup``)
    setup: bytes | None = None
    #: the block functions of the other tasks of the run that this worker may be moved to
    #: (a shared worker, ``_scheduling._sharing``); unpickled only on a move. Empty: the
    #: worker serves its own task only
    shared: tuple[SharedFunction, ...] = ()
    #: the task's declared inputs, ``(store, array path, flags)`` each
    #: (``_outputs._inputs.plan_inputs``: ``CACHE_READS``, the worker caches their decoded
    #: chunks; ``WRITE_THROUGH``, it keeps the whole chunks its blocks write)
    inputs: tuple[tuple[str, str, int], ...] = ()
    #: the bound of that cache in bytes (``Task(input_cache_bytes=...)``); None: derived
    #: from the worker's memory limit
    input_cache_bytes: int | None = None
    #: the task's declared outputs, ``(store, array path)`` each: the worker writes their
    #: chunk-aligned blocks itself (``_worker._chunkwrite``)
    outputs: tuple[tuple[str, str], ...] = ()

    def to_bytes(self) -> bytes:
        fields: list[Any] = [
            PAYLOAD_FORMAT,
            self.function,
            self.arity,
            list(self.sys_path),
            self.log_settings,
            [list(o) for o in self.code_origins],
            self.setup,
        ]
        if self.shared or self.inputs or self.input_cache_bytes is not None or self.outputs:
            # the optional fields travel together (a payload has 7, 10 or 11 fields); left
            # off when all are at their defaults
            fields += [
                [list(i) for i in self.inputs],
                -1 if self.input_cache_bytes is None else self.input_cache_bytes,
                [_shared_wire(f) for f in self.shared],
            ]
            if self.outputs:
                fields.append([list(o) for o in self.outputs])
        packed: bytes = _packb(fields)
        return packed

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkerPayload:
        """The payload ``data`` holds; :class:`ProtocolError` if it is not one of this
        bellis (a worker started by another version of bellis than its driver)."""
        try:
            msg = msgpack.unpackb(data, raw=False, use_list=True)
        except Exception as exc:
            raise ProtocolError(f"bellis worker: malformed payload: {exc}") from exc
        if type(msg) is not list or len(msg) not in (7, 10, 11) or msg[0] != PAYLOAD_FORMAT:
            raise ProtocolError(
                "bellis worker: the payload is not of this bellis's format "
                f"{PAYLOAD_FORMAT}; run the workers with the same bellis version as the driver"
            )
        _fmt, function, arity, sys_path, log_settings, origins, setup = msg[:7]
        inputs, cache_bytes, shared_wire = msg[7:10] if len(msg) >= 10 else ([], -1, [])
        outputs = msg[10] if len(msg) == 11 else []
        if (
            type(function) is not bytes
            or arity not in (0, 1, 2)
            or type(log_settings) is not dict
            or not (setup is None or type(setup) is bytes)
        ):
            raise ProtocolError("bellis worker: malformed payload fields")
        if type(cache_bytes) is not int or cache_bytes < -1 or not _valid_inputs(inputs):
            raise ProtocolError("bellis worker: malformed payload inputs")
        if not _valid_outputs(outputs):
            raise ProtocolError("bellis worker: malformed payload outputs")
        shared: list[SharedFunction] = []
        for entry in shared_wire if type(shared_wire) is list else [None]:
            if (
                type(entry) is not list
                or len(entry) not in (3, 7, 8)
                or type(entry[0]) is not str
                or type(entry[1]) is not bytes
            ):
                raise ProtocolError("bellis worker: malformed shared function in the payload")
            shared.append(_shared_entry(entry))
        return cls(
            function=function,
            arity=arity,
            sys_path=tuple(str(p) for p in sys_path),
            log_settings=log_settings,
            code_origins=_origins(origins),
            setup=setup,
            shared=tuple(shared),
            inputs=tuple((st, pth, c) for st, pth, c in inputs),
            input_cache_bytes=None if cache_bytes == -1 else cache_bytes,
            outputs=tuple((st, pth) for st, pth in outputs),
        )


def _valid_outputs(outputs: Any) -> bool:
    """Whether ``outputs`` is a payload's declared outputs: ``[store, path]`` lists."""
    return type(outputs) is list and all(
        type(o) is list and len(o) == 2 and type(o[0]) is str and type(o[1]) is str for o in outputs
    )


def _valid_inputs(inputs: Any) -> bool:
    """Whether ``inputs`` is a payload's declared inputs: ``[store, path, flags]`` lists
    (flags an int of ``_outputs._inputs.CACHE_READS | WRITE_THROUGH``, or a bool)."""
    return type(inputs) is list and all(
        type(i) is list
        and len(i) == 3
        and type(i[0]) is str
        and type(i[1]) is str
        and type(i[2]) in (bool, int)
        and 0 <= i[2] <= 3
        for i in inputs
    )


def _origins(origins: Any) -> tuple[tuple[str, int, str], ...]:
    return tuple((str(n), int(line), str(f)) for n, line, f in origins)


class SharedFunction(NamedTuple):
    """Another task's block function in a shared worker's payload
    (:attr:`WorkerPayload.shared`): its task, the cloudpickled function and its code
    origins, and what the worker sets up when it moves there: the task's setup
    (cloudpickled; None: none), its arity (2: ``fn(block, ctx)``), its declared inputs
    and their cache bound, and its declared outputs (as :class:`WorkerPayload`'s fields of
    the same names)."""

    task_id: str
    function: bytes
    code_origins: tuple[tuple[str, int, str], ...] = ()
    setup: bytes | None = None
    arity: int = 1
    inputs: tuple[tuple[str, str, int], ...] = ()
    input_cache_bytes: int | None = None
    outputs: tuple[tuple[str, str], ...] = ()


def _shared_wire(f: SharedFunction) -> list[Any]:
    """A :class:`SharedFunction` as the payload's list: 3 fields when it has nothing but
    its function (as before setups and inputs moved with a worker), else 7, or 8 with
    declared outputs."""
    base: list[Any] = [f.task_id, f.function, [list(o) for o in f.code_origins]]
    if (
        f.setup is None
        and f.arity == 1
        and not f.inputs
        and f.input_cache_bytes is None
        and not f.outputs
    ):
        return base
    cache_bytes = -1 if f.input_cache_bytes is None else f.input_cache_bytes
    wire = [*base, f.setup, f.arity, [list(i) for i in f.inputs], cache_bytes]
    if f.outputs:
        wire.append([list(o) for o in f.outputs])
    return wire


def _shared_entry(entry: list[Any]) -> SharedFunction:
    """The :class:`SharedFunction` of a checked-length payload list; ProtocolError for
    malformed fields."""
    if len(entry) == 3:
        return SharedFunction(entry[0], entry[1], _origins(entry[2]))
    setup, arity, inputs, cache_bytes = entry[3:7]
    outputs = entry[7] if len(entry) == 8 else []
    if (
        not (setup is None or type(setup) is bytes)
        or arity not in (1, 2)
        or type(cache_bytes) is not int
        or cache_bytes < -1
        or not _valid_inputs(inputs)
        or not _valid_outputs(outputs)
    ):
        raise ProtocolError("bellis worker: malformed shared function in the payload")
    return SharedFunction(
        entry[0],
        entry[1],
        _origins(entry[2]),
        setup,
        arity,
        tuple((st, pth, c) for st, pth, c in inputs),
        None if cache_bytes == -1 else cache_bytes,
        tuple((st, pth) for st, pth in outputs),
    )


def payload_frame(payload: bytes) -> bytes:
    """The one framing of a worker's payload: its length (8 bytes, little-endian), then its
    bytes. Written to a worker's stdin, a fork server's pipe or a job's payload file."""
    return _PAYLOAD_LENGTH.pack(len(payload)) + payload


def write_payload_frame(stream: Any, payload: bytes) -> None:
    """Write ``payload``'s frame (:func:`payload_frame`) to the binary ``stream``."""
    stream.write(payload_frame(payload))


def read_payload_frame(stream: Any) -> bytes:
    """The payload of the frame at the start of the binary ``stream``. Raises
    :class:`ProtocolError` when there is none, or it is cut short."""
    header = stream.read(_PAYLOAD_LENGTH.size)
    if len(header) != _PAYLOAD_LENGTH.size:
        raise ProtocolError("bellis worker: no payload on stdin (start workers through a launcher)")
    (length,) = _PAYLOAD_LENGTH.unpack(header)
    data: bytes = stream.read(length)
    if len(data) != length:
        raise ProtocolError("bellis worker: truncated payload on stdin")
    return data
