"""Per-block chunk-cache counts (issue 38): what the worker's decoded-chunk cache did for
each block travels home with the block, is stored in the tracking store (``cache_*``
arrays) and comes back through ``task.report().block(...)`` and ``bellis status``.

The test computes the exact counts itself from the block and chunk geometry and the order
the blocks ran in (one worker, or serial mode), and compares every block's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.user_script import run_script

SHAPE = (60, 50)
CHUNKS = (20, 20)
CONTEXT = 5
WRITE = 10

SCRIPT = """
import json, os, sys
import zarr
import bellis
from bellis import Roi

HERE = os.getcwd()
MODE = os.environ["MODE"]
raw = zarr.open_array(os.path.join(HERE, "raw.zarr"), mode="r")

def process(block):
    r = block.read_roi
    data = raw[r.offset[0] : r.end[0], r.offset[1] : r.end[1]]
    assert data.shape == (20, 20)
    with open(os.path.join(HERE, "order.txt"), "a") as f:
        f.write(f"{block.write_roi.offset[0]} {block.write_roi.offset[1]} {int(data.sum())}\\n")

task = bellis.Task(
    "t", Roi((0, 0), (60, 50)), Roi((0, 0), (20, 20)), Roi((5, 5), (10, 10)),
    process_function=process, read_write_conflict=False, max_workers=1, fit="valid",
    inputs=[raw], tracking_path=os.path.join(HERE, "track"),
)
ok = bellis.run_blockwise([task], multiprocessing=MODE == "dist", progress=False)
records = [[list(r.coord), r.cache] for r in task.report().block_records()]
with open(os.path.join(HERE, "result.json"), "w") as f:
    json.dump({"records": records, "total": task.report().input_cache}, f)
# `bellis status PATH`, as the command runs it (in this process: one interpreter less)
import contextlib, io
from bellis._cli._main import main as bellis_command
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = bellis_command(["status", os.path.join(HERE, "track")])
with open(os.path.join(HERE, "status.txt"), "w") as f:
    f.write(out.getvalue())
sys.exit(0 if ok and code == 0 else 3)
"""


def _chunks_of(offset: tuple[int, int]) -> list[tuple[int, int]]:
    """The chunks a block's read ROI (20 x 20 from ``offset``) touches."""
    ranges = [
        range(o // c, (o + 2 * CONTEXT + WRITE - 1) // c + 1)
        for o, c in zip(offset, CHUNKS, strict=True)
    ]
    return list(itertools.product(*ranges))


def _chunk_bytes(idx: tuple[int, int]) -> int:
    size = 2  # uint16
    for i, c, n in zip(idx, CHUNKS, SHAPE, strict=True):
        size *= min(c, n - i * c)
    return size


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_each_blocks_cache_counts_are_stored_with_it(tmp_path: Path, mode: str) -> None:
    data = np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint16).reshape(SHAPE)
    raw = zarr.create_array(tmp_path / "raw.zarr", shape=SHAPE, chunks=CHUNKS, dtype="uint16")
    raw[...] = data
    proc = run_script(tmp_path, SCRIPT, name="counts.py", env={"MODE": mode}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (tmp_path / "order.txt").read_text().splitlines()
    order = [tuple(int(x) for x in line.split()) for line in lines]
    assert len(order) == 5 * 4  # write offsets 5..45 x 5..35: the blocks that fit
    # the expected counts: one worker, blocks in the order they ran, a cache that holds
    # every chunk (9 chunks of at most 800 bytes against the default bound)
    seen: set[tuple[int, int]] = set()
    expected = {}
    for w0, w1, total in order:
        read = (w0 - CONTEXT, w1 - CONTEXT)
        assert total == int(data[read[0] : read[0] + 20, read[1] : read[1] + 20].sum())
        chunks = _chunks_of(read)
        new = [c for c in chunks if c not in seen]
        seen.update(chunks)
        coord = ((w0 - CONTEXT) // WRITE, (w1 - CONTEXT) // WRITE)
        expected[coord] = {
            "hits": len(chunks) - len(new),
            "misses": len(new),
            "miss_bytes": sum(_chunk_bytes(c) for c in new),
            "bypassed": 0,
        }
    result = json.loads((tmp_path / "result.json").read_text())
    stored = {tuple(coord): cache for coord, cache in result["records"]}
    assert stored == expected
    hits = sum(e["hits"] for e in expected.values())
    misses = sum(e["misses"] for e in expected.values())
    assert misses == 9 and hits > 0
    assert result["total"] == {
        "hits": hits,
        "misses": misses,
        "miss_bytes": sum(_chunk_bytes(c) for c in seen),
        "bypassed": 0,
    }
    text = (tmp_path / "status.txt").read_text()
    rate = round(100 * hits / (hits + misses))
    line = f"input cache {rate}% hit: {hits} hits, 9 decodes (0.45 per block, over 20 done blocks)"
    assert line + ", 5.9 KiB decoded, 0 reads bypassed" in text, text
