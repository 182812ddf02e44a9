"""The driver's per-block path for failing blocks, alone: no sockets, no worker processes,
two versions compared in one campaign (interleaved, each repetition a fresh interpreter).

Run::

    python -m compileall -q src /tmp/old-main/src
    python benchmarks/bench_failing_dispatch.py --src src --src /tmp/old-main/src \\
        --blocks 50000 --reps 15

One task of ``--blocks`` 1-D blocks, driven by ``_dispatch_loop.py --fail`` (its docstring
says how): every block returns failed, batch 1 (the path at its dearest), each
connection's first 10 failures with their details. Prints the median CPU µs per block
(``time.process_time``: other load on the machine slows the wall clock more) of each
version, and the paired ratios against the last ``--src``. Both versions must have the
folder layout of issue 23 (``bellis._scheduling``) and error records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _dispatch_loop import campaign, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--src", action="append", required=True, help="a src folder (two)")
    args = ap.parse_args()
    child = ["--shape", str(args.blocks), "--warm", "2000", "--clock", "cpu"]
    child += ["--fail", "--cases", "batch1"]
    report(campaign(list(args.src), args.reps, child), f"{args.blocks} failing blocks")


if __name__ == "__main__":
    main()
