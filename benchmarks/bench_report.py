"""Benchmark: the HTML report of a fully tracked 10^6-block store (issue 16).

    PYTHONPATH=src python benchmarks/bench_report.py [--side 100] [--dims 3] [--workers 64]

Builds a ``side^dims``-cell store directly through ``bellis._tracking.TrackingStore`` (every
resource array, 64 workers' time stamps over a simulated hour, a slow region, a few
failed cells) and one run line in ``runs.jsonl``, then times ``bellis report`` (the CLI,
in a subprocess), reports the HTML size, and times loading the page in headless Chromium
until every plot has rendered (the wall time of the whole ``chromium --dump-dom`` call,
so Chromium's own start-up is included). Targets: build < 15 s, HTML < 25 MB, load < 10 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bellis._stats._aggregates import STATS_DTYPE
from bellis._stats._runlog import append_run_line, validate_run_line
from bellis._tracking import StoreLayout, TrackingStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import browser


def _stat(v: np.ndarray) -> dict[str, float | int]:
    return {
        "n": len(v),
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
        "min": float(v.min()),
        "max": float(v.max()),
        "total": float(v.sum()),
    }


def build_store(root: Path, side: int, workers: int, dims: int = 3) -> int:
    n = side**dims
    layout = StoreLayout(
        (0,) * dims,
        (side * 64,) * dims,
        (0,) * dims,
        (64,) * dims,
        (0,) * dims,
        (64,) * dims,
        "valid",
    )
    rng = np.random.default_rng(0)
    coords = np.unravel_index(np.arange(n), (side,) * dims)
    zz, yy = coords[0], coords[1]
    slow = (zz < side // 5) & (yy > side // 2)  # a slow region of the volume
    wall = rng.lognormal(np.log(0.1), 0.3, n) * np.where(slow, 4.0, 1.0)
    table = np.zeros(n, dtype=STATS_DTYPE)
    table["wall_seconds"] = wall
    table["cpu_seconds"] = wall * rng.uniform(0.3, 0.9, n)
    table["cpu_children_seconds"] = wall * 0.05
    table["peak_rss_bytes"] = (rng.normal(900e6, 80e6, n) + slow * 600e6).astype(np.uint64)
    table["io_read_bytes"] = rng.integers(1 << 20, 64 << 20, n, dtype=np.uint64)
    table["io_write_bytes"] = rng.integers(1 << 20, 16 << 20, n, dtype=np.uint64)
    worker = rng.integers(0, workers, n)
    start = time.time() - 7200.0
    sent = np.zeros(n)
    ret = np.zeros(n)
    for w in range(workers):
        k = np.flatnonzero(worker == w)
        gaps = rng.exponential(0.005, len(k))
        ends = np.cumsum(wall[k] + gaps)
        ret[k] = start + 5.0 + ends
        sent[k] = ret[k] - wall[k] - 0.002
    failed = rng.choice(n, 50, replace=False)
    with TrackingStore.open(root, layout, resource_tracking=True) as ts:
        for w in range(workers):
            k = np.flatnonzero(worker == w)
            ts.record_measured(k, table[k], w, sent[k], ret[k])
        done = np.ones(n, dtype=np.uint8)
        done[failed] = 0
        ts.done.reshape(-1)[:] = done
        ts.failures.reshape(-1)[failed] = 2
    finished = float(ret.max()) + 1.0
    records = []
    for w in range(workers):
        k = np.flatnonzero(worker == w)
        records.append(
            {
                "worker_id": w,
                "startup": 2.0,
                "launch": 1.5,
                "setup": 0.5,
                "idle": _stat(np.full(len(k), 0.005)),
                "compute": _stat(wall[k]),
                "teardown": 0.1,
                "exit": "clean",
                "blocks": len(k),
                "blocks_failed": 0,
                "final_wait": float(finished - ret[k].max()),
                "slot": w,
                "log_files": None,
            }
        )
    line = {
        "schema": 1,
        "task_id": "bench",
        "run_started_at": start,
        "run_finished_at": finished,
        "outcome": "failed",
        "mode": "distributed",
        "wall_seconds": finished - start,
        "resource_tracking": True,
        "counters": {
            "total": n,
            "completed": n - 50,
            "skipped": 0,
            "failed": 50,
            "orphaned": 0,
            "worker_failures": 0,
            "worker_restarts": 0,
            "worker_starts": workers,
            "timeout_reclaims": 0,
        },
        "blocks": {
            "count": n - 50,
            "skipped": 0,
            "failed_attempts": 100,
            "wall": _stat(wall),
            "trend_ms_per_block": None,
        },
        "workers": {
            "count": workers,
            "unmanaged_clients": 0,
            "startup": None,
            "launch": None,
            "setup": None,
            "idle": None,
            "teardown": None,
            "exits": {"clean": workers},
            "records": records,
        },
    }
    problems = validate_run_line(line)
    assert not problems, problems
    append_run_line(root / "runs.jsonl", line)
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", type=int, default=100, help="cells per axis (default 100)")
    p.add_argument("--dims", type=int, default=3, choices=(2, 3), help="grid axes (default 3)")
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--dir")
    args = p.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="bellis-bench-report-"))
    try:
        t0 = time.perf_counter()
        n = build_store(base / "store", args.side, args.workers, args.dims)
        print(f"blocks             {n:,}   (store built in {time.perf_counter() - t0:.1f} s)")
        out = base / "report.html"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "bellis", "report", str(base / "store"), "-o", str(out)],
            check=True,
        )
        build = time.perf_counter() - t0
        size = out.stat().st_size
        print(f"report build       {build:.2f} s   (target < 15 s; `bellis report` wall)")
        print(f"HTML size          {size / 1e6:.1f} MB   (target < 25 MB)")
        if browser.chromium() is None:
            print("chromium           absent: load time not measured")
            return 0
        t0 = time.perf_counter()
        found = browser.load(
            out, "return [document.querySelectorAll('.main-svg').length, performance.now()];"
        )
        load = time.perf_counter() - t0
        assert found["errors"] == [], found["errors"]
        assert found["rendered"] == "yes", "the page did not finish rendering"
        layers, rendered_ms = found["result"]
        print(f"chromium load      {load:.2f} s   (target < 10 s; the whole chromium call)")
        print(
            f"  page rendered    {rendered_ms / 1000:.2f} s after navigation ({layers} plot layers)"
        )
        print(
            json.dumps(
                {
                    "blocks": n,
                    "build_s": round(build, 2),
                    "html_mb": round(size / 1e6, 1),
                    "load_s": round(load, 2),
                    "rendered_s": round(rendered_ms / 1000, 2),
                }
            )
        )
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
