"""The driver-to-worker contract (``bellis._protocol``): the WELCOME a worker runs by, the
payload it starts from and the one frame the payload travels in, read by field name."""

from __future__ import annotations

import dataclasses
import io
import pickle

import msgpack
import pytest

from bellis._payload import (
    PAYLOAD_FORMAT,
    WorkerPayload,
    payload_frame,
    read_payload_frame,
    write_payload_frame,
)
from bellis._protocol import (
    SEND,
    SETUP,
    WELCOME,
    WORKER_ENV,
    FrameDecoder,
    Welcome,
    encode_welcome,
    parse_setup_report,
    parse_welcome,
)
from bellis.errors import ProtocolError

GEOMETRY = {
    "total_offset": [0, 0],
    "total_shape": [20, 20],
    "read_offset": [0, 0],
    "read_shape": [10, 10],
    "write_offset": [0, 0],
    "write_shape": [10, 10],
    "fit": "valid",
    "conflict": True,
}


def wire(welcome: Welcome) -> list[object]:
    (msg,) = FrameDecoder().feed(encode_welcome(welcome))
    return list(msg)


def test_a_plain_welcome_is_the_documented_four_fields() -> None:
    welcome = Welcome(timeout_seconds=30.0, resource_tracking=True, geometry=GEOMETRY)
    msg = wire(welcome)
    # protocol version 4's positional list, unchanged: opcode, timeout, tracking, geometry
    assert msg == [WELCOME, 30.0, True, GEOMETRY]
    parsed = parse_welcome(msg)
    assert parsed == welcome
    assert parsed.stall_timeout_seconds is None and parsed.verify is None


def test_a_stall_timeout_is_the_fifth_field() -> None:
    welcome = Welcome(
        timeout_seconds=float("inf"),
        resource_tracking=False,
        geometry=GEOMETRY,
        stall_timeout_seconds=2.5,
    )
    msg = wire(welcome)
    assert msg == [WELCOME, float("inf"), False, GEOMETRY, 2.5]
    assert parse_welcome(msg).stall_timeout_seconds == 2.5


def test_a_read_back_without_a_stall_timeout_sends_nil_before_it() -> None:
    outputs = [["out.zarr", "raw", [0, 0]]]
    welcome = Welcome(
        timeout_seconds=5.0,
        resource_tracking=False,
        geometry=GEOMETRY,
        verify=(True, outputs),
    )
    msg = wire(welcome)
    assert msg == [WELCOME, 5.0, False, GEOMETRY, None, [True, outputs]]
    parsed = parse_welcome(msg)
    assert parsed.stall_timeout_seconds is None
    assert parsed.verify == (True, outputs)


@pytest.mark.parametrize(
    ("msg", "says"),
    [
        ([SEND, 1], "unexpected reply to hello: opcode 4"),
        ([WELCOME, 1.0, True], "3 fields, not 4 or more"),
        ([WELCOME, 1.0, True, [1, 2]], "geometry is [1, 2], not a map"),
        ([WELCOME, "soon", True, GEOMETRY], "timeout_seconds is 'soon'"),
        ([WELCOME, None, True, GEOMETRY], "timeout_seconds is nil"),
        ([WELCOME, 1.0, True, GEOMETRY, True], "stall_timeout_seconds is True"),
        ([WELCOME, 1.0, True, GEOMETRY, None, "all"], "read-back is 'all'"),
    ],
)
def test_a_malformed_welcome_is_a_protocol_error(msg: list[object], says: str) -> None:
    with pytest.raises(ProtocolError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_welcome(msg)


def test_a_newer_servers_trailing_field_is_ignored() -> None:
    msg = [WELCOME, 1.0, True, GEOMETRY, 3.0, [False, []], "m:setup", "a later field"]
    assert parse_welcome(msg) == Welcome(1.0, True, GEOMETRY, 3.0, (False, []), "m:setup")


def payload() -> WorkerPayload:
    return WorkerPayload(
        function=pickle.dumps(len),
        arity=1,
        sys_path=("/driver/lib", "/driver"),
        log_settings={"log_mode": "files", "log_basedir": None},
        code_origins=(("process", 3, "/driver/run.py"),),
    )


def test_a_payload_round_trips_field_by_field() -> None:
    p = payload()
    back = WorkerPayload.from_bytes(p.to_bytes())
    assert back == p
    assert back.sys_path == ("/driver/lib", "/driver")
    assert back.code_origins == (("process", 3, "/driver/run.py"),)
    assert pickle.loads(back.function) is len


def test_reading_a_payload_unpickles_nothing() -> None:
    # a function whose unpickling would run code: reading the payload leaves it as bytes,
    # for the worker to unpickle once the driver's sys.path is in place
    evil = b"cbuiltins\nexec\n(S'raise SystemExit(9)'\ntR."
    data = msgpack.packb([PAYLOAD_FORMAT, evil, 0, [], {}, [], evil], use_bin_type=True)
    back = WorkerPayload.from_bytes(data)
    assert back.function == evil and back.arity == 0 and back.setup == evil


@pytest.mark.parametrize(
    "data",
    [
        # the earlier format: a cloudpickled dict, from a driver of another bellis
        pickle.dumps({"function": len, "arity": 1, "sys_path": [], "log_settings": {}}),
        msgpack.packb([PAYLOAD_FORMAT + 1, b"", 1, [], {}, [], None], use_bin_type=True),
        msgpack.packb([PAYLOAD_FORMAT, "not bytes", 1, [], {}, [], None], use_bin_type=True),
        msgpack.packb([PAYLOAD_FORMAT, b"", 3, [], {}, [], None], use_bin_type=True),
        # the format before Task(setup=...): six fields
        msgpack.packb([1, b"", 1, [], {}, []], use_bin_type=True),
        msgpack.packb([PAYLOAD_FORMAT, b"", 2, [], {}, [], "not bytes"], use_bin_type=True),
    ],
)
def test_a_payload_of_another_format_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="bellis worker: "):
        WorkerPayload.from_bytes(data)


def test_the_payload_frame_is_its_length_then_its_bytes() -> None:
    data = payload().to_bytes()
    frame = payload_frame(data)
    assert frame[:8] == len(data).to_bytes(8, "little") and frame[8:] == data
    stream = io.BytesIO()
    write_payload_frame(stream, data)
    assert stream.getvalue() == frame
    stream.seek(0)
    assert read_payload_frame(stream) == data


def test_a_missing_or_cut_payload_frame_says_so() -> None:
    with pytest.raises(ProtocolError, match="no payload on stdin"):
        read_payload_frame(io.BytesIO(b""))
    with pytest.raises(ProtocolError, match="truncated payload"):
        read_payload_frame(io.BytesIO(payload_frame(b"abcdef")[:-1]))


def test_the_worker_environment_is_one_table_of_bellis_and_cluster_names() -> None:
    assert all(name.startswith(("BELLIS_", "DAISY_", "SLURM_", "CUDA_")) for name in WORKER_ENV)
    assert {"BELLIS_CONTEXT", "BELLIS_PAYLOAD_FILE", "BELLIS_MEMORY_LIMIT"} <= set(WORKER_ENV)


def test_a_payload_carries_the_setup_and_a_block_function_with_context() -> None:
    p = WorkerPayload(
        function=pickle.dumps(len),
        arity=2,
        sys_path=(),
        log_settings={},
        setup=pickle.dumps(dict),
    )
    back = WorkerPayload.from_bytes(p.to_bytes())
    assert back == p
    assert back.arity == 2 and pickle.loads(back.setup or b"") is dict
    assert WorkerPayload.from_bytes(payload().to_bytes()).setup is None


def test_a_setup_report_says_how_long_or_how_it_failed() -> None:
    assert parse_setup_report([SETUP, 0.25, None]) == (0.25, None)
    assert parse_setup_report([SETUP, 1.5, "ValueError: no volume"]) == (
        1.5,
        ("ValueError: no volume", None),
    )
    details = {"type": "ValueError", "message": "no volume", "pid": 7, "traceback": "..."}
    assert parse_setup_report([SETUP, 0.0, ["setup of task 'A' failed", details]]) == (
        0.0,
        ("setup of task 'A' failed", details),
    )


@pytest.mark.parametrize(
    ("msg", "says"),
    [
        ([SETUP, 0.25], "3"),
        ([SETUP, 1, None], "seconds is 1"),
        ([SETUP, -1.0, None], "seconds is -1.0"),
        ([SETUP, float("nan"), None], "seconds is nan"),
        ([SETUP, 0.5, 7], "error is not text"),
        ([SETUP, 0.5, ["text", {"unknown key": "x"}]], "error is not text"),
    ],
)
def test_a_malformed_setup_report_is_refused(msg: list[object], says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        parse_setup_report(msg)


def test_a_payload_carries_the_declared_outputs_and_so_does_a_shared_function() -> None:
    from bellis._payload import SharedFunction

    outputs = (("/data/out.zarr", "labels"), ("/data/b.zarr", ""))
    shared = (SharedFunction("b", pickle.dumps(len), outputs=(("/data/c.zarr", "x"),)),)
    p = WorkerPayload(
        function=pickle.dumps(len), arity=1, sys_path=(), log_settings={}, outputs=outputs
    )
    back = WorkerPayload.from_bytes(p.to_bytes())
    assert back == p and back.outputs == outputs
    both = WorkerPayload.from_bytes(dataclasses.replace(p, shared=shared).to_bytes())
    assert both.shared == shared and both.shared[0].outputs == (("/data/c.zarr", "x"),)
    # a payload without outputs keeps its earlier length on the wire (7 fields)
    assert len(msgpack.unpackb(payload().to_bytes())) == 7
    bad = msgpack.unpackb(p.to_bytes())
    bad[10] = [["/data/out.zarr"]]
    with pytest.raises(ProtocolError, match="malformed payload outputs"):
        WorkerPayload.from_bytes(msgpack.packb(bad, use_bin_type=True))
