"""Worker-function mode against daisy 2.0.0, with many workers (issue 14 item 5).

Run: ``python benchmarks/bench_worker_scaling.py [--workers 32] [--blocks 2000] [--reps 7]``.

The workload is daisy's ``benchmarks/bench_worker_scaling.py`` idea: a task whose process
function is a 0-argument *worker function* that opens a ``Client`` and loops over
``acquire_block()`` until it hands out None, on ``--workers`` local worker processes. The
blocks do nothing, so the figure is what starting, connecting and serving that many workers
costs. A worker function touches ``daisy.Client`` through the module, as daisy scripts do.

Each measurement is a fresh interpreter that imports the implementation as ``daisy`` and
times ``run_blockwise`` (no progress, no summary, no block tracking) in a private temporary
directory; the implementations alternate (daisy, bellis, daisy, bellis, ...). It prints the
medians of the wall time and of the workers' CPU, and the median of the paired ratios
bellis ÷ daisy (below 1: bellis is faster). The machine is shared: quote the ratios, not
the absolute times.

``--daisy-python`` is an interpreter with daisy 2.0.0 installed (default: this one);
bellis is run from this checkout's ``src`` with ``--bellis-python`` (default: this one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

_CHILD = r"""
import json, resource, sys, time
import daisy

workers, blocks = int(sys.argv[1]), int(sys.argv[2])


def worker_function():
    client = daisy.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break


total = daisy.Roi((0,), (blocks,))
one = daisy.Roi((0,), (1,))
task = daisy.Task("scaling", total, one, one, worker_function, max_workers=workers,
                  read_write_conflict=False)
t0 = time.perf_counter()
states = daisy.run_blockwise(task, progress=False, summary=False, block_tracking=False,
                             return_states=True)
wall = time.perf_counter() - t0
state = states["scaling"]
assert state.completed_count == state.total_block_count == blocks, state
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "version": daisy.__version__,
    "wall_s": wall,
    "workers_cpu_s": children.ru_utime + children.ru_stime,
}))
"""


def _measure(python: str, module: str, workers: int, blocks: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if module == "bellis":
        env["PYTHONPATH"] = str(SRC)
        prelude = "import sys, bellis; sys.modules['daisy'] = bellis\n"
    else:
        prelude = ""
    with tempfile.TemporaryDirectory(prefix="bench-worker-scaling-") as workdir:
        proc = subprocess.run(
            [python, "-c", prelude + _CHILD, str(workers), str(blocks)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if proc.returncode != 0:
        raise SystemExit(f"{module} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--daisy-python", default=sys.executable)
    parser.add_argument("--bellis-python", default=sys.executable)
    args = parser.parse_args()
    impls = {"daisy": args.daisy_python, "bellis": args.bellis_python}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in impls}
    for rep in range(args.reps):
        for name, python in impls.items():
            r = _measure(python, name, args.workers, args.blocks)
            runs[name].append(r)
            print(
                f"rep {rep + 1}/{args.reps} {name} {r['version']}: wall {r['wall_s']:.3f} s, "
                f"workers' CPU {r['workers_cpu_s']:.2f} s",
                flush=True,
            )
    print(f"\n{args.workers} workers, {args.blocks} blocks, {args.reps} reps (medians)")
    for name, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        cpu = statistics.median(r["workers_cpu_s"] for r in rs)
        print(f"  {name:7s} wall {wall:.3f} s   workers' CPU {cpu:.2f} s")
    for key in ("wall_s", "workers_cpu_s"):
        ratios = [b[key] / d[key] for b, d in zip(runs["bellis"], runs["daisy"], strict=True)]
        print(f"  bellis / daisy {key}: {statistics.median(ratios):.2f} (paired, median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
