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
    """The demo's volume: Gaussian blobs plus noise, written one slab of chunks at a time.

    A blob of radius ``r`` is summed only within ``6 r`` of its centre (beyond that it adds
    less than 1.6e-8), as a product of three 1-D factors, so the volume takes O(N^3) time
    and one slab of memory (``BLOCK`` planes), not the whole volume several times over.
    Progress goes to stderr.
    """
    import sys

    import zarr

    rng = np.random.default_rng(seed)
    blobs = []
    for _ in range(max(4, shape[0] // 6)):
        c = rng.uniform(0, shape)
        r = rng.uniform(3, 9)
        blobs.append((c, r))
    root = zarr.open_group(str(path), mode="w")
    raw = root.create_array("raw", shape=shape, chunks=(BLOCK,) * 3, dtype="float32")
    axes = [np.arange(n, dtype=np.float64) for n in shape]
    nz = shape[0]
    print(
        f"bellis demo: building the {'x'.join(map(str, shape))} volume "
        f"({4 * int(np.prod(shape)) / (1 << 20):.0f} MiB) in {path}",
        file=sys.stderr,
        flush=True,
    )
    for z0 in range(0, nz, BLOCK):
        z1 = min(nz, z0 + BLOCK)
        slab = np.zeros((z1 - z0, *shape[1:]), dtype=np.float64)
        for c, r in blobs:
            box = []
            for axis, (ctr, n) in enumerate(zip(c, shape, strict=True)):
                lo, hi = max(0, int(ctr - 6 * r)), min(n, int(ctr + 6 * r) + 1)
                if axis == 0:
                    lo, hi = max(lo, z0), min(hi, z1)
                box.append((lo, hi))
            if any(lo >= hi for lo, hi in box):
                continue
            f = [
                np.exp(-((axes[a][lo:hi] - c[a]) ** 2) / (2 * r * r))
                for a, (lo, hi) in enumerate(box)
            ]
            (zl, zh), (yl, yh), (xl, xh) = box
            slab[zl - z0 : zh - z0, yl:yh, xl:xh] += (
                f[0][:, None, None] * f[1][None, :, None] * f[2][None, None, :]
            )
        # the noise, drawn slab by slab: the same stream as one draw of the whole volume
        slab += rng.normal(0, 0.05, slab.shape)
        raw[z0:z1] = slab.astype(np.float32)
        print(f"bellis demo: raw {z1} of {nz} planes", file=sys.stderr, flush=True)
    for name, dtype in (("smoothed", "float32"), ("labels", "uint32")):
        root.create_array(name, shape=shape, chunks=(BLOCK,) * 3, dtype=dtype, fill_value=0)
    grid = tuple(-(-s // BLOCK) for s in shape)
    # one chunk per cell: blocks write their cells concurrently, and zarr rewrites whole
    # chunks, so no two blocks may share one
    root.create_array("counts", shape=grid, chunks=(1, 1, 1), dtype="uint32", fill_value=0)


def _built_shape(path: Path) -> tuple[int, ...] | None:
    """The shape of the demo volume already at ``path``; None where there is none (or it
    is not a demo volume that every array of the demo lies in)."""
    import zarr

    if not path.exists():
        return None
    try:
        root = zarr.open_group(str(path), mode="r")
        arrays = [root[name] for name in ("raw", "smoothed", "labels", "counts")]
        if not all(isinstance(a, zarr.Array) for a in arrays):
            return None
        shapes = {tuple(a.shape) for a in arrays[:3]}  # type: ignore[union-attr]
        counts = tuple(arrays[3].shape)  # type: ignore[union-attr]
    except Exception:  # a broken or foreign folder: built again, as a missing one is
        return None
    if len(shapes) != 1:
        return None
    shape = shapes.pop()
    if counts != tuple(-(-s // BLOCK) for s in shape):
        return None
    return shape


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
    old = _built_shape(workdir / "demo.zarr")
    if old is not None and old != shape and not fresh:
        import sys

        # the old volume, its outputs and the tracking of its blocks are all of another
        # size: a resume over them would skip or misplace blocks, so the demo starts over
        print(
            f"bellis demo: {workdir / 'demo.zarr'} holds a {'x'.join(map(str, old))} volume, "
            f"not {'x'.join(map(str, shape))} (--size {size}): building it again, as with "
            "--fresh",
            file=sys.stderr,
            flush=True,
        )
        fresh = True
    if fresh or old is None:
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
        fit="shrink",  # a --size that is not a multiple of BLOCK: label the last cells too
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
