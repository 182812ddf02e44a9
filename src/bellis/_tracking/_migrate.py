"""Migration of a tracking store to a grown volume, and recovery from an interrupted one.

Growing a volume
----------------
bellis also records the structural layout (``bellis_layout``, see ``_layout.py``). When
the hash differs but :func:`~bellis._tracking._layout.plan_growth` finds that the old
grid sits inside the new one at a whole-cell shift, the store is migrated instead of
refused. The migration of every child array ``A`` goes in four phases:

1. *prepare*: write the remapped chunk to ``A/c.migrating/0/...`` and msync it;
2. *swap*: rename ``A/c`` to ``A/c.pre-<old hash>``, rename ``A/c.migrating`` to ``A/c``,
   then replace ``A/zarr.json`` (new shape) through a temporary file;
3. *commit*: replace the group ``zarr.json`` (new hash, new record) through a temporary
   file. This single ``os.replace`` is the commit point;
4. *clean*: remove every ``A/c.pre-<old hash>``.

After the commit, the cells the last ``bellis verify`` listed (``verify.json``) are
remapped onto the new grid (``_reset.remap_verify_record``): a summary, so a crash before
it leaves a record of the old grid, which its readers ignore.

Why a crash anywhere leaves a usable store: every writable open first runs
:func:`recover`, which reads the group's hash ``H`` and grid ``G`` (the committed state)
and, in every child directory, deletes ``c.migrating`` and temporary files, then looks at
each ``c.pre-<X>``:

- ``X == H``: the group still names the layout the pre-copy belongs to, so the
  migration had not committed. The pre-copy is the authoritative data: it replaces
  ``c`` and the array's ``zarr.json`` is rewritten with shape ``G``. The store is back to
  the old layout exactly, and an open with the new layout migrates it again.
- ``X != H``: the group was already switched (migrations only happen between
  different hashes), so the pre-copy is stale and is deleted. Commit happens only
  after every array has been swapped, so every ``c`` already holds the new data and
  every ``zarr.json`` already says ``G``.

Before phase 2 touches an array, its ``c`` is untouched (phase 1 only writes beside
it). During phase 2, an array whose ``c`` was moved aside always has its
``c.pre-<old>``, so no state loses the old data. An array's metadata differs between
the two layouts only in its shape fields, so rewriting them from ``G`` is always
correct. Hence the store is always recognised either as the old layout or the new
one, never as a mixture. The steps are
also made durable in that order (msync of the new chunk and fsync of its directories,
fsync of every replaced ``zarr.json`` and of its directory, which also persists the
renames before it), so the argument holds across a power loss too.
``open_readonly`` applies the same rule without writing: an array that has a
``c.pre-<H>`` is read from there.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrackingError
from ._disk import check_space, data_ranges
from ._files import (
    TMP_PREFIX,
    cell_count,
    child_arrays,
    chunk_parts,
    ensure_chunk,
    fsync_dir,
    map_writable,
    read_json,
    rmtree,
    write_atomic,
)
from ._layout import (
    StoreGrowth,
    check_chunking,
    dump_metadata,
    int_shape,
    invalid_metadata,
    numpy_dtype,
    reshaped_metadata,
)
from ._reset import remap_verify_record

__all__ = ["MIGRATING", "PRE_PREFIX", "migrate", "recover"]

_log = logging.getLogger("bellis")

#: an array's new chunk while a migration prepares it
MIGRATING = "c.migrating"
#: an array's old chunk, moved aside (``c.pre-<old hash>``) until the migration is cleaned
PRE_PREFIX = "c.pre-"

_fault_hook: Callable[[str], None] | None = None
"""Test seam: called with the name of each migration step just completed.

A test sets it to a function that raises at a chosen step to simulate a crash there.
"""


def _step(name: str) -> None:
    if _fault_hook is not None:
        _fault_hook(name)


def recover(root: Path, committed_hash: str, record: Any) -> None:
    """Finish or undo an interrupted migration (see the module docstring)."""
    grid = int_shape(record.get("grid_shape")) if isinstance(record, dict) else None
    pre_name = PRE_PREFIX + committed_hash
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(TMP_PREFIX):
            entry.unlink(missing_ok=True)
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        for leftover in sorted(entry.iterdir()):
            if leftover.name.startswith(TMP_PREFIX):
                leftover.unlink(missing_ok=True)
            elif leftover.name == MIGRATING:
                rmtree(leftover)
            elif leftover.name.startswith(PRE_PREFIX) and leftover.name != pre_name:
                rmtree(leftover)
        pre = entry / pre_name
        if not pre.exists():
            continue
        current = entry / "c"
        if current.exists():
            rmtree(current)
        os.rename(pre, current)
        meta = read_json(entry / "zarr.json")
        if meta is not None and grid is not None and int_shape(meta.get("shape")) != grid:
            write_atomic(
                entry / "zarr.json", dump_metadata(reshaped_metadata(meta, grid)), durable=True
            )
        _log.info(
            "block tracking at %s: rolled back an interrupted migration of %s", root, entry.name
        )


def migrate(
    root: Path,
    display: str,
    group: dict[str, Any],
    plan: StoreGrowth,
    new_hash: str,
    record: dict[str, Any],
) -> list[str]:
    """Remap every child array onto the grown grid (four phases, module docstring)."""
    old_hash = group["attributes"]["daisy_task_hash"]
    pre_name = PRE_PREFIX + old_hash
    ndim = len(plan.new_grid)
    parts = chunk_parts(ndim)
    arrays = child_arrays(root)
    target = tuple(slice(k, k + n) for k, n in zip(plan.shift, plan.old_grid, strict=True))
    # the new chunks are written beside the old ones: all of them must fit at once
    cells = cell_count(plan.new_grid)
    check_space(
        display,
        sum(cells * numpy_dtype(display, f, m.get("data_type")).itemsize for _n, f, m in arrays),
        root,
    )

    for name, meta_file, meta in arrays:
        stored = int_shape(meta.get("shape"))
        if stored != plan.old_grid:
            raise invalid_metadata(
                display,
                f"{meta_file} shape inconsistent with task layout "
                f"(stored = {json.dumps(meta.get('shape'))}, "
                f"expected = {json.dumps(list(plan.old_grid))})",
            )
        check_chunking(display, meta_file, meta)
        dtype = numpy_dtype(display, meta_file, meta.get("data_type"))
        directory = root / name
        old_chunk = directory.joinpath("c", *parts)
        ensure_chunk(old_chunk, cell_count(plan.old_grid) * dtype.itemsize, reserved=False)
        staging = directory / MIGRATING
        if staging.exists():
            rmtree(staging)
        new = map_writable(staging.joinpath(*parts), dtype, plan.new_grid)
        old = np.memmap(old_chunk, dtype=dtype, mode="r", shape=plan.old_grid, order="C")
        _copy_data(old_chunk, old, new, target)
        if name == "done":
            for axis, index in plan.clear_done:
                new[(slice(None),) * axis + (index,)] = 0
        new.flush()
        del new, old
        for level in staging.joinpath(*parts).parents:
            fsync_dir(level)
            if level == staging:
                break
        _step(f"prepared {name}")

    for name, meta_file, meta in arrays:
        directory = root / name
        os.rename(directory / "c", directory / pre_name)
        _step(f"moved aside {name}")
        os.rename(directory / MIGRATING, directory / "c")
        _step(f"moved in {name}")
        write_atomic(meta_file, dump_metadata(reshaped_metadata(meta, plan.new_grid)), durable=True)
        _step(f"swapped {name}")

    committed = dict(group)
    attributes = dict(group.get("attributes") or {})
    attributes["daisy_task_hash"] = new_hash
    attributes["bellis_layout"] = record
    committed["attributes"] = attributes
    write_atomic(root / "zarr.json", dump_metadata(committed), durable=True)
    _step("committed")
    # the last verify's listed cells move with their blocks; until this is written the
    # record names the old grid, and its readers list nothing from it (``_reset``)
    try:
        remap_verify_record(root, plan.old_grid, plan.new_grid, plan.shift)
    except (OSError, TrackingError) as exc:
        _log.warning("block tracking at %s: could not remap verify.json: %s", display, exc)

    for name, _meta_file, _meta in arrays:
        rmtree(root / name / pre_name)
        _step(f"cleaned {name}")

    names = [name for name, _f, _m in arrays]
    _log.info(
        "block tracking at %s: volume grew, migrated grid %s -> %s (cell shift %s); arrays: %s",
        display,
        list(plan.old_grid),
        list(plan.new_grid),
        list(plan.shift),
        ", ".join(names) if names else "none",
    )
    return names


#: bytes of the old chunk copied per step of :func:`_copy_data`
_COPY_STEP = 1 << 26


def _copy_data(
    old_chunk: Path,
    old: np.memmap[Any, Any],
    new: np.memmap[Any, Any],
    target: tuple[slice, ...],
) -> None:
    """``new[target] = old``, a slab of axis-0 planes at a time, leaving out slabs that
    lie in a hole of the old chunk (never written, so zeros: the new chunk, just created,
    reads zeros there already). A ``failures`` array without failures costs nothing."""
    if old.size == 0:
        return
    plane = int(np.prod(old.shape[1:])) * old.dtype.itemsize
    fd = os.open(old_chunk, os.O_RDONLY)
    try:
        ranges = data_ranges(fd, old.size * old.dtype.itemsize)
    finally:
        os.close(fd)
    rows = max(1, _COPY_STEP // max(1, plane))
    start = target[0].start
    for z0 in range(0, old.shape[0], rows):
        z1 = min(old.shape[0], z0 + rows)
        lo, hi = z0 * plane, z1 * plane
        if ranges is not None and not any(a < hi and b > lo for a, b in ranges):
            continue
        new[(slice(start + z0, start + z1), *target[1:])] = old[z0:z1]
