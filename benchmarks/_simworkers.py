"""Simulated external workers: many authenticated connections to a real bellis server.

Each client process runs one asyncio loop with its share of the connections. Every
connection speaks the wire protocol as ``bellis worker`` does (``bellis._protocol``): it
answers the server's CHALLENGE with a HELLO signed by the run's secret (worker id -1: an
unmanaged client), reads the WELCOME, then sends ACQUIRE after ACQUIRE, each one returning
the blocks of the previous SEND as successes with no work done, until the server answers
SHUTDOWN. When the WELCOME says the task tracks resources, each block goes back with an
all-zero measurement row, as a worker's would.

Nothing here imports bellis's client (``bellis._worker._client``) or numpy: only the protocol's
constants, framing and MAC (``bellis._protocol``).

Used by ``benchmarks/bench_server_capacity.py`` and
``tests/integration/test_server_capacity.py``; runnable on its own::

    python benchmarks/_simworkers.py --context-file CTX --connections 1000 \
        --processes 4 --json out.json

where ``CTX`` holds the string of ``bellis.Server.worker_context(task_id)``. The JSON
written holds every block index handed out (``blocks``), the connections that were
welcomed, served a first block and told to shut down, the errors, and the times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import resource
import socket
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bellis._protocol import (
    ACQUIRE,
    CHALLENGE,
    HELLO,
    REJECT,
    SEND,
    SHUTDOWN,
    STATS_ROW,
    WELCOME,
    FrameDecoder,
    compute_mac,
    encode,
)

__all__ = ["Clients", "ClientsResult", "Target", "parse_context", "raise_nofile"]

SUCCESS = 2  # BlockStatus.SUCCESS on the wire
_ZERO_ROW = STATS_ROW.pack(0.0, 0.0, 0, 0, 0, 0.0, 0, 0.0)


_CODES = {"%25": "%", "%3A": ":", "%3D": "="}


def _unescape(text: str) -> str:
    """Undo the context's percent-encoding of ``%``, ``:`` and ``=``, in one pass."""
    return re.sub(r"%(25|3[AaDd])", lambda m: _CODES[m.group(0).upper()], text)


def parse_context(text: str) -> dict[str, str]:
    """The fields of a worker context string (``key=value`` pairs joined by ``:``)."""
    out: dict[str, str] = {}
    for token in text.strip().split(":"):
        if token:
            key, _, value = token.partition("=")
            out[_unescape(key)] = _unescape(value)
    return out


@dataclass(frozen=True)
class Target:
    """Where and as what the simulated workers connect."""

    host: str
    port: int
    task_id: str
    secret: bytes

    @classmethod
    def from_context(cls, text: str) -> Target:
        ctx = parse_context(text)
        return cls(ctx["hostname"], int(ctx["port"]), ctx["task_id"], bytes.fromhex(ctx["secret"]))


def raise_nofile(needed: int) -> tuple[int, int]:
    """Raise this process's soft descriptor limit to ``needed`` (capped by the hard
    limit) when it is lower; returns the (soft, hard) limits in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft, hard


@dataclass
class _State:
    blocks: array = field(default_factory=lambda: array("q"))
    first: list[float] = field(default_factory=list)
    welcomed: int = 0
    shutdowns: int = 0
    round_trips: int = 0
    errors: list[str] = field(default_factory=list)
    #: connections refused, or closed before their CHALLENGE: the run had ended
    too_late: int = 0
    #: connections the server closed after its CHALLENGE and before the WELCOME (its
    #: handshake cap dropped them, or it judged the HELLO late)
    dropped: int = 0
    #: welcomed connections closed or reset while a request that returned no block was
    #: unread: the run ended first (the server closes such a socket without a SHUTDOWN)
    cut_off: int = 0


async def _connection(
    target: Target,
    state: _State,
    counter: Any,
    welcomed: Any,
    slot: int,
    barrier: int,
    gate: asyncio.Semaphore | None,
) -> None:
    """One simulated worker; with ``barrier`` > 0 it asks for its first block only once
    that many connections (of all the client processes) have been welcomed. With a
    ``gate``, it holds one of the gate's places from its connect to its WELCOME."""
    if gate is not None:
        await gate.acquire()
    try:
        reader, writer = await asyncio.open_connection(target.host, target.port)
    except OSError as exc:
        if gate is not None:
            gate.release()
        state.too_late += 1
        state.errors.append(f"connect: {exc}")
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    decoder = FrameDecoder()

    async def recv() -> list[Any]:
        while True:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            msgs = decoder.feed(data)
            if msgs:
                if len(msgs) > 1:
                    raise ConnectionError(f"{len(msgs)} replies to one request")
                return msgs[0]  # type: ignore[no-any-return]

    challenge: list[Any] = []
    welcome: list[Any] = []
    message: list[Any] = [ACQUIRE]
    try:
        try:
            challenge = await recv()
            if challenge[0] != CHALLENGE:
                raise ConnectionError(f"opened with opcode {challenge[0]}, not a challenge")
            mac = compute_mac(target.secret, challenge[1])
            writer.write(encode([HELLO, mac, target.task_id, -1, os.getpid(), 0.0, None]))
            welcome = await recv()
        finally:
            if gate is not None:
                gate.release()
        if welcome[0] == REJECT:
            raise ConnectionError(f"rejected: {welcome[1]}")
        if welcome[0] != WELCOME:
            raise ConnectionError(f"answered the hello with opcode {welcome[0]}")
        state.welcomed += 1
        welcomed[slot] += 1
        while barrier and sum(welcomed) < barrier:
            await asyncio.sleep(0.01)
        tracking = bool(welcome[2])
        blocks = state.blocks
        served = False
        while True:
            writer.write(encode(message))
            reply = await recv()
            state.round_trips += 1
            if reply[0] == SHUTDOWN:
                state.shutdowns += 1
                break
            if reply[0] != SEND or len(reply) < 2:
                raise ConnectionError(f"answered an acquire with opcode {reply[0]}")
            ks = reply[1:]
            got = time.monotonic()
            if not served:
                served = True
                state.first.append(time.monotonic())
            blocks.extend(ks)
            counter[slot] += len(ks)
            # zero work: every block succeeds at once, and goes home with the next request
            message = [ACQUIRE]
            if tracking:
                for i, k in enumerate(ks):
                    message += (k, SUCCESS, i, None)
                message.append(_ZERO_ROW * len(ks))
            else:
                for k in ks:
                    message += (k, SUCCESS, -1, None)
            # the seconds spent on the batch, as bellis's client reports them (protocol 4)
            message.append(time.monotonic() - got)
    except (ConnectionError, OSError) as exc:
        if not challenge:
            state.too_late += 1
        elif not welcome:
            state.dropped += 1
        elif len(message) == 1:
            state.cut_off += 1
        state.errors.append(str(exc))
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()


def _client_process(
    text: str,
    connections: int,
    slot: int,
    counter: Any,
    welcomed: Any,
    barrier: int,
    handshakes: int,
    go: Any,
    out: Any,
) -> None:
    """One client process: ``connections`` simulated workers, started when ``go`` is set,
    at most ``handshakes`` of them (0: any number) between connect and WELCOME at once."""
    target = Target.from_context(text)
    raise_nofile(connections + 64)
    state = _State()

    async def main() -> None:
        gate = asyncio.Semaphore(handshakes) if handshakes > 0 else None
        await asyncio.gather(
            *(
                _connection(target, state, counter, welcomed, slot, barrier, gate)
                for _ in range(connections)
            )
        )

    go.wait()
    started = time.monotonic()
    try:
        asyncio.run(main())
    except Exception as exc:  # reported to the parent, which fails on it
        state.errors.append(f"client process {slot}: {exc!r}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.send(
        {
            "blocks": state.blocks.tobytes(),
            "first": state.first,
            "welcomed": state.welcomed,
            "shutdowns": state.shutdowns,
            "round_trips": state.round_trips,
            "errors": state.errors,
            "too_late": state.too_late,
            "dropped": state.dropped,
            "cut_off": state.cut_off,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "started": started,
            "ended": time.monotonic(),
        }
    )
    out.close()


@dataclass
class ClientsResult:
    """What all the simulated workers saw, merged."""

    connections: int
    blocks: array  # every block index handed out, in no particular order
    first: list[float]  # per connection served at least once: when its first block came
    welcomed: int
    shutdowns: int
    round_trips: int
    errors: list[str]
    too_late: int  # of the errors: refused, or closed before the challenge (run over)
    dropped: int  # ... closed by the server between its challenge and the welcome
    cut_off: int  # ... welcomed, holding no block, closed at the end without a SHUTDOWN
    cpu_s: float  # the client processes' CPU, all together
    go: float  # time.monotonic() when the connections were let go
    ended: float  # ... when the last client process finished

    def duplicates(self) -> int:
        """How many hand-outs repeated a block already handed out."""
        return len(self.blocks) - len(set(self.blocks))

    def summary(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "blocks_received": len(self.blocks),
            "distinct_blocks": len(set(self.blocks)),
            "served_first_block": len(self.first),
            "welcomed": self.welcomed,
            "shutdowns": self.shutdowns,
            "round_trips": self.round_trips,
            "errors": self.errors[:20],
            "error_count": len(self.errors),
            "too_late": self.too_late,
            "dropped_in_handshake": self.dropped,
            "cut_off_at_end": self.cut_off,
            "clients_cpu_s": self.cpu_s,
            "all_first_block_s": (max(self.first) - self.go) if self.first else None,
            "clients_wall_s": self.ended - self.go,
        }


class Clients:
    """``processes`` client processes sharing ``connections`` simulated workers.

    They start at once and wait; :meth:`go` lets every connection open together (a burst,
    as when a cluster starts many workers at once). ``counter[i]`` is how many blocks
    process ``i`` has been handed so far (shared memory, readable while they run). With
    ``barrier``, no connection asks for a block before all of them have been welcomed
    (every connection then takes part in the hand-out, however short the run). With
    ``handshakes``, each process has at most that many connections in their handshake at
    once (workers that start over a moment rather than in the same millisecond).
    """

    def __init__(
        self,
        context_text: str,
        connections: int,
        processes: int,
        barrier: bool = False,
        handshakes: int = 0,
    ) -> None:
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else "spawn")
        processes = max(1, min(processes, connections))
        self.connections = connections
        self.counter = ctx.Array("q", processes, lock=False)
        self.welcomed = ctx.Array("q", processes, lock=False)
        wait_for = connections if barrier else 0
        self._go = ctx.Event()
        self._t_go = 0.0
        self._pipes = []
        self._procs = []
        for i in range(processes):
            share = connections // processes + (1 if i < connections % processes else 0)
            recv_end, send_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_client_process,
                args=(
                    context_text,
                    share,
                    i,
                    self.counter,
                    self.welcomed,
                    wait_for,
                    handshakes,
                    self._go,
                    send_end,
                ),
                daemon=True,
            )
            proc.start()
            send_end.close()
            self._pipes.append(recv_end)
            self._procs.append(proc)

    def handed_out(self) -> int:
        return sum(self.counter)

    def go(self) -> float:
        self._t_go = time.monotonic()
        self._go.set()
        return self._t_go

    def join(self, timeout: float) -> ClientsResult:
        """Wait for every client process (at most ``timeout`` seconds in all) and merge
        what they saw; a process that does not report in time is killed and fails this."""
        deadline = time.monotonic() + timeout
        reports = []
        for pipe, proc in zip(self._pipes, self._procs, strict=True):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                for p in self._procs:
                    p.kill()
                raise TimeoutError(f"client process {proc.pid} did not finish in {timeout} s")
            reports.append(pipe.recv())
            proc.join(5)
        blocks = array("q")
        for r in reports:
            blocks.frombytes(r["blocks"])
        return ClientsResult(
            connections=self.connections,
            blocks=blocks,
            first=[t for r in reports for t in r["first"]],
            welcomed=sum(r["welcomed"] for r in reports),
            shutdowns=sum(r["shutdowns"] for r in reports),
            round_trips=sum(r["round_trips"] for r in reports),
            errors=[e for r in reports for e in r["errors"]],
            too_late=sum(r["too_late"] for r in reports),
            dropped=sum(r["dropped"] for r in reports),
            cut_off=sum(r["cut_off"] for r in reports),
            cpu_s=sum(r["cpu_s"] for r in reports),
            go=self._t_go,
            ended=max(r["ended"] for r in reports),
        )


def _read_context(args: argparse.Namespace) -> str:
    if args.context:
        return str(args.context)
    path = Path(args.context_file)
    deadline = time.monotonic() + args.timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no context file at {path} after {args.timeout} s")
        time.sleep(0.05)
    return path.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", help="the worker context string")
    parser.add_argument("--context-file", help="a file holding it (waited for)")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--barrier", action="store_true", help="no block before every connection is welcomed"
    )
    parser.add_argument(
        "--handshakes",
        type=int,
        default=0,
        help="at most this many connections per process in their handshake at once (0: all)",
    )
    parser.add_argument("--json", required=True, help="where to write what the clients saw")
    args = parser.parse_args(argv)
    if not (args.context or args.context_file):
        parser.error("give --context or --context-file")
    clients = Clients(
        _read_context(args), args.connections, args.processes, args.barrier, args.handshakes
    )
    clients.go()
    result = clients.join(args.timeout)
    record = result.summary()
    record["blocks"] = sorted(result.blocks)
    Path(args.json).write_text(json.dumps(record))
    print(json.dumps({k: v for k, v in record.items() if k != "blocks"}), file=sys.stderr)
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
