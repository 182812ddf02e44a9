"""An upstream task's output read downstream through the decoded-chunk cache (issues 37
and 38), as a user runs it: a script in a subprocess, a real zarr v3 array written by an
upstream task and read with context by a downstream task that declares it in ``inputs``,
one shared worker process (``resources={"cpu": 1}``) or serial mode.

- upstream write ROIs aligned with the chunks: the downstream task's reads of the array
  are served from the cache, and every chunk was kept from the worker's own writes (no
  decode of it at all); an upstream attempt that wrote garbage and failed is never
  served; the downstream output is the one the final upstream data gives;
- upstream write ROIs that cut chunks in two: the array stays bypassed (read from zarr),
  and the output is the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.user_script import run_script

SHAPE = (32, 64)
CHUNKS = (16, 16)
CONTEXT = 4

SCRIPT = """
import json, os, sys
import numpy as np
import zarr
import bellis as daisy
from bellis._worker import _chunkcache
from funlib.geometry import Roi

ROOT, MODE, UP_WRITE = {root!r}, {mode!r}, {up_write!r}
A, B = os.path.join(ROOT, "a.zarr"), os.path.join(ROOT, "b.zarr")
SHAPE, C = {shape!r}, {context!r}
FAILED = os.path.join(ROOT, "failed-once")
RECORDS = os.path.join(ROOT, "records")
os.makedirs(RECORDS, exist_ok=True)
rows, cols = np.indices(SHAPE)
FINAL = ((rows * 7 + cols * 3) % 200).astype(np.uint8)
a_out = zarr.open_array(A, mode="r+")
a_in = zarr.open_array(A, mode="r")
b_out = zarr.open_array(B, mode="r+")
done = []


def up(block):
    w = block.write_roi
    sl = (slice(w.offset[0], w.end[0]), slice(w.offset[1], w.end[1]))
    done.append(1)
    if len(done) == 2 and not os.path.exists(FAILED):
        # the second block of this process: garbage written, then a failed attempt
        open(FAILED, "w").close()
        a_out[sl] = np.full(FINAL[sl].shape, 255, dtype=np.uint8)
        block.status = daisy.BlockStatus.FAILED
        return
    a_out[sl] = FINAL[sl].copy()


def down(block):
    r, w = block.read_roi, block.write_roi
    lo = [max(0, o) for o in r.offset]
    hi = [min(n, e) for n, e in zip(SHAPE, r.end)]
    values = a_in[lo[0]:hi[0], lo[1]:hi[1]]
    b_out[w.offset[0]:w.end[0], w.offset[1]:w.end[1]] = int(values.astype(np.int64).sum()) % 251
    inst = _chunkcache.active()
    with open(os.path.join(RECORDS, "down-%d.json" % block.block_id[1]), "w") as f:
        json.dump({{"pid": os.getpid(), "counters": inst.cache.counters()}}, f)


total = Roi((0, 0), SHAPE)
uw = Roi((0, 0), UP_WRITE)
t_up = daisy.Task("up", total, uw, uw, up, max_workers=1, outputs=[A],
                  write_safety="serialize", read_write_conflict=False, max_retries=2,
                  requires={{"cpu": 1}})
t_down = daisy.Task("down", Roi((-C, -C), (SHAPE[0] + 2 * C, SHAPE[1] + 2 * C)),
                    Roi((0, 0), (16 + 2 * C, 16 + 2 * C)), Roi((C, C), (16, 16)), down,
                    max_workers=1, inputs=[A], outputs=[B], read_write_conflict=False,
                    fit="valid", requires={{"cpu": 1}})
states = daisy.run_blockwise(t_up + t_down, multiprocessing=MODE == "distributed",
                             resources={{"cpu": 1}}, progress=False, block_tracking=False,
                             return_states=True)
with open(os.path.join(ROOT, "result.json"), "w") as f:
    json.dump({{"cache": dict(t_down.report().input_cache),
               "done": [states[t].completed_count for t in ("up", "down")],
               "failed": [states[t].failed_count for t in ("up", "down")]}}, f)
"""


def _expected() -> np.ndarray:
    rows, cols = np.indices(SHAPE)
    final = ((rows * 7 + cols * 3) % 200).astype(np.int64)
    out = np.zeros(SHAPE, dtype=np.uint8)
    for r0 in range(0, SHAPE[0], 16):
        for c0 in range(0, SHAPE[1], 16):
            window = final[
                max(0, r0 - CONTEXT) : r0 + 16 + CONTEXT, max(0, c0 - CONTEXT) : c0 + 16 + CONTEXT
            ]
            out[r0 : r0 + 16, c0 : c0 + 16] = int(window.sum()) % 251
    return out


def _run(tmp_path: Path, mode: str, up_write: tuple[int, int]) -> tuple[dict, list[dict]]:
    zarr.create_array(tmp_path / "a.zarr", shape=SHAPE, chunks=CHUNKS, dtype="uint8")
    zarr.create_array(tmp_path / "b.zarr", shape=SHAPE, chunks=CHUNKS, dtype="uint8")
    script = SCRIPT.format(
        root=str(tmp_path), mode=mode, up_write=up_write, shape=SHAPE, context=CONTEXT
    )
    proc = run_script(tmp_path, script, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    # every block done; one failed attempt upstream (the garbage), retried
    assert result["done"] == [SHAPE[0] * SHAPE[1] // (up_write[0] * up_write[1]), 8]
    assert (tmp_path / "failed-once").exists()
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "b.zarr", mode="r")[...], _expected())
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "records").iterdir())]
    assert len(records) == 8
    return result, records


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_an_aligned_upstream_output_is_served_from_the_writers_cache(
    tmp_path: Path, mode: str
) -> None:
    result, records = _run(tmp_path, mode, (16, 16))
    cache = result["cache"]
    # 8 downstream blocks read 2 x (2 or 3) chunks each (2 x 4 chunks, context 4): 40
    # reads, all served from the chunks the one process wrote (none decoded or bypassed)
    assert cache["hits"] == 40, cache
    assert cache["misses"] == 0 and cache["bypassed"] == 0, cache
    assert len({r["pid"] for r in records}) == 1
    last = max(records, key=lambda r: r["counters"]["hits"])["counters"]
    assert last["written"] == 8  # the 8 chunks of the successful attempts, kept


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_an_upstream_output_whose_writes_cut_chunks_stays_bypassed(
    tmp_path: Path, mode: str
) -> None:
    result, records = _run(tmp_path, mode, (8, 16))
    cache = result["cache"]
    assert cache["hits"] == 0 and cache["misses"] == 0, cache
    assert cache["bypassed"] == 8, cache  # one read per block, from zarr
    assert all(r["counters"]["written"] == 0 for r in records)
