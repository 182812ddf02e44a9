"""Upstream outputs read downstream through the decoded-chunk cache (issues 37 and 38):
which arrays a run may cache where a task of it writes them (``plan_inputs``), and the
write-through of whole written chunks committed at a block's success. Pure: real zarr
arrays on disk, no process or socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zarr
from funlib.geometry import Roi

import bellis as daisy
from bellis._outputs._inputs import CACHE_READS, WRITE_THROUGH, plan_inputs
from bellis._payload import WorkerPayload
from bellis._task_spec import TaskSpec
from bellis._worker._chunkcache import active, install


def _array(path: Path) -> Any:
    return zarr.create_array(path, shape=(32, 32), chunks=(16, 16), dtype="uint8")


def _spec(task_id: str, write: int, context: int = 0, **kw: Any) -> TaskSpec:
    """A task over 32 x 32 with ``write``-sized blocks and ``context`` on each side."""
    total = Roi((-context, -context), (32 + 2 * context,) * 2)
    read = Roi((0, 0), (write + 2 * context,) * 2)
    w = Roi((context, context), (write, write))
    t = daisy.Task(task_id, total, read, w, process_function=lambda b: None, fit="valid", **kw)
    return TaskSpec.of(t)


def test_an_upstream_output_is_cacheable_downstream_when_aligned_and_direct(
    tmp_path: Path,
) -> None:
    a, b = _array(tmp_path / "a.zarr"), _array(tmp_path / "b.zarr")
    up = _spec("up", 16, outputs=[a])
    down = _spec("down", 16, context=4, inputs=[a], outputs=[b])
    plan = plan_inputs([up, down], [("up", "down")])
    where = str(tmp_path / "a.zarr")
    # down reads a from its cache; up, a's one writer, keeps what it writes of a
    assert plan["down"] == [(where, "", CACHE_READS)]
    assert plan["up"] == [(where, "", WRITE_THROUGH)]
    # the wire carries the flags
    p = WorkerPayload(b"f", 1, (), {}, inputs=tuple(plan["up"] + plan["down"]))
    assert WorkerPayload.from_bytes(p.to_bytes()).inputs == p.inputs


def test_an_upstream_output_stays_bypassed_where_the_argument_fails(tmp_path: Path) -> None:
    a, b, c = (_array(tmp_path / f"{n}.zarr") for n in "abc")
    where = str(tmp_path / "a.zarr")
    # (b) fails: 8-voxel write ROIs in 16-voxel chunks (two blocks write one chunk)
    up = _spec("up", 8, outputs=[a], write_safety="serialize")
    down = _spec("down", 16, context=4, inputs=[a], outputs=[b])
    plan = plan_inputs([up, down], [("up", "down")])
    assert plan["down"] == [(where, "", 0)] and plan["up"] == []
    # (a) fails: the writer is upstream, but not directly (up -> mid -> down)
    up = _spec("up", 16, outputs=[a])
    mid = _spec("mid", 16, outputs=[c])
    plan = plan_inputs([up, mid, down], [("up", "mid"), ("mid", "down")])
    assert plan["down"] == [(where, "", 0)] and plan["up"] == []
    # (a) fails: the reader writes it too (in place)
    same = _spec("same", 16, context=4, inputs=[a], outputs=[a])
    assert plan_inputs([same], [])["same"] == [(where, "", 0)]
    # (a) fails: a second writer that is not upstream of the reader
    other = _spec("other", 16, outputs=[a])
    plan = plan_inputs([up, other, down], [("up", "down")])
    assert plan["down"] == [(where, "", 0)]


def test_two_direct_aligned_writers_make_it_cacheable_without_write_through(
    tmp_path: Path,
) -> None:
    a, b = _array(tmp_path / "a.zarr"), _array(tmp_path / "b.zarr")
    one = _spec("one", 16, outputs=[a])
    two = _spec("two", 16, outputs=[a])
    down = _spec("down", 16, context=4, inputs=[a], outputs=[b])
    plan = plan_inputs([one, two, down], [("one", "down"), ("two", "down")])
    assert plan["down"] == [(str(tmp_path / "a.zarr"), "", CACHE_READS)]
    # one's chunk may be rewritten by two on another worker: neither keeps its writes
    assert plan["one"] == [] and plan["two"] == []


def test_written_chunks_are_kept_only_when_the_block_succeeds(tmp_path: Path) -> None:
    arr = _array(tmp_path / "a.zarr")
    where = str(tmp_path / "a.zarr")
    inst = install([(where, "", WRITE_THROUGH)], 1 << 20)
    assert inst is not None
    try:
        cache = inst.cache
        ones = np.ones((16, 32), dtype=np.uint8)
        arr[0:16, :] = ones  # two whole chunks
        assert len(cache.pending) == 2 and len(cache) == 0
        cache.discard()  # the block failed: nothing kept
        assert cache.pending == {} and len(cache) == 0
        arr[0:16, :] = ones * 2
        ones[...] = 7  # the caller's buffer changes after the write: the copy does not
        arr[16:32, 0:16] = np.full((16, 16), 3, dtype=np.uint8)
        arr[16:32, 16:24] = np.full((16, 8), 4, dtype=np.uint8)  # half a chunk: not kept
        arr[16:32, 24:32] = np.full((16, 8), 4, dtype=np.int64)  # another dtype: not kept
        cache.commit()
        assert cache.written == 3 and cache.pending == {}
        assert sorted(k[1] for k in cache._chunks) == [(0, 0), (0, 1), (1, 0)]
        assert int(cache._chunks[(where, (0, 1))][0, 0]) == 2
        # the task moves downstream: a is its input now, and the three chunks are hits
        install([(where, "", CACHE_READS)], 1 << 20)
        got = arr[0:32, 0:32]
        want = np.zeros((32, 32), dtype=np.uint8)
        want[0:16] = 2
        want[16:, 0:16] = 3
        want[16:, 16:] = 4
        np.testing.assert_array_equal(got, want)
        assert (cache.hits, cache.misses) == (3, 1)
        # a partial write drops a held chunk; a write through other than [] drops all
        install([(where, "", WRITE_THROUGH | CACHE_READS)], 1 << 20)
        arr[0:4, 0:4] = np.zeros((4, 4), dtype=np.uint8)
        assert (where, (0, 0)) not in cache._chunks and (where, (0, 1)) in cache._chunks
    finally:
        inst.remove()
    assert active() is None
