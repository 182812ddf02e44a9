"""The driver's per-block path for failing blocks, alone: no sockets, no worker processes,
two versions compared in one campaign (interleaved, each repetition a fresh interpreter).

Run::

    python -m compileall -q src /tmp/old-main/src
    python benchmarks/bench_failing_dispatch.py --src src --src /tmp/old-main/src \\
        --blocks 50000 --reps 15

One task of ``--blocks`` 1-D blocks, ``max_retries=0``, two unmanaged connections that
take turns; each returns the block it holds as failed (``block status set to FAILED``, as a
block function that sets ``BlockStatus.FAILED``) and asks for the next one (batch 1: the
path at its dearest). A version with error records gets each connection's first 10
failures with their details (log offsets, host, pid), as its workers send them, and the
rest as the text alone; its task's records go to an ``errors.jsonl`` in a temporary folder.
The ``bellis`` logger's per-failure WARNING goes to ``/dev/null`` in both. Prints the
median CPU µs per block of each version (process time: other load on the machine slows
the wall clock more) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import gc, json, logging, os, sys, tempfile, time
import bellis as daisy
from bellis._protocol import ACQUIRE, HELLO, compute_mac
try:  # main since the folders (issue 23)
    from bellis._scheduling._dispatch import Dispatcher
    from bellis._scheduling._records import Peer, TaskPlan
    from bellis._scheduling._scheduler import Scheduler
    from bellis._run._summary import ErrorCollector
    from bellis._stats._errorlog import ErrorLog
    from bellis._stats._aggregates import TaskAggregates
    from bellis._stats._timeline import TimelineSet
    RECORDS = True
except ImportError:  # before: flat modules, no error records
    from bellis._dispatch import Dispatcher
    from bellis._run_state import Peer, TaskPlan
    from bellis._scheduler import Scheduler
    from bellis._summary import ErrorCollector
    from bellis._aggregates import TaskAggregates
    from bellis._timeline import TimelineSet
    RECORDS = False

TEXT = "block status set to FAILED"
logging.getLogger("bellis").addHandler(logging.StreamHandler(open(os.devnull, "w")))
logging.getLogger("bellis").propagate = False


def run(blocks, folder):
    task = daisy.Task(
        "t", daisy.Roi((0,), (blocks,)), daisy.Roi((0,), (1,)), daisy.Roi((0,), (1,)),
        process_function=lambda b: None, read_write_conflict=False, max_retries=0,
    )
    s = Scheduler(task)
    plans = {r.task_id: TaskPlan(r, b"fn", None, TaskAggregates(), TimelineSet()) for r in s.runs}
    errors = ErrorCollector()
    if RECORDS:
        errors.sinks = {"t": ErrorLog(os.path.join(folder, "errors.jsonl"), 1.0)}
    d = Dispatcher(s, plans, secret=b"s" * 32, worker_key=b"k" * 32, resources={}, errors=errors)
    peers = []
    for i in range(2):
        p = Peer(("127.0.0.1", 5000 + i), b"n%d" % i, 0.0)
        d.receive(p, [HELLO, compute_mac(b"s" * 32, p.nonce), "t", -1, 1, 0.0], 0.0)
        peers.append(p)
    d.out.clear()
    now = 1.0
    done = 0
    # each connection's failures with details: its first 10 where there are error
    # records (the same test per block in both versions)
    quota = [10 if RECORDS else 0 for _ in peers]
    gc.disable()
    t0 = time.process_time()  # CPU time: the machine may be shared
    while True:
        live = False
        for i, p in enumerate(peers):
            if p.closed:
                continue
            live = True
            msg = [ACQUIRE]
            for k in p.held:
                error = TEXT
                if quota[i]:  # a worker's first failures: in full
                    quota[i] -= 1
                    error = [TEXT, {"log": "/x/worker_0.err", "log_offset": 10 * k,
                                    "host": "node", "pid": 4}]
                msg += (k, 3, -1, error)
            done += len(p.held)
            p.batch = 1
            now += 1e-5
            d.receive(p, msg, now)
            d.out.clear()
            if not p.held and not p.parked:
                p.closed = True
        if not live:
            break
    t1 = time.process_time()
    gc.enable()
    errors.close_sinks() if RECORDS else None
    assert done == blocks, (done, blocks)
    assert s.runs[0].failed == blocks, s.runs[0].failed
    return (t1 - t0) / blocks * 1e6


blocks = int(sys.argv[1])
with tempfile.TemporaryDirectory() as folder:
    run(2000, folder)  # warm up
with tempfile.TemporaryDirectory() as folder:
    print(json.dumps({"us": run(blocks, folder), "records": RECORDS}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--src", action="append", required=True, help="a src folder (two)")
    args = ap.parse_args()
    got: dict[str, list[float]] = {s: [] for s in args.src}
    pairs: list[float] = []
    for _ in range(args.reps):
        one: dict[str, float] = {}
        for src in args.src:  # interleaved: A B A B ...
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            cmd = [sys.executable, "-c", _CHILD, str(args.blocks)]
            res = json.loads(subprocess.check_output(cmd, env=env))
            got[src].append(res["us"])
            one[src] = res["us"]
        if len(args.src) == 2:
            pairs.append(one[args.src[0]] / one[args.src[1]])
    for src in args.src:
        v = got[src]
        print(f"{src}: {statistics.median(v):.2f} us/block (min {min(v):.2f})")
    if pairs:
        a, b = (statistics.median(got[s]) for s in args.src)
        print(
            f"ratio {args.src[0]} / {args.src[1]}: {a / b:.3f} "
            f"(paired median {statistics.median(pairs):.3f}, "
            f"range {min(pairs):.2f}-{max(pairs):.2f})"
        )


if __name__ == "__main__":
    main()
