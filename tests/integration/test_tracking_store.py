"""The tracking store on disk: creation, reuse, refusals, recording, migration, inspection."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import bellis._tracking._migrate as migrate_module
from bellis._tracking import (
    NO_WORKER,
    STAT_ARRAYS,
    StoreLayout,
    TrackingStore,
    delete_store,
    failed_cells,
    format_status,
    layout_hash,
)
from bellis._tracking._disk import reserve_by_writing
from bellis._tracking._layout import ARRAY_DTYPES, array_metadata, dump_metadata
from bellis.errors import LayoutMismatch, TrackingError


def simple(
    offset: tuple[int, ...], shape: tuple[int, ...], block: tuple[int, ...], fit: str = "valid"
) -> StoreLayout:
    zero = (0,) * len(block)
    return StoreLayout(offset, shape, zero, block, zero, block, fit)


LAYOUT = simple((0, 0), (30, 40), (10, 10))
STATS = (1.5, 0.25, 123_456_789, 1000, 2000, 42.0, 7, 0.75)


def chunk(root: Path, name: str, ndim: int) -> Path:
    return root.joinpath(name, "c", *(["0"] * ndim))


def chunk_values(root: Path, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    raw = chunk(root, name, len(shape)).read_bytes()
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the store but the lock (each run writes its pid and start time there)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "bellis.lock"
    }


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "tracking" / "seg"


@pytest.fixture
def no_fault_hook() -> Iterator[None]:
    yield
    migrate_module._fault_hook = None


# -- creation and layout on disk ----------------------------------------------------------


def test_create_writes_group_arrays_and_chunks(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.grid_shape == (3, 4)
        assert store.path == store_path
        assert store.layout == LAYOUT
        assert store.runs_jsonl == store_path / "runs.jsonl"
        assert store.migrated_from is None
        assert store.stats == {}
        assert store.done.shape == (3, 4) and store.done.dtype == np.uint8
        assert store.failures.dtype == np.uint32
    assert sorted(p.name for p in store_path.iterdir()) == [
        "bellis.lock",
        "done",
        "failures",
        "zarr.json",
    ]
    assert chunk(store_path, "done", 2).stat().st_size == 12
    assert chunk(store_path, "failures", 2).stat().st_size == 48
    group = json.loads((store_path / "zarr.json").read_text())
    assert group["node_type"] == "group"
    assert group["attributes"]["daisy_task_hash"] == layout_hash(LAYOUT)
    assert group["attributes"]["bellis_layout"]["grid_shape"] == [3, 4]


def test_metadata_files_are_byte_exact(store_path: Path) -> None:
    TrackingStore.open(store_path, LAYOUT, resource_tracking=True).close()
    h = layout_hash(LAYOUT)
    assert (store_path / "zarr.json").read_text() == (
        "{\n"
        '  "attributes": {\n'
        '    "bellis_layout": {\n'
        '      "context_lr": [\n        0,\n        0\n      ],\n'
        '      "context_ul": [\n        0,\n        0\n      ],\n'
        '      "fit": "valid",\n'
        '      "grid_offset": [\n        0,\n        0\n      ],\n'
        '      "grid_shape": [\n        3,\n        4\n      ],\n'
        '      "total_shape": [\n        30,\n        40\n      ],\n'
        '      "version": 1,\n'
        '      "write_stride": [\n        10,\n        10\n      ]\n'
        "    },\n"
        f'    "daisy_task_hash": "{h}"\n'
        "  },\n"
        '  "node_type": "group",\n'
        '  "zarr_format": 3\n'
        "}\n"
    )
    expected_types = {"done": "uint8", "failures": "uint32"}
    expected_types.update(
        dict(
            zip(
                STAT_ARRAYS,
                [
                    *("float32", "float32", "uint64", "uint64", "uint64", "float32", "uint64"),
                    *("uint32", "float64", "float64", "float32"),
                ],
                strict=True,
            )
        )
    )
    for name, data_type in expected_types.items():
        fill = "0.0" if data_type.startswith("float") else "0"
        text = (store_path / name / "zarr.json").read_text()
        assert text == (
            "{\n"
            '  "attributes": {},\n'
            '  "chunk_grid": {\n'
            '    "configuration": {\n'
            '      "chunk_shape": [\n        3,\n        4\n      ]\n'
            "    },\n"
            '    "name": "regular"\n'
            "  },\n"
            '  "chunk_key_encoding": {\n'
            '    "configuration": {\n'
            '      "separator": "/"\n'
            "    },\n"
            '    "name": "default"\n'
            "  },\n"
            '  "codecs": [\n'
            "    {\n"
            '      "configuration": {\n'
            '        "endian": "little"\n'
            "      },\n"
            '      "name": "bytes"\n'
            "    }\n"
            "  ],\n"
            f'  "data_type": "{data_type}",\n'
            f'  "fill_value": {fill},\n'
            '  "node_type": "array",\n'
            '  "shape": [\n    3,\n    4\n  ],\n'
            '  "storage_transformers": [],\n'
            '  "zarr_format": 3\n'
            "}\n"
        ), name
        width = np.dtype(data_type).itemsize
        assert chunk(store_path, name, 2).stat().st_size == 12 * width


def test_one_dimensional_chunk_path(store_path: Path) -> None:
    TrackingStore.open(store_path, simple((0,), (100,), (10,)), resource_tracking=False).close()
    assert (store_path / "done" / "c" / "0").is_file()
    assert chunk_values(store_path, "done", "uint8", (10,)).tolist() == [0] * 10


def test_chunks_are_reserved_not_sparse(store_path: Path) -> None:
    # a store into an unallocated page of a sparse chunk is a SIGBUS on a full disk:
    # every block of every chunk is allocated when the store opens
    layout = simple((0, 0), (1024, 1024), (2, 2))  # 256 Ki cells
    with TrackingStore.open(store_path, layout, resource_tracking=True):
        pass
    for name in ("done", "failures", "sent_at", "cpu_children_seconds"):
        info = chunk(store_path, name, 2).stat()
        assert info.st_size == 256 * 1024 * np.dtype(ARRAY_DTYPES[name]).itemsize
        assert info.st_blocks * 512 >= info.st_size, name


def test_resource_arrays_only_with_resource_tracking(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        assert list(store.stats) == list(STAT_ARRAYS)
        store.record_success(3, STATS, 2, 10.0, 11.0)
    before = snapshot(store_path)
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.stats == {}
        store.record_success(4, STATS, 2, 10.0, 11.0)
    after = snapshot(store_path)
    for name in STAT_ARRAYS:
        key = f"{name}/c/0/0"
        assert after[key] == before[key], name
    assert chunk_values(store_path, "done", "uint8", (3, 4)).reshape(-1)[[3, 4]].tolist() == [1, 1]


def test_enabling_resource_tracking_later_adds_arrays(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_success(0, None, NO_WORKER, 0.0, 0.0)
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        assert set(store.stats) == set(STAT_ARRAYS)
        assert store.done.reshape(-1)[0] == 1


# -- reuse and refusal ----------------------------------------------------------------------


def test_reuse_keeps_the_bytes(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_success(5, None, NO_WORKER, 0.0, 0.0)
        store.record_failure(7)
    assert chunk_values(store_path, "done", "uint8", (3, 4))[1, 1] == 1
    assert chunk_values(store_path, "failures", "uint32", (3, 4))[1, 3] == 1
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.is_done(5)
        assert not store.is_done(6)
        assert not store.is_done(12)
        assert not store.is_done(-1)
        assert int(store.failures[1, 3]) == 1


def test_layout_mismatch_message(store_path: Path) -> None:
    TrackingStore.open(store_path, LAYOUT, resource_tracking=False).close()
    other = simple((0, 0), (30, 40), (10, 5))
    before = snapshot(store_path)
    with pytest.raises(LayoutMismatch) as info:
        TrackingStore.open(store_path, other, resource_tracking=False)
    p = str(store_path)
    assert str(info.value) == (
        f"block tracking at {p} was written for a different task layout "
        f"(stored hash = {layout_hash(LAYOUT)}, expected = {layout_hash(other)}). "
        f"Delete it to start fresh:\n    rm -rf {p}"
    )
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, TrackingError)
    assert info.value.stored == layout_hash(LAYOUT)
    assert info.value.expected == layout_hash(other)
    assert info.value.path == p
    assert snapshot(store_path) == before


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dump_metadata(document))


def test_old_bare_array_store_is_refused(store_path: Path) -> None:
    _write_json(
        store_path / "zarr.json",
        {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [3, 4],
            "data_type": "uint8",
            "attributes": {"daisy_task_hash": "0" * 64},
        },
    )
    with pytest.raises(LayoutMismatch, match=r"different task layout") as info:
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
    assert str(info.value).endswith(f"rm -rf {store_path}")


def test_bare_array_with_the_matching_hash_is_refused(store_path: Path) -> None:
    _write_json(
        store_path / "zarr.json",
        {
            "zarr_format": 3,
            "node_type": "array",
            "attributes": {"daisy_task_hash": layout_hash(LAYOUT)},
        },
    )
    with pytest.raises(LayoutMismatch, match='node_type = "array"') as info:
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
    assert f"rm -rf {store_path}" in str(info.value)


def test_hashless_non_group_is_invalid_metadata(store_path: Path) -> None:
    _write_json(
        store_path / "zarr.json", {"zarr_format": 3, "node_type": "array", "attributes": {}}
    )
    with pytest.raises(TrackingError) as info:
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
    assert not isinstance(info.value, LayoutMismatch)
    assert str(info.value).startswith(f"block tracking metadata at {store_path} is invalid: ")
    assert "exists but is not a zarr group" in str(info.value)


def test_caller_provided_store_made_with_zarr_python(store_path: Path) -> None:
    group = zarr.open_group(store_path, mode="w")
    done = group.create_array(
        "done", shape=(3, 4), chunks=(3, 4), dtype="uint8", compressors=None, fill_value=0
    )
    done[2, 1] = 1
    before_group = (store_path / "zarr.json").read_bytes()
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.is_done(9)
        assert not store.is_done(0)
        store.record_success(0, None, NO_WORKER, 0.0, 0.0)
    assert (store_path / "zarr.json").read_bytes() == before_group
    assert zarr.open_group(store_path, mode="r")["done"][0, 0] == 1


def test_caller_provided_store_with_wrong_shape(store_path: Path) -> None:
    group = zarr.open_group(store_path, mode="w")
    group.create_array(
        "done", shape=(3, 3), chunks=(3, 3), dtype="uint8", compressors=None, fill_value=0
    )
    with pytest.raises(TrackingError) as info:
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
    message = str(info.value)
    assert message.startswith(f"block tracking metadata at {store_path} is invalid: ")
    assert "shape inconsistent with task layout (stored = [3, 3], expected = [3, 4])" in message


def test_caller_provided_store_with_wrong_dtype(store_path: Path) -> None:
    group = zarr.open_group(store_path, mode="w")
    group.create_array(
        "failures", shape=(3, 4), chunks=(3, 4), dtype="uint16", compressors=None, fill_value=0
    )
    with pytest.raises(TrackingError, match=r'dtype is "uint16", expected "uint32"'):
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)


def test_compressed_caller_array_is_refused(store_path: Path) -> None:
    group = zarr.open_group(store_path, mode="w")
    group.create_array("done", shape=(3, 4), chunks=(3, 4), dtype="uint8", fill_value=0)
    with pytest.raises(TrackingError, match="single-chunk, uncompressed"):
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)


def test_invalid_json_is_invalid_metadata(store_path: Path) -> None:
    store_path.mkdir(parents=True)
    (store_path / "zarr.json").write_text("{not json")
    with pytest.raises(
        TrackingError, match=r"block tracking metadata at .*zarr\.json is invalid: "
    ):
        TrackingStore.open(store_path, LAYOUT, resource_tracking=False)


def test_io_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TrackingError) as info:
        TrackingStore.open(blocker, LAYOUT, resource_tracking=False)
    assert str(info.value).startswith(f"io error opening block tracking at {blocker}: ")
    assert isinstance(info.value.__cause__, OSError)


def test_wrong_chunk_length_is_resized(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_success(1, None, NO_WORKER, 0.0, 0.0)
    done_chunk = chunk(store_path, "done", 2)
    done_chunk.write_bytes(done_chunk.read_bytes()[:5])
    os.remove(chunk(store_path, "failures", 2))
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.done.reshape(-1).tolist() == [0, 1] + [0] * 10
    assert done_chunk.stat().st_size == 12
    assert chunk(store_path, "failures", 2).stat().st_size == 48


def test_daisy_hash_only_group_is_reused_and_gains_the_layout_record(store_path: Path) -> None:
    _write_json(
        store_path / "zarr.json",
        {
            "attributes": {"daisy_task_hash": layout_hash(LAYOUT)},
            "node_type": "group",
            "zarr_format": 3,
        },
    )
    _write_json(store_path / "done" / "zarr.json", array_metadata("uint8", (3, 4)))
    chunk(store_path, "done", 2).parent.mkdir(parents=True)
    chunk(store_path, "done", 2).write_bytes(bytes([1] * 12))
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert int(store.done.sum()) == 12
    attributes = json.loads((store_path / "zarr.json").read_text())["attributes"]
    assert attributes["daisy_task_hash"] == layout_hash(LAYOUT)
    assert attributes["bellis_layout"]["grid_shape"] == [3, 4]


def test_daisy_hash_only_group_keeps_the_plain_hash_behaviour(store_path: Path) -> None:
    _write_json(
        store_path / "zarr.json",
        {
            "attributes": {"daisy_task_hash": layout_hash(LAYOUT)},
            "node_type": "group",
            "zarr_format": 3,
        },
    )
    grown = simple((0, 0), (50, 40), (10, 10))
    with pytest.raises(LayoutMismatch, match="rm -rf"):
        TrackingStore.open(store_path, grown, resource_tracking=False)


# -- recording --------------------------------------------------------------------------


def test_record_success_writes_every_stat_array(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        store.record_success(6, STATS, 4, 1_700_000_000.25, 1_700_000_001.5)
        store.record_success(2, None, 9, 5.0, 6.0)
        store.record_success(8, STATS[:7], NO_WORKER, 1.0, 2.0)
    shape = (3, 4)
    flat = {
        name: chunk_values(store_path, name, dtype, shape).reshape(-1)
        for name, dtype in [
            ("done", "uint8"),
            ("wall_seconds", "float32"),
            ("cpu_seconds", "float32"),
            ("peak_rss_bytes", "uint64"),
            ("io_read_bytes", "uint64"),
            ("io_write_bytes", "uint64"),
            ("gpu_util_pct", "float32"),
            ("gpu_mem_bytes", "uint64"),
            ("worker_id", "uint32"),
            ("sent_at", "float64"),
            ("returned_at", "float64"),
            ("cpu_children_seconds", "float32"),
        ]
    }
    assert flat["done"].tolist() == [0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0]
    assert flat["wall_seconds"][6] == np.float32(1.5)
    assert flat["cpu_seconds"][6] == np.float32(0.25)
    assert flat["peak_rss_bytes"][6] == 123_456_789
    assert flat["io_read_bytes"][6] == 1000
    assert flat["io_write_bytes"][6] == 2000
    # the GPU figures as measured (42 %, 7 bytes): stored as given
    assert flat["gpu_util_pct"][6] == np.float32(42.0)
    assert chunk(store_path, "gpu_util_pct", 2).read_bytes()[24:28] == np.float32(42.0).tobytes()
    assert flat["gpu_mem_bytes"][6] == 7
    assert flat["worker_id"][6] == 4
    assert flat["sent_at"][6] == 1_700_000_000.25
    assert flat["returned_at"][6] == 1_700_000_001.5
    assert flat["cpu_children_seconds"][6] == np.float32(0.75)
    # A block without stats only marks done.
    assert flat["worker_id"][2] == 0 and flat["sent_at"][2] == 0.0
    assert flat["gpu_util_pct"][2] == 0.0
    # A 7-tuple (an old client: no child CPU) records zero child CPU and no GPU figure.
    assert flat["worker_id"][8] == NO_WORKER
    assert flat["cpu_children_seconds"][8] == 0.0
    assert math.isnan(flat["gpu_util_pct"][8])
    assert flat["gpu_mem_bytes"][8] == 0


def test_record_failure_stamps_a_cell_that_is_not_done(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        store.record_failure(3, 1, 10.0, 11.5)
        store.record_failure(3, 2, 20.0, 21.0)  # the last failed attempt's stamps stay
        store.record_success(5, STATS, 0, 30.0, 31.0)
        store.record_failure(5, 7, 40.0, 41.0)  # a done cell keeps its success's stamps
        store.record_failure(6)  # no round trip known: no stamps
    flat = {
        name: chunk_values(store_path, name, dtype, (3, 4)).reshape(-1)
        for name, dtype in [
            ("worker_id", "uint32"),
            ("sent_at", "float64"),
            ("returned_at", "float64"),
            ("wall_seconds", "float32"),
        ]
    }
    assert (flat["worker_id"][3], flat["sent_at"][3], flat["returned_at"][3]) == (2, 20.0, 21.0)
    assert flat["wall_seconds"][3] == 0.0
    assert (flat["worker_id"][5], flat["sent_at"][5], flat["returned_at"][5]) == (0, 30.0, 31.0)
    assert flat["returned_at"][6] == 0.0
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_failure(7, 1, 50.0, 51.0)  # a store opened without resource tracking
    assert chunk_values(store_path, "returned_at", "float64", (3, 4)).reshape(-1)[7] == 0.0


def test_unaddressable_cells_are_ignored(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        store.record_success(-1, STATS, 0, 0.0, 0.0)
        store.record_success(12, STATS, 0, 0.0, 0.0)
        store.record_failure(-1)
        store.record_failure(12)
        assert int(store.done.sum()) == 0
        assert int(store.failures.sum()) == 0


def test_failures_saturate(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_failure(3)
        store.record_failure(3)
        store.failures[0, 0] = 2**32 - 2
        for _ in range(3):
            store.record_failure(0)
    values = chunk_values(store_path, "failures", "uint32", (3, 4)).reshape(-1)
    assert values[0] == 2**32 - 1
    assert values[3] == 2


def test_zarr_python_reads_while_the_store_is_being_written(store_path: Path) -> None:
    store = TrackingStore.open(store_path, LAYOUT, resource_tracking=True)
    try:
        store.record_success(1, STATS, 0, 1.0, 2.0)
        store.record_failure(2)
        (store_path / "runs.jsonl").write_text('{"schema": 1}\n')
        group = zarr.open_group(store_path, mode="r")
        assert group["done"][:].tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
        assert int(group["failures"][0, 2]) == 1
        assert float(group["gpu_util_pct"][0, 1]) == 42.0
        store.record_success(11, STATS, 3, 1.0, 2.0)
        assert int(zarr.open_group(store_path, mode="r")["done"][2, 3]) == 1
        assert int(group["worker_id"][2, 3]) == 3
    finally:
        store.close()


def test_closed_store_refuses_use(store_path: Path) -> None:
    store = TrackingStore.open(store_path, LAYOUT, resource_tracking=True)
    store.close()
    store.close()
    with pytest.raises(TrackingError, match="is closed"):
        store.record_success(0, None, 0, 0.0, 0.0)
    with pytest.raises(TrackingError, match="is closed"):
        store.record_failure(0)
    with pytest.raises(TrackingError, match="is closed"):
        _ = store.done
    with pytest.raises(TrackingError, match="is closed"):
        store.is_done(0)
    assert "closed" in repr(store)


# -- read-only access ---------------------------------------------------------------------


def test_open_readonly(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as writer:
        writer.record_success(4, STATS, 1, 1.0, 2.0)
        writer.record_failure(5)
        with TrackingStore.open_readonly(store_path) as reader:
            assert reader.layout is None
            assert not reader.is_writable
            assert reader.grid_shape == (3, 4)
            assert reader.task_hash == layout_hash(LAYOUT)
            assert int(reader.done[1, 0]) == 1
            assert int(reader.failures[1, 1]) == 1
            assert set(reader.stats) == set(STAT_ARRAYS)
            assert reader.stats["worker_id"][1, 0] == 1
            writer.record_success(0, None, 0, 0.0, 0.0)
            assert int(reader.done[0, 0]) == 1
            with pytest.raises(TrackingError, match="read-only"):
                reader.record_success(1, None, 0, 0.0, 0.0)
            with pytest.raises(TrackingError, match="read-only"):
                reader.record_failure(1)


def test_open_readonly_without_a_store(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match=r"zarr\.json is missing"):
        TrackingStore.open_readonly(tmp_path / "nothing")


# -- delete_store and failed_cells ----------------------------------------------------------


def test_delete_store(store_path: Path, tmp_path: Path) -> None:
    TrackingStore.open(store_path, LAYOUT, resource_tracking=False).close()
    (store_path / "runs.jsonl").write_text("{}\n")
    assert delete_store(store_path) == str(store_path)
    assert not store_path.exists()
    assert delete_store(store_path) is None
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert delete_store(str(plain)) == str(plain)
    assert not plain.exists()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert delete_store(link) == str(link)
    assert not os.path.lexists(link)
    assert (target / "keep").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_delete_store_failure() -> None:
    with pytest.raises(
        TrackingError, match=r"^failed to clear block tracking at /proc/self/status: "
    ):
        delete_store("/proc/self/status")


def test_failed_cells(store_path: Path, tmp_path: Path) -> None:
    assert failed_cells(tmp_path / "absent") == []
    (tmp_path / "empty").mkdir()
    assert failed_cells(tmp_path / "empty") == []
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_failure(7)
        store.record_failure(2)
        store.record_failure(2)
        store.record_failure(4)
        store.record_success(4, None, 0, 0.0, 0.0)
        assert failed_cells(store_path) == [2, 7]
    assert failed_cells(store_path, layout=LAYOUT) == [2, 7]


def test_failed_cells_refuses_what_cannot_be_opened(store_path: Path) -> None:
    TrackingStore.open(store_path, LAYOUT, resource_tracking=False).close()
    other = simple((0, 0), (30, 40), (5, 5))
    with pytest.raises(TrackingError) as info:
        failed_cells(store_path, layout=other)
    assert str(info.value).startswith(
        f"cannot open block tracking at {store_path}: block tracking at"
    )
    assert "rm -rf" in str(info.value)
    (store_path / "zarr.json").write_text('{"node_type": "array", "zarr_format": 3}')
    with pytest.raises(TrackingError, match=r"^cannot open block tracking at .*not a zarr group"):
        failed_cells(store_path)


def test_failed_cells_of_a_grown_layout_are_remapped(store_path: Path) -> None:
    old = simple((0,), (50,), (10,))
    with TrackingStore.open(store_path, old, resource_tracking=False) as store:
        store.record_failure(1)
        store.record_failure(3)
        store.record_success(3, None, 0, 0.0, 0.0)
    grown = simple((-20,), (90,), (10,))
    before = snapshot(store_path)
    assert failed_cells(store_path, layout=grown) == [3]
    assert snapshot(store_path) == before


# -- grown volumes ------------------------------------------------------------------------


def _fill(store: TrackingStore, layout: StoreLayout, positions: list[tuple[int, ...]]) -> None:
    for i, position in enumerate(positions):
        cell = layout.tracking_cell(position)
        assert cell >= 0
        store.record_failure(cell)
        if i % 2 == 0:
            store.record_success(
                cell, (float(i + 1), 0.5, i, i, i, 0.0, 0, 0.0), i, float(i), float(i) + 0.5
            )


def _check_migrated(
    store: TrackingStore, old: StoreLayout, new: StoreLayout, positions: list[tuple[int, ...]]
) -> None:
    expected_done = np.zeros(new.cell_count, dtype=np.uint8)
    expected_failures = np.zeros(new.cell_count, dtype=np.uint32)
    for i, position in enumerate(positions):
        cell = new.tracking_cell(position)
        assert cell >= 0
        expected_failures[cell] = 1
        if i % 2 == 0:
            expected_done[cell] = 1
            if store.stats:
                assert store.stats["wall_seconds"].reshape(-1)[cell] == i + 1
                assert store.stats["worker_id"].reshape(-1)[cell] == i
                assert store.stats["sent_at"].reshape(-1)[cell] == float(i)
    assert store.done.reshape(-1).tolist() == expected_done.tolist()
    assert store.failures.reshape(-1).tolist() == expected_failures.tolist()


GROWTH_CASES = [
    pytest.param(
        simple((0,), (50,), (10,)), simple((-30,), (120,), (10,)), [(0,), (20,), (40,)], id="1d"
    ),
    pytest.param(
        simple((0, 0), (30, 40), (10, 10)),
        simple((-20, 0), (50, 60), (10, 10)),
        [(0, 0), (10, 30), (20, 10), (20, 30)],
        id="2d",
    ),
    pytest.param(
        simple((10, 0, 5), (4, 6, 6), (2, 3, 3)),
        simple((6, -6, 5), (10, 12, 9), (2, 3, 3)),
        [(10, 0, 5), (12, 3, 8), (12, 0, 8), (10, 3, 5), (12, 3, 5)],
        id="3d",
    ),
    pytest.param(
        StoreLayout((0, 0), (60, 60), (-20, -20), (50, 50), (0, 0), (10, 10), "valid"),
        StoreLayout((-30, 0), (90, 80), (-20, -20), (50, 50), (0, 0), (10, 10), "valid"),
        [(20, 20), (30, 20), (20, 30), (30, 30)],
        id="2d-wide-context",
    ),
]


@pytest.mark.parametrize(("old", "new", "positions"), GROWTH_CASES)
def test_grown_volume_is_migrated(
    store_path: Path,
    old: StoreLayout,
    new: StoreLayout,
    positions: list[tuple[int, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with TrackingStore.open(store_path, old, resource_tracking=True) as store:
        _fill(store, old, positions)
    (store_path / "runs.jsonl").write_text('{"schema": 1}\n')
    with caplog.at_level(logging.INFO, logger="bellis"):
        with TrackingStore.open(store_path, new, resource_tracking=True) as store:
            assert store.migrated_from == old.grid_shape
            assert store.grid_shape == new.grid_shape
            _check_migrated(store, old, new, positions)
    messages = [r.getMessage() for r in caplog.records if r.name == "bellis"]
    assert any(
        str(list(old.grid_shape)) in m and str(list(new.grid_shape)) in m and "done, failures" in m
        for m in messages
    ), messages
    group = json.loads((store_path / "zarr.json").read_text())
    assert group["attributes"]["daisy_task_hash"] == layout_hash(new)
    assert group["attributes"]["bellis_layout"]["grid_shape"] == list(new.grid_shape)
    for name in ("done", "failures", *STAT_ARRAYS):
        meta = (store_path / name / "zarr.json").read_bytes()
        data_type = json.loads(meta)["data_type"]
        assert meta == dump_metadata(array_metadata(data_type, new.grid_shape))
        assert sorted(p.name for p in (store_path / name).iterdir()) == ["c", "zarr.json"]
    assert (store_path / "runs.jsonl").read_text() == '{"schema": 1}\n'
    zarr_done = zarr.open_group(store_path, mode="r")["done"][:]
    assert zarr_done.shape == new.grid_shape
    assert int(zarr_done.sum()) == len(positions[::2])
    with TrackingStore.open(store_path, new, resource_tracking=False) as store:
        assert store.migrated_from is None
        _check_migrated(store, old, new, positions)


def test_growth_carries_unknown_child_arrays(store_path: Path) -> None:
    old = simple((0,), (30,), (10,))
    TrackingStore.open(store_path, old, resource_tracking=False).close()
    extra = zarr.open_group(store_path, mode="r+").create_array(
        "my_flags", shape=(3,), chunks=(3,), dtype="int16", compressors=None, fill_value=0
    )
    extra[:] = [5, -6, 7]
    new = simple((-10,), (50,), (10,))
    with TrackingStore.open(store_path, new, resource_tracking=False):
        pass
    assert zarr.open_group(store_path, mode="r")["my_flags"][:].tolist() == [0, 5, -6, 7, 0]


def test_growth_without_stat_arrays_then_enabling_them(store_path: Path) -> None:
    old = simple((0, 0), (20, 20), (10, 10))
    with TrackingStore.open(store_path, old, resource_tracking=False) as store:
        store.record_success(3, None, 0, 0.0, 0.0)
    new = simple((0, 0), (30, 20), (10, 10))
    with TrackingStore.open(store_path, new, resource_tracking=True) as store:
        assert store.migrated_from == (2, 2)
        assert store.done.tolist() == [[0, 0], [0, 1], [0, 0]]
        assert store.stats["sent_at"].shape == (3, 2)


@pytest.mark.parametrize("fit", ["overhang", "shrink"])
def test_growth_reruns_partial_boundary_blocks(store_path: Path, fit: str) -> None:
    old = simple((0,), (95,), (10,), fit)
    with TrackingStore.open(store_path, old, resource_tracking=False) as store:
        for cell in range(10):
            store.record_success(cell, None, 0, 0.0, 0.0)
    with TrackingStore.open(
        store_path, simple((0,), (120,), (10,), fit), resource_tracking=False
    ) as store:
        assert store.done.tolist() == [1] * 9 + [0] * 3


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(simple((0, 0), (20, 40), (10, 10)), id="shrink"),
        pytest.param(simple((0, 0), (60, 40), (10, 5)), id="stride"),
        pytest.param(simple((0, 0), (60, 40), (10, 10), "overhang"), id="fit"),
        pytest.param(simple((-5, 0), (60, 40), (10, 10)), id="off-lattice"),
        pytest.param(
            StoreLayout((0, 0), (60, 40), (-10, 0), (30, 10), (0, 0), (10, 10), "valid"),
            id="context",
        ),
    ],
)
def test_incompatible_layouts_are_still_refused(store_path: Path, new: StoreLayout) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        store.record_success(0, STATS, 0, 0.0, 0.0)
    before = snapshot(store_path)
    with pytest.raises(LayoutMismatch) as info:
        TrackingStore.open(store_path, new, resource_tracking=True)
    assert str(info.value) == (
        f"block tracking at {store_path} was written for a different task layout "
        f"(stored hash = {layout_hash(LAYOUT)}, expected = {layout_hash(new)}). "
        f"Delete it to start fresh:\n    rm -rf {store_path}"
    )
    assert snapshot(store_path) == before


# -- crashes during a migration ---------------------------------------------------------------


class _Crash(Exception):
    pass


CRASH_OLD = simple((0, 0), (30, 20), (10, 10))
CRASH_NEW = simple((-10, 0), (50, 30), (10, 10))
CRASH_POSITIONS = [(0, 0), (10, 10), (20, 0), (20, 10)]


def _migration_steps(tmp_path: Path) -> list[str]:
    steps: list[str] = []
    path = tmp_path / "probe"
    TrackingStore.open(path, CRASH_OLD, resource_tracking=True).close()
    migrate_module._fault_hook = steps.append
    try:
        TrackingStore.open(path, CRASH_NEW, resource_tracking=True).close()
    finally:
        migrate_module._fault_hook = None
    return steps


def test_every_migration_step_is_announced(tmp_path: Path) -> None:
    steps = _migration_steps(tmp_path)
    arrays = 2 + len(STAT_ARRAYS)
    assert len(steps) == 5 * arrays + 1
    assert steps[4 * arrays] == "committed"


def _crash_at(path: Path, step: str) -> None:
    def hook(name: str) -> None:
        if name == step:
            raise _Crash(name)

    migrate_module._fault_hook = hook
    try:
        with pytest.raises(_Crash):
            TrackingStore.open(path, CRASH_NEW, resource_tracking=True)
    finally:
        migrate_module._fault_hook = None


def _crash_cases() -> list[str]:
    names = ["done", "failures", *STAT_ARRAYS]
    steps = [f"prepared {n}" for n in names]
    for n in names:
        steps += [f"moved aside {n}", f"moved in {n}", f"swapped {n}"]
    steps.append("committed")
    steps += [f"cleaned {n}" for n in names]
    return steps


@pytest.mark.parametrize("step", _crash_cases())
def test_crash_during_migration_leaves_old_or_new(
    store_path: Path, step: str, no_fault_hook: None
) -> None:
    with TrackingStore.open(store_path, CRASH_OLD, resource_tracking=True) as store:
        _fill(store, CRASH_OLD, CRASH_POSITIONS)
    _crash_at(store_path, step)
    committed = step == "committed" or step.startswith("cleaned")
    current = CRASH_NEW if committed else CRASH_OLD

    # A reader sees a consistent store before anyone repairs it.
    with TrackingStore.open_readonly(store_path) as reader:
        assert reader.grid_shape == current.grid_shape
        _check_migrated(reader, CRASH_OLD, current, CRASH_POSITIONS)
    assert failed_cells(store_path) == sorted(
        current.tracking_cell(p) for p in CRASH_POSITIONS[1::2]
    )

    if committed:
        with pytest.raises(LayoutMismatch):
            TrackingStore.open(store_path, CRASH_OLD, resource_tracking=True)
    else:
        with TrackingStore.open(store_path, CRASH_OLD, resource_tracking=True) as store:
            assert store.migrated_from is None
            _check_migrated(store, CRASH_OLD, CRASH_OLD, CRASH_POSITIONS)
        for name in ("done", "failures", *STAT_ARRAYS):
            assert sorted(p.name for p in (store_path / name).iterdir()) == ["c", "zarr.json"]
            meta = json.loads((store_path / name / "zarr.json").read_text())
            assert meta["shape"] == list(CRASH_OLD.grid_shape)

    with TrackingStore.open(store_path, CRASH_NEW, resource_tracking=True) as store:
        assert store.migrated_from == (None if committed else CRASH_OLD.grid_shape)
        _check_migrated(store, CRASH_OLD, CRASH_NEW, CRASH_POSITIONS)
    for name in ("done", "failures", *STAT_ARRAYS):
        assert sorted(p.name for p in (store_path / name).iterdir()) == ["c", "zarr.json"]
    assert not [p for p in store_path.rglob(".bellis-tmp-*")]
    assert zarr.open_group(store_path, mode="r")["failures"][:].shape == CRASH_NEW.grid_shape


def test_crash_then_readonly_then_crash_again(store_path: Path, no_fault_hook: None) -> None:
    with TrackingStore.open(store_path, CRASH_OLD, resource_tracking=True) as store:
        _fill(store, CRASH_OLD, CRASH_POSITIONS)
    _crash_at(store_path, "moved aside failures")
    _crash_at(store_path, "swapped wall_seconds")
    with TrackingStore.open(store_path, CRASH_NEW, resource_tracking=True) as store:
        _check_migrated(store, CRASH_OLD, CRASH_NEW, CRASH_POSITIONS)


# -- bellis status ------------------------------------------------------------------------


def test_format_status_2d(store_path: Path) -> None:
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        store.record_success(0, None, 0, 0.0, 0.0)
        store.record_success(5, None, 0, 0.0, 0.0)
        store.record_failure(5)
        store.record_failure(2)
        store.record_failure(2)
        (store_path / "runs.jsonl").write_text("{}\n{}\n")
        text = format_status(store_path)
    lines = text.splitlines()
    assert lines[0] == f"block tracking at {store_path}"
    assert f"hash {layout_hash(LAYOUT)}" in text
    assert "grid        3 x 4 = 12 cells" in text
    assert "done        2" in text
    assert "failed      1 " in text
    assert "untouched   9" in text
    assert "attempts    3 failed attempts recorded; 1 of the done cells failed before" in text
    assert "resources   none" in text
    assert "runs        2 recorded" in text
    assert lines[-3:] == ["    #.x.", "    .#..", "    ...."]


def test_format_status_1d_downsampled(store_path: Path) -> None:
    layout = simple((0,), (2000,), (10,))
    with TrackingStore.open(store_path, layout, resource_tracking=True) as store:
        for cell in range(100):
            store.record_success(cell, None, 0, 0.0, 0.0)
        store.record_failure(150)
        text = format_status(store_path, max_width=54)
    lines = text.splitlines()
    assert "resources   all 11 arrays" in text
    assert "each character covers 4 x 4 cells" in text
    assert lines[-1] == "    " + "#" * 25 + "." * 12 + "x" + "." * 12
    assert all(len(line) <= 54 for line in lines[-1:])


def test_format_status_partial_squares(store_path: Path) -> None:
    layout = simple((0, 0), (40, 40), (10, 10))
    with TrackingStore.open(store_path, layout, resource_tracking=False) as store:
        store.record_success(0, None, 0, 0.0, 0.0)
        for cell in (2, 3, 6, 7):
            store.record_success(cell, None, 0, 0.0, 0.0)
        text = format_status(store_path, max_width=6)
    assert "covers 2 x 2 cells" in text
    assert text.splitlines()[-2:] == ["    +#", "    .."]


def test_format_status_3d_shows_the_middle_slice(store_path: Path) -> None:
    layout = simple((0, 0, 0), (50, 20, 30), (10, 10, 10))
    with TrackingStore.open(store_path, layout, resource_tracking=False) as store:
        store.record_success(2 * 6 + 1 * 3 + 2, None, 0, 0.0, 0.0)
        store.record_failure(2 * 6 + 0)
        store.record_success(0, None, 0, 0.0, 0.0)
        text = format_status(store_path)
    assert "middle slice along axis 0 (index 2 of 0..4)" in text
    assert text.splitlines()[-2:] == ["    x..", "    ..#"]
    assert "done        2" in text


def test_format_status_of_a_daisy_store_and_an_empty_grid(tmp_path: Path) -> None:
    daisy = tmp_path / "daisy"
    _write_json(
        daisy / "zarr.json",
        {"attributes": {"daisy_task_hash": "f" * 64}, "node_type": "group", "zarr_format": 3},
    )
    for name, data_type in [("done", "uint8"), ("failures", "uint32"), ("wall_seconds", "float32")]:
        _write_json(daisy / name / "zarr.json", array_metadata(data_type, (2,)))
    chunk(daisy, "done", 1).parent.mkdir(parents=True)
    chunk(daisy, "done", 1).write_bytes(b"\x01\x00")
    text = format_status(daisy)
    assert "resources   1 of 11 arrays (missing cpu_seconds," in text
    assert "hash " + "f" * 64 in text
    assert text.splitlines()[-1] == "    #."

    empty = tmp_path / "empty"
    group = zarr.open_group(empty, mode="w")
    for name, dtype in [("done", "uint8"), ("failures", "uint32")]:
        group.create_array(
            name, shape=(0, 3), chunks=(1, 3), dtype=dtype, compressors=None, fill_value=0
        )
    text = format_status(empty)
    assert "no daisy_task_hash" in text
    assert "0 x 3 = 0 cells" in text
    assert "(empty grid)" in text


def test_format_status_without_a_store(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match=r"zarr\.json is missing"):
        format_status(tmp_path / "none")


# -- stores and hashes recorded from daisy 2.0.0 ------------------------------------------

COMPAT = Path(__file__).resolve().parent.parent / "compat"
REFERENCE = COMPAT / "daisy_reference.json"
FIXTURE = COMPAT / "daisy_store_fixture"
needs_reference = pytest.mark.skipif(
    not (REFERENCE.is_file() and FIXTURE.is_dir()), reason="daisy 2.0.0 reference data absent"
)


def _reference() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE.read_text())["tracking"]
    return data


def _layout_of(entry: dict[str, Any]) -> StoreLayout:
    (to, ts), (ro, rs), (wo, ws) = entry["total_roi"], entry["read_roi"], entry["write_roi"]
    return StoreLayout(
        tuple(to), tuple(ts), tuple(ro), tuple(rs), tuple(wo), tuple(ws), entry["fit"]
    )


@needs_reference
def test_hashes_equal_daisy_2_0_0() -> None:
    reference = _reference()
    entries = [*reference["hashes"], reference["fixture"]]
    assert len(entries) > 1
    for entry in entries:
        assert layout_hash(_layout_of(entry)) == entry["daisy_task_hash"], entry.get("name")


@needs_reference
def test_daisy_store_metadata_is_what_bellis_writes() -> None:
    fixture = _reference()["fixture"]
    assert (FIXTURE / "zarr.json").read_bytes() == dump_metadata(
        {
            "attributes": {"daisy_task_hash": fixture["daisy_task_hash"]},
            "node_type": "group",
            "zarr_format": 3,
        }
    )
    for name, spec in fixture["arrays"].items():
        expected = dump_metadata(array_metadata(spec["dtype"], tuple(spec["shape"])))
        assert (FIXTURE / name / "zarr.json").read_bytes() == expected, name


@needs_reference
def test_daisy_store_is_read_and_reused(tmp_path: Path) -> None:
    fixture = _reference()["fixture"]
    layout = _layout_of(fixture)
    failing = layout.tracking_cell(tuple(fixture["failing_block_write_offset"]))
    assert divmod(failing, 4) == (1, 2)
    with TrackingStore.open_readonly(FIXTURE) as reader:
        assert reader.done.tolist() == fixture["done"]
        assert reader.failures.tolist() == fixture["failures"]
        assert len(reader.stats) == 7
        assert math.isnan(float(reader.stats["gpu_util_pct"][0, 0]))
    text = format_status(FIXTURE)
    assert "resources   7 of 11 arrays (missing worker_id, sent_at, returned_at" in text
    assert failed_cells(FIXTURE, layout=layout) == []

    copy = tmp_path / "fixture"
    for source in FIXTURE.rglob("*"):
        if source.is_file():
            target = copy / source.relative_to(FIXTURE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    before = snapshot(copy)
    grown = StoreLayout((0, 0), (44, 34), (-2, -2), (14, 14), (0, 0), (10, 10), "valid")
    with pytest.raises(LayoutMismatch):
        TrackingStore.open(copy, grown, resource_tracking=True)
    assert snapshot(copy) == before
    with TrackingStore.open(copy, layout, resource_tracking=True) as store:
        assert store.done.tolist() == fixture["done"]
        assert store.failures.tolist() == fixture["failures"]
    after = snapshot(copy)
    for key, value in before.items():
        if key != "zarr.json":
            assert after[key] == value, key
    with TrackingStore.open(copy, grown, resource_tracking=True) as store:
        assert store.migrated_from == (3, 4)
        assert store.done.tolist() == [*fixture["done"], [0] * 4, [0] * 4]


def test_deferred_resource_arrays_and_a_close_that_cannot_create_them(tmp_path: Path) -> None:
    from bellis._run._runner import _close_stores

    good_path, bad_path = tmp_path / "good", tmp_path / "bad"
    good = TrackingStore.open(good_path, LAYOUT, resource_tracking=True, defer_stats=True)
    bad = TrackingStore.open(bad_path, LAYOUT, resource_tracking=True, defer_stats=True)
    # deferred: only the base arrays exist until open_stats() or close()
    assert sorted(p.name for p in good_path.iterdir() if p.is_dir()) == ["done", "failures"]
    bad.record_success(0, None, 0, 0.0, 0.0)
    # a dangling symlink where a resource array must go: creating it fails
    (bad_path / "cpu_seconds").symlink_to(tmp_path / "nowhere" / "cpu_seconds")
    with pytest.raises(TrackingError, match="cpu_seconds"):
        _close_stores({"bad": bad, "good": good})
    # both stores are closed all the same; the bad one's done marker reached the disk
    assert "closed" in repr(bad) and "closed" in repr(good)
    assert (good_path / "wall_seconds" / "zarr.json").exists()
    done = zarr.open_array(str(bad_path / "done"), mode="r")
    assert int(np.asarray(done[:]).reshape(-1)[0]) == 1


# -- reserving and the run lock -----------------------------------------------------------


def test_reserving_by_writing_allocates_holes_and_keeps_data(tmp_path: Path) -> None:
    # the fallback where posix_fallocate is unsupported (EOPNOTSUPP / EINVAL)
    if not _has_sparse_files(tmp_path):
        pytest.skip("the temporary directory's file system has no sparse files")
    file = tmp_path / "chunk"
    size = 4 * 1024 * 1024
    with open(file, "wb") as fh:
        fh.truncate(size)
        fh.seek(1024 * 1024 + 17)
        fh.write(b"data")
    fd = os.open(file, os.O_RDWR)
    try:
        reserve_by_writing(fd, size)
    finally:
        os.close(fd)
    info = file.stat()
    assert info.st_size == size
    assert info.st_blocks * 512 >= size
    raw = file.read_bytes()
    assert raw[1024 * 1024 + 17 : 1024 * 1024 + 21] == b"data"
    assert raw.count(0) == size - 4


def _has_sparse_files(directory: Path) -> bool:
    probe = directory / "sparse-probe"
    with open(probe, "wb") as fh:
        fh.truncate(16 * 1024 * 1024)
    allocated = probe.stat().st_blocks * 512
    probe.unlink()
    return allocated < 1024 * 1024


def _open_in_subprocess(path: Path, layout: StoreLayout) -> subprocess.CompletedProcess[str]:
    fields = (
        layout.total_offset,
        layout.total_shape,
        layout.read_offset,
        layout.read_shape,
        layout.write_offset,
        layout.write_shape,
        layout.fit,
    )
    code = (
        "import sys\n"
        "from bellis._tracking import StoreLayout, TrackingStore\n"
        "from bellis.errors import TrackingError\n"
        f"layout = StoreLayout{fields!r}\n"
        "try:\n"
        f"    TrackingStore.open({str(path)!r}, layout, resource_tracking=False).close()\n"
        "except TrackingError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_held_store_is_refused_and_a_grown_layout_not_migrated(store_path: Path) -> None:
    grown = simple((0, 0), (50, 40), (10, 10))
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=True) as store:
        store.record_success(5, STATS, 1, 1.0, 2.0)
        store.flush()
        before = snapshot(store_path)
        for layout in (LAYOUT, grown):
            done = _open_in_subprocess(store_path, layout)
            assert done.returncode == 2, done.stderr
            assert f"block tracking at {store_path} is in use by another run" in done.stdout
            assert f"pid {os.getpid()} on host " in done.stdout
        assert snapshot(store_path) == before  # no migration happened
        with pytest.raises(TrackingError, match="already open in this process"):
            TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
        # the refused second open did not drop this process's lock
        assert _open_in_subprocess(store_path, LAYOUT).returncode == 2
    # closed: the lock is free again and the grown layout migrates
    done = _open_in_subprocess(store_path, grown)
    assert done.returncode == 0, done.stdout + done.stderr
    with TrackingStore.open_readonly(store_path) as reader:
        assert reader.grid_shape == (5, 4)
        assert reader.done[1, 1] == 1


def test_a_forked_child_does_not_keep_the_lock(store_path: Path) -> None:
    # a block function that forks (a multiprocessing Pool) must not leave the store
    # locked after the run that forked it
    store = TrackingStore.open(store_path, LAYOUT, resource_tracking=False)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child lives on until the test lets it go
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        assert _open_in_subprocess(store_path, LAYOUT).returncode == 2  # still held
        store.close()
        done = _open_in_subprocess(store_path, LAYOUT)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


# -- the code version per block (issue 26) -------------------------------------------------


def test_code_version_is_created_on_first_use_and_written_before_done(store_path: Path) -> None:
    from bellis._tracking._codever import (
        code_counts,
        made_at,
        read_table,
        register,
        resolve,
        version_counts,
    )

    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert store.code_versions() is None and store.hot_writer().code is None  # type: ignore[union-attr]
        index, table = register(store_path, {"hash": "aa", "functions": {"f": "1"}}, 1.0)
        assert index == 1 and table[0]["first_seen"] == 1.0
        # one entry per run: the same code in a later run gets its own index, same_as
        # the first, and keeps the first time the code was seen
        again, table = register(store_path, {"hash": "aa", "functions": {"f": "1"}}, 2.0)
        assert again == 2 and table[1]["same_as"] == 1 and table[1]["first_seen"] == 1.0
        assert "functions" not in table[1] and resolve(table)[2]["functions"] == {"f": "1"}
        assert made_at(table)[[0, 1, 2, 3]].tolist() == [-np.inf, 1.0, 2.0, -np.inf]
        store.use_code_version(index)
        store.record_success(0, None, -1, 0.0, 0.0)
        writer = store.hot_writer()
        assert writer is not None and writer.code is not None and writer.code_index == 1
        writer.code[5] = 1
        writer.done[5] = 1
    assert (store_path / "code_version" / "zarr.json").is_file()
    assert chunk(store_path, "code_version", 2).stat().st_size == 24
    codes = chunk_values(store_path, "code_version", "uint16", (3, 4))
    assert codes.reshape(-1).tolist() == [1, 0, 0, 0, 0, 1] + [0] * 6
    assert [e["hash"] for e in read_table(store_path)] == ["aa", "aa"]
    z = zarr.open_group(str(store_path), mode="r")
    assert z["code_version"].dtype == np.uint16

    # a new fingerprint gets index 2; its blocks and the unknown ones are told apart
    with TrackingStore.open(store_path, LAYOUT, resource_tracking=False) as store:
        assert register(store_path, {"hash": "bb"}, 3.0)[0] == 3
        store.use_code_version(3)
        store.record_success(1, None, -1, 0.0, 0.0)
        store.done.reshape(-1)[2] = 1  # done by code that recorded no version: unknown
        codes_now = store.code_versions()
        assert codes_now is not None
        counts = code_counts(store.done, codes_now)
        assert counts == {0: 1, 1: 2, 3: 1}
        rows = version_counts(read_table(store_path), counts)
        assert [(r["version"], r["hash"], r["blocks"]) for r in rows] == [
            (1, "aa", 2),
            (2, "bb", 1),
            (None, None, 1),
        ]
    readonly = TrackingStore.open_readonly(store_path)
    assert readonly.code_versions() is not None
    readonly.close()
    # a table deleted by hand: the next index stays above those the array holds
    (store_path / "code_versions.json").unlink()
    assert register(store_path, {"hash": "cc"}, 4.0)[0] == 1
    (store_path / "code_versions.json").unlink()
    assert register(store_path, {"hash": "cc"}, 4.0, floor=3)[0] == 4


# -- the one owner of the done markers (bellis._donemarks) --------------------------------


def test_done_markers_are_written_and_cleared_only_through_the_store(store_path: Path) -> None:
    from bellis._tracking import find_stores, is_store, open_readonly, open_store, store_exists

    assert not store_exists(store_path) and not is_store(store_path)
    with open_store(store_path, LAYOUT, resource_tracking=False) as store:
        writer = store.hot_writer()
        assert writer is not None and writer.code is None and writer.code_index == 0
        writer.done[1] = 1
        store.record_success(2, None, -1, 0.0, 0.0)
        store.record_skip(5)
        assert store.use_code({"hash": "aa"}, 1.0) == 1
        again = store.hot_writer()
        assert again is not None and again.code is not None and again.code_index == 1
        again.code[7] = again.code_index
        again.done[7] = 1
        # cells outside the grid and repeats are ignored; only done ones count
        assert store.clear_done([2, 2, 3, -1, 10**6]) == 1
    assert chunk_values(store_path, "done", "uint8", (3, 4)).reshape(-1).tolist() == [
        0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0,
    ]  # fmt: skip
    assert chunk_values(store_path, "code_version", "uint16", (3, 4)).reshape(-1)[7] == 1
    assert store_exists(store_path) and is_store(store_path)
    assert find_stores(store_path.parent) == [store_path]
    with open_readonly(store_path) as ro:
        assert ro.hot_writer() is None
        with pytest.raises(TrackingError, match="read-only"):
            ro.clear_done([1])
        # a dry run's scratch copy takes clears; the store on disk keeps its markers
        scratch = ro.scratch()
        assert scratch.clear_done([1, 5]) == 2
        assert not scratch.is_done(1) and ro.is_done(1)
        assert ro.code_table()[0]["hash"] == "aa"
    assert chunk_values(store_path, "done", "uint8", (3, 4)).reshape(-1)[[1, 5]].tolist() == [1, 1]
