"""What the decoded-chunk cache of declared inputs buys (issue 38, items 1 and 3), each case
against its baselines in the same campaign, repetitions interleaved (A B C A B C ...),
every run in a fresh interpreter, 2 workers (or 2 processes) each.

The data: a ``SIZE``³ uint8 zarr v3 array (chunks 64³, zarr's default zstd, random
values), made once per campaign.

``w2``   threshold: 32³ blocks, no context (each 64³ chunk holds 8 blocks), each block
         writes ``raw > 127`` into a uint8 array of 32³ chunks.
``w1``   a 64³ block with an 8-voxel margin (an 80³ read touching 27 chunks), a 3-point box
         smoothing along each axis, the 64³ result written into a uint8 array of 64³ chunks.

For each, three runs:

``split``     a static 2-process split of the block loop (a ``multiprocessing`` pool of 2
              spawned processes, each opening the arrays once and running half the blocks,
              in block order): the best a scheduler-free loop does;
``bellis``    ``run_blockwise`` with 2 workers, no ``inputs``;
``inputs``    the same with ``inputs=[raw]``: each worker keeps decoded chunks.

Figures: the run's wall (median), ratios against ``split`` per repetition (median), and
for ``inputs`` the chunk decodes per block (the cache's misses, from the run line's
``input_cache``, ÷ blocks; both bellis runs keep a tracking store). ``bellis`` and
``split`` decode every chunk a block touches: 1 (w2) or 27 (w1) per block. The load
average is recorded before and after each case.

Usage::

    python -m compileall -q src
    .venv/bin/python benchmarks/bench_chunk_cache.py --size 256 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ONE = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import zarr

    ROOT, CASE, RUN, SIZE = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    RAW = os.path.join(ROOT, "raw.zarr")
    OUT = os.path.join(ROOT, "out-" + CASE + ".zarr")
    BLOCK, CTX = (32, 0) if CASE == "w2" else (64, 8)
    raw = zarr.open_array(RAW, mode="r")
    out = zarr.open_array(OUT, mode="r+")


    def kernel(x):
        if CASE == "w2":
            return (x > 127).astype(np.uint8)
        f = x.astype(np.float32)
        for ax in range(3):
            a = [slice(None)] * 3
            b = list(a)
            c = list(a)
            a[ax], b[ax], c[ax] = slice(0, -2), slice(1, -1), slice(2, None)
            f = (f[tuple(a)] + f[tuple(b)] + f[tuple(c)]) / 3
        return f[tuple(slice(CTX - 1, CTX - 1 + BLOCK) for _ in range(3))].astype(np.uint8)


    def one(offset):
        read = tuple(slice(max(0, o - CTX), min(SIZE, o + BLOCK + CTX)) for o in offset)
        x = raw[read]
        out[tuple(slice(o, o + BLOCK) for o in offset)] = kernel(x)


    def offsets():
        lo, hi = (CTX, SIZE - CTX - BLOCK) if CASE == "w1" else (0, SIZE - BLOCK)
        r = range(lo, hi + 1, BLOCK)
        return [(z, y, x) for z in r for y in r for x in r]


    def split_half(i):
        offs = offsets()
        half = len(offs) // 2
        for off in offs[:half] if i == 0 else offs[half:]:
            one(off)
        return 0


    if __name__ == "__main__":
        blocks = len(offsets())
        t0 = time.perf_counter()
        if RUN == "split":
            import multiprocessing as mp
            with mp.get_context("spawn").Pool(2) as pool:
                pool.map(split_half, [0, 1])
        else:
            import bellis as daisy
            from funlib.geometry import Roi

            def process(block):
                one(tuple(int(o) for o in block.write_roi.offset))

            total = Roi((0,) * 3, (SIZE,) * 3)
            read = Roi((0,) * 3, (BLOCK + 2 * CTX,) * 3)
            write = Roi((CTX,) * 3, (BLOCK,) * 3)
            # tracked (both bellis runs alike): the run line has the caches' counts
            track = os.path.join(ROOT, "tracking", "%s-%s-%d" % (CASE, RUN, os.getpid()))
            task = daisy.Task(CASE, total, read, write, process, max_workers=2,
                              read_write_conflict=False, tracking_path=track,
                              inputs=[RAW] if RUN == "inputs" else None)
            assert daisy.run_blockwise([task], progress=False, summary=False)
        wall = time.perf_counter() - t0
        misses = None
        if RUN == "inputs":
            with open(os.path.join(track, "runs.jsonl")) as f:
                misses = json.loads(f.readline())["input_cache"]["misses"]
        print(json.dumps({"wall": wall, "blocks": blocks, "misses": misses}))
    """
)


def _make(root: str, size: int) -> None:
    import numpy as np
    import zarr

    raw = zarr.create_array(
        os.path.join(root, "raw.zarr"), shape=(size,) * 3, chunks=(64,) * 3, dtype="uint8"
    )
    rng = np.random.default_rng(0)
    for z in range(0, size, 64):
        raw[z : z + 64] = rng.integers(0, 256, (64, size, size), dtype=np.uint8)
    for case, chunk in (("w2", 32), ("w1", 64)):
        zarr.create_array(
            os.path.join(root, f"out-{case}.zarr"),
            shape=(size,) * 3,
            chunks=(chunk,) * 3,
            dtype="uint8",
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cases", default="w2,w1")
    ap.add_argument("--json", default=None, help="write every record here")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-chunk-cache-")
    script = os.path.join(root, "one.py")
    with open(script, "w") as f:
        f.write(ONE)
    records = []
    try:
        _make(root, args.size)
        for case in args.cases.split(","):
            load = os.getloadavg()
            runs: dict[str, list[dict[str, float]]] = {"split": [], "bellis": [], "inputs": []}
            for _rep in range(args.reps):
                for run in runs:
                    proc = subprocess.run(
                        [sys.executable, script, root, case, run, str(args.size)],
                        capture_output=True,
                        text=True,
                        cwd=root,
                        check=False,
                    )
                    if proc.returncode != 0:
                        raise SystemExit(proc.stdout + proc.stderr)
                    rec = json.loads(proc.stdout.strip().splitlines()[-1])
                    runs[run].append(rec)
                    records.append({"case": case, "run": run, **rec, "at": time.time()})
            blocks = runs["split"][0]["blocks"]
            print(f"\n{case}: {blocks} blocks, {args.size}^3, load average before {load}")
            for run, recs in runs.items():
                walls = [r["wall"] for r in recs]
                ratio = statistics.median(
                    r["wall"] / s["wall"] for r, s in zip(recs, runs["split"], strict=True)
                )
                decodes = ""
                if run == "inputs":
                    per = statistics.median(r["misses"] / r["blocks"] for r in recs)
                    decodes = f"decodes/block {per:.2f}"
                print(
                    f"  {run:7s} wall median {statistics.median(walls):7.2f} s  "
                    f"÷ split {ratio:5.2f}  {decodes}"
                )
            print(f"  load average after {os.getloadavg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
