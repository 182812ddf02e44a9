"""How good is ``bellis.plan(tasks, sample=...)``'s forecast? (issue 28)

Per workload: a fresh tracking store; ``bellis.plan(task, sample=True)`` (2% of the blocks,
at least 20) runs its sample and forecasts the rest; then the real run runs what is left,
timed, with resource tracking on so that every block's peak RSS is in the store. The
forecast is scored against the run: total wall (the forecast's estimate and interval
against the measured ``run_blockwise`` wall) and p99 peak RSS per block (the sample's
against all blocks'). A naive forecast (mean sampled block × blocks left ÷ workers) is
shown beside it.

Blocks sleep (a few ms) and hold a buffer, so the runs are short and the machine's load
matters little; the workers are local.

Workloads (2-d grids of 3,000 blocks):

* ``uniform``: every block 4 ms, 16 MiB;
* ``gradient``: 1 to 8 ms, rising along axis 0, with read/write conflicts (levels);
* ``hotspots``: 5% of the blocks, in three round spots of about 50 blocks, 20x slower
  (60 ms instead of 3) and 4x the memory;
* ``scattered``: the same 5%, but each hot block at random, alone: the case a spread
  sample of 2% cannot see (it holds 0 to 7 of the 150 hot blocks);
* ``+hint`` (``scattered+hint``, ``hotspots+hint``): the same, with a ``cost_hint`` that
  marks the hot blocks (as a downsampled volume would).

Run: ``.venv/bin/python -m compileall -q src && .venv/bin/python benchmarks/bench_forecast.py``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import bellis
from bellis import Roi

GRID = (50, 60)
W = 10
SPOT_RADIUS = 4.0  # blocks: a spot is about 50 blocks, so 3 spots make 5%
MIB = 1 << 20


def costs_for(name: str, seed: int = 7) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Seconds and bytes per block, on the grid; ``seed`` places the hot blocks."""
    rng = np.random.default_rng(seed)
    if name == "uniform":
        return np.full(GRID, 0.004), np.full(GRID, 16 * MIB)
    if name == "gradient":
        sec = np.linspace(0.001, 0.008, GRID[0])[:, None] * np.ones(GRID)
        return sec, np.full(GRID, 16 * MIB)
    if name == "hotspots":  # round spots (dense tissue, a nucleus), 5% of the blocks
        hot = np.zeros(GRID, dtype=bool)
        yy, xx = np.indices(GRID)
        while hot.mean() < 0.05:
            cy, cx = rng.uniform(0, GRID[0]), rng.uniform(0, GRID[1])
            hot |= (yy - cy) ** 2 + (xx - cx) ** 2 <= SPOT_RADIUS**2
    elif name == "scattered":  # 5% of the blocks, each at random
        hot = rng.random(GRID) < 0.05
    else:
        raise ValueError(f"no workload {name!r}")
    return np.where(hot, 0.060, 0.003), np.where(hot, 64 * MIB, 16 * MIB)


def make_task(name: str, costs: Path, workers: int, conflicts: bool, launcher: Any = None) -> Any:
    ctx = W if conflicts else 0
    total = Roi((-ctx, -ctx), (GRID[0] * W + 2 * ctx, GRID[1] * W + 2 * ctx))
    return bellis.Task(
        name,
        total,
        Roi((0, 0), (W + 2 * ctx, W + 2 * ctx)),
        Roi((ctx, ctx), (W, W)),
        process_function=_Block(str(costs)),
        read_write_conflict=conflicts,
        max_workers=workers,
        resource_tracking=True,
        launcher=launcher,
    )


class _Block:
    """The block function: sleep for the block's cost, hold its buffer."""

    def __init__(self, costs: str) -> None:
        self.costs = costs
        self.table: Any = None

    def __call__(self, block: Any) -> None:
        if self.table is None:
            self.table = np.load(self.costs)
        o = block.write_roi.offset
        sec, nbytes = self.table[:, int(o[0]) // W, int(o[1]) // W]
        buf = np.ones(int(nbytes) // 8)  # touched: resident
        time.sleep(float(sec))
        del buf


def prewarm() -> None:
    """Touch 2 GiB and free it. This VM hands free memory back to its host after a few
    seconds (virtio-balloon free page reporting); the next process to touch it pays ~10x
    (64 MiB: 110-125 ms instead of 12 ms), a cost a physical node does not have. Touched
    just before, the sample's fresh workers and the run's find warm pages alike."""
    buf = np.ones(256 << 20)
    del buf


def run_case(
    name: str,
    workers: int,
    base: Path,
    slurm: bool = False,
    seed: int = 7,
    warm: bool = True,
) -> dict[str, Any]:
    kind = name.split("+")[0]
    sec, mem = costs_for(kind, seed)
    work = base / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    table = work / "costs.npy"
    np.save(table, np.stack([sec, mem]).astype(np.float64))
    bellis.set_tracking_basedir(work / "tracking")
    launcher = None
    if slurm:
        # a memory request, as users give one: without it the CI cluster's default
        # (half the node) lets only two jobs run at once
        launcher = bellis.SlurmLauncher(
            partition="oversub", poll_interval=0.5, job_name_prefix="bfc", mem="512M"
        )
    task = make_task(kind, table, workers, conflicts=kind == "gradient", launcher=launcher)
    hint = sec if name.endswith("+hint") else None
    if warm:
        prewarm()
    t0 = time.perf_counter()
    plan = bellis.plan(task, sample=True, cost_hint=hint, show=False)
    t_plan = time.perf_counter() - t0
    f = plan.forecast
    assert f is not None
    tf = plan.tasks[0].forecast
    assert tf is not None
    if warm:
        prewarm()
    t0 = time.perf_counter()
    ok = bellis.run_blockwise(task, progress=False, summary=False)
    actual = time.perf_counter() - t0
    assert ok, name
    store = bellis._tracking.TrackingStore.open_readonly(work / "tracking" / kind)
    try:
        rss = np.asarray(store.stats["peak_rss_bytes"]).reshape(-1)
        done = np.asarray(store.done).reshape(-1) != 0
        block_wall = np.asarray(store.stats["wall_seconds"]).reshape(-1)[done & (rss > 0)]
        rss = rss[done & (rss > 0)]
    finally:
        store.close()
    actual_p99 = float(np.percentile(rss, 99))
    left = plan.tasks[0].left
    naive = tf["block_wall"]["mean"] * left / workers
    return {
        "case": name + (" (slurm)" if slurm else ""),
        "seed": seed,
        "prewarm": warm,
        "blocks": int(np.prod(GRID)),
        "sampled": tf["sampled"],
        "workers": workers,
        "plan_seconds": t_plan,
        "wall_actual": actual,
        "wall_forecast": f["wall"],
        "wall_error_pct": 100 * (f["wall"]["estimate"] - actual) / actual,
        "in_interval": f["wall"]["low"] <= actual <= f["wall"]["high"],
        "naive_wall": naive,
        "block_wall_mean_sample": tf["block_wall"]["mean"],
        "block_wall_mean_all": float(block_wall.mean()),
        "overhead_per_block": f["overhead_seconds_per_block"],
        "start_delay": f["start_delay_seconds"],
        "naive_error_pct": 100 * (naive - actual) / actual,
        "p99_rss_actual": actual_p99,
        "p99_rss_forecast": tf["peak_rss"]["p99"],
        "p99_rss_error_pct": 100 * (tf["peak_rss"]["p99"] - actual_p99) / actual_p99,
    }


def sampling_error(placements: int) -> None:
    """The forecast's sampling error alone, without running anything: for each workload
    and ``placements`` placements of its hot blocks, bellis's own pick (a 2% sample) and
    cost model (the nearest sampled block, or the line in the hint) predict every block
    left from the sampled blocks' *true* costs; the error of the total is what no timing
    can fix. Hot spots of radius 2, 4 and 8 blocks (5% of the blocks either way)."""
    from bellis._plan._costs import pick, predict_costs

    global SPOT_RADIUS
    cases = [("uniform", None), ("gradient", None), ("scattered", None)]
    cases += [("hotspots", r) for r in (2.0, 4.0, 8.0)] + [("scattered+hint", None)]
    print("| workload | placements | error of the total: p5 / p50 / p95 | within ±20% |")
    print("|---|---|---|---|")
    radius = SPOT_RADIUS
    for name, r in cases:
        SPOT_RADIUS = r if r is not None else radius
        errors = []
        for seed in range(placements):
            sec, _ = costs_for(name.split("+")[0], seed)
            flat = sec.reshape(-1)
            hint = flat if name.endswith("+hint") else None
            picked = pick(np.ones(GRID, dtype=bool), 60, hint, np.random.default_rng(seed))
            left = np.setdiff1d(np.arange(flat.size), picked)
            pred, _ = predict_costs(GRID, left, picked, flat[picked], hint)
            errors.append(100 * (pred.sum() - flat[left].sum()) / flat[left].sum())
        e = np.asarray(errors)
        p5, p50, p95 = np.percentile(e, [5, 50, 95])
        label = name if r is None else f"{name} (radius {r:g})"
        print(
            f"| {label} | {placements} | {p5:+.0f}% / {p50:+.0f}% / {p95:+.0f}% "
            f"| {100 * float((abs(e) <= 20).mean()):.0f}% |"
        )
    SPOT_RADIUS = radius


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reps", type=int, default=3, help="repetitions per case (interleaved)")
    p.add_argument(
        "--cases",
        default="uniform,gradient,hotspots,scattered,scattered+hint",
        help="comma-separated",
    )
    p.add_argument("--json", help="also write the records here (one JSON line per run)")
    p.add_argument("--slurm", action="store_true", help="workers as SLURM jobs (oversub)")
    p.add_argument("--seed", type=int, default=7, help="the first repetition's placement")
    p.add_argument(
        "--no-prewarm", action="store_true", help="do not touch 2 GiB before sample and run"
    )
    p.add_argument(
        "--sampling-error",
        type=int,
        metavar="N",
        help="only the sampling error: N placements per workload, nothing runs",
    )
    args = p.parse_args()
    if args.sampling_error:
        sampling_error(args.sampling_error)
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-forecast-"))
    os.chdir(base)  # worker logs land here too
    cases = args.cases.split(",")
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    try:
        for rep in range(args.reps):
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]  # rotate
            for name in order:
                # each repetition places the hot blocks anew: the error includes the
                # sampling error, not one lucky (or unlucky) placement again and again
                row = run_case(
                    name,
                    args.workers,
                    base,
                    args.slurm,
                    seed=args.seed + rep,
                    warm=not args.no_prewarm,
                )
                rows[name].append(row)
                print(json.dumps(row), file=sys.stderr)
                if args.json:
                    with open(args.json, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        "| case | blocks | sample | wall actual (median) | wall error per rep | in interval "
        "| naive error per rep | p99 RSS actual | p99 RSS error per rep |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in cases:
        rs = rows[name]
        walls = sorted(r["wall_actual"] for r in rs)
        print(
            f"| {name} | {rs[0]['blocks']} | {rs[0]['sampled']} | "
            f"{walls[len(walls) // 2]:.2f} s | "
            + ", ".join(f"{r['wall_error_pct']:+.0f}%" for r in rs)
            + f" | {sum(r['in_interval'] for r in rs)}/{len(rs)} | "
            + ", ".join(f"{r['naive_error_pct']:+.0f}%" for r in rs)
            + f" | {rs[0]['p99_rss_actual'] / MIB:.1f} MiB | "
            + ", ".join(f"{r['p99_rss_error_pct']:+.1f}%" for r in rs)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
