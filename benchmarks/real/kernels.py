"""The block kernels of the real-workload benchmark, shared by every runner.

Each kernel reads its block's read ROI from a zarr array (zero-padded where it leaves the
volume), computes, and writes its write ROI. World units are voxels (voxel size 1, offset 0).
Every process opens each array once (``_array``) and logs, per block, the time the block's
own read, compute and write took (wall), and the CPU time of its process over the block (all
threads: zarr decodes on its event-loop thread), measured inside the block function, to a
per-process file in ``timing_dir`` (one ``os.write`` of one line per block, the same for
every runner).

The outputs do not depend on the order blocks run in: the labels of a block are numbered
from ``block_index << 20``, where ``block_index`` is the linear index of the block's write
ROI in the grid, not the scheduler's block id.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from scipy import ndimage  # here, not in the first block: a process's imports are not block time

SIGMA = 2.0
THRESHOLD = 127
LABEL_SHIFT = 20  # 64^3 = 2^18 voxels, so a block has fewer than 2^20 components

_ARRAYS: dict[tuple[str, str], Any] = {}
_LOG: dict[str, int] = {}


def _profile_worker() -> None:
    """``BENCH_REAL_PROFILE=DIR``: a bellis worker (``BELLIS_CONTEXT`` set) that imports
    this module (when it unpickles the block function) runs under cProfile from then on
    and writes ``DIR/worker-PID.prof`` at exit (wall clock: waits count)."""
    out = os.environ.get("BENCH_REAL_PROFILE")
    if not out or "BELLIS_CONTEXT" not in os.environ:
        return
    import atexit
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    atexit.register(lambda: prof.dump_stats(os.path.join(out, f"worker-{os.getpid()}.prof")))


_profile_worker()


def _array(path: str, mode: str = "r") -> Any:
    key = (path, mode)
    arr = _ARRAYS.get(key)
    if arr is None:
        import zarr

        arr = zarr.open_array(path, mode=mode)
        _ARRAYS[key] = arr
    return arr


def _log(
    timing_dir: str,
    kernel: str,
    read_s: float,
    compute_s: float,
    write_s: float,
    cpu_s: float,
    index: int = -1,
) -> None:
    fd = _LOG.get(timing_dir)
    if fd is None:
        fd = os.open(
            os.path.join(timing_dir, f"{os.getpid()}.tsv"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        )
        _LOG[timing_dir] = fd
    line = f"{kernel}\t{read_s:.6f}\t{compute_s:.6f}\t{write_s:.6f}\t{cpu_s:.6f}\t{index}\n"
    os.write(fd, line.encode())


def read_padded(arr: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    """``arr`` over ``offset`` + ``shape``, zeros where that leaves the array."""
    lo = [max(0, o) for o in offset]
    hi = [min(s, o + n) for s, o, n in zip(arr.shape, offset, shape, strict=True)]
    data = arr[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]
    if tuple(data.shape) == tuple(shape):
        return data
    pad = [(a - o, o + n - b) for a, b, o, n in zip(lo, hi, offset, shape, strict=True)]
    return np.pad(data, pad)


def _slices(offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def _inner(read_shape: tuple[int, ...], context: int) -> tuple[slice, ...]:
    return tuple(slice(context, n - context) for n in read_shape)


def gaussian_compute(x: Any, context: int) -> Any:
    """The smoothing of one padded block: float32 gaussian, cropped, rounded to uint8."""
    y = ndimage.gaussian_filter(x.astype(np.float32), SIGMA, mode="reflect")
    if context:
        y = y[_inner(x.shape, context)]
    return np.clip(np.rint(y), 0, 255).astype(np.uint8)


def threshold_compute(x: Any) -> Any:
    return (x > THRESHOLD).astype(np.uint8)


def label_compute(x: Any, context: int, block_index: int) -> Any:
    """Connected components of ``x > THRESHOLD`` over the padded block, cropped, numbered
    from ``block_index << LABEL_SHIFT``."""
    lab, _ = ndimage.label(x > THRESHOLD)
    lab = lab[_inner(x.shape, context)].astype(np.uint32)
    lab[lab > 0] += np.uint32(block_index << LABEL_SHIFT)
    return lab


def compute(kernel: str, x: Any, context: int, block_index: int) -> Any:
    """The kernel ``kernel`` (gaussian, threshold or label) on the padded block ``x``."""
    if kernel == "gaussian":
        return gaussian_compute(x, context)
    if kernel == "threshold":
        return threshold_compute(x)
    if kernel == "label":
        return label_compute(x, context, block_index)
    raise ValueError(f"unknown kernel {kernel!r}")


def block_index(write_offset: tuple[int, ...], write_shape: tuple[int, ...], size: int) -> int:
    """Linear index of a block's write ROI in the grid of ``write_shape`` over ``size``^3."""
    per = size // write_shape[0]
    idx = 0
    for o, n in zip(write_offset, write_shape, strict=True):
        idx = idx * per + o // n
    return idx


def run_block(
    spec: dict[str, Any],
    read_offset: tuple[int, ...],
    read_shape: tuple[int, ...],
    write_offset: tuple[int, ...],
    write_shape: tuple[int, ...],
) -> None:
    """One block of the kernel ``spec["kernel"]`` (gaussian, threshold or label)."""
    perf = time.perf_counter
    kernel = spec["kernel"]
    src = _array(spec["input"])
    dst = _array(spec["output"], "r+")
    index = block_index(write_offset, write_shape, spec["size"])
    c0 = time.process_time()
    t0 = perf()
    x = read_padded(src, read_offset, read_shape)
    t1 = perf()
    y = compute(kernel, x, spec["context"], index)
    t2 = perf()
    dst[_slices(write_offset, write_shape)] = y
    t3 = perf()
    _log(spec["timing_dir"], kernel, t1 - t0, t2 - t1, t3 - t2, time.process_time() - c0, index)


def process_block(spec: dict[str, Any], block: Any) -> None:
    """The process function of bellis and daisy: ``functools.partial(process_block, spec)``."""
    r, w = block.read_roi, block.write_roi
    run_block(spec, tuple(r.offset), tuple(r.shape), tuple(w.offset), tuple(w.shape))
