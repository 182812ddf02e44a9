"""The dispatcher's per-block path on a 2-D grid, alone: no sockets, no worker processes
(issue 38 item 2: locality-aware dispatch against the FIFO order of before).

Run: ``python benchmarks/bench_locality_dispatch.py --src src --src /tmp/base/src
[--grid 100] [--reps 21]`` (byte-compile both first: ``python -m compileall -q src
/tmp/base/src``). Each ``--src`` is a checkout's ``src`` folder; the versions run in
turn (A B A B ...), each measurement a fresh interpreter.

One task of ``--grid`` x ``--grid`` blocks (the shape of ``dist_noop_w2``), two unmanaged
connections that take turns. Each connection's message returns the blocks it holds
(success, no measurements) and asks for more: :meth:`Dispatcher.receive` parses the
returns, releases the blocks, serves the request and appends the SEND instruction, which
is dropped. ``batch1`` pins each connection's batch at one block (the per-block path at its
dearest); ``adaptive`` lets the batch grow as it does in a run. The figure is the CPU time
(``time.process_time``) per block; the report is each version's median and the median of
the paired ratios against the last ``--src``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import gc, json, sys, time
import bellis as daisy
from bellis._protocol import ACQUIRE, HELLO, compute_mac
from bellis._scheduling._dispatch import Dispatcher
from bellis._scheduling._records import Peer, TaskRecord
from bellis._scheduling._scheduler import Scheduler
from bellis._stats._aggregates import TaskAggregates
from bellis._stats._errorgroups import ErrorCollector
from bellis._stats._timeline import TimelineSet


def run(grid, pin):
    task = daisy.Task(
        "t", daisy.Roi((0, 0), (grid, grid)), daisy.Roi((0, 0), (1, 1)),
        daisy.Roi((0, 0), (1, 1)), process_function=lambda b: None,
        read_write_conflict=False,
    )
    t0 = time.process_time()
    s = Scheduler(task)
    plans = {r.task_id: TaskRecord(r, b"fn", TaskAggregates(), TimelineSet()) for r in s.runs}
    d = Dispatcher(s, plans, secret=b"s" * 32, worker_key=b"k" * 32, resources={},
                   errors=ErrorCollector())
    peers = []
    for i in range(2):
        p = Peer(("127.0.0.1", 5000 + i), b"n%d" % i, 0.0)
        d.receive(p, [HELLO, compute_mac(b"s" * 32, p.nonce), "t", -1, 1, 0.0], 0.0)
        peers.append(p)
    d.out.clear()
    now = 1.0
    done = 0
    gc.disable()
    while True:
        live = False
        for p in peers:
            if p.closed:
                continue
            live = True
            msg = [ACQUIRE]
            for k in p.held:
                msg += (k, 2, -1, None)
            done += len(p.held)
            if pin:
                p.batch = 1
            elif p.held:
                msg.append(0.001)  # the worker's busy seconds: fast blocks
            now += 1e-5
            d.receive(p, msg, now)
            d.out.clear()
            if not p.held and not p.parked:
                p.closed = True
        if not live:
            break
    s.task_states  # the run's statistics, as the summary reads them
    t1 = time.process_time()
    gc.enable()
    assert done == grid * grid, (done, grid)
    return (t1 - t0) / done * 1e6


grid = int(sys.argv[1])
run(20, True)  # warm up
print(json.dumps({"batch1": run(grid, True), "adaptive": run(grid, False)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=100)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--src", action="append", default=[], help="a src folder; repeat")
    args = ap.parse_args()
    srcs = args.src or ["src"]
    rows: dict[str, dict[str, list[float]]] = {s: {"batch1": [], "adaptive": []} for s in srcs}
    for _ in range(args.reps):
        for src in srcs:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(args.grid)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            fig = json.loads(out.stdout)
            for key in ("batch1", "adaptive"):
                rows[src][key].append(fig[key])
    base = srcs[-1]
    print(f"load average: {os.getloadavg()[0]:.2f}; {args.reps} reps; grid {args.grid}^2")
    for src in srcs:
        cells = []
        for key in ("batch1", "adaptive"):
            vals = rows[src][key]
            ratios = [a / b for a, b in zip(vals, rows[base][key], strict=True)]
            cells.append(
                f"{key} {statistics.median(vals):.3f} µs/block "
                f"(paired ratio {statistics.median(ratios):.3f}, "
                f"{min(ratios):.2f}-{max(ratios):.2f})"
            )
        print(f"{src}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
