"""Opening a tracking store on disk: its group against the layout, its arrays checked and
mapped, for a run (writable) or for reading.

Opening (SPEC §4.4) compares the stored ``daisy_task_hash`` with the layout's. A match
reuses the store, a bare array (an old daisy store) or a mismatch raises
:class:`~bellis.errors.LayoutMismatch`, and a group without a hash is a caller-provided
store whose arrays are checked by shape and dtype.

Growing a volume
----------------
bellis also records the structural layout (``bellis_layout``, see ``_layout.py``). When
the hash differs but :func:`~bellis._tracking._layout.plan_growth` finds that the old
grid sits inside the new one at a whole-cell shift, the store is migrated instead of
refused (``_migrate.py``, whose docstring tells why a crash anywhere leaves a usable store).
Every writable open first runs its recovery. :func:`open_readable` applies the same rule
without writing: an array that has a ``c.pre-<H>`` is read from there.

What is opened here is plain data (:class:`Opened`); ``_store.TrackingStore`` wraps it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrackingError
from ._codever import CODE_ARRAY
from ._disk import check_space, unreserved_bytes
from ._files import (
    chunk_files,
    chunk_parts,
    create_array,
    map_array,
    map_readonly,
    read_json,
    write_atomic,
)
from ._layout import (
    ARRAY_DTYPES,
    BASE_ARRAYS,
    CACHE_ARRAYS,
    CHECKSUM_ARRAY,
    GRANT_ARRAY,
    STAT_ARRAYS,
    StoreGrowth,
    StoreLayout,
    check_array,
    dump_metadata,
    group_metadata,
    int_shape,
    invalid_metadata,
    layout_hash,
    layout_mismatch,
    layout_record,
    plan_growth,
    reshaped_metadata,
)
from ._migrate import PRE_PREFIX, migrate, recover

__all__ = ["Opened", "open_readable", "open_writable"]

_log = logging.getLogger("bellis")


@dataclass(frozen=True)
class Opened:
    """A store's group and arrays as an open found them."""

    grid: tuple[int, ...]
    arrays: dict[str, np.memmap[Any, Any]]
    task_hash: str | None  # the group's ``daisy_task_hash``
    record: dict[str, Any] | None  # the group's ``bellis_layout``
    migrated_from: tuple[int, ...] | None = None  # the grid before this open grew it
    missing: tuple[str, ...] = ()  # resource arrays not created yet (``open_stats``)
    created: bool = False  # this open created the ``done`` array


def open_writable(root: Path, display: str, layout: StoreLayout, resource_tracking: bool) -> Opened:
    """The store at ``root`` for a run of ``layout``, under the run lock the caller holds:
    the group created, reused, recovered or migrated (or refused), then its arrays
    checked, mapped or created. The resource arrays the store lacks are left out
    (:attr:`Opened.missing`), but their room on the disk is checked now."""
    stored, record, migrated_from = _check_group(root, display, layout)
    grid = layout.grid_shape
    names = BASE_ARRAYS + (STAT_ARRAYS if resource_tracking else ())
    # the resource arrays open_stats() creates later are counted now: a full disk is
    # an error here, before any block runs
    check_space(display, unreserved_bytes(chunk_files(root, grid, names)), root)
    arrays: dict[str, np.memmap[Any, Any]] = {}
    missing: list[str] = []
    created: list[str] = []
    for name in names:
        meta_file = root / name / "zarr.json"
        meta = read_json(meta_file)
        if meta is not None:
            check_array(display, meta_file, meta, grid, ARRAY_DTYPES[name])
            arrays[name] = map_array(root, name, grid)
        elif name in BASE_ARRAYS:
            if not root.joinpath(name, "c", *chunk_parts(len(grid))).exists():
                created.append(name)
            arrays[name] = create_array(root, name, grid)
        else:
            missing.append(name)  # created by open_stats()
    return Opened(
        grid,
        arrays,
        stored,
        record,
        migrated_from,
        missing=tuple(missing),
        created="done" in created,
    )


def _check_group(
    root: Path, display: str, layout: StoreLayout
) -> tuple[Any, dict[str, Any], tuple[int, ...] | None]:
    """The group's hash against ``layout``'s (the module docstring): returns the hash the
    store carries now, the layout record and the grid it was migrated from, if it was."""
    expected = layout_hash(layout)
    record = layout_record(layout)
    group_file = root / "zarr.json"
    group = read_json(group_file)
    migrated_from: tuple[int, ...] | None = None
    stored: Any = None
    if group is None:
        write_atomic(group_file, dump_metadata(group_metadata(expected, record)))
        stored = expected
    else:
        node_type = group.get("node_type")
        attributes = group.get("attributes")
        if not isinstance(attributes, dict):
            attributes = {}
        stored = attributes.get("daisy_task_hash")
        if stored is not None and not isinstance(stored, str):
            raise invalid_metadata(str(group_file), "attributes.daisy_task_hash is not a string")
        if node_type == "group" and stored is not None:
            recover(root, stored, attributes.get("bellis_layout"))
        if stored is None:
            if node_type != "group":
                raise invalid_metadata(
                    display,
                    f"tracking path {display} exists but is not a zarr group "
                    f"(node_type = {json.dumps(node_type)}) and carries no daisy_task_hash; "
                    f"delete it to start fresh:\n    rm -rf {display}",
                )
        elif stored == expected:
            if node_type != "group":
                raise layout_mismatch(
                    display,
                    f'<zarr node_type = {json.dumps(node_type)}, expected "group">',
                    expected,
                )
            if attributes.get("bellis_layout") != record:
                updated = dict(group)
                updated["attributes"] = {**attributes, "bellis_layout": record}
                write_atomic(group_file, dump_metadata(updated))
        else:
            plan: StoreGrowth | str = "the store is not a zarr group"
            if node_type == "group":
                plan = plan_growth(attributes.get("bellis_layout"), layout)
            if isinstance(plan, str):
                _log.info("block tracking at %s cannot follow the new layout: %s", display, plan)
                raise layout_mismatch(display, stored, expected)
            migrate(root, display, {**group, "attributes": attributes}, plan, expected, record)
            migrated_from = plan.old_grid
            stored = expected
    return stored, record, migrated_from


def open_readable(root: Path, display: str) -> Opened:
    """An existing store's arrays, mapped read-only, with no layout to check against:
    ``done`` and ``failures`` are required, every other array present is mapped."""
    group = read_json(root / "zarr.json")
    if group is None:
        raise TrackingError(f"no block tracking at {display} (zarr.json is missing)", path=display)
    node_type = group.get("node_type")
    if node_type != "group":
        raise invalid_metadata(
            display,
            f"tracking path {display} exists but is not a zarr group "
            f"(node_type = {json.dumps(node_type)}); delete it to start fresh:\n"
            f"    rm -rf {display}",
        )
    attributes = group.get("attributes")
    if not isinstance(attributes, dict):
        attributes = {}
    stored = attributes.get("daisy_task_hash")
    stored = stored if isinstance(stored, str) else None
    record = attributes.get("bellis_layout")
    record = record if isinstance(record, dict) else None
    committed_grid = int_shape(record.get("grid_shape")) if record is not None else None
    pre_name = PRE_PREFIX + stored if stored is not None else None

    grid: tuple[int, ...] | None = committed_grid
    arrays: dict[str, np.memmap[Any, Any]] = {}
    for name in (
        BASE_ARRAYS + STAT_ARRAYS + (CODE_ARRAY, CHECKSUM_ARRAY, GRANT_ARRAY) + CACHE_ARRAYS
    ):
        directory = root / name
        meta_file = directory / "zarr.json"
        meta = read_json(meta_file)
        if meta is None:
            if name in BASE_ARRAYS:
                raise invalid_metadata(display, f"the group has no {name!r} array")
            continue
        chunk_dir = directory / "c"
        if pre_name is not None and (directory / pre_name).exists():
            chunk_dir = directory / pre_name
            meta = reshaped_metadata(meta, committed_grid) if committed_grid is not None else meta
        if grid is None:
            shape = int_shape(meta.get("shape"))
            if shape is None:
                raise invalid_metadata(display, f"{meta_file} has no valid shape")
            grid = shape
        check_array(display, meta_file, meta, grid, ARRAY_DTYPES[name])
        dtype = np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")
        arrays[name] = map_readonly(
            chunk_dir.joinpath(*chunk_parts(len(grid))), dtype, grid, display
        )
    assert grid is not None
    return Opened(grid, arrays, stored, record)
