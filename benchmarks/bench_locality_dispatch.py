"""The dispatcher's per-block path on a 2-D grid, alone: no sockets, no worker processes
(issue 38 item 2: locality-aware dispatch against the FIFO order of before).

Run: ``python benchmarks/bench_locality_dispatch.py --src src --src /tmp/base/src
[--grid 100] [--reps 21]`` (byte-compile both first: ``python -m compileall -q src
/tmp/base/src``). Each ``--src`` is a checkout's ``src`` folder; the versions run in
turn (A B A B ...), each measurement a fresh interpreter.

One task of ``--grid`` x ``--grid`` blocks (the shape of ``dist_noop_w2``), driven by
``_dispatch_loop.py`` (its docstring says how); in ``adaptive`` each return reports 1 ms
of the worker's busy time (fast blocks). The figure is the CPU time
(``time.process_time``) per block, the scheduler's construction and the run's statistics
included; the report is each version's median and the median of the paired ratios
against the last ``--src``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _dispatch_loop import campaign, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=100)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--src", action="append", default=[], help="a src folder; repeat")
    args = ap.parse_args()
    srcs: list[str | None] = list(args.src) or ["src"]
    child = ["--shape", f"{args.grid},{args.grid}", "--warm", "20,20", "--clock", "cpu"]
    child += ["--with-setup", "--busy", "0.001"]
    report(campaign(srcs, args.reps, child), f"grid {args.grid}^2")


if __name__ == "__main__":
    main()
