"""W3 (issue 37): a smooth -> threshold-and-label pipeline with 2 workers in all.

The volume (``--size``³ uint8, zarr v3, 64³ chunks, zstd) is generated once. Two
configurations run interleaved (A, B, A, B, ...), each repetition in a fresh tracking
directory and fresh output arrays:

* ``shared``: ``resources={"cpu": 2}``, both tasks ``requires={"cpu": 1}``,
  ``max_workers=2``: 2 workers in all, which move from smooth to label;
* ``bound4``: no budget, ``max_workers=2`` per task and one launcher per task (workers
  stay with their task, as before issue 37): up to 4 worker processes.

Smooth: 64³ blocks, context 8, a gaussian of sigma 2 (``scipy.ndimage`` when installed, else
a 5³ box filter in numpy). Label: context 4, ``read_write_conflict=True``, threshold at the
block's mean and ``scipy.ndimage.label`` (else the threshold alone). Every block opens its
arrays itself, as daisy's tutorial does, and appends ``task pid start end`` (wall clock) to
a file, from which the benchmark counts the worker processes (distinct pids) and, per
worker that served both tasks, the hand-over gap: its last smooth block's end to its first
label block's start.

    python benchmarks/bench_warm_pipeline.py --size 256 --reps 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import bellis
from bellis import Roi

try:
    from scipy import ndimage
except ImportError:  # pragma: no cover - the fallback of the benchmark's own text
    ndimage = None

BLOCK = 64


def _record(task: str, t0: float) -> None:
    with open(os.environ["W3_TIMES"], "a") as f:
        f.write(f"{task} {os.getpid()} {t0!r} {time.time()!r}\n")


def _box(x: Any) -> Any:
    out = x.astype(np.float32)
    for axis in range(3):
        acc = np.zeros_like(out)
        for d in range(-2, 3):
            acc += np.roll(out, d, axis=axis)
        out = acc / 5
    return out


def smooth(block: Any) -> None:
    t0 = time.time()
    d = os.environ["W3_DIR"]
    src = zarr.open_array(os.path.join(d, "raw.zarr"), mode="r")
    dst = zarr.open_array(os.path.join(d, "smooth.zarr"), mode="r+")
    r, w = block.read_roi, block.write_roi
    x = src[tuple(slice(o, o + s) for o, s in zip(r.offset, r.shape, strict=True))]
    y = ndimage.gaussian_filter(x.astype(np.float32), 2.0) if ndimage is not None else _box(x)
    c = [wo - ro for wo, ro in zip(w.offset, r.offset, strict=True)]
    core = y[tuple(slice(ci, ci + s) for ci, s in zip(c, w.shape, strict=True))]
    dst[tuple(slice(o, o + s) for o, s in zip(w.offset, w.shape, strict=True))] = core.astype(
        np.uint8
    )
    _record("smooth", t0)


def label(block: Any) -> None:
    t0 = time.time()
    d = os.environ["W3_DIR"]
    src = zarr.open_array(os.path.join(d, "smooth.zarr"), mode="r")
    dst = zarr.open_array(os.path.join(d, "labels.zarr"), mode="r+")
    r, w = block.read_roi, block.write_roi
    x = src[tuple(slice(o, o + s) for o, s in zip(r.offset, r.shape, strict=True))]
    mask = x > x.mean()
    if ndimage is not None:
        lab, _n = ndimage.label(mask)
    else:
        lab = mask.astype(np.uint32)
    c = [wo - ro for wo, ro in zip(w.offset, r.offset, strict=True)]
    core = lab[tuple(slice(ci, ci + s) for ci, s in zip(c, w.shape, strict=True))]
    dst[tuple(slice(o, o + s) for o, s in zip(w.offset, w.shape, strict=True))] = core.astype(
        np.uint32
    )
    _record("label", t0)


def make_volume(d: Path, size: int) -> None:
    arr = zarr.create_array(
        str(d / "raw.zarr"),
        shape=(size,) * 3,
        chunks=(BLOCK,) * 3,
        dtype="uint8",
        compressors=zarr.codecs.ZstdCodec(level=3),
        overwrite=True,
    )
    rng = np.random.default_rng(37)
    for z in range(0, size, BLOCK):
        arr[z : z + BLOCK] = rng.integers(0, 256, (BLOCK, size, size), dtype=np.uint8)


def _outputs(d: Path, size: int) -> None:
    for name, dtype in (("smooth.zarr", "uint8"), ("labels.zarr", "uint32")):
        zarr.create_array(
            str(d / name),
            shape=(size,) * 3,
            chunks=(BLOCK,) * 3,
            dtype=dtype,
            compressors=zarr.codecs.ZstdCodec(level=3),
            overwrite=True,
        )


def one_run(d: Path, size: int, mode: str, rep: int) -> dict[str, Any]:
    _outputs(d, size)
    times = d / f"times_{mode}_{rep}.txt"
    os.environ["W3_TIMES"] = str(times)
    track = Path(tempfile.mkdtemp(prefix="w3track", dir=d))
    total = Roi((0, 0, 0), (size,) * 3)
    bound = mode == "bound4"
    kw: dict[str, Any] = {"max_workers": 2}
    if not bound:
        kw["requires"] = {"cpu": 1}
    # the write ROIs tile the volume less its context; shrunk at the far edge
    s = bellis.Task(
        "smooth",
        total,
        Roi((0,) * 3, (BLOCK + 16,) * 3),
        Roi((8,) * 3, (BLOCK,) * 3),
        process_function=smooth,
        read_write_conflict=False,
        fit="shrink",
        tracking_path=str(track / "smooth"),
        launcher=bellis.LocalLauncher() if bound else None,
        **kw,
    )
    lab = bellis.Task(
        "label",
        total,
        Roi((0,) * 3, (BLOCK + 8,) * 3),
        Roi((4,) * 3, (BLOCK,) * 3),
        process_function=label,
        read_write_conflict=True,
        fit="shrink",
        tracking_path=str(track / "label"),
        launcher=bellis.LocalLauncher() if bound else None,
        **kw,
    )
    t0 = time.perf_counter()
    states = bellis.run_blockwise(
        s + lab,
        resources=None if bound else {"cpu": 2},
        progress=False,
        summary=False,
        return_states=True,
    )
    wall = time.perf_counter() - t0
    rows = [line.split() for line in times.read_text().splitlines()]
    pids = {r[1] for r in rows}
    last_smooth = max(float(r[3]) for r in rows if r[0] == "smooth")
    gaps, after_last = [], []
    for pid in pids:
        ends = [float(r[3]) for r in rows if r[1] == pid and r[0] == "smooth"]
        starts = [float(r[2]) for r in rows if r[1] == pid and r[0] == "label"]
        if ends and starts and min(starts) > max(ends):
            gaps.append(min(starts) - max(ends))
            # the part of the gap after the run's last smooth block ended: a worker that
            # moved earlier may wait for label blocks that need that block
            after_last.append(max(0.0, min(starts) - max(max(ends), last_smooth)))
    # the reference: a worker's gap between two blocks of one task (one round trip), under
    # the same load
    within = []
    for pid in pids:
        for task in ("smooth", "label"):
            mine = sorted((float(r[2]), float(r[3])) for r in rows if r[1] == pid and r[0] == task)
            within += [b[0] - a[1] for a, b in itertools.pairwise(mine)]
    ok = all(st.completed_count == st.total_block_count for st in states.values())
    shutil.rmtree(track, ignore_errors=True)
    return {
        "mode": mode,
        "wall_s": wall,
        "worker_pids": len(pids),
        "worker_starts": sum(st.worker_start_count for st in states.values()),
        "handover_gaps_ms": [g * 1000 for g in gaps],
        "gaps_after_last_smooth_ms": [g * 1000 for g in after_last],
        "block_to_block_gap_median_ms": statistics.median(within) * 1000 if within else None,
        "blocks": len(rows),
        "ok": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="w3_"))
    os.environ["W3_DIR"] = str(d)
    try:
        make_volume(d, args.size)
        results = []
        for rep in range(args.reps):
            for mode in ("shared", "bound4"):  # interleaved
                r = one_run(d, args.size, mode, rep)
                r["load"] = os.getloadavg()[0]
                results.append(r)
                print(json.dumps(r), flush=True)
        summary: dict[str, Any] = {"size": args.size, "reps": args.reps}
        for mode in ("shared", "bound4"):
            rs = [r for r in results if r["mode"] == mode]
            summary[mode] = {
                "wall_median_s": statistics.median(r["wall_s"] for r in rs),
                "worker_pids": [r["worker_pids"] for r in rs],
                "worker_starts": [r["worker_starts"] for r in rs],
                "handover_gap_median_ms": (
                    statistics.median(g for r in rs for g in r["handover_gaps_ms"])
                    if any(r["handover_gaps_ms"] for r in rs)
                    else None
                ),
                # per run, the smaller gap: the worker that ran the last smooth block
                "handover_gap_min_per_run_ms": [
                    min(r["handover_gaps_ms"]) for r in rs if r["handover_gaps_ms"]
                ],
                "gap_after_last_smooth_median_ms": (
                    statistics.median(g for r in rs for g in r["gaps_after_last_smooth_ms"])
                    if any(r["gaps_after_last_smooth_ms"] for r in rs)
                    else None
                ),
                "block_to_block_gap_median_ms": statistics.median(
                    r["block_to_block_gap_median_ms"] for r in rs
                ),
                "all_ok": all(r["ok"] for r in rs),
            }
        ratios = [
            a["wall_s"] / b["wall_s"] for a, b in zip(results[0::2], results[1::2], strict=True)
        ]
        summary["wall_ratio_shared_over_bound4_median"] = statistics.median(ratios)
        summary["wall_ratios"] = ratios
        summary["load_median"] = statistics.median(r["load"] for r in results)
        summary["scipy"] = ndimage is not None
        print(json.dumps(summary, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
