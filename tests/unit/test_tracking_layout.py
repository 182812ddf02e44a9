"""The tracking layout: grid, cells, the daisy layout hash, metadata text and growth plans."""

from __future__ import annotations

import hashlib
import struct

import pytest

from bellis._tracking._layout import (
    ARRAY_DTYPES,
    STAT_ARRAYS,
    StoreGrowth,
    StoreLayout,
    array_metadata,
    dump_metadata,
    group_metadata,
    layout_hash,
    layout_record,
    plan_growth,
)
from bellis.errors import ConfigurationError


def make(
    total: tuple[tuple[int, ...], tuple[int, ...]],
    read: tuple[tuple[int, ...], tuple[int, ...]],
    write: tuple[tuple[int, ...], tuple[int, ...]],
    fit: str = "valid",
) -> StoreLayout:
    return StoreLayout(total[0], total[1], read[0], read[1], write[0], write[1], fit)


def simple(offset: tuple[int, ...], shape: tuple[int, ...], block: tuple[int, ...]) -> StoreLayout:
    zero = (0,) * len(block)
    return make((offset, shape), (zero, block), (zero, block))


# -- the hash ---------------------------------------------------------------------------


def test_hash_matches_daisy_2_0_0_reference_value() -> None:
    layout = simple((0, 0), (30, 40), (10, 10))
    digest = layout_hash(layout)
    assert digest.startswith("6659e166")
    assert digest.endswith("977570")
    assert len(digest) == 64
    assert digest == digest.lower()


def _reference_hash(layout: StoreLayout, fit_name: str) -> str:
    """The SPEC §4.4 construction, spelled out byte by byte."""
    data = b"daisy-tracking:v1\n"
    for label, offset, shape in (
        (b"total", layout.total_offset, layout.total_shape),
        (b"read", layout.read_offset, layout.read_shape),
        (b"write", layout.write_offset, layout.write_shape),
    ):
        data += label + b":offset="
        data += b"".join(v.to_bytes(8, "little", signed=True) + b"," for v in offset)
        data += b";shape="
        data += b"".join(struct.pack("<q", v) + b"," for v in shape)
        data += b";"
    data += b"fit=" + fit_name.encode()
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("fit", "name"), [("valid", "Valid"), ("overhang", "Overhang"), ("shrink", "Shrink")]
)
def test_hash_follows_the_spec_construction_with_negative_offsets(fit: str, name: str) -> None:
    layout = make(
        ((-5, 0, 7), (100, 64, 33)), ((-2, -2, -2), (12, 12, 12)), ((0, 0, 0), (8, 8, 8)), fit
    )
    assert layout_hash(layout) == _reference_hash(layout, name)


def test_every_geometric_parameter_changes_the_hash() -> None:
    base = make(((0, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)))
    variants = [
        make(((1, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 0), (10, 10))),
        make(((0, 0), (100, 110)), ((-5, -5), (20, 20)), ((0, 0), (10, 10))),
        make(((0, 0), (100, 100)), ((-4, -5), (20, 20)), ((0, 0), (10, 10))),
        make(((0, 0), (100, 100)), ((-5, -5), (20, 21)), ((0, 0), (10, 10))),
        make(((0, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 1), (10, 10))),
        make(((0, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 0), (10, 5))),
        make(((0, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)), "shrink"),
    ]
    hashes = {layout_hash(v) for v in variants}
    assert len(hashes) == len(variants)
    assert layout_hash(base) not in hashes
    same = make(((0, 0), (100, 100)), ((-5, -5), (20, 20)), ((0, 0), (10, 10)))
    assert layout_hash(same) == layout_hash(base)


# -- geometry ---------------------------------------------------------------------------


def test_grid_shape_rounds_up_and_is_at_least_one() -> None:
    assert simple((0, 0), (30, 40), (10, 10)).grid_shape == (3, 4)
    assert simple((0,), (95,), (10,)).grid_shape == (10,)
    assert simple((0,), (0,), (10,)).grid_shape == (1,)
    assert simple((0,), (-20,), (10,)).grid_shape == (1,)
    assert make(((0,), (50,)), ((0,), (0,)), ((0,), (0,))).grid_shape == (1,)
    assert simple((0, 0, 0), (7, 8, 9), (2, 4, 3)).cell_count == 4 * 2 * 3


def test_contexts() -> None:
    layout = make(((0, 0), (100, 100)), ((-10, -3), (30, 20)), ((0, 0), (10, 10)))
    assert layout.context_ul == (10, 3)
    assert layout.context_lr == (10, 7)
    assert layout.ndim == 2


def test_tracking_cell_shifts_by_the_context_in_blocks() -> None:
    # SPEC §4.3 example: total (0,100), read (-10,30), write (0,10): grid 10, cells 1..8.
    layout = make(((0,), (100,)), ((-10,), (30,)), ((0,), (10,)))
    assert layout.grid_shape == (10,)
    # Blocks of this task write at total.offset + context + k * stride.
    cells = [layout.tracking_cell((10 + 10 * k,)) for k in range(8)]
    assert cells == list(range(1, 9))


def test_tracking_cell_is_c_order_and_rejects_outside_cells() -> None:
    layout = simple((100, 200), (30, 40), (10, 10))
    assert layout.tracking_cell((100, 200)) == 0
    assert layout.tracking_cell((110, 230)) == 1 * 4 + 3
    assert layout.tracking_cell((120, 230)) == 11
    assert layout.tracking_cell((90, 200)) == -1
    assert layout.tracking_cell((130, 200)) == -1
    assert layout.tracking_cell((100, 240)) == -1


def test_layout_validation() -> None:
    with pytest.raises(ConfigurationError, match="unknown fit mode"):
        simple((0,), (10,), (5,)).__class__((0,), (10,), (0,), (5,), (0,), (5,), "bogus")
    with pytest.raises(ConfigurationError, match="axes"):
        StoreLayout((0, 0), (10,), (0,), (5,), (0,), (5,), "valid")
    with pytest.raises(ConfigurationError, match="at least one axis"):
        StoreLayout((), (), (), (), (), (), "valid")
    with pytest.raises(ConfigurationError, match="64 bits"):
        StoreLayout((2**63,), (10,), (0,), (5,), (0,), (5,), "valid")
    with pytest.raises(ValueError):
        StoreLayout((0,), (10,), (0,), (5,), (0,), (5,), "VALID")


def test_layout_normalises_sequences_to_int_tuples() -> None:
    layout = StoreLayout([0, 0], [30, 40], [0, 0], [10, 10], [0, 0], [10, 10], "valid")  # type: ignore[arg-type]
    assert layout.total_shape == (30, 40)
    assert layout_hash(layout) == layout_hash(simple((0, 0), (30, 40), (10, 10)))


# -- metadata text ----------------------------------------------------------------------

DONE_3x4 = """{
  "attributes": {},
  "chunk_grid": {
    "configuration": {
      "chunk_shape": [
        3,
        4
      ]
    },
    "name": "regular"
  },
  "chunk_key_encoding": {
    "configuration": {
      "separator": "/"
    },
    "name": "default"
  },
  "codecs": [
    {
      "configuration": {
        "endian": "little"
      },
      "name": "bytes"
    }
  ],
  "data_type": "uint8",
  "fill_value": 0,
  "node_type": "array",
  "shape": [
    3,
    4
  ],
  "storage_transformers": [],
  "zarr_format": 3
}
"""


def test_array_metadata_text_is_byte_exact() -> None:
    assert dump_metadata(array_metadata("uint8", (3, 4))) == DONE_3x4.encode()
    wall = dump_metadata(array_metadata("float32", (5,))).decode()
    assert '"fill_value": 0.0,' in wall
    assert '"data_type": "float32",' in wall
    assert wall.endswith("}\n")


def test_group_metadata_text_for_a_daisy_store_is_byte_exact() -> None:
    text = dump_metadata(group_metadata("ab" * 32, None)).decode()
    assert text == (
        "{\n"
        '  "attributes": {\n'
        f'    "daisy_task_hash": "{"ab" * 32}"\n'
        "  },\n"
        '  "node_type": "group",\n'
        '  "zarr_format": 3\n'
        "}\n"
    )


def test_stat_arrays_order_and_dtypes() -> None:
    assert STAT_ARRAYS == (
        "wall_seconds",
        "cpu_seconds",
        "peak_rss_bytes",
        "io_read_bytes",
        "io_write_bytes",
        "gpu_util_pct",
        "gpu_mem_bytes",
        "worker_id",
        "sent_at",
        "returned_at",
        "cpu_children_seconds",
    )
    assert [ARRAY_DTYPES[n] for n in STAT_ARRAYS] == [
        "float32",
        "float32",
        "uint64",
        "uint64",
        "uint64",
        "float32",
        "uint64",
        "uint32",
        "float64",
        "float64",
        "float32",
    ]
    assert ARRAY_DTYPES["done"] == "uint8"
    assert ARRAY_DTYPES["failures"] == "uint32"


def test_layout_record() -> None:
    layout = make(((5, 0), (100, 60)), ((-10, 0), (30, 10)), ((0, 0), (10, 10)), "overhang")
    assert layout_record(layout) == {
        "version": 1,
        "grid_offset": [5, 0],
        "write_stride": [10, 10],
        "context_ul": [10, 0],
        "context_lr": [10, 0],
        "fit": "overhang",
        "grid_shape": [10, 6],
        "total_shape": [100, 60],
    }


# -- growth plans -----------------------------------------------------------------------


def test_growth_at_the_far_end_keeps_cells_in_place() -> None:
    old = simple((0, 0), (30, 40), (10, 10))
    new = simple((0, 0), (50, 40), (10, 10))
    plan = plan_growth(layout_record(old), new)
    assert plan == StoreGrowth(old_grid=(3, 4), new_grid=(5, 4), shift=(0, 0), clear_done=())


def test_growth_at_the_near_end_shifts_cells() -> None:
    old = simple((20, 0, 0), (30, 10, 10), (10, 5, 5))
    new = simple((-10, -5, 0), (70, 20, 12), (10, 5, 5))
    plan = plan_growth(layout_record(old), new)
    assert isinstance(plan, StoreGrowth)
    assert plan.shift == (3, 1, 0)
    assert plan.old_grid == (3, 2, 2)
    assert plan.new_grid == (7, 4, 3)
    # Every old block lands on the cell the new layout computes for the same position.
    for x in range(3):
        for y in range(2):
            position = (20 + 10 * x, 5 * y, 0)
            assert new.tracking_cell(position) == (((x + 3) * 4 + (y + 1)) * 3 + 0)


def test_growth_with_a_context_wider_than_a_block() -> None:
    old = make(((0, 0), (60, 60)), ((-20, -20), (50, 50)), ((0, 0), (10, 10)))
    new = make(((-30, 0), (120, 60)), ((-20, -20), (50, 50)), ((0, 0), (10, 10)))
    plan = plan_growth(layout_record(old), new)
    assert isinstance(plan, StoreGrowth)
    assert plan.shift == (3, 0)
    first_block_old = old.tracking_cell((20, 20))
    first_block_new = new.tracking_cell((20, 20))
    assert divmod(first_block_old, 6) == (2, 2)
    assert divmod(first_block_new, 6) == (5, 2)


@pytest.mark.parametrize(
    ("new", "reason"),
    [
        (simple((0, 0), (20, 40), (10, 10)), "shrank on axis 0 (its end"),
        (simple((10, 0), (20, 40), (10, 10)), "shrank on axis 0 (its start"),
        (simple((0, 0), (40, 40), (10, 5)), "write stride changed"),
        (simple((-5, 0), (40, 40), (10, 10)), "not a whole number of blocks"),
        (make(((0, 0), (40, 40)), ((-1, 0), (11, 10)), ((0, 0), (10, 10))), "context changed"),
        (make(((0, 0), (40, 40)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), "shrink"), "fit changed"),
        (simple((0, 0, 0), (40, 40, 10), (10, 10, 10)), "does not describe a 3-D layout"),
    ],
)
def test_growth_refusals(new: StoreLayout, reason: str) -> None:
    old = simple((0, 0), (30, 40), (10, 10))
    plan = plan_growth(layout_record(old), new)
    assert isinstance(plan, str)
    assert reason in plan


def test_growth_needs_a_record_of_a_known_version() -> None:
    new = simple((0,), (40,), (10,))
    assert "no bellis_layout" in str(plan_growth(None, new))
    record = layout_record(simple((0,), (30,), (10,)))
    record["version"] = 2
    assert "version" in str(plan_growth(record, new))
    record = layout_record(simple((0,), (30,), (10,)))
    record["grid_shape"] = ["3"]
    assert "does not describe" in str(plan_growth(record, new))


@pytest.mark.parametrize("fit", ["overhang", "shrink"])
def test_partial_boundary_blocks_are_cleared_when_the_boundary_moves(fit: str) -> None:
    old = make(((0, 0), (95, 40)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), fit)
    new = make(((-10, 0), (115, 47)), ((0, 0), (10, 10)), ((0, 0), (10, 10)), fit)
    plan = plan_growth(layout_record(old), new)
    assert isinstance(plan, StoreGrowth)
    assert plan.shift == (1, 0)
    # Axis 0: the old last block [90, 100) was partial (total ended at 95); it sits at
    # old cell 9, new cell 10. Axis 1 ended on a block boundary: nothing to clear.
    assert plan.clear_done == ((0, 10),)


def test_partial_boundary_blocks_stay_when_that_end_did_not_move() -> None:
    old = make(((0,), (95,)), ((0,), (10,)), ((0,), (10,)), "shrink")
    new = make(((-20,), (115,)), ((0,), (10,)), ((0,), (10,)), "shrink")
    plan = plan_growth(layout_record(old), new)
    assert isinstance(plan, StoreGrowth)
    assert plan.clear_done == ()


def test_valid_fit_never_clears() -> None:
    old = simple((0,), (95,), (10,))
    new = simple((0,), (100,), (10,))
    plan = plan_growth(layout_record(old), new)
    assert plan == StoreGrowth(old_grid=(10,), new_grid=(10,), shift=(0,), clear_done=())
