"""The dispatcher's per-block path driven alone (no sockets, no worker processes), shared by
``bench_dispatch_block.py`` (1-D blocks) and ``bench_locality_dispatch.py`` (a 2-D grid).

One task of one-voxel blocks over ``--shape``, two unmanaged connections that take turns.
Each connection's message returns the blocks it holds (success, no measurements) and asks
for more: :meth:`Dispatcher.receive` parses the returns, releases the blocks, serves the
request and appends the SEND instruction, which is dropped (the shell's part, encoding
aside, is not timed). ``batch1`` pins each connection's batch at one block (the per-block
path at its dearest: one message, one parse, one instruction per block); ``adaptive``
lets the batch grow as it does in a run (with ``--busy``, each return reports that many
busy seconds of the worker's, as a worker does).

The child, one measurement in a fresh interpreter (bellis from its ``PYTHONPATH``)::

    python benchmarks/_dispatch_loop.py --shape 100,100 [--warm 20,20] [--clock cpu]
        [--with-setup] [--busy 0.001]

prints ``{"batch1": µs, "adaptive": µs}``: the ``--clock`` time (``wall``:
``time.perf_counter``; ``cpu``: ``time.process_time``) per block of the loop, and with
``--with-setup`` of the scheduler's construction and the run's statistics too.
:func:`campaign` runs the child for each ``src`` in turn (A B A B ...), :func:`report`
prints the medians and the paired ratios against the last ``src``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CASES = ("batch1", "adaptive")


def drive(shape: tuple[int, ...], pin: bool, clock: str, with_setup: bool, busy: float) -> float:
    """µs per block of one run of the loop (the module's docstring)."""
    import gc

    import bellis as daisy
    from bellis._protocol import ACQUIRE, HELLO, compute_mac
    from bellis._scheduling._dispatch import Dispatcher
    from bellis._scheduling._records import Peer, TaskRecord
    from bellis._scheduling._scheduler import Scheduler
    from bellis._stats._aggregates import TaskAggregates
    from bellis._stats._errorgroups import ErrorCollector
    from bellis._stats._timeline import TimelineSet

    tick = time.process_time if clock == "cpu" else time.perf_counter
    one = (1,) * len(shape)
    task = daisy.Task(
        "t",
        daisy.Roi((0,) * len(shape), shape),
        daisy.Roi((0,) * len(shape), one),
        daisy.Roi((0,) * len(shape), one),
        process_function=lambda b: None,
        read_write_conflict=False,
    )
    t0 = tick()
    s = Scheduler(task)
    plans = {r.task_id: TaskRecord(r, b"fn", TaskAggregates(), TimelineSet()) for r in s.runs}
    d = Dispatcher(
        s, plans, secret=b"s" * 32, worker_key=b"k" * 32, resources={}, errors=ErrorCollector()
    )
    peers = []
    for i in range(2):
        p = Peer(("127.0.0.1", 5000 + i), b"n%d" % i, 0.0)
        d.receive(p, [HELLO, compute_mac(b"s" * 32, p.nonce), "t", -1, 1, 0.0], 0.0)
        peers.append(p)
    d.out.clear()
    now = 1.0
    done = 0
    gc.disable()
    if not with_setup:
        t0 = tick()
    while True:
        live = False
        for p in peers:
            if p.closed:
                continue
            live = True
            msg: list[Any] = [ACQUIRE]
            for k in p.held:
                msg += (k, 2, -1, None)
            done += len(p.held)
            if pin:
                p.batch = 1
            elif busy and p.held:
                msg.append(busy)  # the worker's busy seconds
            now += 1e-5
            d.receive(p, msg, now)
            d.out.clear()
            if not p.held and not p.parked:
                p.closed = True
        if not live:
            break
    if with_setup:
        _ = s.task_states  # the run's statistics, as the summary reads them
    t1 = tick()
    gc.enable()
    blocks = 1
    for n in shape:
        blocks *= n
    assert done == blocks, (done, blocks)
    return (t1 - t0) / done * 1e6


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(","))


def child_main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", type=_shape, required=True)
    ap.add_argument("--warm", type=_shape, default=None, help="the warm-up run's shape")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--with-setup", action="store_true")
    ap.add_argument("--busy", type=float, default=0.0)
    args = ap.parse_args()
    knobs = (args.clock, args.with_setup, args.busy)
    drive(args.warm or tuple(min(n, 20) for n in args.shape), True, *knobs)  # warm up
    print(json.dumps({case: drive(args.shape, case == "batch1", *knobs) for case in CASES}))


def campaign(
    srcs: list[str | None], reps: int, child_args: list[str]
) -> dict[str | None, dict[str, list[float]]]:
    """``reps`` rounds, each running the child once for every ``src`` in turn (``None``:
    bellis as installed), each measurement a fresh interpreter."""
    rows: dict[str | None, dict[str, list[float]]] = {s: {c: [] for c in CASES} for s in srcs}
    for _ in range(reps):
        for src in srcs:  # interleaved: A B A B ...
            env = None if src is None else dict(os.environ, PYTHONPATH=os.path.abspath(src))
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *child_args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            fig = json.loads(out.stdout)
            for case in CASES:
                rows[src][case].append(fig[case])
    return rows


def report(rows: dict[str | None, dict[str, list[float]]], what: str) -> None:
    """Each version's median (and minimum) µs per block; with two or more versions, the
    median and range of the paired ratios against the last one."""
    srcs = list(rows)
    base = rows[srcs[-1]]
    reps = len(base[CASES[0]])
    print(f"load average: {os.getloadavg()[0]:.2f}; {reps} reps; {what}")
    for src in srcs:
        cells = []
        for case in CASES:
            vals = rows[src][case]
            cell = f"{case} {statistics.median(vals):.3f} µs/block (min {min(vals):.3f}"
            if len(srcs) > 1:
                ratios = [a / b for a, b in zip(vals, base[case], strict=True)]
                cell += (
                    f", paired ratio {statistics.median(ratios):.3f},"
                    f" {min(ratios):.2f}-{max(ratios):.2f}"
                )
            cells.append(cell + ")")
        print(f"{src or 'installed'}: " + "; ".join(cells))


if __name__ == "__main__":
    child_main()
