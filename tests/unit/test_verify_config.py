"""``Task(verify_outputs=...)`` validation, the checksum on the wire, and which downstream
blocks read a block (``transitive_readers``): pure, no processes or stores."""

from __future__ import annotations

from pathlib import Path

import pytest
import zarr
from funlib.geometry import Roi

import bellis as daisy
from bellis._graph import TaskGeometry
from bellis._outputs._readback import RECORDED, ReadBack
from bellis._outputs._units import OutputSpec, owns_units
from bellis._outputs._verify import transitive_readers
from bellis._protocol import ACQUIRE, parse_returns
from bellis.errors import ConfigurationError, ProtocolError

OK, FAIL = int(daisy.BlockStatus.SUCCESS), int(daisy.BlockStatus.FAILED)


def _task(**kw: object) -> daisy.Task:
    r = Roi((0, 0), (16, 16))
    return daisy.Task("t", r, Roi((0, 0), (8, 8)), Roi((0, 0), (8, 8)), lambda b: None, **kw)


def test_verify_outputs_needs_declared_outputs() -> None:
    with pytest.raises(ConfigurationError, match=r"verify_outputs=True needs declared outputs"):
        _task(verify_outputs=True)


def test_verify_outputs_takes_only_its_modes(tmp_path: Path) -> None:
    path = str(tmp_path / "o.zarr")
    zarr.create_array(path, shape=(16, 16), chunks=(8, 8), dtype="uint8")
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigurationError, match=r"is not a verify mode"):
            _task(outputs=[path], verify_outputs=bad)
    assert _task(outputs=[path], verify_outputs="allow_empty").verify_outputs == "allow_empty"
    assert _task(outputs=[path]).verify_outputs is False


def test_verify_outputs_refuses_an_in_memory_output() -> None:
    arr = zarr.create_array(zarr.storage.MemoryStore(), shape=(16, 16), chunks=(8, 8), dtype="u1")
    _task(outputs=[arr])  # declared, not verified: fine
    with pytest.raises(ConfigurationError, match=r"store of this process only"):
        _task(outputs=[arr], verify_outputs=True)


def test_a_checksum_travels_only_with_a_success() -> None:
    checksum = RECORDED | 0xDEADBEEF
    assert parse_returns([ACQUIRE, 5, OK, -1, checksum], 4, 0, {5}, False, "t") == [
        (5, OK, -1, checksum)
    ]
    with pytest.raises(ProtocolError, match="malformed error text"):
        parse_returns([ACQUIRE, 5, FAIL, -1, checksum], 4, 0, {5}, False, "t")
    with pytest.raises(ProtocolError, match="malformed output checksum"):
        parse_returns([ACQUIRE, 5, OK, -1, -1], 4, 0, {5}, False, "t")


@pytest.mark.parametrize(
    "bad", ["deadbeef", ["text", {}], 1.5, True, 1 << 64, -1, b"\x01", {"crc": 1}]
)
def test_a_success_carries_no_checksum_but_an_integer_the_store_holds(bad: object) -> None:
    # a worker's error text or anything else where a success's checksum goes would be
    # stored into output_checksum by the server: the message is refused whole, before any
    # block of it is taken back (the block before it in the batch included)
    msg = [ACQUIRE, 4, OK, -1, None, 5, OK, -1, bad]
    with pytest.raises(ProtocolError, match=r"malformed output checksum for block t/5"):
        parse_returns(msg, 8, 0, {4, 5}, False, "t")
    assert parse_returns([ACQUIRE, 5, OK, -1, (1 << 64) - 1], 4, 0, {5}, False, "t") == [
        (5, OK, -1, (1 << 64) - 1)
    ]


def test_checksums_are_marked_recorded_and_combine_in_order() -> None:
    assert ReadBack.combine([0]) == RECORDED  # a CRC of 0 is still "recorded"
    assert ReadBack.combine([1, 2]) != ReadBack.combine([2, 1])
    assert ReadBack.combine([1, 2]) & RECORDED


def _geom(tid: str, total: int, read: int, ctx: int, write: int) -> TaskGeometry:
    return TaskGeometry(
        tid, Roi((0,), (total,)), Roi((0,), (read,)), Roi((ctx,), (write,)), fit="valid"
    )


def test_transitive_readers_follow_read_rois_transitively() -> None:
    # a: blocks of 10 over 0..100; b reads 20 (context 5 each side), writes 10 from 5;
    # c reads b's writes exactly (blocks of 10 from 5)
    geoms = {
        "a": _geom("a", 100, 10, 0, 10),
        "b": _geom("b", 100, 20, 5, 10),
        "c": TaskGeometry("c", Roi((5,), (90,)), Roi((0,), (10,)), Roi((0,), (10,))),
    }
    readers = transitive_readers(geoms, [("a", "b"), ("b", "c")], {"a": {3}})
    # a block 3 writes [30, 40); b block g reads [10g, 10g + 20): g = 2 and 3
    assert readers["b"] == {2, 3}
    # b blocks 2, 3 write [25, 35) and [35, 45); c block g reads [5 + 10g, 15 + 10g)
    assert readers["c"] == {2, 3}
    # brute force over every pair of ROIs
    a_w = geoms["a"].write_roi_of(3)
    want_b = {k for k in range(geoms["b"].num_blocks) if geoms["b"].read_roi_of(k).intersects(a_w)}
    assert readers["b"] == want_b


def test_transitive_readers_skip_tasks_without_a_grid_and_the_bad_blocks_themselves() -> None:
    geoms = {"a": _geom("a", 100, 10, 0, 10), "b": _geom("b", 100, 10, 0, 10)}
    assert transitive_readers(geoms, [("a", "b"), ("a", "x")], {"a": {1}, "b": {1}}) == {}
    assert transitive_readers(geoms, [("a", "b")], {"a": set()}) == {}


def _spec(shape: int, chunk: int, vs: int = 1, offset: int = 0) -> OutputSpec:
    return OutputSpec("/s", "", (shape,), (chunk,), None, (vs,), (offset,), "uint8", "1:1")


@pytest.mark.parametrize(
    ("total", "write", "fit", "spec", "owns"),
    [
        (64, 16, "valid", _spec(64, 16), True),  # a block per chunk
        (64, 32, "valid", _spec(64, 16), True),  # two chunks per block
        (64, 8, "valid", _spec(64, 16), False),  # two blocks per chunk
        (60, 16, "shrink", _spec(60, 16), True),  # the last block cut by the array's end
        (60, 16, "shrink", _spec(64, 16), False),  # ... by the task's end, mid-chunk
        (64, 16, "valid", _spec(72, 16, offset=8), False),  # the grid is off the chunks
        (128, 32, "valid", _spec(64, 16, vs=2), True),  # world units: 2 per voxel
    ],
)
def test_a_block_owns_its_units_when_each_lies_wholly_in_it(
    total: int, write: int, fit: str, spec: OutputSpec, owns: bool
) -> None:
    geom = TaskGeometry("t", Roi((0,), (total,)), Roi((0,), (write,)), Roi((0,), (write,)), fit=fit)
    assert owns_units(geom, spec) is owns


def test_verify_codes_and_counts_of_a_store() -> None:
    import numpy as np

    from bellis._tracking._reset import verify_codes, verify_counts

    done = np.array([1, 1, 1, 1, 0, 1], dtype=np.uint8)
    sums = np.array([RECORDED, RECORDED | 5, 0, RECORDED, RECORDED, RECORDED], dtype=np.uint64)
    # the last verify listed cells 1 (still done) and 4 (reset since: not done)
    record = {"version": 1, "time": 7.0, "missing": [1], "changed": [4]}
    assert verify_codes(done, sums, record).tolist() == [1, 2, 0, 1, -1, 1]
    assert verify_counts(done, sums, record) == (3, 1, 1, 7.0)
    assert verify_counts(done, None, None) == (0, 0, 5, None)


def test_absent_units_are_asked_by_key_until_one_listing_is_cheaper(tmp_path: Path) -> None:
    """``bellis verify`` on S3 asks which chunks of a damaged block are absent one key at a
    time (a HEAD, two for an absent key) while that is cheaper than listing the array
    (one request per 1,000 chunks), then lists once and asks nothing more."""
    from bellis._outputs._verify import _Presence

    arr = zarr.create_array(
        str(tmp_path / "o.zarr"), shape=(64, 64), chunks=(1, 1), dtype="uint8", fill_value=0
    )
    arr[:2, :] = 1  # chunks c/0/* and c/1/* exist, no other
    presence = _Presence(arr)
    assert presence.list_cost == 5  # 4,096 chunks
    assert presence.absent(["c/0/0", "c/5/5"]) == ["c/5/5"]  # by key: 1 + 2 requests
    assert presence.listed is None and presence.spent == 3
    assert presence.absent(["c/1/3", "c/9/9"]) == ["c/9/9"]  # 3 + 4 > 5: one listing
    assert presence.listed is not None and len(presence.listed) == 128 + 1  # + zarr.json
    assert presence.absent(["c/0/7", "c/7/0"]) == ["c/7/0"]  # from the listing
    assert presence.spent == 3


def test_an_output_on_s3_is_recorded_by_its_url_and_nothing_else() -> None:
    """A zarr array opened on S3 (zarr's FsspecStore over s3fs) is named by its s3:// URL
    in outputs.json and to the workers; the options it was opened with are not kept."""
    pytest.importorskip("s3fs", reason="outputs on S3 need s3fs (pip install 'bellis[s3]')")
    from zarr.storage import FsspecStore

    from bellis._outputs._declared import store_of

    store = FsspecStore.from_url("s3://bucket/volumes/seg.zarr", storage_options={"anon": True})
    assert store_of(store) == "s3://bucket/volumes/seg.zarr"
