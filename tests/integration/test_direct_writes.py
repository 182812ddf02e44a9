"""Writes of declared outputs, as a user meets them: a script in a subprocess declares
``Task(outputs=[...])`` over real zarr v3 arrays on the local disk and writes its blocks
with ``arr[roi] = values``, from real worker processes or in serial mode.

- chunk-aligned writes (an edge chunk, all-fill chunks, scalars, cast values, values in
  the other byte order) of arrays of several dtypes, both endiannesses, zstd, gzip, blosc
  and no compressor, the v2 chunk key encoding and ``write_empty_chunks``, are written by
  bellis itself (each process counts them), and every chunk file is byte for byte the one
  zarr writes for the same values in the test's own process (gzip: but for its header's
  time stamp); zarr reads the same arrays back;
- writes that do not qualify (a sharded output, a misaligned box, fancy and strided
  selections, codecs bellis does not encode, a store not on the local disk) are left to
  zarr, each counted as such, and the data is right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)

from kit.user_script import run_script

SHAPE = (20, 24, 12)  # edge chunks on the first and last axes
CHUNKS = (8, 8, 8)

# the values each block writes, the same text in the test and in the user's script
GEN = '''
import sys
import numpy as np

NAMES = ["u8_zstd", "i16_big_gzip", "f32_blosc", "u16_raw", "f64_nan_zstd", "i32_v2_blosc",
         "bool_zstd", "u8_write_empty"]
WRITE_EMPTY = {"u8_write_empty"}


def values(name, dtype, fill, offset, shape):
    """What the block at ``offset`` writes to the array ``name``: the fill value (a chunk
    zarr removes), a scalar, random values, the same as float64 (cast as zarr casts) or in
    the other byte order."""
    b = offset[0] // 8 * 9 + offset[1] // 8 * 3 + offset[2] // 8
    rng = np.random.default_rng([NAMES.index(name), *offset])
    dt = np.dtype(dtype)
    if b % 5 == 1:
        return np.full(shape, fill, dt)
    if b % 5 == 2:
        return True if dt.kind == "b" else 5
    if dt.kind == "b":
        v = rng.random(shape) > 0.5
    elif dt.kind == "f":
        v = rng.normal(0, 100, shape).astype(dt)
    else:
        info = np.iinfo(dt)
        v = rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True)
        v = v.astype(dt)
    if b % 5 == 3 and dt.kind != "b":
        v = v.astype(np.float64)
    if b % 5 == 4 and dt.itemsize > 1:
        v = v.astype(v.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))
    return v
'''

WRITES = """
import json, os, sys
import numpy as np
import zarr
import bellis as daisy
from bellis._worker import _chunkwrite
from funlib.geometry import Roi
{gen}
ROOT, MODE, SHAPE = {root!r}, {mode!r}, {shape!r}
os.makedirs(os.path.join(ROOT, "counts"), exist_ok=True)


def process(block):
    w = block.write_roi
    sel = tuple(slice(o, e) for o, e in zip(w.offset, w.end))
    for name in NAMES:
        arr = zarr.open_array(os.path.join(ROOT, "bellis", name + ".zarr"), mode="r+")
        if name in WRITE_EMPTY:
            arr = arr.with_config({{"write_empty_chunks": True}})
        arr[sel] = values(name, arr.dtype, arr.fill_value, tuple(w.offset), tuple(w.shape))
    with open(os.path.join(ROOT, "counts", "%d.json" % os.getpid()), "w") as f:
        json.dump(_chunkwrite.counts(), f)


total = Roi((0, 0, 0), SHAPE)
w = Roi((0, 0, 0), (8, 8, 8))
task = daisy.Task("t", total, w, w, process, max_workers=2, fit="shrink",
                  read_write_conflict=False,
                  outputs=[os.path.join(ROOT, "bellis", n + ".zarr") for n in NAMES])
ok = daisy.run_blockwise([task], multiprocessing=MODE == "distributed", progress=False,
                         block_tracking=False)
sys.exit(0 if ok else 3)
"""


def _gen() -> dict[str, Any]:
    space: dict[str, Any] = {}
    exec(GEN, space)
    return space


def _create(path: Path, name: str) -> Any:
    kw: dict[str, Any] = {
        "u8_zstd": {"dtype": "uint8", "compressors": ZstdCodec()},
        "i16_big_gzip": {
            "dtype": "int16",
            "serializer": BytesCodec(endian="big"),
            "compressors": GzipCodec(level=3),
            "fill_value": -7,
        },
        "f32_blosc": {
            "dtype": "float32",
            "compressors": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
        },
        "u16_raw": {"dtype": "uint16", "compressors": None},
        "f64_nan_zstd": {
            "dtype": "float64",
            "fill_value": float("nan"),
            "compressors": ZstdCodec(level=3, checksum=True),
        },
        "i32_v2_blosc": {
            "dtype": "int32",
            "chunk_key_encoding": {"name": "v2", "separator": "."},
            "compressors": BloscCodec(),  # typesize and shuffle chosen by zarr
        },
        "bool_zstd": {"dtype": "bool", "compressors": ZstdCodec()},
        "u8_write_empty": {"dtype": "uint8", "compressors": ZstdCodec(), "fill_value": 3},
    }[name]
    arr = zarr.create_array(path, shape=SHAPE, chunks=CHUNKS, **kw)
    # every chunk exists before the run, so that a chunk of the fill value is removed
    arr[...] = 9 if arr.dtype.kind != "b" else True
    return arr


def _blocks() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    out = []
    for z in range(0, SHAPE[0], 8):
        for y in range(0, SHAPE[1], 8):
            for x in range(0, SHAPE[2], 8):
                lo = (z, y, x)
                out.append((lo, tuple(min(8, n - o) for o, n in zip(lo, SHAPE, strict=True))))
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != "zarr.json"
    }


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_aligned_writes_are_bellis_own_and_byte_for_byte_zarrs(tmp_path: Path, mode: str) -> None:
    gen = _gen()
    names: list[str] = gen["NAMES"]
    blocks = _blocks()
    for name in names:
        _create(tmp_path / "bellis" / f"{name}.zarr", name)
        ref = _create(tmp_path / "ref" / f"{name}.zarr", name)
        if name in gen["WRITE_EMPTY"]:
            ref = ref.with_config({"write_empty_chunks": True})
        # zarr's own write, in this process (no bellis installed here)
        for lo, shape in blocks:
            sel = tuple(slice(o, o + n) for o, n in zip(lo, shape, strict=True))
            ref[sel] = gen["values"](name, ref.dtype, ref.fill_value, lo, shape)
    script = WRITES.format(gen=GEN, root=str(tmp_path), mode=mode, shape=SHAPE)
    proc = run_script(tmp_path, script, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # every write was bellis's own: one per block and array, none left to zarr
    counts = [json.loads(p.read_text()) for p in (tmp_path / "counts").glob("*.json")]
    assert counts and (mode == "distributed" or len(counts) == 1)
    assert sum(c["direct"] for c in counts) == len(blocks) * len(names)
    assert sum(c["zarr"] for c in counts) == 0
    assert sum(c["deleted"] for c in counts) > 0  # chunks of the fill value were removed

    for name in names:
        ours = _files(tmp_path / "bellis" / f"{name}.zarr")
        theirs = _files(tmp_path / "ref" / f"{name}.zarr")
        assert sorted(ours) == sorted(theirs), name  # the same chunks written and removed
        if name != "u8_write_empty":
            assert len(ours) < len(blocks), name  # some were removed
        else:
            assert len(ours) == len(blocks)
        assert not [k for k in ours if k.endswith(".partial")]
        for key, data in theirs.items():
            if "gzip" in name:  # the gzip header's modification time (bytes 4-7) differs
                assert data[:4] + data[8:] == ours[key][:4] + ours[key][8:], (name, key)
            else:
                assert ours[key] == data, (name, key)
        if name == "i32_v2_blosc":
            assert "0.0.0" in ours
        a = zarr.open_array(tmp_path / "bellis" / f"{name}.zarr", mode="r")[...]
        b = zarr.open_array(tmp_path / "ref" / f"{name}.zarr", mode="r")[...]
        np.testing.assert_array_equal(a, b)


FALLBACK = """
import json, os, sys
import numpy as np
import zarr
import bellis as daisy
from bellis._worker import _chunkwrite
from funlib.geometry import Roi

ROOT, MODE = {root!r}, {mode!r}
NAMES = {names!r}
OUT = os.path.join(ROOT, "deltas")
os.makedirs(OUT, exist_ok=True)
memory = None
if MODE == "serial":
    memory = zarr.create_array(zarr.storage.MemoryStore(), shape=(16, 16, 16), chunks=(8, 8, 8),
                               dtype="uint8")


def write(name, arr, z, y, x, v):
    box = (slice(z, z + 8), slice(y, y + 8), slice(x, x + 8))
    if name == "misaligned":
        arr[z + 1:z + 8, y:y + 8, x:x + 8] = v[1:]
    elif name == "fancy":
        arr[list(range(z, z + 8)), y:y + 8, x:x + 8] = v
    elif name == "strided":
        arr[z:z + 8:2, y:y + 8, x:x + 8] = v[::2]
    elif name == "listvalue":
        arr[box] = v.tolist()
    else:
        arr[box] = v


def process(block):
    z, y, x = block.write_roi.offset
    b = z // 8 * 4 + y // 8 * 2 + x // 8
    rec = []
    for i, name in enumerate(NAMES):
        if name == "memory":
            if memory is None:
                continue
            arr = memory
        else:
            arr = zarr.open_array(os.path.join(ROOT, name + ".zarr"), mode="r+")
        v = np.full((8, 8, 8), 10 * i + b + 1, dtype=np.uint8)
        before = _chunkwrite.counts()
        write(name, arr, z, y, x, v)
        after = _chunkwrite.counts()
        rec.append([name, after["direct"] - before["direct"], after["zarr"] - before["zarr"]])
    with open(os.path.join(OUT, "%d.json" % b), "w") as f:
        json.dump(rec, f)


total = Roi((0, 0, 0), (16, 16, 16))
w = Roi((0, 0, 0), (8, 8, 8))
outputs = [os.path.join(ROOT, n + ".zarr") for n in NAMES if n != "memory"]
if memory is not None:
    outputs.append(memory)
task = daisy.Task("t", total, w, w, process, max_workers=2, read_write_conflict=False,
                  outputs=outputs)
ok = daisy.run_blockwise([task], multiprocessing=MODE == "distributed", progress=False,
                         block_tracking=False)
if memory is not None:
    np.save(os.path.join(ROOT, "memory.npy"), memory[...])
sys.exit(0 if ok else 3)
"""

FALLBACK_NAMES = [
    "aligned",  # the control: bellis writes it
    "sharded",
    "misaligned",
    "fancy",
    "strided",
    "listvalue",
    "crc32c",
    "transpose",
    "memory",
]


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_writes_that_do_not_qualify_go_to_zarr_and_are_right(tmp_path: Path, mode: str) -> None:
    shape = (16, 16, 16)
    for name in FALLBACK_NAMES:
        path = tmp_path / f"{name}.zarr"
        if name == "sharded":
            zarr.create_array(path, shape=shape, chunks=(4, 4, 4), shards=(8, 8, 8), dtype="uint8")
        elif name == "crc32c":
            zarr.create_array(
                path, shape=shape, chunks=(8, 8, 8), dtype="uint8",
                compressors=[ZstdCodec(), Crc32cCodec()],
            )  # fmt: skip
        elif name == "transpose":
            zarr.create_array(
                path, shape=shape, chunks=(8, 8, 8), dtype="uint8",
                filters=[TransposeCodec(order=(2, 1, 0))],
            )  # fmt: skip
        elif name != "memory":
            zarr.create_array(path, shape=shape, chunks=(8, 8, 8), dtype="uint8")
    script = FALLBACK.format(root=str(tmp_path), mode=mode, names=FALLBACK_NAMES)
    proc = run_script(tmp_path, script, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    seen: dict[str, list[tuple[int, int]]] = {}
    for path in (tmp_path / "deltas").glob("*.json"):
        for name, direct, by_zarr in json.loads(path.read_text()):
            seen.setdefault(name, []).append((direct, by_zarr))
    names = [n for n in FALLBACK_NAMES if n != "memory" or mode == "serial"]
    assert sorted(seen) == sorted(names)
    for name in names:
        want = [(1, 0)] * 8 if name == "aligned" else [(0, 1)] * 8
        assert seen[name] == want, name

    # the data is right: what each block wrote, where it wrote it
    for i, name in enumerate(FALLBACK_NAMES):
        if name == "memory" and mode != "serial":
            continue
        expect = np.zeros(shape, dtype=np.uint8)
        for b in range(8):
            z, y, x = (b >> 2 & 1) * 8, (b >> 1 & 1) * 8, (b & 1) * 8
            value = 10 * i + b + 1
            if name == "misaligned":
                expect[z + 1 : z + 8, y : y + 8, x : x + 8] = value
            elif name == "strided":
                expect[z : z + 8 : 2, y : y + 8, x : x + 8] = value
            else:
                expect[z : z + 8, y : y + 8, x : x + 8] = value
        if name == "memory":
            got = np.load(tmp_path / "memory.npy")
        else:
            got = zarr.open_array(tmp_path / f"{name}.zarr", mode="r")[...]
        np.testing.assert_array_equal(got, expect, err_msg=name)
