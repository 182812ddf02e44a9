"""``bellis demo``: a real two-task pipeline on a synthetic 3-D volume stored in zarr.

1. ``smooth`` reads ``raw`` with a one-voxel context and writes a 3x3x3 mean to ``smoothed``.
2. ``label`` reads ``smoothed`` (so every one of its blocks waits for the smoothing blocks
   it overlaps), thresholds it and labels 6-connected foreground components per block,
   writing ``labels`` and a per-block component count into ``counts``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

BLOCK = 32


def make_raw(path: Path, shape: tuple[int, int, int], seed: int = 0) -> None:
    import zarr

    rng = np.random.default_rng(seed)
    zz, yy, xx = np.meshgrid(*(np.arange(s) for s in shape), indexing="ij")
    vol = np.zeros(shape, dtype=np.float32)
    for _ in range(max(4, shape[0] // 6)):
        c = rng.uniform(0, shape)
        r = rng.uniform(3, 9)
        vol += np.exp(-((zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2) / (2 * r * r))
    vol += rng.normal(0, 0.05, shape).astype(np.float32)
    root = zarr.open_group(str(path), mode="w")
    root.create_array("raw", data=vol, chunks=(BLOCK,) * 3)
    for name, dtype in (("smoothed", "float32"), ("labels", "uint32")):
        root.create_array(name, shape=shape, chunks=(BLOCK,) * 3, dtype=dtype, fill_value=0)
    grid = tuple(-(-s // BLOCK) for s in shape)
    # one chunk per cell: blocks write their cells concurrently, and zarr rewrites whole
    # chunks, so no two blocks may share one
    root.create_array("counts", shape=grid, chunks=(1, 1, 1), dtype="uint32", fill_value=0)


def _array(name: str, mode: Literal["r", "r+"] = "r+") -> Any:
    """One array of the demo's zarr group in the current directory."""
    import zarr

    arr = zarr.open_group(str(Path.cwd() / "demo.zarr"), mode=mode)[name]
    if not isinstance(arr, zarr.Array):
        raise TypeError(f"demo.zarr/{name} is not an array")
    return arr


def smooth_block(block: Any) -> None:
    """3x3x3 mean. The read ROI reaches one voxel past the volume at its faces; those
    voxels repeat the edge (``np.pad`` mode "edge")."""
    raw = _array("raw", "r")
    r = block.read_roi
    w = block.write_roi
    lo = [max(0, o) for o in r.offset]
    hi = [min(n, o + s) for o, s, n in zip(r.offset, r.shape, raw.shape, strict=True)]
    data = np.asarray(raw[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))], np.float32)
    pad = [(a - o, (o + s) - b) for a, b, o, s in zip(lo, hi, r.offset, r.shape, strict=True)]
    data = np.pad(data, pad, mode="edge")
    acc = np.zeros_like(data)
    for dz in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                acc += np.roll(data, (dz, dy, dx), axis=(0, 1, 2))
    acc /= 27.0
    inner = tuple(
        slice(wo - ro, wo - ro + ws) for wo, ro, ws in zip(w.offset, r.offset, w.shape, strict=True)
    )
    out = tuple(slice(o, o + s) for o, s in zip(w.offset, w.shape, strict=True))
    _array("smoothed")[out] = acc[inner]


def _label(mask: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], int]:
    labels = np.where(mask, np.arange(1, mask.size + 1, dtype=np.uint32).reshape(mask.shape), 0)
    big = np.uint32(np.iinfo(np.uint32).max)
    while True:
        cur = np.where(mask, labels, big)
        best = cur.copy()
        for axis in range(3):
            for shift in (1, -1):
                rolled = np.roll(cur, shift, axis=axis)
                edge = [slice(None)] * 3
                edge[axis] = slice(0, 1) if shift == 1 else slice(-1, None)
                rolled[tuple(edge)] = big
                np.minimum(best, rolled, out=best)
        new = np.where(mask, best, 0)
        if np.array_equal(new, labels):
            break
        labels = new
    uniq = np.unique(labels[labels > 0])
    remap = np.zeros(int(labels.max()) + 1, dtype=np.uint32)
    remap[uniq] = np.arange(1, len(uniq) + 1, dtype=np.uint32)
    return remap[labels], len(uniq)


def label_block(block: Any) -> None:
    w = block.write_roi
    sl = tuple(slice(o, o + s) for o, s in zip(w.offset, w.shape, strict=True))
    data = np.asarray(_array("smoothed", "r")[sl])
    labels, n = _label(data > 0.25)
    _array("labels")[sl] = labels
    cell = tuple(o // BLOCK for o in w.offset)
    _array("counts")[cell] = n


def resume_notice(states: dict[str, Any]) -> str | None:
    """What the demo says when it resumed: which blocks it skipped, and how to start over
    (the library's own notice points to ``Task.reset()``, which a demo user never sees)."""
    skipped = [(tid, s) for tid, s in states.items() if s.skipped_count > 0]
    if not skipped:
        return None
    parts = ", ".join(f"{tid} {s.skipped_count}/{s.total_block_count}" for tid, s in skipped)
    return (
        f"Resumed: blocks done by an earlier run were skipped ({parts}). "
        "Run `bellis demo --fresh` to start over and compute them again."
    )


def run_demo(workdir: Path, *, size: int, workers: int, serial: bool, fresh: bool) -> bool:
    import os

    from funlib.geometry import Roi

    import bellis

    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    shape = (size, size, size)
    if fresh or not (workdir / "demo.zarr").exists():
        make_raw(workdir / "demo.zarr", shape)
        import shutil

        shutil.rmtree(workdir / "tracking", ignore_errors=True)
    bellis.set_tracking_basedir(workdir / "tracking")
    bellis.logging.set_log_basedir(workdir / "logs")
    total = Roi((0, 0, 0), shape)
    # smooth reads one voxel of context on each side; its total ROI includes that context,
    # so its write blocks tile the volume exactly and line up with the zarr chunks (two
    # blocks never write the same chunk). "shrink" clips a trailing partial block.
    smooth = bellis.Task(
        "smooth",
        total_roi=total.grow((1, 1, 1), (1, 1, 1)),
        read_roi=Roi((0, 0, 0), (BLOCK + 2,) * 3),
        write_roi=Roi((1, 1, 1), (BLOCK,) * 3),
        process_function=smooth_block,
        read_write_conflict=False,
        fit="shrink",
        max_workers=workers,
        resource_tracking=True,
    )
    label = bellis.Task(
        "label",
        total_roi=total,
        read_roi=Roi((0, 0, 0), (BLOCK,) * 3),
        write_roi=Roi((0, 0, 0), (BLOCK,) * 3),
        process_function=label_block,
        read_write_conflict=False,
        max_workers=workers,
        resource_tracking=True,
    )
    states = bellis.run_blockwise(
        smooth + label, multiprocessing=not serial, progress=True, return_states=True
    )
    ok = all(s.completed_count == s.total_block_count for s in states.values())
    notice = resume_notice(states)
    if notice:
        print()
        print(notice)
    counts = np.asarray(_array("counts", "r")[:])
    print()
    print(f"Wrote {workdir / 'demo.zarr'}: smoothed {shape}, labels {shape}, counts {counts.shape}")
    print(f"  components per block: min {counts.min()}, max {counts.max()}, total {counts.sum()}")
    print(
        f"  tracking stores under {workdir / 'tracking'} (run `bellis status "
        f"{workdir / 'tracking' / 'label'}`)"
    )
    print(f"  worker logs under {workdir / 'logs'}")
    from .._report._html import write_report

    report = write_report([workdir / "tracking"], workdir / "report.html")
    print(f"  report: {report} (open it in a browser)")
    return ok
