"""``dist_noop_w2`` tracked on S3 against tracked on local disk (issue #40). Not in the suite.

The shared harness's ``dist_noop_w2`` shape (10,000 2-D blocks of 100 x 100, two local
workers, ``read_write_conflict=False``, an empty block function) with a tracking store,
each run timed around ``run_blockwise`` in a fresh interpreter, the two interleaved
(local, s3, local, s3, ...: the load of the shared machine falls on both alike). The call
is the harness's (``progress=False, summary=False, return_states=True``); ``--as-user``
calls it with its defaults, as a user's script does (the progress line and the printed
summary and panel add about 50 ms to both: runs measured before 2026-12-07 04:00 UTC
were made this way, as the flag did not exist):

``local``
    ``tracking_path`` a fresh local folder;
``s3``
    ``tracking_path`` a fresh prefix on a moto S3 server on 127.0.0.1 (started once, by
    this script), ``BELLIS_S3_FLUSH_SECONDS`` the default 5.

``--rt`` adds ``resource_tracking=True`` to both (the per-flush statistics objects on
S3). Prints each pair, the paired ratios s3 / local and their median, and the load
average; ``--json`` writes the record.

    .venv/bin/python -m compileall -q src
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 10 --rt
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 10
    # before and after in one campaign: the base tree's src/ (git archive <commit> src)
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 8 --base-src /tmp/base/src
    # the server on core 1, every run (local and s3) on core 0: latency without the
    # server's CPU competing with the run's processes
    .venv/bin/python benchmarks/bench_s3_noop.py --pairs 12 --server-core 1

Each S3 run's server CPU (psutil, user + system of the moto process) goes to the record
as ``server_cpu``, with its median printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_s3_requests import _moto_env, _start_moto


def _start_latency_proxy(endpoint: str, one_way_ms: float) -> str:
    """A TCP proxy on 127.0.0.1 in front of ``endpoint`` that holds every byte
    ``one_way_ms`` in each direction (an S3 endpoint one round trip of twice that away,
    whose CPU is not this machine's); its URL. Runs in a thread of this process."""
    import asyncio
    import threading

    host, port = endpoint.rsplit("//", 1)[1].rsplit(":", 1)
    delay = one_way_ms / 1000.0
    ready: list[str] = []
    started = threading.Event()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            loop = asyncio.get_running_loop()
            while True:
                at, data = await queue.get()
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((asyncio.get_running_loop().time() + delay, data))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            sender.cancel()
            writer.close()

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            c_writer.close()
            return
        await asyncio.gather(pipe(c_reader, s_writer), pipe(s_reader, c_writer))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        started.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    started.wait(10)
    return ready[0]


_CHILD = r"""
import json, sys, time
import bellis
from bellis import Roi

path, blocks, rt = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
as_user = sys.argv[5] == "1"
if sys.argv[4] == "1" and path.startswith("s3://"):  # --warm-client: made before the timing
    from bellis._tracking._s3io import _client
    _client(path)

def noop(block):
    pass

side = 100
task = bellis.Task(
    "noop",
    total_roi=Roi((0, 0), (side, blocks // side)),
    read_roi=Roi((0, 0), (1, 1)),
    write_roi=Roi((0, 0), (1, 1)),
    process_function=noop,
    max_workers=2,
    read_write_conflict=False,
    tracking_path=path,
    resource_tracking=rt,
)
t0 = time.perf_counter()
if as_user:  # a user's script: the defaults (progress on stderr, the summary and panel)
    ok = bellis.run_blockwise([task])
else:  # the shared harness's call (../shared/bench/bench.py: Impl.run)
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    ok = all(s.completed_count == s.total_block_count for s in states.values())
print(json.dumps({"ok": bool(ok), "seconds": time.perf_counter() - t0}))
"""


_WARM = {"on": False, "as_user": False}
#: --server-core: the cores the runs may use (None: all); the server's own is left out
_RUN_CORES: dict[str, set[int] | None] = {"cores": None}
#: the S3 server's CPU seconds (user + system) during each S3 run, in order
_SERVER_CPU: list[float] = []
_SERVER: dict[str, subprocess.Popen[bytes] | None] = {"proc": None}


def _server_cpu() -> float:
    import psutil

    proc = _SERVER["proc"]
    assert proc is not None
    times = psutil.Process(proc.pid).cpu_times()
    return float(times.user + times.system)


def _one(path: str, blocks: int, rt: bool, env: dict[str, str]) -> float:
    return _timed(path, blocks, rt, env)[0]


def _timed(path: str, blocks: int, rt: bool, env: dict[str, str]) -> tuple[float, float]:
    """The run's wall around ``run_blockwise`` and the child process's whole wall (its
    interpreter start and imports included)."""
    cores = _RUN_CORES["cores"]
    cpu0 = _server_cpu() if path.startswith("s3://") else 0.0
    t0 = time.perf_counter()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            path,
            str(blocks),
            "1" if rt else "0",
            "1" if _WARM["on"] else "0",
            "1" if _WARM["as_user"] else "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        # the run and every process it starts on the cores left to it (--server-core)
        preexec_fn=None if cores is None else (lambda: os.sched_setaffinity(0, cores)),
    )
    if r.returncode != 0:
        raise SystemExit(f"a run failed ({path}):\n{r.stdout}\n{r.stderr}")
    whole = time.perf_counter() - t0
    if path.startswith("s3://"):
        _SERVER_CPU.append(_server_cpu() - cpu0)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if not got["ok"]:
        raise SystemExit(f"a run was not ok ({path}):\n{r.stderr}")
    return float(got["seconds"]), whole


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--blocks", type=int, default=10_000)
    p.add_argument("--rt", action="store_true", help="resource_tracking=True on both")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--warm-client",
        action="store_true",
        help="make the S3 client before the timed run (what the requests alone cost)",
    )
    p.add_argument(
        "--base-src",
        default=None,
        help="also run the tree whose src/ is here (PYTHONPATH), interleaved: before/after",
    )
    p.add_argument(
        "--server-core",
        type=int,
        default=None,
        help="pin the S3 server to this core and every run to the others (what the "
        "server's own CPU costs a run on a shared machine)",
    )
    p.add_argument(
        "--as-user",
        action="store_true",
        help="call run_blockwise with its defaults, as a user's script does (progress and "
        "the summary on); else the shared harness's call (both off, return_states=True)",
    )
    p.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="reach the S3 server through a proxy that holds every byte this long in each "
        "direction (an endpoint one round trip of twice this away)",
    )
    args = p.parse_args()
    _WARM["on"] = args.warm_client
    _WARM["as_user"] = args.as_user

    server, endpoint = _start_moto()
    _SERVER["proc"] = server
    if args.server_core is not None:
        everything = os.sched_getaffinity(0)
        os.sched_setaffinity(server.pid, {args.server_core})
        _RUN_CORES["cores"] = everything - {args.server_core}
    try:
        env = _moto_env(endpoint, "bellis-bench")
        if args.latency_ms:
            env["AWS_ENDPOINT_URL"] = _start_latency_proxy(endpoint, args.latency_ms)
        load = [os.getloadavg()[0]]
        # each tree: its env (PYTHONPATH for --base-src) and its pairs (local, s3), the
        # walls around run_blockwise and of the whole child process
        trees = {"this": env}
        if args.base_src:
            trees["base"] = {**env, "PYTHONPATH": os.path.abspath(args.base_src)}
        pairs: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
        wholes: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.pairs):
                for tree, tree_env in trees.items():
                    local, local_whole = _timed(
                        os.path.join(tmp, f"{tree}{i}"), args.blocks, args.rt, tree_env
                    )
                    s3, s3_whole = _timed(
                        f"s3://bellis-bench/{uuid.uuid4().hex}", args.blocks, args.rt, tree_env
                    )
                    pairs[tree].append((local, s3))
                    wholes[tree].append((local_whole, s3_whole))
                    print(
                        f"pair {i} {tree}: local {local:.2f} s, s3 {s3:.2f} s, ratio "
                        f"{s3 / local:.3f} (whole process: {local_whole:.2f} s, "
                        f"{s3_whole:.2f} s, ratio {s3_whole / local_whole:.3f})",
                        flush=True,
                    )
        load.append(os.getloadavg()[0])
        if _SERVER_CPU:
            print(
                f"S3 server CPU per S3 run: median {statistics.median(_SERVER_CPU) * 1000:.0f} "
                f"ms (range {min(_SERVER_CPU) * 1000:.0f}-{max(_SERVER_CPU) * 1000:.0f} ms)"
            )
        record: dict[str, object] = {
            "blocks": args.blocks,
            "resource_tracking": args.rt,
            "base_src": args.base_src,
            "loadavg_start_end": load,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "server_core": args.server_core,
            "latency_ms_each_way": args.latency_ms,
            "call": "defaults (as a user)" if args.as_user else "the shared harness's",
            # the S3 server's CPU seconds in each S3 run (the trees interleaved, in order)
            "server_cpu": _SERVER_CPU,
        }
        for tree in trees:
            ratios = [s / lo for lo, s in pairs[tree]]
            whole_ratios = [s / lo for lo, s in wholes[tree]]
            rec = {
                "pairs": pairs[tree],
                "ratios": ratios,
                "median_ratio": statistics.median(ratios),
                "median_local": statistics.median(lo for lo, _ in pairs[tree]),
                "median_s3": statistics.median(s for _, s in pairs[tree]),
                "whole_pairs": wholes[tree],
                "median_whole_ratio": statistics.median(whole_ratios),
                "median_whole_local": statistics.median(lo for lo, _ in wholes[tree]),
                "median_whole_s3": statistics.median(s for _, s in wholes[tree]),
            }
            if tree == "this":
                record.update(rec)
            else:
                record[tree] = rec
            print(
                f"{tree}: median local {rec['median_local']:.2f} s, median s3 "
                f"{rec['median_s3']:.2f} s, paired median ratio s3/local "
                f"{rec['median_ratio']:.3f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
                f"whole process {rec['median_whole_local']:.2f} s / "
                f"{rec['median_whole_s3']:.2f} s, ratio {rec['median_whole_ratio']:.3f}"
            )
        print(f"load average {load[0]:.1f} -> {load[1]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        return 0
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
