"""Rogue clients against a live run: each is dropped, and the run completes unharmed."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
import bellis._run._transport as transport_module
from bellis._protocol import (
    ACQUIRE,
    BYE,
    CHALLENGE,
    HELLO,
    PROTOCOL_VERSION,
    REJECT,
    SEND,
    STATS_ROW,
    FrameDecoder,
    compute_mac,
    encode,
    parse_welcome,
)
from kit.blocks import done_count, done_ids, exit_once_block, make_task, read_records, sleep_block


def connect(port: int) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    msg = recv_msg(sock)
    assert msg[0] == CHALLENGE
    return sock, msg[1]


def recv_msg(sock: socket.socket) -> list[Any]:
    dec = FrameDecoder()
    while True:
        data = sock.recv(65536)
        assert data, "server closed the connection"
        msgs = dec.feed(data)
        if msgs:
            return msgs[0]  # type: ignore[no-any-return]


class Dropped:
    """What a rogue saw after its attack: the messages the server still sent it, and
    when (``time.monotonic()``) the server closed the connection; None if it never did."""

    def __init__(self, messages: list[Any], closed_at: float | None) -> None:
        self.messages = messages
        self.closed_at = closed_at


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> Dropped:
    """Read until the peer closes (EOF or reset) or ``timeout`` passes."""
    sock.settimeout(timeout)
    dec = FrameDecoder()
    messages: list[Any] = []
    closed_at: float | None = None
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                closed_at = time.monotonic()
                break
            messages.extend(dec.feed(data))
    except ConnectionResetError:
        closed_at = time.monotonic()
    except (TimeoutError, ValueError):
        pass  # no close within the timeout, or bytes that are no frame: the test fails
    finally:
        sock.close()
    return Dropped(messages, closed_at)


def authenticate(port: int, secret: bytes, task_id: str) -> socket.socket:
    sock, nonce = connect(port)
    sock.sendall(encode([HELLO, compute_mac(secret, nonce), task_id, -1, 0, 0.0]))
    assert parse_welcome(recv_msg(sock)).geometry["fit"] == "valid"
    return sock


def rogue_garbage(port: int, secret: bytes) -> Dropped:
    sock, _ = connect(port)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)))
    return closed_by_server(sock)


def rogue_wrong_mac(port: int, secret: bytes) -> Dropped:
    sock, nonce = connect(port)
    sock.sendall(encode([HELLO, compute_mac(b"not the secret", nonce), "a", -1, 0, 0.0]))
    return closed_by_server(sock)


def rogue_oversized(port: int, secret: bytes) -> Dropped:
    sock, _ = connect(port)
    sock.sendall(struct.pack(">IB", 0xFFFFFFFF, PROTOCOL_VERSION))
    return closed_by_server(sock)


def rogue_silent(port: int, secret: bytes) -> Dropped:
    sock, _ = connect(port)
    return closed_by_server(sock)


def rogue_malformed_acquire(port: int, secret: bytes) -> Dropped:
    sock = authenticate(port, secret, "a")
    sock.sendall(encode([ACQUIRE, "three", 1, None, None]))
    return closed_by_server(sock)


def rogue_short_acquire(port: int, secret: bytes) -> Dropped:
    sock = authenticate(port, secret, "a")
    sock.sendall(encode([ACQUIRE, 1]))
    return closed_by_server(sock)


def rogue_foreign_return(port: int, secret: bytes) -> Dropped:
    sock = authenticate(port, secret, "a")
    sock.sendall(encode([ACQUIRE, 3, 1, -1, None]))  # block 3 "succeeded"
    return closed_by_server(sock)


def rogue_pipelined_acquire(port: int, secret: bytes) -> Dropped:
    sock = authenticate(port, secret, "a")
    # two requests without returning the first block: the held block goes back for a retry
    sock.sendall(encode([ACQUIRE, -1, 0, -1, None]) + encode([ACQUIRE, -1, 0, -1, None]))
    return closed_by_server(sock)


def _rogue_bad_return(
    port: int, secret: bytes, status: Any, row: Any, error: Any, *rows: Any
) -> Dropped:
    """Take real blocks, then return the first with a malformed field."""
    sock = authenticate(port, secret, "a")
    sock.sendall(encode([ACQUIRE]))
    sent = recv_msg(sock)
    assert sent[0] == SEND
    sock.sendall(encode([ACQUIRE, sent[1], status, row, error, *rows]))
    return closed_by_server(sock)


def _row(wall: float = 0.1, cpu: float = 0.1, children: float = 0.0) -> bytes:
    return STATS_ROW.pack(wall, cpu, 1 << 20, 0, 0, float("nan"), 0, children)


def rogue_nan_wall(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 0, None, _row(wall=float("nan")))


def rogue_negative_cpu(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 0, None, _row(cpu=-1.0))


def rogue_infinite_child_cpu(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 0, None, _row(children=float("inf")))


def rogue_rows_not_bytes(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 0, None, "abc")


def rogue_partial_row(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 0, None, _row()[:-1])


def rogue_row_out_of_range(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, 1, None, _row())


def rogue_row_not_an_int(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 2, [0.1, 0.1, 0, 0, 0, 0.0, 0], None)


def rogue_rows_without_blocks(port: int, secret: bytes) -> Dropped:
    sock = authenticate(port, secret, "a")
    sock.sendall(encode([ACQUIRE]))
    assert recv_msg(sock)[0] == SEND
    sock.sendall(encode([ACQUIRE, _row()]))
    return closed_by_server(sock)


def rogue_created_pin(port: int, secret: bytes) -> Dropped:
    """Return a block as never started while asking for more: it would come straight back."""
    return _rogue_bad_return(port, secret, 0, -1, None)


def rogue_preauth_bomb(port: int, secret: bytes) -> Dropped:
    """Before any HELLO: 100 KiB of empty msgpack arrays (millions of objects if decoded)."""
    sock, _ = connect(port)
    n = 100 * 1024
    payload = b"\xdd" + struct.pack(">I", n) + b"\x90" * n
    sock.sendall(struct.pack(">IB", len(payload) + 1, PROTOCOL_VERSION) + payload)
    return closed_by_server(sock)


def rogue_wide_array(port: int, secret: bytes) -> Dropped:
    """Authenticated: one array of 100,000 items (far more than any message holds)."""
    sock = authenticate(port, secret, "a")
    n = 100_000
    payload = b"\xdd" + struct.pack(">I", n) + b"\x90" * n
    sock.sendall(struct.pack(">IB", len(payload) + 1, PROTOCOL_VERSION) + payload)
    return closed_by_server(sock)


def rogue_bad_status(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, "done", -1, None)


def rogue_bad_error_text(port: int, secret: bytes) -> Dropped:
    return _rogue_bad_return(port, secret, 3, -1, {"not": "text"})


ROGUES = {
    "nan_wall": rogue_nan_wall,
    "negative_cpu": rogue_negative_cpu,
    "infinite_child_cpu": rogue_infinite_child_cpu,
    "rows_not_bytes": rogue_rows_not_bytes,
    "partial_row": rogue_partial_row,
    "row_out_of_range": rogue_row_out_of_range,
    "row_not_an_int": rogue_row_not_an_int,
    "rows_without_blocks": rogue_rows_without_blocks,
    "bad_status": rogue_bad_status,
    "created_pin": rogue_created_pin,
    "preauth_bomb": rogue_preauth_bomb,
    "wide_array": rogue_wide_array,
    "bad_error_text": rogue_bad_error_text,
    "garbage": rogue_garbage,
    "wrong_mac": rogue_wrong_mac,
    "oversized": rogue_oversized,
    "silent": rogue_silent,
    "malformed_acquire": rogue_malformed_acquire,
    "short_acquire": rogue_short_acquire,
    "foreign_return": rogue_foreign_return,
    "pipelined_acquire": rogue_pipelined_acquire,
}


#: what the server's log line gives as the reason a rogue was dropped
DROP_REASON = {
    "wrong_mac": "failed authentication",
    "silent": "no handshake within",
    "oversized": "frame",
    "foreign_return": "is not held by it",
    "pipelined_acquire": "without returning them",
    "nan_wall": "a time is negative, infinite or NaN",
    "negative_cpu": "a time is negative, infinite or NaN",
    "infinite_child_cpu": "a time is negative, infinite or NaN",
    "rows_not_bytes": "not a whole number of stats rows",
    "partial_row": "not a whole number of stats rows",
    "created_pin": "returned unstarted by a client that asks for more",
    "preauth_bomb": "is outside 1..16384",
    "wide_array": "malformed frame payload",
}


@pytest.mark.parametrize("name", sorted(ROGUES))
def test_rogue_client_is_dropped_and_run_completes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transport_module, "HANDSHAKE_SECONDS", 0.5)
    caplog.set_level(logging.WARNING, logger="bellis")
    recdir = tmp_path / "rec"
    recdir.mkdir()
    n = 8
    task = make_task("a", n, functools.partial(sleep_block, str(recdir), 0.15), max_workers=1)
    outcome: dict[str, Any] = {}

    def attack(server: Any) -> None:
        try:
            outcome["dropped"] = ROGUES[name](server.port, server.secret)
        except BaseException as exc:
            outcome["error"] = exc

    def on_listen(server: Any) -> None:
        outcome["hostname"] = server.hostname
        threading.Thread(target=attack, args=(server,), daemon=True).start()

    states = bellis.Server(on_listen=on_listen).run_blockwise([task], progress=False, summary=False)
    run_returned = time.monotonic()
    deadline = time.monotonic() + 10
    while not outcome.keys() - {"hostname"} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "error" not in outcome, outcome.get("error")
    dropped = outcome["dropped"]
    # dropped by the server while the run still went on (every connection is closed when
    # a run ends, so a close alone would prove nothing), and served nothing more: the one
    # reply a pipelining client gets is to its first, valid, request
    assert dropped.closed_at is not None and dropped.closed_at < run_returned
    assert [m[0] for m in dropped.messages] == ([SEND] if name == "pipelined_acquire" else [])
    drops = [r.getMessage() for r in caplog.records if "dropping client" in r.getMessage()]
    assert len(drops) == 1, drops
    assert DROP_REASON.get(name, "") in drops[0]
    assert outcome["hostname"] == "127.0.0.1"
    s = states["a"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n, 0, 0)
    assert s.worker_failure_count == 0
    recs = read_records(recdir)
    assert done_ids(recs, "a") == list(range(n))
    assert all(done_count(recs, "a", k) == 1 for k in range(n))


def test_wrong_task_id_is_rejected(tmp_path: Path) -> None:
    recdir = tmp_path / "rec"
    recdir.mkdir()
    task = make_task("a", 4, functools.partial(sleep_block, str(recdir), 0.1), max_workers=1)
    replies: list[Any] = []

    def attack(server: Any) -> None:
        sock, nonce = connect(server.port)
        sock.sendall(encode([HELLO, compute_mac(server.secret, nonce), "nope", -1, 0, 0.0]))
        replies.append(recv_msg(sock))
        replies.append(closed_by_server(sock))

    def on_listen(server: Any) -> None:
        threading.Thread(target=attack, args=(server,), daemon=True).start()

    states = bellis.Server(on_listen=on_listen).run_blockwise([task], progress=False, summary=False)
    assert states["a"].completed_count == 4
    assert replies[0][0] == REJECT and "no task 'nope'" in replies[0][1]
    assert replies[1].messages == [] and replies[1].closed_at is not None


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_client_with_the_run_secret_cannot_pass_for_a_managed_worker(
    when: str, tmp_path: Path
) -> None:
    """Knowing the run's secret lets a client in, but only as an unmanaged client: it can
    neither take a managed worker's place (whose process the server would then stop on
    the impostor's word) nor, by claiming a worker that has exited, fail the run."""
    recdir = tmp_path / "rec"
    recdir.mkdir()
    n = 6
    # worker 0 exits (cleanly, 0) at its first attempt of block 1; worker 1 replaces it
    task = make_task("a", n, functools.partial(exit_once_block, str(recdir), 1, 0.2), max_workers=1)
    outcome: dict[str, Any] = {}

    def claim(server: Any) -> None:
        try:
            if when == "after":  # once worker 0 has exited: its replacement is at work
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    pids = {a.pid for rows in read_records(recdir).values() for a in rows}
                    if len(pids) >= 2:
                        break
                    time.sleep(0.02)
            sock, nonce = connect(server.port)
            # worker 0's id, the run's secret, but not worker 0's own token
            sock.sendall(encode([HELLO, compute_mac(server.secret, nonce), "a", 0, 0, 0.0]))
            outcome["reply"] = recv_msg(sock)
            sock.close()
        except BaseException as exc:
            outcome["error"] = exc

    def on_listen(server: Any) -> None:
        threading.Thread(target=claim, args=(server,), daemon=True).start()

    server = bellis.Server(on_listen=on_listen)
    states = server.run_blockwise([task], progress=False, summary=False)
    s = states["a"]
    assert "error" not in outcome, outcome.get("error")
    assert parse_welcome(outcome["reply"]).resource_tracking is False  # let in, unmanaged
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n, 0, 0)
    assert s.worker_failure_count == 0 and s.timeout_reclaim_count == 0
    report = task.report()
    assert report.workers.unmanaged_clients == 1
    assert set(report.workers.exits) == {"clean"}
    # worker 0's record is the real worker's, which did its blocks as the managed worker
    assert report.worker(0).blocks >= 1


_FLOOD = """
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(300)]
print("open", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("first", ["flood", "worker"])
def test_a_flood_of_silent_connections_cannot_hold_more_than_its_share(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, first: str
) -> None:
    """Whichever comes first, the worker or the flood, the run goes on until the server has
    dropped silent connections: the blocks wait for a gate that the drop's log line opens
    (the drop comes only after HANDSHAKE_SECONDS, longer than any fixed run would last).
    Both orders are forced: the flood connects before the server starts its worker, or the
    worker's first block starts the flood."""
    caplog.set_level(logging.WARNING, logger="bellis")
    gate, port_file, pid_file = tmp_path / "dropped", tmp_path / "port", tmp_path / "flood.pid"
    n = 4

    def gated(block: Any) -> None:
        if first == "worker" and not pid_file.exists():
            flood = subprocess.Popen(
                [sys.executable, "-c", _FLOOD, port_file.read_text()], stdout=subprocess.PIPE
            )
            assert flood.stdout is not None
            flood.stdout.readline()  # all 300 connected
            pid_file.write_text(str(flood.pid))
        give_up = time.monotonic() + 120.0
        while not gate.exists() and time.monotonic() < give_up:
            time.sleep(0.05)

    class OpenGateOnDrop(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "no handshake within" in record.getMessage():
                gate.touch()

    opener = OpenGateOnDrop()
    logging.getLogger("bellis").addHandler(opener)
    task = make_task("a", n, gated, max_workers=1)
    floods: list[subprocess.Popen[str]] = []

    def on_listen(server: Any) -> None:
        port_file.write_text(str(server.port))
        if first == "flood":
            flood = subprocess.Popen(
                [sys.executable, "-c", _FLOOD, str(server.port)], stdout=subprocess.PIPE, text=True
            )
            floods.append(flood)
            assert flood.stdout is not None
            flood.stdout.readline()  # all 300 in the backlog before the worker starts

    try:
        states = bellis.Server(on_listen=on_listen).run_blockwise(
            [task], progress=False, summary=False
        )
    finally:
        logging.getLogger("bellis").removeHandler(opener)
        for p in floods:
            p.kill()
            p.communicate()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    s = states["a"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n, 0, 0)
    capped = [r for r in caplog.records if "connections are in their handshake" in r.getMessage()]
    silent = [r for r in caplog.records if "no handshake within" in r.getMessage()]
    # the server held at most its cap of silent connections, stopped accepting, and made
    # room (for the rest of the flood and for the worker) by dropping the silent ones
    assert capped and silent
    assert gate.exists() and (first == "flood" or pid_file.exists())


def test_a_connection_at_the_handshake_cap_is_not_dropped_before_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    # a burst of real workers: the first connection says its HELLO only after 2 s, while
    # the cap is reached behind it. It is dropped only past the handshake timeout (10 s)
    recdir = tmp_path / "rec"
    recdir.mkdir()
    n = 8
    task = make_task("a", n, functools.partial(sleep_block, str(recdir), 0.5), max_workers=1)
    outcome: dict[str, Any] = {}
    floods: list[subprocess.Popen[str]] = []

    def late_hello(server: Any) -> None:
        try:
            sock, nonce = connect(server.port)
            floods.append(
                subprocess.Popen(
                    [sys.executable, "-c", _FLOOD, str(server.port)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            assert floods[0].stdout is not None
            floods[0].stdout.readline()  # the 300 are connected
            time.sleep(2.0)
            sock.sendall(encode([HELLO, compute_mac(server.secret, nonce), "a", -1, 0, 0.0]))
            outcome["reply"] = recv_msg(sock)
            sock.sendall(encode([BYE]))
            sock.close()
        except BaseException as exc:
            outcome["error"] = exc

    def on_listen(server: Any) -> None:
        threading.Thread(target=late_hello, args=(server,), daemon=True).start()

    try:
        states = bellis.Server(on_listen=on_listen).run_blockwise(
            [task], progress=False, summary=False
        )
    finally:
        for p in floods:
            p.kill()
            p.communicate()
    assert "error" not in outcome, outcome.get("error")
    assert parse_welcome(outcome["reply"]).timeout_seconds > 0
    s = states["a"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (n, 0, 0)
