"""Declared outputs and write safety, as a user meets them: a script in a subprocess writes
a real zarr v3 array from real worker processes.

The array is sharded (shards of 4x4x4 chunks) and each block is one chunk, so the blocks
of one shard race in zarr's read-modify-write of the shard. Each block reads its region,
adds a value of its own and writes it back, and logs when it started and ended and which
shard it wrote (one file per worker process).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import zarr
from funlib.geometry import Roi

import bellis as daisy
from bellis.errors import ConfigurationError
from kit.user_script import run_script

SCRIPT = """
import json, logging, os, sys, time
import numpy as np
import zarr
import bellis as daisy
from funlib.geometry import Roi

ARRAY, LOGS, SAFETY, WORKERS = {array!r}, {logs!r}, {safety!r}, {workers!r}
VS, BLOCK, SHARD = {vs!r}, {block!r}, {shard!r}
FIT, TOTAL = {fit!r}, {total!r}
os.makedirs(LOGS, exist_ok=True)
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")


def process(block):
    arr = zarr.open_array(ARRAY, mode="r+")
    roi = block.write_roi
    sl = tuple(slice(o // v, (o + s) // v) for o, s, v in zip(roi.offset, roi.shape, VS))
    shard = tuple(o // v // SHARD for o, v in zip(roi.offset, VS))
    start = time.time()
    data = arr[sl]
    time.sleep(0.002)
    arr[sl] = data + (block.block_id[1] % 200) + 1
    end = time.time()
    with open(os.path.join(LOGS, str(os.getpid())), "a") as f:
        f.write(json.dumps([block.block_id[1], list(shard), start, end]) + "\\n")


total = Roi((0, 0, 0), TOTAL)
w = Roi((0, 0, 0), BLOCK)
task = daisy.Task(
    "t", total, w, w, process, max_workers=WORKERS, fit=FIT, read_write_conflict=False,
    outputs=[ARRAY], write_safety=SAFETY,
)
ok = daisy.run_blockwise([task], progress=False, block_tracking=False)
sys.exit(0 if ok else 3)
"""

CHUNK = 2
SHARD = 4 * CHUNK  # voxels: shards of 4x4x4 chunks


def make_array(path: Path, shape=(8, 8, 16), vs=None) -> str:
    arr = zarr.create_array(
        str(path),
        shape=shape,
        chunks=(CHUNK,) * 3,
        shards=(SHARD,) * 3,
        dtype="uint16",
        fill_value=0,
    )
    if vs is not None:
        arr.attrs["voxel_size"] = list(vs)
        arr.attrs["offset"] = [0, 0, 0]
    return str(path)


def run(
    tmp_path: Path,
    safety: str,
    *,
    workers=3,
    vs=(1, 1, 1),
    fit="valid",
    shape=(8, 8, 16),
    block=None,
    total=None,
):
    array = make_array(tmp_path / "out.zarr", shape, vs if vs != (1, 1, 1) else None)
    logs = tmp_path / "logs"
    block = block or tuple(CHUNK * v for v in vs)
    total = total or tuple(s * v for s, v in zip(shape, vs, strict=True))
    text = SCRIPT.format(
        array=array,
        logs=str(logs),
        safety=safety,
        workers=workers,
        vs=list(vs),
        block=list(block),
        shard=SHARD,
        fit=fit,
        total=list(total),
    )
    proc = run_script(tmp_path, text, timeout=300)
    return proc, array, logs


def log_lines(logs: Path) -> list[list]:
    if not logs.exists():
        return []
    return [json.loads(line) for f in logs.iterdir() for line in f.read_text().splitlines()]


def expected_array(shape, block_vox, fit="valid"):
    """What the array holds when every block wrote once: its block id's value."""
    task = daisy.Task(
        "t",
        Roi((0, 0, 0), shape),
        Roi((0, 0, 0), block_vox),
        Roi((0, 0, 0), block_vox),
        lambda b: None,
        fit=fit,
        read_write_conflict=False,
    )
    out = np.zeros(shape, dtype=np.uint16)
    for k in range(task._geom.num_blocks):
        b = task._geom.block(k)
        roi = b.write_roi
        sl = tuple(slice(o, o + s) for o, s in zip(roi.offset, roi.shape, strict=True))
        out[sl] += (b.block_id[1] % 200) + 1
    return out


def test_default_refuses_shared_shards_before_any_block_runs(tmp_path):
    proc, _, logs = run(tmp_path, "error")
    assert proc.returncode != 0
    assert "ConfigurationError" in proc.stderr
    assert "write into the same shard of output" in proc.stderr
    assert "chunks 2x2x2 voxels" in proc.stderr and "shards 8x8x8 voxels" in proc.stderr
    assert "write_safety='serialize'" in proc.stderr
    assert log_lines(logs) == []  # no block function ran
    assert not logs.exists() or not any(logs.iterdir())


@pytest.mark.parametrize("attempt", range(3))
def test_serialize_never_runs_two_blocks_of_one_shard_at_once(tmp_path, attempt):
    proc, array, logs = run(tmp_path, "serialize", workers=2 + attempt)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log_lines(logs)
    assert len(lines) == 4 * 4 * 8
    assert len({tuple(s) for _, s, _, _ in lines}) == 2
    assert overlaps(lines) == 0, "two blocks of one shard ran at once"
    got = zarr.open_array(array, mode="r")[:]
    assert np.array_equal(got, expected_array((8, 8, 16), (CHUNK,) * 3))


def overlaps(lines: list[list]) -> int:
    """How many times a block started while another block of its shard was running."""
    by_shard: dict[tuple, list] = {}
    for _, shard, start, end in lines:
        by_shard.setdefault(tuple(shard), []).append((start, end))
    n = 0
    for spans in by_shard.values():
        spans.sort()
        latest = 0.0
        for start, end in spans:
            n += start < latest
            latest = max(latest, end)
    return n


def test_off_warns_once_and_shows_the_race(tmp_path):
    """Shows the race where it can: blocks of one shard at once, and (often, not always)
    voxels lost. Not required to lose data every time."""
    proc, array, logs = run(tmp_path, "off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("write safety is off") == 1
    assert "WARNING bellis: write safety is off" in proc.stderr
    lines = log_lines(logs)
    assert len(lines) == 4 * 4 * 8
    got = zarr.open_array(array, mode="r")[:]
    lost = int(np.count_nonzero(got != expected_array((8, 8, 16), (CHUNK,) * 3)))
    print(f"off: {overlaps(lines)} overlapping blocks of one shard, {lost} voxels lost")


def test_blocks_of_the_shard_shape_pass_with_no_warning(tmp_path):
    proc, array, logs = run(tmp_path, "error", block=(SHARD,) * 3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "write safety" not in proc.stderr
    assert len(log_lines(logs)) == 2
    assert np.array_equal(
        zarr.open_array(array, mode="r")[:], expected_array((8, 8, 16), (SHARD,) * 3)
    )


@pytest.mark.parametrize("fit", ["shrink", "overhang"])
def test_border_blocks_of_the_shard_shape_pass(tmp_path, fit):
    # 8x8x12 voxels: the last block along the last axis is half a shard, clipped (shrink)
    # or hanging over the end (overhang); each shard still has one writer
    shape = (8, 8, 12)
    if fit == "overhang":
        a = make_array(tmp_path / "o.zarr", shape=(8, 8, 16))
        t = daisy.Task(
            "t",
            Roi((0, 0, 0), shape),
            Roi((0, 0, 0), (8, 8, 8)),
            Roi((0, 0, 0), (8, 8, 8)),
            lambda b: None,
            fit=fit,
            outputs=[a],
        )
        assert t.block_grid_shape == [1, 1, 2]
        return
    proc, array, _ = run(tmp_path, "error", fit=fit, shape=shape, block=(SHARD,) * 3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert np.array_equal(
        zarr.open_array(array, mode="r")[:], expected_array(shape, (SHARD,) * 3, fit)
    )


def test_shrunk_border_blocks_that_share_a_shard_are_refused(tmp_path):
    a = make_array(tmp_path / "o.zarr", shape=(8, 8, 16))
    # blocks of 6 along the last axis: 0-6 and 6-12 share the shard 0-8
    w = Roi((0, 0, 0), (8, 8, 6))
    with pytest.raises(ConfigurationError, match="same shard"):
        daisy.Task("t", Roi((0, 0, 0), (8, 8, 16)), w, w, lambda b: None, fit="shrink", outputs=[a])


def test_world_units_map_through_the_voxel_size(tmp_path):
    # voxels of 4x2x2 world units: blocks of one chunk are 8x4x4, shards 32x16x16 world
    vs = (4, 2, 2)
    proc, _, logs = run(tmp_path, "error", vs=vs)
    assert proc.returncode != 0
    assert "shards 8x8x8 voxels (32x16x16 world units)" in proc.stderr
    assert "block write shape is 8x4x4 world units (2x2x2 voxels)" in proc.stderr
    assert log_lines(logs) == []
    # shard-sized blocks in world units run, and write the right voxels
    (tmp_path / "again").mkdir()
    proc, array, logs = run(tmp_path / "again", "error", vs=vs, block=(32, 16, 16))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(log_lines(logs)) == 2
    assert np.array_equal(
        zarr.open_array(array, mode="r")[:], expected_array((8, 8, 16), (SHARD,) * 3)
    )


class FunlibLike:
    """What bellis reads of a funlib.persistence Array (funlib is not a dependency)."""

    def __init__(self, data, voxel_size, offset):
        self.data = data
        self.voxel_size = voxel_size
        self.offset = offset


def test_a_funlib_array_brings_its_voxel_size_and_offset(tmp_path):
    arr = zarr.open_array(make_array(tmp_path / "f.zarr"), mode="r+")
    fa = FunlibLike(arr, (2, 2, 2), (4, 4, 4))
    total = Roi((4, 4, 4), (16, 16, 32))
    w = Roi((0, 0, 0), (16, 16, 16))
    t = daisy.Task("t", total, w, w, lambda b: None, outputs=[fa])
    (spec,) = t.outputs
    assert spec.voxel_size == (2, 2, 2) and spec.offset == (4, 4, 4) and spec.mapping == "funlib"
    # the same blocks against the array read 1:1 would straddle shards
    with pytest.raises(ConfigurationError, match="voxel mapping: 1:1"):
        daisy.Task("t", total, w, w, lambda b: None, outputs=[arr])


def test_a_downstream_task_writing_the_same_array(tmp_path, caplog):
    a = make_array(tmp_path / "o.zarr", shape=(8, 8, 16))
    total = Roi((0, 0, 0), (8, 8, 16))
    chunk = Roi((0, 0, 0), (2, 2, 2))
    shard = Roi((0, 0, 0), (8, 8, 8))

    def task(name, w, safety="error"):
        return daisy.Task(
            name,
            total,
            w,
            w,
            lambda b: None,
            outputs=[a],
            write_safety=safety,
            read_write_conflict=False,
        )

    # a downstream block of one chunk reads only its chunk, so it waits for one upstream
    # block while the other 63 of its shard may still be writing: serialize widens the edge
    sched = daisy.Scheduler(task("up", chunk, "serialize") + task("down", chunk, "serialize"))
    ((edge, _),) = sched.by_id["down"].up_edges
    assert len(edge.upstream_of(0)) == 4 * 4 * 4
    # under off: the same, with one WARNING for the task's own blocks and the pair
    with caplog.at_level(logging.WARNING, logger="bellis"):
        sched = daisy.Scheduler(task("up", chunk, "serialize") + task("down", chunk, "off"))
    warned = [r.getMessage() for r in caplog.records if "write safety is off" in r.getMessage()]
    assert len(warned) == 1 and 'tasks "up" and "down"' in warned[0]
    ((edge, _),) = sched.by_id["down"].up_edges
    assert len(edge.upstream_of(0)) == 1
    # a downstream block of one shard reads the whole shard: it waits for every writer
    daisy.Scheduler(task("up", chunk, "serialize") + task("down", shard))
    # side by side, blocks of one shard each still write each shard twice at once
    with pytest.raises(ConfigurationError, match="does not order the two tasks"):
        daisy.Scheduler(task("left", shard) | task("right", shard))


def test_the_tracking_group_records_the_outputs(tmp_path):
    a = make_array(tmp_path / "o.zarr", shape=(8, 8, 16), vs=(2, 2, 2))
    total = Roi((0, 0, 0), (16, 16, 32))
    w = Roi((0, 0, 0), (16, 16, 16))
    t = daisy.Task("t", total, w, w, lambda b: None, outputs=[a], tracking_path=tmp_path / "track")
    assert daisy.run_blockwise([t], multiprocessing=False, progress=False)
    record = json.loads((tmp_path / "track" / "outputs.json").read_text())
    assert record["version"] == 1 and record["write_safety"] == "error"
    (out,) = record["outputs"]
    assert out["store"] == a and out["path"] == ""
    assert out["chunks"] == [2, 2, 2] and out["shards"] == [8, 8, 8]
    assert out["voxel_size"] == [2, 2, 2] and out["offset"] == [0, 0, 0]
    assert out["mapping"] == "attributes"
    # a zarr reader still opens the group
    assert zarr.open_group(str(tmp_path / "track"), mode="r")["done"][:].all()
