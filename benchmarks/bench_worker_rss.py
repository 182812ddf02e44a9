"""A worker's own peak RSS and module count at its first block (issue 37).

The harness's "peak RSS child" is ``ru_maxrss`` of the reaped children, which Linux makes at
least the driver's own peak RSS (the high-water mark survives ``vfork`` + ``exec``). This
reads what a worker itself holds instead: each worker's block writes its ``VmHWM`` (from
``/proc/self/status``) and the size of its ``sys.modules``.

    PY benchmarks/bench_worker_rss.py [--impl bellis|daisy] [--runs 5]

runs 2 blocks on 2 workers ``--runs`` times with the implementation ``PY`` imports as
``--impl`` and prints one line per worker that got a block, then the medians. Linux only.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile


def probe(block: object) -> None:
    with open("/proc/self/status") as f:
        hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    out = os.environ["BENCH_WORKER_RSS_DIR"]
    with open(os.path.join(out, f"w.{os.getpid()}"), "w") as f:
        f.write(f"{hwm_kb} {len(sys.modules)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="bellis", help="module to import as daisy")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    daisy = importlib.import_module(args.impl)
    rows: list[tuple[int, int]] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            os.environ["BENCH_WORKER_RSS_DIR"] = out  # the workers inherit it
            os.chdir(tmp)
            roi = daisy.Roi((0, 0), (2, 1))
            block = daisy.Roi((0, 0), (1, 1))
            task = daisy.Task("rss", roi, block, block, probe, max_workers=2)
            assert daisy.run_blockwise([task], progress=False)
            for name in sorted(os.listdir(out)):
                with open(os.path.join(out, name)) as f:
                    kb, modules = (int(x) for x in f.read().split())
                rows.append((kb, modules))
                print(f"{args.impl} worker VmHWM {kb / 1024:.1f} MiB, {modules} modules")
            os.chdir("/")
    kbs = [kb for kb, _ in rows]
    print(
        f"{args.impl}: {len(rows)} workers, VmHWM median {statistics.median(kbs) / 1024:.1f} MiB "
        f"({min(kbs) / 1024:.1f}-{max(kbs) / 1024:.1f}), modules median "
        f"{statistics.median(m for _, m in rows):.0f}"
    )


if __name__ == "__main__":
    main()
