"""The geometry a tracking store is written for, its hash, and the zarr metadata it writes.

Everything here is pure: plain integer tuples in, strings and dictionaries out.

Two descriptions of a layout are persisted in the group's ``zarr.json`` attributes:

``daisy_task_hash``
    SHA-256 over ``(total, read, write, fit)`` exactly as daisy 2.0.0 computes it, so a
    store written by either implementation is recognised by the other.
``bellis_layout``
    bellis's structural record: the tracking grid's anchor (``grid_offset``), its stride
    (``write_stride``), the read/write context, ``fit``, the grid shape and the total
    shape. It is what lets a grown volume keep its resume state (:func:`plan_growth`);
    daisy ignores it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._block import NO_WORKER, STAMP_ARRAYS, STATS_ARRAYS
from ..errors import ConfigurationError, LayoutMismatch, TrackingError

__all__ = [
    "ARRAY_DTYPES",
    "BASE_ARRAYS",
    "CACHE_ARRAYS",
    "CHECKSUM_ARRAY",
    "GRANT_ARRAY",
    "LAYOUT_RECORD_VERSION",
    "NO_WORKER",
    "STAT_ARRAYS",
    "StoreGrowth",
    "StoreLayout",
    "array_metadata",
    "check_array",
    "check_chunking",
    "dump_metadata",
    "format_roi",
    "group_metadata",
    "int_shape",
    "invalid_metadata",
    "layout_hash",
    "layout_mismatch",
    "layout_record",
    "numpy_dtype",
    "plan_growth",
    "reshaped_metadata",
]


BASE_ARRAYS: tuple[str, ...] = ("done", "failures")
"""The arrays every store has."""

GRANT_ARRAY = "memory_grant_mb"
"""The memory grant (megabytes) a block succeeded with after it ran out of memory; 0: the
task's request. Created when a store first records one: older stores lack it."""

CHECKSUM_ARRAY = "output_checksum"
"""The checksum of a done block's declared outputs as the worker read them back
(``Task(verify_outputs=True)``; ``bellis._outputs._readback``): bit 32 set means recorded,
the low 32 bits are the CRC-32C; 0: none recorded. Created when a store first records one."""

CACHE_ARRAYS: tuple[str, ...] = (
    "cache_hits",
    "cache_misses",
    "cache_miss_bytes",
    "cache_bypassed",
)
"""What the worker's decoded-chunk cache did for each block of a task with declared
inputs (``Task(inputs=...)``; ``bellis._worker._chunkcache``), in
``_protocol.CACHE_COUNTS`` order: chunks served from memory, chunks decoded from the
store, the bytes decoded, and reads of an input the run writes that were not cached (not
proven final: ``_outputs._inputs``). Created
when a store first records one: stores of tasks without inputs lack them."""

STAT_ARRAYS: tuple[str, ...] = (*STATS_ARRAYS[:7], *STAMP_ARRAYS, STATS_ARRAYS[7])
"""The arrays a store opened with ``resource_tracking`` has, in SPEC §4.2 order.

``cpu_children_seconds`` is bellis's addition (CPU of the child processes a block
started); daisy 2.0.0 neither writes nor reads it.
"""

ARRAY_DTYPES: dict[str, str] = {
    "done": "uint8",
    "failures": "uint32",
    "wall_seconds": "float32",
    "cpu_seconds": "float32",
    "peak_rss_bytes": "uint64",
    "io_read_bytes": "uint64",
    "io_write_bytes": "uint64",
    "gpu_util_pct": "float32",
    "gpu_mem_bytes": "uint64",
    "worker_id": "uint32",
    "sent_at": "float64",
    "returned_at": "float64",
    "cpu_children_seconds": "float32",
    "memory_grant_mb": "uint32",
    "code_version": "uint16",
    "output_checksum": "uint64",
    "cache_hits": "uint32",
    "cache_misses": "uint32",
    "cache_miss_bytes": "uint64",
    "cache_bypassed": "uint32",
}
"""The zarr v3 ``data_type`` of every array bellis knows."""

LAYOUT_RECORD_VERSION = 1

_FITS = {"valid": "Valid", "overhang": "Overhang", "shrink": "Shrink"}
_HASH_DOMAIN = b"daisy-tracking:v1\n"
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class StoreLayout:
    """The task geometry a tracking store is written for.

    ``total_*`` is the task's whole region (read context included); ``read_*`` and
    ``write_*`` are the per-block templates, relative to each other, as daisy takes
    them. ``fit`` is ``"valid"``, ``"overhang"`` or ``"shrink"``.
    """

    total_offset: tuple[int, ...]
    total_shape: tuple[int, ...]
    read_offset: tuple[int, ...]
    read_shape: tuple[int, ...]
    write_offset: tuple[int, ...]
    write_shape: tuple[int, ...]
    fit: str

    def __post_init__(self) -> None:
        fields = (
            ("total_offset", self.total_offset),
            ("total_shape", self.total_shape),
            ("read_offset", self.read_offset),
            ("read_shape", self.read_shape),
            ("write_offset", self.write_offset),
            ("write_shape", self.write_shape),
        )
        dims = len(self.total_offset)
        if dims == 0:
            raise ConfigurationError(
                "a tracking layout needs at least one axis", parameter="total_roi"
            )
        for name, value in fields:
            object.__setattr__(self, name, tuple(int(v) for v in value))
            if len(value) != dims:
                raise ConfigurationError(
                    f"tracking layout {name} has {len(value)} axes, total_offset has {dims}",
                    parameter=name,
                )
            for v in value:
                if not _I64_MIN <= int(v) <= _I64_MAX:
                    raise ConfigurationError(
                        f"tracking layout {name} component {v} does not fit in 64 bits",
                        parameter=name,
                    )
        if self.fit not in _FITS:
            raise ConfigurationError(
                f"unknown fit mode: {self.fit!r} (expected 'valid', 'overhang' or 'shrink')",
                parameter="fit",
            )

    @property
    def ndim(self) -> int:
        return len(self.total_offset)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Tracking-grid cells per axis: ``ceil(total_shape / write_shape)``, at least 1.

        An axis whose write shape is not positive counts as one cell, as daisy does.
        """
        out = []
        for t, w in zip(self.total_shape, self.write_shape, strict=True):
            out.append(max(1, -(-t // w)) if w > 0 else 1)
        return tuple(out)

    @property
    def cell_count(self) -> int:
        n = 1
        for g in self.grid_shape:
            n *= g
        return n

    @property
    def context_ul(self) -> tuple[int, ...]:
        """Upper-left context: ``write_offset - read_offset``."""
        return tuple(w - r for w, r in zip(self.write_offset, self.read_offset, strict=True))

    @property
    def context_lr(self) -> tuple[int, ...]:
        """Lower-right context: ``(read_offset + read_shape) - (write_offset + write_shape)``."""
        return tuple(
            (ro + rs) - (wo + ws)
            for ro, rs, wo, ws in zip(
                self.read_offset, self.read_shape, self.write_offset, self.write_shape, strict=True
            )
        )

    @classmethod
    def from_record(cls, record: Any) -> StoreLayout | None:
        """The geometry a ``bellis_layout`` record describes, or None for a store without a
        usable record (daisy 2.0.0's stores carry only the hash: their read context and fit
        are unknown).

        The record holds the anchor, the stride, both contexts, ``fit`` and the total
        shape, which is all the block geometry needs; the absolute read and write
        offsets are not recorded, so the layout returned has the read ROI at 0 (its
        :func:`layout_hash` is not the store's, its blocks and ROIs are).
        """
        if not isinstance(record, dict) or record.get("version") != LAYOUT_RECORD_VERSION:
            return None
        offset = record.get("grid_offset")
        dims = len(offset) if isinstance(offset, list) else 0
        parts = [
            _int_list(record, key, dims)
            for key in ("grid_offset", "write_stride", "context_ul", "context_lr", "total_shape")
        ]
        if dims == 0 or any(p is None for p in parts) or record.get("fit") not in _FITS:
            return None
        grid_offset, stride, ul, lr, total = (p for p in parts if p is not None)
        if any(v < 0 for v in (*ul, *lr, *total)) or any(s <= 0 for s in stride):
            return None
        try:
            layout = cls(
                total_offset=grid_offset,
                total_shape=total,
                read_offset=(0,) * dims,
                read_shape=tuple(u + s + v for u, s, v in zip(ul, stride, lr, strict=True)),
                write_offset=ul,
                write_shape=stride,
                fit=str(record["fit"]),
            )
        except ConfigurationError:
            return None
        grid = _int_list(record, "grid_shape", dims)
        if grid is not None and grid != layout.grid_shape:
            return None
        return layout

    @property
    def block_cells(self) -> tuple[tuple[int, int], ...]:
        """Per axis, ``(first, count)``: the tracking cells ``first .. first + count - 1``
        hold blocks; every other cell of the grid is one no block maps to.

        Blocks tile the total region shrunk by the read context (daisy's
        ``total_write_roi``) with the write shape as stride: ``valid`` drops a partial
        last block, ``overhang`` and ``shrink`` keep it. Block ``g`` writes from
        ``total_offset + context_ul + g * write_shape``, so it sits in cell
        ``g + context_ul // write_shape`` (the grid is anchored at the total ROI).
        """
        out = []
        for t, u, v, w in zip(
            self.total_shape, self.context_ul, self.context_lr, self.write_shape, strict=True
        ):
            extent = t - u - v
            if w <= 0 or extent <= 0:
                out.append((0, 0))
                continue
            count = extent // w if self.fit == "valid" else -(-extent // w)
            out.append((u // w, count))
        return tuple(out)

    @property
    def block_grid(self) -> tuple[int, ...]:
        """Blocks per axis (the task's ``block_grid_shape``)."""
        return tuple(n for _, n in self.block_cells)

    @property
    def block_count(self) -> int:
        """How many blocks the task has: the cells that are blocks."""
        n = 1
        for g in self.block_grid:
            n *= g
        return n

    def block_axis_masks(self) -> list[NDArray[np.bool_]]:
        """Per axis, which of the grid's cells hold blocks (a cell is a block when it is
        on every axis)."""
        masks = []
        for (first, count), g in zip(self.block_cells, self.grid_shape, strict=True):
            m = np.zeros(g, dtype=bool)
            m[first : first + count] = True
            masks.append(m)
        return masks

    def write_interval(self, axis: int, cell: int) -> tuple[int, int] | None:
        """The ``[begin, end)`` along ``axis`` of the write ROI of the blocks in cell index
        ``cell``, or None when no block maps to it. The one place the report's table, its
        volume hovers and the trace take a block's world ROI from.

        ``shrink`` clips the last block to the total write region; ``overhang`` keeps it
        at full size, past the region, as the block's own ``write_roi`` is.
        """
        first, count = self.block_cells[axis]
        g = cell - first
        if not 0 <= g < count:
            return None
        w = self.write_shape[axis]
        begin = self.total_offset[axis] + self.context_ul[axis] + g * w
        end = begin + w
        if self.fit == "shrink":
            end = min(end, self.total_offset[axis] + self.total_shape[axis] - self.context_lr[axis])
        return begin, end

    def write_intervals(self, axis: int) -> list[tuple[int, int] | None]:
        """:meth:`write_interval` of every cell index along ``axis``."""
        return [self.write_interval(axis, c) for c in range(self.grid_shape[axis])]

    def write_roi_of_cell(
        self, coord: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """``(begin, end)`` of the write ROI of the block in tracking cell ``coord`` (an
        N-d cell index), or None when the cell is not a block."""
        begin, end = [], []
        for axis, c in enumerate(coord):
            iv = self.write_interval(axis, int(c))
            if iv is None:
                return None
            begin.append(iv[0])
            end.append(iv[1])
        return tuple(begin), tuple(end)

    def tracking_cell(self, write_offset: tuple[int, ...]) -> int:
        """The flat C-order tracking cell of a block whose write ROI starts at ``write_offset``.

        ``write_offset`` is absolute (a block's ``write_roi.offset``). Returns -1 when
        the block is not addressable (SPEC §4.3: a negative or out-of-range cell).
        """
        cell = 0
        for o, t, s, g in zip(
            write_offset, self.total_offset, self.write_shape, self.grid_shape, strict=True
        ):
            if s <= 0:
                return -1
            c = (o - t) // s
            if c < 0 or c >= g:
                return -1
            cell = cell * g + c
        return cell


def layout_hash(layout: StoreLayout) -> str:
    """daisy 2.0.0's ``daisy_task_hash`` of a layout (SPEC §4.4), lowercase hex SHA-256.

    The bytes hashed are ``daisy-tracking:v1\\n``, then for ``total``, ``read`` and
    ``write`` in turn: the label, ``:offset=``, every offset component as an 8-byte
    little-endian signed integer followed by ``,``, then ``;shape=`` and the shape
    components likewise, then ``;``; finally ``fit=`` and ``Valid``, ``Overhang`` or
    ``Shrink``.
    """
    h = hashlib.sha256(_HASH_DOMAIN)
    for label, offset, shape in (
        ("total", layout.total_offset, layout.total_shape),
        ("read", layout.read_offset, layout.read_shape),
        ("write", layout.write_offset, layout.write_shape),
    ):
        h.update(label.encode("ascii"))
        h.update(b":offset=")
        for v in offset:
            h.update(struct.pack("<q", v))
            h.update(b",")
        h.update(b";shape=")
        for v in shape:
            h.update(struct.pack("<q", v))
            h.update(b",")
        h.update(b";")
    h.update(b"fit=")
    h.update(_FITS[layout.fit].encode("ascii"))
    return h.hexdigest()


def layout_record(layout: StoreLayout) -> dict[str, Any]:
    """The ``bellis_layout`` group attribute: the structural parameters of a layout."""
    return {
        "version": LAYOUT_RECORD_VERSION,
        "grid_offset": list(layout.total_offset),
        "write_stride": list(layout.write_shape),
        "context_ul": list(layout.context_ul),
        "context_lr": list(layout.context_lr),
        "fit": layout.fit,
        "grid_shape": list(layout.grid_shape),
        "total_shape": list(layout.total_shape),
    }


def dump_metadata(document: dict[str, Any]) -> bytes:
    """A zarr.json document as daisy writes it: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def group_metadata(task_hash: str | None, record: dict[str, Any] | None) -> dict[str, Any]:
    """The group ``zarr.json`` document."""
    attributes: dict[str, Any] = {}
    if task_hash is not None:
        attributes["daisy_task_hash"] = task_hash
    if record is not None:
        attributes["bellis_layout"] = record
    return {"attributes": attributes, "node_type": "group", "zarr_format": 3}


def array_metadata(data_type: str, shape: tuple[int, ...]) -> dict[str, Any]:
    """The ``zarr.json`` of one single-chunk, little-endian, uncompressed tracking array."""
    is_float = data_type.startswith("float")
    return {
        "attributes": {},
        "chunk_grid": {"configuration": {"chunk_shape": list(shape)}, "name": "regular"},
        "chunk_key_encoding": {"configuration": {"separator": "/"}, "name": "default"},
        "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}],
        "data_type": data_type,
        "fill_value": 0.0 if is_float else 0,
        "node_type": "array",
        "shape": list(shape),
        "storage_transformers": [],
        "zarr_format": 3,
    }


@dataclass(frozen=True)
class StoreGrowth:
    """How the arrays of a store move when its volume grew.

    Old cell ``c`` (an N-d grid index) becomes new cell ``c + shift``. ``clear_done``
    lists, per axis, the *new* grid index of a hyperplane whose ``done`` flags are
    cleared because its old blocks were partial (``overhang`` / ``shrink``) at an upper
    boundary that has since moved: the same cells now hold full-size blocks that have
    not run. Failures and stats are carried over unchanged.
    """

    old_grid: tuple[int, ...]
    new_grid: tuple[int, ...]
    shift: tuple[int, ...]
    clear_done: tuple[tuple[int, int], ...]


def _int_list(record: dict[str, Any], key: str, dims: int) -> tuple[int, ...] | None:
    value = record.get(key)
    if not isinstance(value, list) or len(value) != dims:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return tuple(value)


def _partial_last_cell(total: int, ctx_ul: int, ctx_lr: int, stride: int) -> int | None:
    """The grid index of the last block along an axis if that block is partial, else None."""
    extent = total - ctx_ul - ctx_lr
    if extent <= 0 or extent % stride == 0:
        return None
    blocks = -(-extent // stride)
    return ctx_ul // stride + blocks - 1


def plan_growth(record: Any, layout: StoreLayout) -> StoreGrowth | str:
    """Decide whether a store recorded as ``record`` can be remapped onto ``layout``.

    Returns the plan, or a sentence saying why not. The store can follow the task when
    the stride, both contexts and ``fit`` are unchanged, the old anchor lies a
    non-negative whole number of strides above the new one on every axis (so every
    old block sits on the new block lattice), and the new total region contains the
    old one. Anything else — a shrink, a different stride, context or fit, or an anchor
    off the lattice — cannot keep the old cells' meaning.
    """
    if not isinstance(record, dict):
        return "the store has no bellis_layout record"
    if record.get("version") != LAYOUT_RECORD_VERSION:
        return f"unsupported bellis_layout version {record.get('version')!r}"
    dims = layout.ndim
    grid_offset = _int_list(record, "grid_offset", dims)
    stride = _int_list(record, "write_stride", dims)
    ctx_ul = _int_list(record, "context_ul", dims)
    ctx_lr = _int_list(record, "context_lr", dims)
    old_grid = _int_list(record, "grid_shape", dims)
    total_shape = _int_list(record, "total_shape", dims)
    if None in (grid_offset, stride, ctx_ul, ctx_lr, old_grid, total_shape):
        return f"the bellis_layout record does not describe a {dims}-D layout"
    assert grid_offset is not None and stride is not None and ctx_ul is not None
    assert ctx_lr is not None and old_grid is not None and total_shape is not None
    if record.get("fit") != layout.fit:
        return f"fit changed from {record.get('fit')!r} to {layout.fit!r}"
    if stride != layout.write_shape:
        return f"write stride changed from {list(stride)} to {list(layout.write_shape)}"
    if any(s <= 0 for s in stride):
        return "the write stride is not positive on every axis"
    if ctx_ul != layout.context_ul or ctx_lr != layout.context_lr:
        return "the read/write context changed"
    new_grid = layout.grid_shape
    shift: list[int] = []
    clear: list[tuple[int, int]] = []
    for axis in range(dims):
        s = stride[axis]
        delta = grid_offset[axis] - layout.total_offset[axis]
        if delta < 0:
            return f"the volume shrank on axis {axis} (its start moved up)"
        if delta % s != 0:
            return f"the new start on axis {axis} is not a whole number of blocks from the old one"
        old_end = grid_offset[axis] + total_shape[axis]
        new_end = layout.total_offset[axis] + layout.total_shape[axis]
        if new_end < old_end:
            return f"the volume shrank on axis {axis} (its end moved down)"
        k = delta // s
        if k + old_grid[axis] > new_grid[axis]:
            return f"the old grid does not fit in the new one on axis {axis}"
        shift.append(k)
        if layout.fit != "valid" and new_end > old_end:
            last = _partial_last_cell(total_shape[axis], ctx_ul[axis], ctx_lr[axis], s)
            if last is not None and 0 <= last < old_grid[axis]:
                clear.append((axis, last + k))
    return StoreGrowth(
        old_grid=old_grid, new_grid=new_grid, shift=tuple(shift), clear_done=tuple(clear)
    )


# -- metadata checks and errors shared by the store and its readers ---------------------


def invalid_metadata(display: str, reason: str) -> TrackingError:
    return TrackingError(f"block tracking metadata at {display} is invalid: {reason}", path=display)


def layout_mismatch(display: str, stored: str, expected: str) -> LayoutMismatch:
    # an S3 store (docs/cloud.md) is deleted with the AWS command line, not rm
    remove = "aws s3 rm --recursive" if display.startswith("s3://") else "rm -rf"
    return LayoutMismatch(
        f"block tracking at {display} was written for a different task layout "
        f"(stored hash = {stored}, expected = {expected}). Delete it to start fresh:\n"
        f"    {remove} {display}",
        path=display,
        stored=stored,
        expected=expected,
    )


def int_shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return tuple(value)


def check_chunking(display: str, meta_file: Path, meta: dict[str, Any]) -> None:
    """Refuse arrays bellis cannot memory-map: several chunks, compression, big endian."""
    shape = meta.get("shape")
    grid = meta.get("chunk_grid")
    chunk_shape = (
        grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None
    )
    encoding = meta.get("chunk_key_encoding")
    separator = None
    if isinstance(encoding, dict) and encoding.get("name") == "default":
        separator = (encoding.get("configuration") or {}).get("separator", "/")
    codecs = meta.get("codecs")
    plain = (
        isinstance(codecs, list)
        and len(codecs) == 1
        and isinstance(codecs[0], dict)
        and codecs[0].get("name") == "bytes"
        and (codecs[0].get("configuration") or {}).get("endian", "little") == "little"
    )
    empty = isinstance(shape, list) and 0 in shape
    if not empty and (chunk_shape != shape or separator != "/" or not plain):
        raise invalid_metadata(
            display,
            f"{meta_file} is not a single-chunk, uncompressed, little-endian array with "
            "'/'-separated chunk keys (bellis memory-maps the chunk)",
        )


def check_array(
    display: str,
    meta_file: Path,
    meta: dict[str, Any],
    shape: tuple[int, ...],
    data_type: str,
) -> None:
    """SPEC §4.4: an existing array must have the layout's grid shape and its dtype."""
    if meta.get("node_type") != "array":
        raise invalid_metadata(display, f"{meta_file} is not a zarr array")
    stored_shape = meta.get("shape")
    if int_shape(stored_shape) != shape:
        raise invalid_metadata(
            display,
            f"{meta_file} shape inconsistent with task layout "
            f"(stored = {json.dumps(stored_shape)}, expected = {json.dumps(list(shape))})",
        )
    stored_type = meta.get("data_type")
    if stored_type != data_type:
        raise invalid_metadata(
            display,
            f"{meta_file} dtype is {json.dumps(stored_type)}, expected {json.dumps(data_type)}",
        )
    check_chunking(display, meta_file, meta)


def reshaped_metadata(meta: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    out = dict(meta)
    out["shape"] = list(shape)
    grid = dict(out.get("chunk_grid") or {"name": "regular"})
    configuration = dict(grid.get("configuration") or {})
    configuration["chunk_shape"] = list(shape)
    grid["configuration"] = configuration
    out["chunk_grid"] = grid
    return out


def numpy_dtype(display: str, meta_file: Path, data_type: Any) -> np.dtype[Any]:
    try:
        dtype = np.dtype(str(data_type))
    except TypeError as exc:
        raise invalid_metadata(display, f"{meta_file} has data_type {data_type!r}") from exc
    return dtype.newbyteorder("<")


def format_roi(begin: tuple[int, ...], end: tuple[int, ...]) -> str:
    """A world ROI as the report writes it: ``[b0:e0, b1:e1)``, half-open on every axis."""
    return "[" + ", ".join(f"{b}:{e}" for b, e in zip(begin, end, strict=True)) + ")"
