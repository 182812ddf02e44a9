"""The dispatcher's per-block path, alone: no sockets, no worker processes.

Run: ``python benchmarks/bench_dispatch_block.py [--blocks 20000] [--reps 7]`` (byte-compile
``src`` first: ``python -m compileall -q src``). With ``--src DIR`` it imports bellis from
``DIR`` instead (another checkout's ``src``); repeat it to compare versions in one campaign
(A B A B ..., paired ratios against the last one).

One task of ``--blocks`` 1-D blocks, driven by ``_dispatch_loop.py`` (its docstring says
how): the wall time (``time.perf_counter``) of the loop alone per block, ``batch1`` and
``adaptive``. Prints the median, over ``--reps`` fresh interpreters run one after the
other, of µs per block for each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _dispatch_loop import campaign, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--src", action="append", default=[], help="a src folder; repeat to compare")
    args = ap.parse_args()
    srcs: list[str | None] = list(args.src) or [None]
    child = ["--shape", str(args.blocks), "--warm", "2000", "--clock", "wall"]
    report(campaign(srcs, args.reps, child), f"{args.blocks} blocks")


if __name__ == "__main__":
    main()
