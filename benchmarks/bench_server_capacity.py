"""Server capacity with many simulated external workers (issue 18, item 3).

Run: ``python benchmarks/bench_server_capacity.py [--connections 2,16,128,512,1000]
[--blocks 500000] [--processes 4] [--track] [--resource-tracking] [--handshakes K]
[--barrier] [--src SRC] [--profile DIR] [--json out.json]`` with this checkout's ``src`` on
``PYTHONPATH`` (``--src`` runs the server from other sources, to compare two versions).
Results and what they mean: ``benchmarks/results/server-capacity.md``.

For each N, a fresh server process runs what a user runs to serve external workers: a task
of ``--blocks`` one-voxel blocks (no read/write conflicts, no process function) on
``bellis.Server(external_workers=True, on_listen=...)``, whose callback writes
``Server.worker_context(task_id)`` to a file. ``--processes`` client processes
(``benchmarks/_simworkers.py``, asyncio, no bellis client) then open N authenticated
connections at once and return zero-work blocks until the server says SHUTDOWN.

Measured, while the run goes on (every 20 ms: the blocks handed out, from shared counters in
the client processes, and the server process's CPU time, from ``/proc/PID/stat``):

* the dispatch rate, blocks/s, over the steady window: from when every connection has been
  served its first block (and 10% of the blocks are out) to when 90% are out;
* the server's CPU per block over the same window (its whole process: the run loop thread
  and any other);
* the time from the moment all N connections are let go until each has been served a
  first block.

Every block must be handed out exactly once (checked from the blocks the clients saw) and the
server's task state must say all done; the bench fails otherwise. Connections that never
got in (too late, or dropped by the server in their handshake, with the server's reason from
its log) and connections closed at the end holding nothing are counted and reported, not
failed on: they are what is being measured. The load average is printed
beside each figure: the machine is shared, so a figure means nothing without it.

``--profile DIR`` runs each server under cProfile and writes ``DIR/server-N.pstats`` (slower:
use it to find what costs, not for the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))

from _simworkers import Clients, raise_nofile  # noqa: E402

_SERVER = r"""
import json, os, resource, sys, time
ctx_file, connections, blocks, track, profile, measure = sys.argv[1:7]
connections, blocks = int(connections), int(blocks)
# one descriptor per connection, plus the listener, the selector, logs and stores
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = connections + 256
if soft != resource.RLIM_INFINITY and soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
import bellis
import bellis._run._server as _srv

# the run loop's tick, timed from outside (bellis's code unchanged): how long each takes
_ticks = []
_tick = _srv.RunLoop._tick


def _timed_tick(self, now):
    t = time.perf_counter()
    _tick(self, now)
    _ticks.append(time.perf_counter() - t)


_srv.RunLoop._tick = _timed_tick

total = bellis.Roi((0,), (blocks,))
one = bellis.Roi((0,), (1,))
task = bellis.Task("capacity", total, one, one, None, read_write_conflict=False,
                   max_retries=0, resource_tracking=measure == "1",
                   tracking_path="store" if track == "1" else None)


def on_listen(server):
    tmp = ctx_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(server.worker_context("capacity"))
    os.replace(tmp, ctx_file)


server = bellis.Server(external_workers=True, on_listen=on_listen)
prof = None
if profile != "-":
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t0 = time.perf_counter()
states = server.run_blockwise([task], progress=False, summary=False,
                              block_tracking=track == "1")
wall = time.perf_counter() - t0
if prof is not None:
    prof.disable()
    prof.dump_stats(profile)
s = states["capacity"]
usage = resource.getrusage(resource.RUSAGE_SELF)
_ticks.sort()
print(json.dumps({
    "ticks": len(_ticks),
    "tick_median_ms": 1e3 * _ticks[len(_ticks) // 2] if _ticks else None,
    "tick_p90_ms": 1e3 * _ticks[int(0.9 * len(_ticks))] if _ticks else None,
    "tick_max_ms": 1e3 * _ticks[-1] if _ticks else None,
    "total": s.total_block_count, "completed": s.completed_count, "failed": s.failed_count,
    "orphaned": s.orphaned_count, "wall_s": wall,
    "cpu_s": usage.ru_utime + usage.ru_stime,
    "nofile_soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
}))
"""

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU of process ``pid`` (all its threads, ended ones included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def _listen_overflows() -> int:
    """This host's count of connections dropped because a listen queue was full."""
    with open("/proc/net/netstat") as f:
        lines = [line.split() for line in f if line.startswith("TcpExt:")]
    return int(lines[1][lines[0].index("ListenOverflows")])


def _load() -> float:
    return os.getloadavg()[0]


def measure(
    connections: int,
    blocks: int,
    processes: int,
    track: bool,
    profile: Path | None,
    src: Path = SRC,
    barrier: bool = False,
    handshakes: int = 0,
    resource_tracking: bool = False,
) -> dict[str, Any]:
    """One run of the server (bellis from ``src``) with ``connections`` simulated workers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        ctx_file = Path(tmp) / "context"
        log = (Path(tmp) / "server.err").open("w")
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SERVER,
                str(ctx_file),
                str(connections),
                str(blocks),
                "1" if track else "0",
                "-" if profile is None else str(profile),
                "1" if resource_tracking else "0",
            ],
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            # to a file: a pipe nobody reads until the end would stall a server that logs
            # many dropped connections
            stderr=log,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not ctx_file.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start (exit code {server.poll()})")
                time.sleep(0.02)
            clients = Clients(ctx_file.read_text(), connections, processes, barrier, handshakes)
            time.sleep(0.3)  # let the client processes start before the clock does
            overflows0 = _listen_overflows()
            user0, sys0 = _cpu_seconds(server.pid)
            t_go = clients.go()
            samples: list[tuple[float, int, float, float]] = [(t_go, 0, user0, sys0)]
            while server.poll() is None:
                time.sleep(0.02)
                try:
                    user, system = _cpu_seconds(server.pid)
                except (FileNotFoundError, ProcessLookupError):
                    break
                samples.append((time.monotonic(), clients.handed_out(), user, system))
            result = clients.join(60)
            overflows = _listen_overflows() - overflows0
            out, _ = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
            log.close()
            err = (Path(tmp) / "server.err").read_text(errors="replace")
    if server.returncode != 0:
        raise RuntimeError(f"the server exited with code {server.returncode}:\n{err[-3000:]}")
    states = json.loads(out.strip().splitlines()[-1])
    # why the server dropped connections, from its log
    drops = {
        # (bellis before the capacity fixes dropped the oldest at the cap; it now pauses)
        "handshake_cap": sum(
            "dropping client" in line and "connections are in their handshake" in line
            for line in err.splitlines()
        ),
        "handshake_timeout": err.count("no handshake within"),
        "other": err.count("dropping client"),
    }
    drops["other"] -= drops["handshake_cap"] + drops["handshake_timeout"]
    load_after = _load()
    dup = result.duplicates()
    ok = (
        states["completed"] == states["total"] == blocks
        and len(result.blocks) == blocks
        and dup == 0
        # errors only on connections that never got a WELCOME (too late: the run had
        # ended; or dropped by the server in their handshake), or that were closed at the
        # end holding no block (cut off); each is counted and reported
        and len(result.errors) == result.too_late + result.dropped + result.cut_off
        and result.welcomed == connections - result.too_late - result.dropped
        and result.shutdowns == result.welcomed - result.cut_off
    )
    if not ok:
        raise RuntimeError(
            f"N={connections}: outcome wrong: server {states}, clients "
            f"{ {k: v for k, v in result.summary().items()} }, duplicates {dup}"
        )
    all_first = max(result.first) if len(result.first) == connections else None
    lo, hi = 0.1 * blocks, 0.9 * blocks
    start = next(
        (s for s in samples if s[1] >= lo and (all_first is None or s[0] >= all_first)), None
    )
    end = next((s for s in reversed(samples) if s[1] <= hi), None)
    steady = start is not None and end is not None and end[0] - start[0] > 0.2
    if not steady:
        # every connection was first served late in the run: the 10-90% window instead
        start = next(s for s in samples if s[1] >= lo)
        end = next(s for s in reversed(samples) if s[1] <= hi)
    assert start is not None and end is not None
    dt, dn = end[0] - start[0], end[1] - start[1]
    duser, dsys = end[2] - start[2], end[3] - start[3]
    dcpu = duser + dsys
    first = sorted(t - t_go for t in result.first)
    return {
        "connections": connections,
        "blocks": blocks,
        "processes": processes,
        "track": track,
        "resource_tracking": resource_tracking,
        "rate_blocks_per_s": dn / dt if dt > 0 else None,
        "server_cpu_us_per_block": 1e6 * dcpu / dn if dn else None,
        "server_cpu_share": dcpu / dt if dt > 0 else None,
        "server_sys_share_of_cpu": dsys / dcpu if dcpu > 0 else None,
        "window_s": dt,
        "window_blocks": dn,
        "window_after_all_first": steady,
        "all_first_block_s": None if all_first is None else all_first - t_go,
        "served_first_block": len(result.first),
        "too_late": result.too_late,
        "dropped_in_handshake": result.dropped,
        "cut_off_at_end": result.cut_off,
        "server_drops": drops,
        "barrier": barrier,
        "handshakes_per_process": handshakes,
        "first_block_s_p50_p90_p99": [first[int(q * (len(first) - 1))] for q in (0.5, 0.9, 0.99)],
        "listen_overflows": overflows,
        "run_s": result.ended - t_go,
        "round_trips": result.round_trips,
        "blocks_per_round_trip": blocks / max(1, result.round_trips),
        "server_cpu_total_s": states["cpu_s"],
        "clients_cpu_s": result.cpu_s,
        "server_nofile_soft": states["nofile_soft"],
        "ticks": states["ticks"],
        "tick_ms_median_p90_max": [
            states["tick_median_ms"],
            states["tick_p90_ms"],
            states["tick_max_ms"],
        ],
        "load_before": load_before,
        "load_after": load_after,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="2,16,128,512,1000")
    parser.add_argument("--blocks", type=int, default=500_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--track", action="store_true", help="block tracking on")
    parser.add_argument(
        "--resource-tracking",
        action="store_true",
        help="the task measures its blocks (each comes back with a row); implies --track",
    )
    parser.add_argument(
        "--barrier",
        action="store_true",
        help="no connection asks for a block before all N are welcomed",
    )
    parser.add_argument(
        "--handshakes",
        type=int,
        default=0,
        help="at most this many connections per client process in their handshake at once",
    )
    parser.add_argument("--profile", type=Path, help="cProfile each server into this folder")
    parser.add_argument("--json", type=Path, help="append one JSON line per N here")
    parser.add_argument(
        "--src",
        type=Path,
        default=SRC,
        help="the bellis sources the server runs (default: this checkout's)",
    )
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.connections.split(",")]
    if args.resource_tracking:
        args.track = True
    soft, _hard = raise_nofile(max(counts) + 256)
    print(f"descriptor soft limit here: {soft}", file=sys.stderr)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    header = (
        f"{'N':>5} {'blocks/s':>9} {'srv µs/blk':>10} {'srv CPU':>7} {'all 1st s':>9} "
        f"{'blk/rt':>6} {'tick ms':>7} {'sys%':>4} {'drop':>4} {'load':>9}"
    )
    print(header)
    for n in counts:
        profile = None if args.profile is None else args.profile / f"server-{n}.pstats"
        r = measure(
            n,
            args.blocks,
            args.processes,
            args.track,
            profile,
            args.src,
            args.barrier,
            args.handshakes,
            args.resource_tracking,
        )
        r["src"] = str(args.src)
        first = r["all_first_block_s"]
        print(
            f"{n:>5} {r['rate_blocks_per_s']:>9.0f} {r['server_cpu_us_per_block']:>10.2f} "
            f"{r['server_cpu_share']:>7.2f} "
            f"{'-' if first is None else f'{first:.3f}':>9} "
            f"{r['blocks_per_round_trip']:>6.1f} "
            f"{r['tick_ms_median_p90_max'][0]:>7.3f} "
            f"{100 * r['server_sys_share_of_cpu']:>4.0f} "
            f"{r['dropped_in_handshake']:>4} "
            f"{r['load_before']:>4.2f}/{r['load_after']:<4.2f}",
            flush=True,
        )
        if args.json is not None:
            with args.json.open("a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
