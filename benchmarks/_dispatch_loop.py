"""The dispatcher's per-block path driven alone (no sockets, no worker processes), shared by
``bench_dispatch_block.py`` (1-D blocks), ``bench_locality_dispatch.py`` (a 2-D grid) and
``bench_failing_dispatch.py`` (blocks that fail).

One task of one-voxel blocks over ``--shape``, two unmanaged connections that take turns.
Each connection's message returns the blocks it holds (success, no measurements) and asks
for more: :meth:`Dispatcher.receive` parses the returns, releases the blocks, serves the
request and appends the SEND instruction, which is dropped (the shell's part, encoding
aside, is not timed). ``batch1`` pins each connection's batch at one block (the per-block
path at its dearest: one message, one parse, one instruction per block); ``adaptive``
lets the batch grow as it does in a run (with ``--busy``, each return reports that many
busy seconds of the worker's, as a worker does). With ``--fail`` every block comes back
failed (``block status set to FAILED``; ``max_retries=0``, and
``max_consecutive_failures=None``, whose rule would end the task early): each
connection's first 10 failures with their details (log offsets, host, pid), as workers
send them, the rest as the text alone; the task's error records go to an ``errors.jsonl``
in a temporary folder and the ``bellis`` logger's per-failure WARNING to ``/dev/null``.

The child, one measurement in a fresh interpreter (bellis from its ``PYTHONPATH``)::

    python benchmarks/_dispatch_loop.py --shape 100,100 [--warm 20,20] [--clock cpu]
        [--with-setup] [--busy 0.001] [--fail] [--cases batch1]

prints ``{"batch1": µs, "adaptive": µs}``: the ``--clock`` time (``wall``:
``time.perf_counter``; ``cpu``: ``time.process_time``) per block of the loop, and with
``--with-setup`` of the scheduler's construction and the run's statistics too.
:func:`campaign` runs the child for each ``src`` in turn (A B A B ...), :func:`report`
prints the medians and the paired ratios against the last ``src``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CASES = ("batch1", "adaptive")
#: the error of a block that ``--fail`` returns, as a block function that sets FAILED
_FAILED = "block status set to FAILED"


def drive(
    shape: tuple[int, ...], pin: bool, clock: str, with_setup: bool, busy: float, fail: bool
) -> float:
    """µs per block of one run of the loop (the module's docstring)."""
    with tempfile.TemporaryDirectory() as folder:
        return _drive(shape, pin, clock, with_setup, busy, folder if fail else None)


def _drive(
    shape: tuple[int, ...],
    pin: bool,
    clock: str,
    with_setup: bool,
    busy: float,
    failing: str | None,
) -> float:
    import gc

    import bellis as daisy
    from bellis._protocol import ACQUIRE, HELLO, compute_mac
    from bellis._scheduling._dispatch import Dispatcher
    from bellis._scheduling._records import Peer, TaskRecord
    from bellis._scheduling._scheduler import Scheduler
    from bellis._stats._aggregates import TaskAggregates
    from bellis._stats._errorgroups import ErrorCollector
    from bellis._stats._errorlog import ErrorLog
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
        # every block fails: no retry, and the broken-function rule off (it would end the
        # task after its first failures in a row)
        **({"max_retries": 0, "max_consecutive_failures": None} if failing else {}),
    )
    t0 = tick()
    s = Scheduler(task)
    plans = {r.task_id: TaskRecord(r, b"fn", TaskAggregates(), TimelineSet()) for r in s.runs}
    errors = ErrorCollector()
    if failing:
        errors.sinks = {"t": ErrorLog(os.path.join(failing, "errors.jsonl"), 1.0)}
    d = Dispatcher(s, plans, secret=b"s" * 32, worker_key=b"k" * 32, resources={}, errors=errors)
    peers = []
    for i in range(2):
        p = Peer(("127.0.0.1", 5000 + i), b"n%d" % i, 0.0)
        d.receive(p, [HELLO, compute_mac(b"s" * 32, p.nonce), "t", -1, 1, 0.0], 0.0)
        peers.append(p)
    d.out.clear()
    now = 1.0
    done = 0
    # with --fail, each connection's first 10 failures come with their details
    quota = [10 if failing else 0 for _ in peers]
    gc.disable()
    if not with_setup:
        t0 = tick()
    while True:
        live = False
        for i, p in enumerate(peers):
            if p.closed:
                continue
            live = True
            msg: list[Any] = [ACQUIRE]
            for k in p.held:
                if not failing:
                    msg += (k, 2, -1, None)
                    continue
                error: Any = _FAILED
                if quota[i]:  # a worker's first failures: in full
                    quota[i] -= 1
                    details = {"log": "/x/worker_0.err", "log_offset": 10 * k}
                    error = [_FAILED, {**details, "host": "node", "pid": 4}]
                msg += (k, 3, -1, error)
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
    if failing:
        errors.close_sinks()
        assert s.runs[0].failed == done, (s.runs[0].failed, done)
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
    ap.add_argument("--fail", action="store_true", help="every block comes back failed")
    ap.add_argument("--cases", default=",".join(CASES), help="of " + ",".join(CASES))
    args = ap.parse_args()
    if args.fail:  # the per-failure WARNING: measured, but not shown
        logging.getLogger("bellis").addHandler(logging.StreamHandler(open(os.devnull, "w")))
        logging.getLogger("bellis").propagate = False
    knobs = (args.clock, args.with_setup, args.busy, args.fail)
    drive(args.warm or tuple(min(n, 20) for n in args.shape), True, *knobs)  # warm up
    cases = args.cases.split(",")
    print(json.dumps({case: drive(args.shape, case == "batch1", *knobs) for case in cases}))


def campaign(
    srcs: list[str | None], reps: int, child_args: list[str]
) -> dict[str | None, dict[str, list[float]]]:
    """``reps`` rounds, each running the child once for every ``src`` in turn (``None``:
    bellis as installed), each measurement a fresh interpreter."""
    rows: dict[str | None, dict[str, list[float]]] = {s: {} for s in srcs}
    for _ in range(reps):
        for src in srcs:  # interleaved: A B A B ...
            env = None if src is None else dict(os.environ, PYTHONPATH=os.path.abspath(src))
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), *child_args],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode:
                sys.exit(f"the measurement of {src or 'installed'} failed:\n{out.stderr}")
            for case, value in json.loads(out.stdout).items():
                rows[src].setdefault(case, []).append(value)
    return rows


def report(rows: dict[str | None, dict[str, list[float]]], what: str) -> None:
    """Each version's median (and minimum) µs per block; with two or more versions, the
    median and range of the paired ratios against the last one."""
    srcs = list(rows)
    base = rows[srcs[-1]]
    reps = min(len(v) for v in base.values())
    print(f"load average: {os.getloadavg()[0]:.2f}; {reps} reps; {what}")
    for src in srcs:
        cells = []
        for case, vals in rows[src].items():
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
