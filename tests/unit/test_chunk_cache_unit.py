"""Declared inputs and the decoded-chunk cache, unit by unit: the cache's byte accounting
and eviction, how a selection becomes a box, the default bound, ``Task(inputs=...,
input_cache_bytes=...)``'s errors, and the inputs in the worker payload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from funlib.geometry import Roi

import bellis as daisy
from bellis._outputs._inputs import run_outputs, wire_inputs
from bellis._payload import PAYLOAD_FORMAT, WorkerPayload
from bellis._protocol import ACQUIRE, BYE
from bellis._worker._chunkcache import (
    DEFAULT_CACHE_BYTES,
    ChunkCache,
    _box,
    active,
    cache_bound,
)
from bellis.errors import ConfigurationError, ProtocolError


class Chunk:
    """What the cache reads of a chunk: its size."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_the_cache_holds_at_most_its_bound_and_drops_the_least_recently_used() -> None:
    cache = ChunkCache(100)
    for i in range(4):
        cache.put(("a", (i,)), Chunk(30))
        assert cache.bytes <= 100
    # 4 x 30 > 100: the first chunk went
    assert cache.get(("a", (0,))) is None
    assert cache.bytes == 90 and len(cache) == 3 and cache.evictions == 1
    assert cache.get(("a", (1,))) is not None  # now the most recently used
    cache.put(("a", (4,)), Chunk(30))
    assert cache.get(("a", (2,))) is None and cache.get(("a", (1,))) is not None
    assert cache.counters() == {
        "hits": 2,
        "misses": 5,
        "miss_bytes": 150,
        "evictions": 2,
        "bypassed": 0,
        "written": 0,
        "bytes": 90,
        "peak_bytes": 90,
    }


def test_a_chunk_larger_than_the_bound_is_served_but_not_kept() -> None:
    cache = ChunkCache(100)
    cache.put(("a", (0,)), Chunk(60))
    cache.put(("a", (1,)), Chunk(101))
    assert cache.bytes == 60 and len(cache) == 1 and cache.misses == 2
    assert cache.get(("a", (1,))) is None


def test_putting_a_chunk_again_counts_its_bytes_once() -> None:
    cache = ChunkCache(100)
    cache.put(("a", (0,)), Chunk(40))
    cache.put(("a", (0,)), Chunk(40))
    assert cache.bytes == 40 and len(cache) == 1


def test_dropping_an_array_forgets_its_chunks_only() -> None:
    cache = ChunkCache(1000)
    for i in range(3):
        cache.put((("s", "a"), (i,)), Chunk(10))
        cache.put((("s", "b"), (i,)), Chunk(20))
    cache.drop_array(("s", "a"))
    assert cache.bytes == 60 and len(cache) == 3
    assert cache.get((("s", "b"), (0,))) is not None


def test_the_bound_comes_from_the_task_else_the_memory_limit() -> None:
    assert cache_bound(None, None) == DEFAULT_CACHE_BYTES
    assert cache_bound(None, 4 << 30) == 1 << 30
    assert cache_bound(5 << 20, 4 << 30) == 5 << 20
    assert cache_bound(0, 4 << 30) == 0


@pytest.mark.parametrize(
    ("selection", "box"),
    [
        ((slice(2, 5), slice(None)), ([2, 0], [5, 8], [False, False])),
        ((Ellipsis, slice(1, 3)), ([0, 1], [6, 3], [False, False])),
        ((slice(-3, None), 4), ([3, 4], [6, 5], [False, True])),
        ((np.int64(-1), slice(0, 100)), ([5, 0], [6, 8], [True, False])),
        (slice(1, 2), ([1, 0], [2, 8], [False, False])),
        # not boxes: zarr reads them
        ((slice(0, 6, 2), slice(None)), None),
        (([0, 1], slice(None)), None),
        ((1, 2), None),  # one voxel
        ((slice(3, 3), slice(None)), None),  # empty
        ((slice(None), slice(None), slice(None)), None),
        ((7, slice(None)), None),  # out of bounds: zarr says so
    ],
)
def test_a_selection_is_a_box_or_goes_to_zarr(selection: Any, box: Any) -> None:
    assert _box(selection, (6, 8)) == box


def _array(path: Path, **kw: Any) -> Any:
    return zarr.create_array(path, shape=(20, 20), chunks=(10, 10), dtype="uint8", **kw)


def _task(**kw: Any) -> daisy.Task:
    r = Roi((0, 0), (20, 20))
    return daisy.Task("t", r, r, r, process_function=lambda b: None, **kw)


def test_inputs_are_declared_like_outputs(tmp_path: Path) -> None:
    arr = _array(tmp_path / "a.zarr")
    arr.attrs["voxel_size"], arr.attrs["offset"] = [2, 2], [4, 0]
    v2 = zarr.create_array(
        tmp_path / "v2.zarr", shape=(20, 20), chunks=(10, 10), dtype="uint8", zarr_format=2
    )
    task = _task(inputs=[arr, str(tmp_path / "a.zarr"), v2], input_cache_bytes="64M")
    a, by_path, old = task.inputs
    assert a.key == by_path.key and a.voxel_size == (2, 2) and a.offset == (4, 0)
    assert a.mapping == "attributes" and old.shards is None
    assert task.input_cache_bytes == 64 << 20
    assert _task().inputs == () and _task().input_cache_bytes is None
    assert _task(inputs=arr).inputs == (a,)  # one input needs no list


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        (42, r"inputs\[0\]=42 is not an input: pass a zarr array, the path of one"),
        ("missing.zarr", r"inputs\[0\]='missing.zarr' is not a zarr array that can be opened"),
    ],
)
def test_a_bad_input_names_the_parameter_and_value(inputs: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        _task(inputs=inputs)
    assert caught.value.parameter == "inputs"


def test_an_input_of_other_dimensions_says_which(tmp_path: Path) -> None:
    zarr.create_array(tmp_path / "one.zarr", shape=(20,), chunks=(10,), dtype="uint8")
    with pytest.raises(ConfigurationError, match=r"inputs\[0\] .* does not fit the task's 2"):
        _task(inputs=[str(tmp_path / "one.zarr")])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-1, "must not be negative"),
        ("lots", "is not a memory size"),
        (1.5, "is not a size"),
        (True, "is not a size"),
    ],
)
def test_a_bad_cache_size_names_the_parameter(value: Any, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        _task(input_cache_bytes=value)
    assert caught.value.parameter == "input_cache_bytes"
    assert _task(input_cache_bytes=0).input_cache_bytes == 0
    assert _task(input_cache_bytes="0").input_cache_bytes == 0


def test_an_input_that_a_task_of_the_run_writes_is_not_cacheable(tmp_path: Path) -> None:
    a, b = _array(tmp_path / "a.zarr"), _array(tmp_path / "b.zarr")
    up = _task(outputs=[a])
    down = _task(inputs=[a, b])
    wired = wire_inputs(down.inputs, run_outputs([up, down]))
    assert wired == [
        (str(tmp_path / "a.zarr"), "", False),
        (str(tmp_path / "b.zarr"), "", True),
    ]


def test_the_payload_carries_the_inputs_and_the_bound() -> None:
    p = WorkerPayload(
        function=b"f",
        arity=1,
        sys_path=(),
        log_settings={},
        inputs=(("/data/raw.zarr", "s0", True), ("/data/seg.zarr", "", False)),
        input_cache_bytes=0,
    )
    back = WorkerPayload.from_bytes(p.to_bytes())
    assert back == p and back.inputs[1] == ("/data/seg.zarr", "", False)
    default = WorkerPayload(function=b"f", arity=1, sys_path=(), log_settings={})
    assert WorkerPayload.from_bytes(default.to_bytes()).input_cache_bytes is None


@pytest.mark.parametrize(
    "fields",
    [
        [[["/raw.zarr", "", "yes"]], -1],
        [[["/raw.zarr", ""]], -1],
        [[], -2],
        [[], "256M"],
        ["not a list", -1],
    ],
)
def test_malformed_payload_inputs_are_refused(fields: list[Any]) -> None:
    import msgpack

    data = msgpack.packb(
        [PAYLOAD_FORMAT, b"f", 1, [], {}, [], None, *fields, []], use_bin_type=True
    )
    with pytest.raises(ProtocolError, match="malformed payload inputs"):
        WorkerPayload.from_bytes(data)


def test_the_cache_reports_what_it_did_since_it_last_said() -> None:
    cache = ChunkCache(100)
    assert cache.take_counts() is None
    cache.put(("a", (0,)), Chunk(30))
    cache.get(("a", (0,)))
    cache.get(("a", (0,)))
    assert cache.take_counts() == [2, 1, 30, 0]
    assert cache.take_counts() is None  # nothing new
    cache.put(("a", (1,)), Chunk(10))
    assert cache.take_counts() == [0, 1, 10, 0]


OK = 2  # BlockStatus.SUCCESS


def _returned_with_cache(*last: Any) -> tuple[Any, Any, list[Any]]:
    from kit.dispatch import OK, Script, send_of, task

    sc = Script(task(blocks=8))
    peer = sc.connect()
    (k,) = send_of(sc.acquire(peer), peer)
    sc.dispatcher.receive(peer, [ACQUIRE, k, OK, -1, None, 0.001, *last], sc.now)
    return sc, peer, sc.take()


def test_the_dispatcher_adds_up_the_workers_cache_counts() -> None:
    from kit.dispatch import send_of

    sc, peer, out = _returned_with_cache({"cache": [5, 2, 4096, 1]})
    assert len(send_of(out, peer)) >= 1 and sc.run().completed == 1
    sc.dispatcher.receive(peer, [BYE, {"cache": [1, 0, 0, 0]}], sc.now)
    assert sc.run().input_cache == [6, 2, 4096, 1]


def test_the_dispatcher_adds_up_each_returned_blocks_cache_counts() -> None:
    from kit.dispatch import send_of

    sc, peer, out = _returned_with_cache({"cache": [0, 0, 0, 0], "blocks": []})
    ks = send_of(out, peer)
    # per block (k, hits, misses, miss_bytes, bypassed), and outside blocks
    groups = [f for k in ks for f in (k, OK, -1, None)]
    per_block = [f for k in ks for f in (k, 3, 2, 64, 0)]
    counts = {"cache": [1, 0, 0, 0], "blocks": per_block}
    sc.dispatcher.receive(peer, [ACQUIRE, *groups, 0.001, counts], sc.now)
    n = len(ks)
    assert sc.run().completed == 1 + n
    assert sc.run().input_cache == [1 + 3 * n, 2 * n, 64 * n, 0]
    # a block this connection does not hold is no block of its: its counts are dropped
    ks2 = send_of(sc.take(), peer)
    groups = [f for k in ks2 for f in (k, OK, -1, None)]
    stray = {"cache": [0, 0, 0, 0], "blocks": [ks2[0], 1, 1, 1, 1, 10_000, 5, 5, 5, 5]}
    sc.dispatcher.receive(peer, [ACQUIRE, *groups, 0.001, stray], sc.now)
    assert sc.run().completed == 1 + n + len(ks2)
    assert sc.run().input_cache == [2 + 3 * n, 1 + 2 * n, 64 * n + 1, 1]


@pytest.mark.parametrize(
    "field",
    [
        {"cache": [1, 2, 3]},
        {"cache": [1, 2, 3, -1]},
        {"cache": "x"},
        {"cache": [], "x": 1},
        {"cache": [0, 0, 0, 0], "x": []},
        {"cache": [0, 0, 0, 0], "blocks": [0, 1, 2, 3]},
        {"cache": [0, 0, 0, 0], "blocks": [0, 1, 2, 3, -4]},
        {"cache": [0, 0, 0, 0], "blocks": "x"},
    ],
)
def test_malformed_cache_counts_drop_the_client(field: Any) -> None:
    from kit.dispatch import closed

    sc, peer, out = _returned_with_cache(field)
    assert closed(out, peer)
    assert sc.run().completed == 0 and sc.run().input_cache == [0, 0, 0, 0]


def test_a_message_without_cache_counts_is_read_as_before() -> None:
    from kit.dispatch import send_of

    sc, peer, out = _returned_with_cache()  # the busy time is the last field again
    assert send_of(out, peer) and sc.run().completed == 1
    assert sc.run().input_cache == [0, 0, 0, 0]


def test_an_input_is_recognised_however_the_block_function_opens_it(tmp_path: Path) -> None:
    from bellis._worker._chunkcache import array_key, install

    group = zarr.open_group(tmp_path / "vol.zarr", mode="w")
    raw = group.create_array("raw", shape=(20, 20), chunks=(10, 10), dtype="uint8")
    data = np.arange(400, dtype=np.uint8).reshape(20, 20)
    raw[...] = data
    spec = _task(inputs=[str(tmp_path / "vol.zarr" / "raw")]).inputs[0]
    by_group = zarr.open_group(tmp_path / "vol.zarr", mode="r")["raw"]
    by_path = zarr.open_array(tmp_path / "vol.zarr" / "raw", mode="r")
    assert array_key(by_group) == array_key(by_path)
    inst = install(wire_inputs([spec], ()), 1 << 20)
    assert inst is not None
    try:
        np.testing.assert_array_equal(by_group[3:17, 5:], data[3:17, 5:])
        np.testing.assert_array_equal(by_path[3:17, 5:], data[3:17, 5:])
        assert inst.cache.misses == 4 and inst.cache.hits == 4  # the second read: all hits
    finally:
        inst.remove()
    assert active() is None


def test_a_second_install_retargets_the_one_cache(tmp_path: Path) -> None:
    """A shared worker that moves installs the new task's inputs: the same cache and
    chunks, the new inputs and bound; a task without inputs: nothing served or held."""
    from bellis._worker._chunkcache import install

    group = zarr.open_group(tmp_path / "vol.zarr", mode="w")
    data = np.arange(400, dtype=np.uint8).reshape(20, 20)
    for name in ("a", "b"):
        group.create_array(name, shape=(20, 20), chunks=(10, 10), dtype="uint8")[...] = data
    a = zarr.open_array(tmp_path / "vol.zarr" / "a", mode="r")
    b = zarr.open_array(tmp_path / "vol.zarr" / "b", mode="r")
    spec = {n: _task(inputs=[str(tmp_path / "vol.zarr" / n)]).inputs[0] for n in "ab"}
    inst = install(wire_inputs([spec["a"]], ()), 1 << 20)
    assert inst is not None
    try:
        np.testing.assert_array_equal(a[:, :], data)
        np.testing.assert_array_equal(b[:, :], data)  # not a's task's input: not cached
        assert (inst.cache.hits, inst.cache.misses, len(inst.cache)) == (0, 4, 4)
        again = install(wire_inputs([spec["a"], spec["b"]], ()), 500)
        assert again is inst and active() is inst  # one cache per process
        assert inst.cache.bound_bytes == 500 and len(inst.cache) == 4  # a's chunks kept
        np.testing.assert_array_equal(a[:10, :10], data[:10, :10])  # still served
        np.testing.assert_array_equal(b[:10, :10], data[:10, :10])  # b is an input now
        assert (inst.cache.hits, inst.cache.misses, len(inst.cache)) == (1, 5, 5)
        install(wire_inputs([spec["b"]], ()), 300)  # a smaller bound: the oldest go
        assert len(inst.cache) == 3 and inst.cache.bytes == 300
        assert install([], 1 << 20) is inst
        assert inst.inputs == {} and len(inst.cache) == 0 and inst.cache.bytes == 0
        hits, misses = inst.cache.hits, inst.cache.misses
        np.testing.assert_array_equal(a[:, :], data)  # served by zarr: no input any more
        assert (inst.cache.hits, inst.cache.misses) == (hits, misses)
    finally:
        inst.remove()
    assert active() is None
