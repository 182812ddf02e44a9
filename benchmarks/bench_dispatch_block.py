"""The dispatcher's per-block path, alone: no sockets, no worker processes.

Run: ``python benchmarks/bench_dispatch_block.py [--blocks 20000] [--reps 7]`` (byte-compile
``src`` first: ``python -m compileall -q src``). With ``--src DIR`` it imports bellis from
``DIR`` instead (another checkout's ``src``), to compare two versions in one campaign.

One task of ``--blocks`` 1-D blocks, two unmanaged connections that take turns. Each
connection's message returns the blocks it holds (success, no measurements) and asks for
more: :meth:`Dispatcher.receive` parses the returns, releases the blocks, serves the
request and appends the SEND instruction, which is dropped (the shell's part, encoding
aside, is not timed). ``batch1`` pins each connection's batch at one block (the per-block
path at its dearest: one message, one parse, one instruction per block); ``adaptive``
lets the batch grow as it does in a run. Prints the median, over ``--reps`` fresh
interpreters run one after the other, of µs per block for each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import gc, json, sys, time
import bellis as daisy
from bellis._protocol import ACQUIRE, HELLO, compute_mac
from bellis._scheduling._dispatch import Dispatcher
from bellis._scheduling._records import Peer, TaskPlan
from bellis._scheduling._scheduler import Scheduler


class Errors:
    def add(self, *a):
        pass


class Aggregates:
    def add_block(self, *a):
        pass


class Timelines:
    def unmanaged_client(self):
        pass


def run(blocks, pin):
    task = daisy.Task(
        "t", daisy.Roi((0,), (blocks,)), daisy.Roi((0,), (1,)), daisy.Roi((0,), (1,)),
        process_function=lambda b: None, read_write_conflict=False,
    )
    s = Scheduler(task)
    plans = {r.task_id: TaskPlan(r, b"fn", None, Aggregates(), Timelines()) for r in s.runs}
    d = Dispatcher(s, plans, secret=b"s" * 32, worker_key=b"k" * 32, resources={}, errors=Errors())
    peers = []
    for i in range(2):
        p = Peer(("127.0.0.1", 5000 + i), b"n%d" % i, 0.0)
        d.receive(p, [HELLO, compute_mac(b"s" * 32, p.nonce), "t", -1, 1, 0.0], 0.0)
        peers.append(p)
    d.out.clear()
    now = 1.0
    done = 0
    gc.disable()
    t0 = time.perf_counter()
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
            now += 1e-5
            d.receive(p, msg, now)
            d.out.clear()
            if not p.held and not p.parked:
                p.closed = True
        if not live:
            break
    t1 = time.perf_counter()
    gc.enable()
    assert done == blocks, (done, blocks)
    return (t1 - t0) / blocks * 1e6


blocks = int(sys.argv[1])
run(2000, True)  # warm up
print(json.dumps({"batch1": run(blocks, True), "adaptive": run(blocks, False)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--src", action="append", default=[], help="a src folder; repeat to compare")
    args = ap.parse_args()
    srcs = args.src or [""]
    got: dict[str, dict[str, list[float]]] = {s: {"batch1": [], "adaptive": []} for s in srcs}
    for _ in range(args.reps):
        for src in srcs:  # interleaved: A B A B ...
            env_cmd = [sys.executable, "-c", _CHILD, str(args.blocks)]
            env = None
            if src:
                import os

                env = dict(os.environ, PYTHONPATH=src)
            res = json.loads(subprocess.check_output(env_cmd, env=env))
            for case, v in res.items():
                got[src][case].append(v)
    for src in srcs:
        line = ", ".join(
            f"{case} {statistics.median(v):.2f} µs/block (min {min(v):.2f})"
            for case, v in got[src].items()
        )
        print(f"{src or 'installed'}: {line}")


if __name__ == "__main__":
    main()
