"""Resume a fully done task of 10^8 blocks: wall time and peak RSS (VmHWM).

The store is created directly through ``bellis._tracking.TrackingStore`` with the
layout ``run_blockwise`` derives for the task, filled with done = 1, and then the task is
run serially with a no-op function. Targets: < 30 s, < 2 GiB.

    python benchmarks/bench_resume_1e8.py [--side 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import bellis
from bellis._tracking import StoreLayout, TrackingStore


def vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def noop(block: object) -> None:
    raise AssertionError("a fully done task must not call its process function")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=10_000, help="blocks per axis (2-D)")
    parser.add_argument("--dir", default=None, help="where to put the store (default: a tmp dir)")
    args = parser.parse_args()
    side = args.side
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bellis-bench-"))
    store = base / "resume"
    try:
        task = bellis.Task(
            "resume",
            total_roi=bellis.Roi((0, 0), (side, side)),
            read_roi=bellis.Roi((0, 0), (1, 1)),
            write_roi=bellis.Roi((0, 0), (1, 1)),
            process_function=noop,
            tracking_path=store,
        )
        g = task._geom
        layout = StoreLayout(
            g.total_offset,
            g.total_shape,
            tuple(int(x) for x in task.read_roi.offset),
            g.read_shape,
            tuple(int(x) for x in task.write_roi.offset),
            g.write_shape,
            g.fit,
        )
        t0 = time.perf_counter()
        with TrackingStore.open(store, layout, resource_tracking=False) as ts:
            ts.done[...] = 1
        t_create = time.perf_counter() - t0
        rss_before = vm_hwm_bytes()

        t0 = time.perf_counter()
        states = bellis.run_blockwise(
            [task], multiprocessing=False, progress=False, return_states=True, summary=False
        )
        wall = time.perf_counter() - t0
        hwm = vm_hwm_bytes()
        st = states["resume"]
        n = side * side
        ok = st.skipped_count == st.completed_count == st.total_block_count == n
        print(f"blocks             {n:,}")
        print(f"store fill         {t_create:.2f} s")
        print(f"resume wall        {wall:.2f} s   (target < 30 s)")
        print(
            f"peak RSS (VmHWM)   {hwm / 2**30:.2f} GiB   (before the run {rss_before / 2**30:.2f}"
            " GiB; target < 2 GiB)"
        )
        print(
            f"skipped/completed  {st.skipped_count:,}/{st.completed_count:,}  "
            f"{'ok' if ok else 'WRONG'}"
        )
        return 0 if ok and wall < 30 and hwm < 2 * 2**30 else 1
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
