"""The workloads of the real-workload benchmark, their data, and how outputs are checked."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

CHUNK = 64
SEED = 38


@dataclass(frozen=True)
class Stage:
    """One task of a workload: ``kernel`` reads ``input`` with ``context`` voxels around
    each ``write``^3 block and writes ``output``, chunked ``min(64, write)``^3 so that no two
    blocks write one chunk (32^3 blocks into 64^3 chunks would race in zarr's
    read-modify-write of the chunk, and lose writes)."""

    name: str
    kernel: str
    input: str
    output: str
    write: int
    context: int
    conflict: bool
    dtype: str

    @property
    def out_chunk(self) -> int:
        return min(CHUNK, self.write)


WORKLOADS: dict[str, tuple[Stage, ...]] = {
    "W1": (Stage("gaussian", "gaussian", "raw", "w1_smooth", 128, 8, False, "uint8"),),
    "W2": (Stage("threshold", "threshold", "raw", "w2_mask", 32, 0, False, "uint8"),),
    "W3": (
        Stage("smooth", "gaussian", "raw", "w3_smooth", 64, 8, False, "uint8"),
        Stage("label", "label", "w3_smooth", "w3_labels", 64, 4, True, "uint32"),
    ),
}


def describe(workload: str, size: int) -> str:
    parts = []
    for s in WORKLOADS[workload]:
        n = (size // s.write) ** 3
        rwc = ", read_write_conflict" if s.conflict else ""
        parts.append(f"{s.name} {s.write}^3 ctx {s.context}{rwc} ({n} blocks)")
    return " -> ".join(parts)


def make_array(path: str, size: int, dtype: str, chunk: int = CHUNK) -> Any:
    import zarr
    from zarr.codecs import ZstdCodec

    return zarr.create_array(
        store=path,
        shape=(size,) * 3,
        chunks=(chunk,) * 3,
        dtype=dtype,
        compressors=ZstdCodec(),
        fill_value=0,
        overwrite=True,
    )


def ensure_raw(data_dir: str, size: int) -> str:
    """``data_dir/raw_<size>.zarr``: uniform random uint8, made once (a marker file says it
    is complete) and reused by every measurement of a campaign."""
    path = os.path.join(data_dir, f"raw_{size}.zarr")
    done = path + ".done"
    if os.path.exists(done):
        return path
    arr = make_array(path, size, "uint8")
    rng = np.random.default_rng(SEED)
    step = min(size, CHUNK)
    for z in range(0, size, step):
        arr[z : z + step] = rng.integers(0, 256, (step, size, size), dtype=np.uint8)
    with open(done, "w") as f:
        f.write("ok\n")
    return path


def digest(path: str) -> str:
    """sha256 of an array's voxels (C order), read in slabs."""
    import zarr

    arr = zarr.open_array(path, mode="r")
    h = hashlib.sha256()
    h.update(f"{arr.dtype}{arr.shape}".encode())
    step = CHUNK
    for z in range(0, arr.shape[0], step):
        h.update(np.ascontiguousarray(arr[z : z + step]).tobytes())
    return h.hexdigest()


def blocks(stage: Stage, size: int) -> list[tuple[tuple[int, ...], ...]]:
    """(read offset, read shape, write offset, write shape) of every block, in z, y, x order."""
    w, c = stage.write, stage.context
    n = size // w
    out = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                wo = (i * w, j * w, k * w)
                out.append((tuple(o - c for o in wo), (w + 2 * c,) * 3, wo, (w,) * 3))
    return out
