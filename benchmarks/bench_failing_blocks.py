"""What failed attempts cost a run, since failures are recorded (issue 25): a run whose every
block fails, against the same run on other sources, interleaved, each in a fresh interpreter.

Every block sets ``block.status = FAILED`` (no exception: the cheapest failure a worker
reports), ``max_retries=0``, with a tracking store, on 2 local workers. The new code appends
each failure to ``errors.jsonl`` (bounded: the first attempts of a distinct error in full,
then counts), so the figure to watch is the wall per block, and the bytes the records take.

Usage::

    python -m compileall -q src /tmp/old-main/src
    python benchmarks/bench_failing_blocks.py --new-src src --old-src /tmp/old-main/src \
        --blocks 100000 --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

DRIVER = textwrap.dedent(
    """
    import json, os, resource, sys, time
    import bellis

    def process(block):
        block.status = bellis.BlockStatus.FAILED

    n, store = int(sys.argv[1]), sys.argv[2]
    task = bellis.Task(
        "fail", total_roi=bellis.Roi((0,), (n,)), read_roi=bellis.Roi((0,), (1,)),
        write_roi=bellis.Roi((0,), (1,)), process_function=process, max_retries=0,
        max_workers=2, read_write_conflict=False, tracking_path=store,
    )
    def cpu(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime

    s0, c0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    wall = time.perf_counter() - t0
    server, workers = cpu(resource.RUSAGE_SELF) - s0, cpu(resource.RUSAGE_CHILDREN) - c0
    records = os.path.join(store, "errors.jsonl")
    size = os.path.getsize(records) if os.path.exists(records) else 0
    print(json.dumps({"wall": wall, "failed": states["fail"].failed_count, "bytes": size,
                      "server": server, "workers": workers}))
    """
)


def run(src: str, blocks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
        out = subprocess.run(
            [sys.executable, "-c", DRIVER, str(blocks), os.path.join(tmp, "store")],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp,
            check=True,
            timeout=1200,
        ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if result["failed"] != blocks:
        raise SystemExit(f"{src}: {result['failed']} of {blocks} blocks failed")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new-src", default="src")
    p.add_argument("--old-src", required=True)
    p.add_argument("--blocks", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    got: dict[str, dict[str, list[float]]] = {
        label: {"wall": [], "server": [], "workers": []} for label in ("old", "new")
    }
    ratios: list[float] = []
    size = {"old": 0.0, "new": 0.0}
    for _ in range(args.reps):
        wall = {}
        for label, src in (("old", args.old_src), ("new", args.new_src)):
            r = run(src, args.blocks)
            for key in ("wall", "server", "workers"):
                got[label][key].append(r[key])
            wall[label] = r["wall"]
            size[label] = r["bytes"]
        ratios.append(wall["new"] / wall["old"])
    n = args.blocks
    print(f"{n} failing blocks, 2 workers, {args.reps} interleaved reps (medians)")
    for label in ("old", "new"):
        w, s, c = (statistics.median(got[label][key]) for key in ("wall", "server", "workers"))
        print(
            f"  {label}: wall {w:.3f} s ({1e6 * w / n:.1f} us/block); CPU per block: "
            f"driver {1e6 * s / n:.2f} us, workers {1e6 * c / n:.2f} us"
        )
    old, new = statistics.median(got["old"]["wall"]), statistics.median(got["new"]["wall"])
    srv = statistics.median(got["new"]["server"]) / statistics.median(got["old"]["server"])
    print(
        f"  ratio new/old: wall {new / old:.3f} (paired median {statistics.median(ratios):.3f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f}), driver CPU {srv:.3f}; "
        f"errors.jsonl {size['new'] / 1024:.1f} KiB"
    )


if __name__ == "__main__":
    main()
