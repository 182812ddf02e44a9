"""How long a crashed local worker leaves its task without one: from its death to the first
block of its replacement (issue 18 item 6).

One worker (``max_workers=1``) runs 2 ms blocks; every ``--every``-th block SIGKILLs its own
worker the first time it runs, just after writing the time (``time.time()``, one clock for
every process). The replacement's first block writes its start time and how long its
process had existed by then (``setup_seconds_since_start``: from the fork for a worker forked
from the zygote, from the exec for a spawned one). Each driver runs in a fresh interpreter,
fork and spawn alternating (``BELLIS_WORKER_START``).

    death -> first block = detection (the run loop sees the exit at its next tick, 50 ms)
                           + start (request, fork or exec, connect, first acquire)

Usage::

    python -m compileall -q src
    PYTHONPATH=src python benchmarks/bench_worker_replacement.py --runs 6 --deaths 8
    # against another checkout's sources (the code before a change), interleaved
    PYTHONPATH=src python benchmarks/bench_worker_replacement.py --old-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

DRIVER = r"""
import json, os, signal, sys, time
import bellis
from bellis._worker._profiling import setup_seconds_since_start

OUT = sys.argv[1]
EVERY = int(sys.argv[2])
DEATHS = int(sys.argv[3])
first = [True]


def fn(block):
    i = block.block_id[1]
    now = time.time()
    if first[0]:
        first[0] = False
        with open(os.path.join(OUT, f"first-{os.getpid()}"), "w") as f:
            json.dump({"t": now, "age": setup_seconds_since_start(), "block": i}, f)
    marker = os.path.join(OUT, f"died-{i}")
    if i % EVERY == EVERY - 1 and not os.path.exists(marker):
        with open(marker, "w") as f:
            json.dump({"t": time.time(), "pid": os.getpid()}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.002)


n = EVERY * DEATHS
task = bellis.Task(
    "replace", bellis.Roi((0,), (n,)), bellis.Roi((0,), (1,)), bellis.Roi((0,), (1,)),
    process_function=fn, max_workers=1, max_retries=2, max_worker_restarts=DEATHS + 2,
)
state = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
assert state["replace"].completed_count == n, state
"""


def one_run(mode: str, every: int, deaths: int, src: str | None = None) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "driver.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(DRIVER))
        env = {**os.environ, "BELLIS_WORKER_START": mode}
        # the driver runs in a temporary directory: a relative PYTHONPATH ("src") would
        # silently import the installed bellis instead of this checkout's
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
        )
        if src is not None:  # another checkout's sources (the code before a change)
            env["PYTHONPATH"] = os.path.abspath(src)
        subprocess.run(
            [sys.executable, script, d, str(every), str(deaths)],
            cwd=d,
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
        died = []
        firsts = []
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if name.startswith("died-"):
                with open(path) as f:
                    died.append(json.load(f))
            elif name.startswith("first-"):
                with open(path) as f:
                    firsts.append(json.load(f))
        firsts.sort(key=lambda r: r["t"])
        out = []
        for death in sorted(died, key=lambda r: r["t"]):
            after = [r for r in firsts if r["t"] > death["t"]]
            if not after:
                continue
            nxt = after[0]
            out.append(
                {
                    "death_to_first_block_ms": (nxt["t"] - death["t"]) * 1e3,
                    "process_age_at_first_block_ms": nxt["age"] * 1e3,
                }
            )
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=6, help="drivers per mode (alternating)")
    ap.add_argument("--deaths", type=int, default=8, help="worker deaths per driver")
    ap.add_argument("--every", type=int, default=5, help="a death every N blocks")
    ap.add_argument("--json", help="write the raw figures here")
    ap.add_argument(
        "--modes",
        default="auto,fork,spawn",
        help="BELLIS_WORKER_START values to alternate (auto: the start policy)",
    )
    ap.add_argument(
        "--old-src",
        help="also alternate with BELLIS_WORKER_START=fork on this src directory ('old-fork')",
    )
    args = ap.parse_args()
    modes = args.modes.split(",") + (["old-fork"] if args.old_src else [])
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            if mode == "old-fork":
                rows[mode].extend(one_run("fork", args.every, args.deaths, args.old_src))
            else:
                rows[mode].extend(one_run(mode, args.every, args.deaths))
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(
        "| start | n | death → first block, median | p10 | p90 "
        "| process age at first block, median |"
    )
    print("|---|---|---|---|---|---|")
    for mode, rs in rows.items():
        total = sorted(r["death_to_first_block_ms"] for r in rs)
        age = [r["process_age_at_first_block_ms"] for r in rs]
        q = statistics.quantiles(total, n=10) if len(total) > 1 else [total[0]] * 9
        print(
            f"| {mode} | {len(rs)} | {statistics.median(total):.1f} ms | {q[0]:.1f} ms | "
            f"{q[-1]:.1f} ms | {statistics.median(age):.1f} ms |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
