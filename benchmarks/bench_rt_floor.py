"""The floor under ``dist_noop_w2_rt``: what the seed's readings alone cost a distributed run.

Run: ``python benchmarks/bench_rt_floor.py [--reps 15] [--blocks 10000]``.

Three variants of the shared harness's ``dist_noop_w2`` case (10,000 2-D blocks, two local
workers, ``read_write_conflict=False``), each timed around ``run_blockwise`` in a fresh
interpreter, interleaved A B C A B C ...:

``noop``
    no tracking, an empty block function: the harness's ``dist_noop_w2``;
``readings``
    no tracking, a block function that takes, once per block, exactly the readings
    bellis's chained measurement takes at each block boundary: ``getrusage`` twice (the
    CPU time and page faults at the block's end and again at the next block's start),
    ``/proc/self/statm`` (the resident size, to know whether the high-water mark needs a
    reset) and ``/proc/self/io`` (``rchar``/``wchar``). Nothing is packed, shipped or
    stored;
``minimal``
    the same with one ``getrusage`` per block: the least any per-block measurement of the
    seed's figures can read (CPU needs ``getrusage``, IO ``/proc/self/io``, and the peak
    at least one ``/proc`` access per block: ``statm``, or the ``clear_refs`` reset);
``rt``
    ``tracking_path`` + ``resource_tracking=True`` and an empty block function: the
    harness's ``dist_noop_w2_rt``.

``minimal`` ÷ ``noop`` is a lower bound for ``rt`` ÷ ``noop`` on this machine for any
implementation that measures every block in the worker, before anything is packed,
shipped or stored.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, resource, sys, tempfile, time
import bellis
from bellis import Roi

variant, blocks = sys.argv[1], int(sys.argv[2])
getrusage, pread, SELF = resource.getrusage, os.pread, resource.RUSAGE_SELF
fds = []

def noop(block):
    pass

def open_fds():
    fds.append(os.open("/proc/self/statm", os.O_RDONLY))
    fds.append(os.open("/proc/self/io", os.O_RDONLY))

def readings(block):
    if not fds:
        open_fds()
    getrusage(SELF)
    pread(fds[1], 512, 0)
    getrusage(SELF)
    pread(fds[0], 256, 0)

def minimal(block):
    if not fds:
        open_fds()
    getrusage(SELF)
    pread(fds[1], 512, 0)
    pread(fds[0], 256, 0)

FUNCTIONS = {"noop": noop, "readings": readings, "minimal": minimal, "rt": noop}

side = 100
kw = {}
if variant == "rt":
    kw = {"tracking_path": os.path.join(tempfile.mkdtemp(), "tracking"), "resource_tracking": True}
task = bellis.Task(
    "floor",
    total_roi=Roi((0, 0), (side, blocks // side)),
    read_roi=Roi((0, 0), (1, 1)),
    write_roi=Roi((0, 0), (1, 1)),
    process_function=FUNCTIONS[variant],
    read_write_conflict=False,
    num_workers=2,
    **kw,
)
t0 = time.perf_counter()
states = bellis.run_blockwise([task], multiprocessing=True, progress=False, return_states=True)
wall = time.perf_counter() - t0
state = states["floor"]
assert state.completed_count == blocks, (state.completed_count, blocks)
print(json.dumps({"variant": variant, "wall": wall}))
"""

VARIANTS = ("noop", "minimal", "readings", "rt")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--blocks", type=int, default=10_000, help="a multiple of 100")
    args = p.parse_args()
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.reps):
            for v in VARIANTS:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, v, str(args.blocks)],
                    check=True,
                    capture_output=True,
                    text=True,
                    cwd=work,  # worker logs go under ./daisy_logs there
                )
                walls[v].append(json.loads(out.stdout.strip().splitlines()[-1])["wall"])
    base = walls["noop"]
    for v in VARIANTS:
        w = walls[v]
        paired = statistics.median(x / b for x, b in zip(w, base, strict=True))
        extra = (statistics.median(w) - statistics.median(base)) / args.blocks * 1e6
        print(
            f"{v:9s} median {statistics.median(w):.4f} s  [min {min(w):.4f}]  "
            f"÷ noop {statistics.median(w) / statistics.median(base):.3f} "
            f"(paired median {paired:.3f})  +{extra:.2f} µs/block"
        )


if __name__ == "__main__":
    main()
