"""The block tracking store: a Zarr v3 group of memory-mapped, single-chunk arrays.

Theory of operation
===================

On disk (SPEC §4.2)::

    <path>/zarr.json           group; attributes daisy_task_hash and bellis_layout
    <path>/<array>/zarr.json   array metadata: shape = tracking grid, one chunk, bytes codec
    <path>/<array>/c/0[/0...]  the chunk: a raw little-endian element array
    <path>/runs.jsonl          one JSON line per run (written by the report layer)

Every array holds one element per tracking-grid cell, C order. The chunk file is
created at its full length, its blocks are reserved (``_disk.reserve``: a store into an
unallocated page of a full disk would be a SIGBUS, not an exception) and it is
memory-mapped, so recording a block is a few element stores into the mapping: no
syscall per block. A run holds the store's lock (``_disk.StoreLock``) from open to
close; recovery and migration happen under it. The maps are the only copy of
the data; ``flush()`` msyncs them and readers (zarr-python included) see every store as
soon as it is made, because they read the same page cache.

Opening (SPEC §4.4) compares the stored ``daisy_task_hash`` with the layout's. A match
reuses the store, a bare array (an old daisy store) or a mismatch raises
:class:`~bellis.errors.LayoutMismatch`, and a group without a hash is a caller-provided
store whose arrays are checked by shape and dtype.

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

Why a crash anywhere leaves a usable store: every writable open first runs
:func:`_recover`, which reads the group's hash ``H`` and grid ``G`` (the committed state)
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

import errno
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._block import MEASURED_ARRAYS
from ..errors import TrackingError
from ._disk import (
    LOCK_NAME,
    StoreLock,
    check_space,
    disk_full_error,
    is_no_space,
    reserve,
    unreserved_bytes,
)
from ._layout import (
    ARRAY_DTYPES,
    BASE_ARRAYS,
    NO_WORKER,
    STAT_ARRAYS,
    GrowthPlan,
    StoreLayout,
    array_metadata,
    check_array,
    check_chunking,
    dump_metadata,
    group_metadata,
    int_shape,
    invalid_metadata,
    layout_hash,
    layout_mismatch,
    layout_record,
    numpy_dtype,
    plan_growth,
    reshaped_metadata,
)

__all__ = ["TrackingStore", "delete_store"]

_log = logging.getLogger("bellis")

_TMP_PREFIX = ".bellis-tmp-"
_MIGRATING = "c.migrating"
_PRE_PREFIX = "c.pre-"
_U32_MAX = 2**32 - 1
_NAN = float("nan")
_MEMORYVIEW_FORMATS = {
    "uint8": "B",
    "uint32": "I",
    "uint64": "Q",
    "float32": "f",
    "float64": "d",
}

_fault_hook: Callable[[str], None] | None = None
"""Test seam: called with the name of each migration step just completed.

A test sets it to a function that raises at a chosen step to simulate a crash there.
"""


def _step(name: str) -> None:
    if _fault_hook is not None:
        _fault_hook(name)


def _read_json(file: Path) -> dict[str, Any] | None:
    """A zarr.json document, or None when the file does not exist."""
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise invalid_metadata(str(file), str(exc)) from exc
    if not isinstance(document, dict):
        raise invalid_metadata(str(file), "zarr.json does not hold a JSON object")
    return document


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(file: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``file`` through a temporary file in the same directory and ``os.replace``.

    ``durable`` also fsyncs the file and its directory, so the replacement survives a
    power loss; the migration needs that for its commit point, creation does not.
    """
    tmp = file.with_name(f"{_TMP_PREFIX}{os.getpid()}-{file.name}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(file.parent)


def _chunk_parts(ndim: int) -> tuple[str, ...]:
    return ("0",) * max(1, ndim)


def _cell_count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _ensure_chunk(file: Path, nbytes: int, *, reserved: bool = True) -> None:
    """Create the chunk file with ``nbytes`` or resize it to that length, and (``reserved``)
    allocate all of its blocks, so that no store into its mapping can meet a full disk."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != nbytes:
            os.ftruncate(fd, nbytes)
        if reserved:
            reserve(fd, nbytes)
    finally:
        os.close(fd)


def _chunk_files(
    root: Path, grid: tuple[int, ...], names: tuple[str, ...]
) -> list[tuple[Path, int]]:
    """The chunk file and byte size of each of the arrays ``names`` on ``grid``."""
    cells = _cell_count(grid)
    parts = _chunk_parts(len(grid))
    return [
        (root.joinpath(name, "c", *parts), cells * np.dtype(ARRAY_DTYPES[name]).itemsize)
        for name in names
    ]


def _open_error(display: str, exc: OSError, files: list[tuple[Path, int]]) -> TrackingError:
    """The TrackingError of an OSError while opening: a full disk and a read-only
    filesystem say what to do."""
    if is_no_space(exc):
        return disk_full_error(display, max(1, unreserved_bytes(files)), Path(display))
    if exc.errno == errno.EROFS:
        return TrackingError(
            f"block tracking at {display} is on a read-only filesystem ({exc}); a run "
            f"writes its store. Read it with `bellis status {display}`, or pass "
            "tracking_path= on a writable filesystem",
            path=display,
        )
    return TrackingError(f"io error opening block tracking at {display}: {exc}", path=display)


def _map_writable(file: Path, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.memmap[Any, Any]:
    _ensure_chunk(file, _cell_count(shape) * dtype.itemsize)
    return np.memmap(os.fspath(file), dtype=dtype, mode="r+", shape=shape, order="C")


def _create_array(root: Path, name: str, grid: tuple[int, ...]) -> np.memmap[Any, Any]:
    """Write array ``name``'s metadata and map its (sparse) chunk file."""
    directory = root / name
    directory.mkdir(exist_ok=True)
    _write_atomic(directory / "zarr.json", dump_metadata(array_metadata(ARRAY_DTYPES[name], grid)))
    return _map_array(root, name, grid)


def _map_array(root: Path, name: str, grid: tuple[int, ...]) -> np.memmap[Any, Any]:
    dtype = np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")
    return _map_writable(root.joinpath(name, "c", *_chunk_parts(len(grid))), dtype, grid)


def _map_readonly(
    file: Path, dtype: np.dtype[Any], shape: tuple[int, ...], display: str
) -> np.memmap[Any, Any]:
    """Map a chunk read-only. A missing chunk reads as the fill value (zarr semantics)."""
    nbytes = _cell_count(shape) * dtype.itemsize
    if nbytes == 0 or not file.exists():
        return np.zeros(shape, dtype=dtype).view(np.memmap)
    size = file.stat().st_size
    if size != nbytes:
        raise invalid_metadata(display, f"chunk file {file} is {size} bytes, expected {nbytes}")
    return np.memmap(os.fspath(file), dtype=dtype, mode="r", shape=shape, order="C")


def _child_arrays(root: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Every child directory of the group that holds a zarr array, sorted by name."""
    found = []
    for child in sorted(root.iterdir()):
        if child.is_symlink() or not child.is_dir():
            continue
        meta = _read_json(child / "zarr.json")
        if meta is not None and meta.get("node_type") == "array":
            found.append((child.name, child / "zarr.json", meta))
    return found


def _make_dir(root: Path) -> Path:
    """Create the store directory (and its parents); returns it."""
    root.mkdir(parents=True, exist_ok=True)
    return root


def _rmtree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _recover(root: Path, committed_hash: str, record: Any) -> None:
    """Finish or undo an interrupted migration (see the module docstring)."""
    grid = int_shape(record.get("grid_shape")) if isinstance(record, dict) else None
    pre_name = _PRE_PREFIX + committed_hash
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(_TMP_PREFIX):
            entry.unlink(missing_ok=True)
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        for leftover in sorted(entry.iterdir()):
            if leftover.name.startswith(_TMP_PREFIX):
                leftover.unlink(missing_ok=True)
            elif leftover.name == _MIGRATING:
                _rmtree(leftover)
            elif leftover.name.startswith(_PRE_PREFIX) and leftover.name != pre_name:
                _rmtree(leftover)
        pre = entry / pre_name
        if not pre.exists():
            continue
        current = entry / "c"
        if current.exists():
            _rmtree(current)
        os.rename(pre, current)
        meta = _read_json(entry / "zarr.json")
        if meta is not None and grid is not None and int_shape(meta.get("shape")) != grid:
            _write_atomic(
                entry / "zarr.json", dump_metadata(reshaped_metadata(meta, grid)), durable=True
            )
        _log.info(
            "block tracking at %s: rolled back an interrupted migration of %s", root, entry.name
        )


def _migrate(
    root: Path,
    display: str,
    group: dict[str, Any],
    plan: GrowthPlan,
    new_hash: str,
    record: dict[str, Any],
) -> list[str]:
    """Remap every child array onto the grown grid (four phases, module docstring)."""
    old_hash = group["attributes"]["daisy_task_hash"]
    pre_name = _PRE_PREFIX + old_hash
    ndim = len(plan.new_grid)
    parts = _chunk_parts(ndim)
    arrays = _child_arrays(root)
    target = tuple(slice(k, k + n) for k, n in zip(plan.shift, plan.old_grid, strict=True))
    # the new chunks are written beside the old ones: all of them must fit at once
    cells = _cell_count(plan.new_grid)
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
        _ensure_chunk(old_chunk, _cell_count(plan.old_grid) * dtype.itemsize, reserved=False)
        staging = directory / _MIGRATING
        if staging.exists():
            _rmtree(staging)
        new = _map_writable(staging.joinpath(*parts), dtype, plan.new_grid)
        old = np.memmap(old_chunk, dtype=dtype, mode="r", shape=plan.old_grid, order="C")
        new[target] = old
        if name == "done":
            for axis, index in plan.clear_done:
                new[(slice(None),) * axis + (index,)] = 0
        new.flush()
        del new, old
        for level in staging.joinpath(*parts).parents:
            _fsync_dir(level)
            if level == staging:
                break
        _step(f"prepared {name}")

    for name, meta_file, meta in arrays:
        directory = root / name
        os.rename(directory / "c", directory / pre_name)
        _step(f"moved aside {name}")
        os.rename(directory / _MIGRATING, directory / "c")
        _step(f"moved in {name}")
        _write_atomic(
            meta_file, dump_metadata(reshaped_metadata(meta, plan.new_grid)), durable=True
        )
        _step(f"swapped {name}")

    committed = dict(group)
    attributes = dict(group.get("attributes") or {})
    attributes["daisy_task_hash"] = new_hash
    attributes["bellis_layout"] = record
    committed["attributes"] = attributes
    _write_atomic(root / "zarr.json", dump_metadata(committed), durable=True)
    _step("committed")

    for name, _meta_file, _meta in arrays:
        _rmtree(root / name / pre_name)
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


class TrackingStore:
    """One task's open tracking group.

    Build it with :meth:`open` (the scheduler's writable store, created or checked
    against a layout) or :meth:`open_readonly` (inspection). ``done``, ``failures`` and
    the arrays in ``stats`` are ``numpy.memmap`` views of the chunk files, shaped as the
    tracking grid. Cells are C-order flat indices into ``grid_shape``.
    """

    __slots__ = (
        "_arrays",
        "_cell_count",
        "_closed",
        "_columns",
        "_cpu_children",
        "_cpu_seconds",
        "_done_flat",
        "_failures_flat",
        "_gpu_mem",
        "_gpu_util",
        "_io_read",
        "_io_write",
        "_lock",
        "_missing_stats",
        "_peak_rss",
        "_returned_at",
        "_sent_at",
        "_stats",
        "_tracks_resources",
        "_views",
        "_wall_seconds",
        "_worker_id",
        "_writable",
        "grid_shape",
        "layout",
        "migrated_from",
        "path",
        "record",
        "runs_jsonl",
        "task_hash",
    )

    def __init__(
        self,
        path: Path,
        layout: StoreLayout | None,
        grid_shape: tuple[int, ...],
        arrays: dict[str, np.memmap[Any, Any]],
        *,
        writable: bool,
        tracks_resources: bool,
        task_hash: str | None,
        record: dict[str, Any] | None,
        migrated_from: tuple[int, ...] | None = None,
        lock: StoreLock | None = None,
    ) -> None:
        self.path = path
        self._lock = lock
        self.layout = layout
        self.grid_shape = grid_shape
        self.migrated_from = migrated_from
        self.runs_jsonl = path / "runs.jsonl"
        self.task_hash = task_hash
        self.record = record
        self._arrays = arrays
        self._stats = {n: arrays[n] for n in STAT_ARRAYS if n in arrays}
        self._cell_count = _cell_count(grid_shape)
        self._writable = writable
        self._closed = False
        self._tracks_resources = tracks_resources
        self._done_flat = self._flat("done")
        self._failures_flat = self._flat("failures")
        self._missing_stats: tuple[str, ...] = ()
        self._views: list[memoryview] = []
        self._columns: dict[str, NDArray[Any]] = {}

    def _flat(self, name: str) -> NDArray[Any]:
        return self._arrays[name].reshape(-1).view(np.ndarray)

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        layout: StoreLayout,
        *,
        resource_tracking: bool,
        defer_stats: bool = False,
    ) -> TrackingStore:
        """Open the store at ``path`` for ``layout``, creating it if absent (SPEC §4.4).

        ``defer_stats`` leaves the creation of missing resource arrays to
        :meth:`open_stats` (a distributed run does it while its workers start).

        Raises :class:`LayoutMismatch` when the store belongs to another layout and
        cannot follow it (a grown volume can, see the module docstring), and
        :class:`TrackingError` for invalid metadata and IO errors: a full disk (every
        chunk's blocks are reserved here), a read-only filesystem, and a store that another
        run holds (its lock is held from here to :meth:`close`).
        """
        display = os.fspath(path)
        root = Path(path)
        names = BASE_ARRAYS + (STAT_ARRAYS if resource_tracking else ())
        files = _chunk_files(root, layout.grid_shape, names)
        try:
            lock = StoreLock.acquire(_make_dir(root), display)
        except OSError as exc:
            raise _open_error(display, exc, files) from exc
        try:
            store = cls._open(root, display, layout, resource_tracking, lock)
        except OSError as exc:
            lock.release()
            raise _open_error(display, exc, files) from exc
        except BaseException:
            lock.release()
            raise
        if not defer_stats:
            store.open_stats()
        return store

    @classmethod
    def _open(
        cls,
        root: Path,
        display: str,
        layout: StoreLayout,
        resource_tracking: bool,
        lock: StoreLock,
    ) -> TrackingStore:
        expected = layout_hash(layout)
        record = layout_record(layout)
        group_file = root / "zarr.json"
        group = _read_json(group_file)
        migrated_from: tuple[int, ...] | None = None
        stored: Any = None
        if group is None:
            _write_atomic(group_file, dump_metadata(group_metadata(expected, record)))
            stored = expected
        else:
            node_type = group.get("node_type")
            attributes = group.get("attributes")
            if not isinstance(attributes, dict):
                attributes = {}
            stored = attributes.get("daisy_task_hash")
            if stored is not None and not isinstance(stored, str):
                raise invalid_metadata(
                    str(group_file), "attributes.daisy_task_hash is not a string"
                )
            if node_type == "group" and stored is not None:
                _recover(root, stored, attributes.get("bellis_layout"))
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
                    _write_atomic(group_file, dump_metadata(updated))
            else:
                plan: GrowthPlan | str = "the store is not a zarr group"
                if node_type == "group":
                    plan = plan_growth(attributes.get("bellis_layout"), layout)
                if isinstance(plan, str):
                    _log.info(
                        "block tracking at %s cannot follow the new layout: %s", display, plan
                    )
                    raise layout_mismatch(display, stored, expected)
                _migrate(root, display, {**group, "attributes": attributes}, plan, expected, record)
                migrated_from = plan.old_grid
                stored = expected

        grid = layout.grid_shape
        names = BASE_ARRAYS + (STAT_ARRAYS if resource_tracking else ())
        # the resource arrays open_stats() creates later are counted now: a full disk is
        # an error here, before any block runs
        check_space(display, unreserved_bytes(_chunk_files(root, grid, names)), root)
        arrays: dict[str, np.memmap[Any, Any]] = {}
        missing: list[str] = []
        for name in names:
            meta_file = root / name / "zarr.json"
            meta = _read_json(meta_file)
            if meta is not None:
                check_array(display, meta_file, meta, grid, ARRAY_DTYPES[name])
                arrays[name] = _map_array(root, name, grid)
            elif name in BASE_ARRAYS:
                arrays[name] = _create_array(root, name, grid)
            else:
                missing.append(name)  # created by open_stats()
        store = cls(
            root,
            layout,
            grid,
            arrays,
            writable=True,
            tracks_resources=resource_tracking,
            task_hash=stored,
            record=record,
            migrated_from=migrated_from,
            lock=lock,
        )
        store._missing_stats = tuple(missing)
        if not missing and resource_tracking:
            store._map_stats()
        return store

    def open_stats(self) -> None:
        """Create the resource arrays this store still lacks (a no-op once they exist).

        ``open(..., defer_stats=True)`` leaves their creation (up to eleven arrays:
        directories, metadata and chunk files) to this call, so that a distributed run
        can do it while its workers start. Recording the first measurement, reading
        :attr:`stats` and :meth:`close` call it too.
        """
        missing = self._missing_stats
        if not missing:
            return
        try:
            for name in missing:
                self._arrays[name] = _create_array(self.path, name, self.grid_shape)
        except OSError as exc:
            files = _chunk_files(self.path, self.grid_shape, missing)
            raise _open_error(str(self.path), exc, files) from exc
        self._missing_stats = ()
        self._map_stats()

    def _map_stats(self) -> None:
        arrays = self._arrays
        self._stats = {n: arrays[n] for n in STAT_ARRAYS if n in arrays}
        fast = self._fast
        self._wall_seconds = fast("wall_seconds")
        self._cpu_seconds = fast("cpu_seconds")
        self._peak_rss = fast("peak_rss_bytes")
        self._io_read = fast("io_read_bytes")
        self._io_write = fast("io_write_bytes")
        self._gpu_util = fast("gpu_util_pct")
        self._gpu_mem = fast("gpu_mem_bytes")
        self._worker_id = fast("worker_id")
        self._sent_at = fast("sent_at")
        self._returned_at = fast("returned_at")
        self._cpu_children = fast("cpu_children_seconds")
        self._columns = {name: self._flat(name) for name in STAT_ARRAYS}

    def _fast(self, name: str) -> Any:
        """A flat, writable view of array ``name`` for per-block stores.

        A typed ``memoryview`` takes a Python number about three times faster than a
        numpy scalar assignment, and ``record_success`` writes eleven per block. The
        chunks are little-endian, so that is only used on little-endian hosts.
        """
        flat = self._flat(name)
        if sys.byteorder != "little":
            return flat
        return self._view(flat, ARRAY_DTYPES[name])

    def _view(self, flat: NDArray[Any], data_type: str) -> memoryview:
        """A typed ``memoryview`` of ``flat``, released when the store closes (a write
        through it after that raises instead of going unnoticed)."""
        raw: Any = memoryview(flat.view(np.uint8))  # type: ignore[arg-type]
        view: memoryview = raw.cast(_MEMORYVIEW_FORMATS[data_type])
        self._views.append(view)
        return view

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> TrackingStore:
        """Open an existing store for reading, with no layout to check against.

        For ``bellis status``, ``Task.failed_blocks()`` and reports. Safe while a run
        writes the store, and on stores written by daisy 2.0.0. ``done`` and
        ``failures`` are required; every resource array present is opened.
        """
        display = os.fspath(path)
        try:
            return cls._open_readonly(Path(path), display)
        except OSError as exc:
            raise TrackingError(
                f"io error opening block tracking at {display}: {exc}", path=display
            ) from exc

    @classmethod
    def _open_readonly(cls, root: Path, display: str) -> TrackingStore:
        group = _read_json(root / "zarr.json")
        if group is None:
            raise TrackingError(
                f"no block tracking at {display} (zarr.json is missing)", path=display
            )
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
        pre_name = _PRE_PREFIX + stored if stored is not None else None

        grid: tuple[int, ...] | None = committed_grid
        arrays: dict[str, np.memmap[Any, Any]] = {}
        for name in BASE_ARRAYS + STAT_ARRAYS:
            directory = root / name
            meta_file = directory / "zarr.json"
            meta = _read_json(meta_file)
            if meta is None:
                if name in BASE_ARRAYS:
                    raise invalid_metadata(display, f"the group has no {name!r} array")
                continue
            chunk_dir = directory / "c"
            if pre_name is not None and (directory / pre_name).exists():
                chunk_dir = directory / pre_name
                meta = (
                    reshaped_metadata(meta, committed_grid) if committed_grid is not None else meta
                )
            if grid is None:
                shape = int_shape(meta.get("shape"))
                if shape is None:
                    raise invalid_metadata(display, f"{meta_file} has no valid shape")
                grid = shape
            check_array(display, meta_file, meta, grid, ARRAY_DTYPES[name])
            dtype = np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")
            arrays[name] = _map_readonly(
                chunk_dir.joinpath(*_chunk_parts(len(grid))), dtype, grid, display
            )
        assert grid is not None
        return cls(
            root,
            None,
            grid,
            arrays,
            writable=False,
            tracks_resources=False,
            task_hash=stored,
            record=record,
        )

    # -- the arrays ------------------------------------------------------------------------

    def _array(self, name: str) -> np.memmap[Any, Any]:
        if self._closed:
            raise TrackingError(f"block tracking at {self.path} is closed", path=str(self.path))
        return self._arrays[name]

    @property
    def done(self) -> np.memmap[Any, Any]:
        """``uint8`` per cell, 1 = completed. Writable for a store from :meth:`open`."""
        return self._array("done")

    @property
    def failures(self) -> np.memmap[Any, Any]:
        """``uint32`` per cell: failed attempts, saturating at ``2**32 - 1``."""
        return self._array("failures")

    @property
    def stats(self) -> dict[str, np.memmap[Any, Any]]:
        """The resource arrays by name; empty for a writable store without resource tracking."""
        if self._closed:
            raise TrackingError(f"block tracking at {self.path} is closed", path=str(self.path))
        if self._writable and not self._tracks_resources:
            return {}
        self.open_stats()
        return dict(self._stats)

    @property
    def is_writable(self) -> bool:
        return self._writable

    def done_view(self) -> memoryview | None:
        """A writable ``memoryview`` of the done markers, one byte per cell, or None for
        a store that cannot take writes.

        The scheduler's per-block fast path for blocks that come back unmeasured: one
        ``view[cell] = 1`` instead of a :meth:`record_success` call.
        """
        if not self._writable:
            return None
        return self._view(self._done_flat, "uint8")

    def is_done(self, cell: int) -> bool:
        """Whether ``cell`` is marked done; False for a cell outside the grid."""
        if self._closed:
            raise self._refuse_write()
        return 0 <= cell < self._cell_count and bool(self._done_flat[cell])

    # -- recording (the scheduler's hot path) ----------------------------------------------

    def _refuse_write(self) -> TrackingError:
        state = "closed" if self._closed else "open read-only"
        return TrackingError(f"block tracking at {self.path} is {state}", path=str(self.path))

    def record_success(
        self,
        cell: int,
        stats: tuple[Any, ...] | None,
        worker_id: int,
        sent_at: float,
        returned_at: float,
    ) -> None:
        """Mark ``cell`` done and, with resource tracking and ``stats``, store the figures.

        ``stats`` is ``BlockStats.to_tuple()``: wall, cpu, peak_rss, io_read, io_write,
        gpu_util, gpu_mem, cpu_children. The reserved GPU slots are written NaN and 0.
        A cell outside the grid is not addressable and is ignored (SPEC §4.3).
        """
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        self._done_flat[cell] = 1
        if stats is None or not self._tracks_resources:
            return
        if self._missing_stats:
            self.open_stats()
        self._wall_seconds[cell] = stats[0]
        self._cpu_seconds[cell] = stats[1]
        self._peak_rss[cell] = stats[2]
        self._io_read[cell] = stats[3]
        self._io_write[cell] = stats[4]
        self._gpu_util[cell] = _NAN
        self._gpu_mem[cell] = 0
        self._cpu_children[cell] = stats[7] if len(stats) > 7 else 0.0
        # serial runs and unmanaged clients have no worker id (-1): stored as NO_WORKER
        self._worker_id[cell] = worker_id if worker_id >= 0 else NO_WORKER
        self._sent_at[cell] = sent_at
        self._returned_at[cell] = returned_at

    def record_measured(
        self,
        cells: NDArray[np.intp],
        table: NDArray[Any],
        worker_id: int,
        sent_at: NDArray[np.float64],
        returned_at: NDArray[np.float64],
    ) -> None:
        """Store the figures of many blocks at once, without marking them done.

        ``table`` is a structured array whose field names are the store's resource array
        names (the server's ``STATS_DTYPE``), one record per cell of ``cells`` (every cell
        inside the grid). The reserved GPU slots are written NaN and 0. The caller marks
        the cells done afterwards, so a crash in between leaves figures but no done marker:
        the blocks run again and overwrite them. A store without resource tracking takes
        nothing.
        """
        if not self._writable:
            raise self._refuse_write()
        if not self._tracks_resources or len(cells) == 0:
            return
        if self._missing_stats:
            self.open_stats()
        columns = self._columns
        for name in MEASURED_ARRAYS:
            columns[name][cells] = table[name]
        columns["gpu_util_pct"][cells] = _NAN
        columns["gpu_mem_bytes"][cells] = 0
        columns["worker_id"][cells] = worker_id if worker_id >= 0 else NO_WORKER
        columns["sent_at"][cells] = sent_at
        columns["returned_at"][cells] = returned_at

    def record_failure(
        self, cell: int, worker_id: int = -1, sent_at: float = 0.0, returned_at: float = 0.0
    ) -> None:
        """Count one failed attempt of ``cell``, saturating at ``2**32 - 1``.

        With resource tracking and a known round trip (``returned_at > 0``), a cell that
        is not done also takes the attempt's ``worker_id``, ``sent_at`` and
        ``returned_at``: the stamps of a cell that is not done are those of its last
        failed attempt (a later success overwrites them). Its figures are left alone.
        """
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        failures = self._failures_flat
        count = int(failures[cell])
        if count < _U32_MAX:
            failures[cell] = count + 1
        if returned_at > 0.0 and self._tracks_resources and self._done_flat[cell] == 0:
            if self._missing_stats:
                self.open_stats()
            self._worker_id[cell] = worker_id if worker_id >= 0 else NO_WORKER
            self._sent_at[cell] = sent_at
            self._returned_at[cell] = returned_at

    # -- lifetime --------------------------------------------------------------------------

    def flush(self) -> None:
        """msync every map, so the chunk files on disk hold every recorded block."""
        if not self._writable:
            return
        try:
            for array in self._arrays.values():
                array.flush()
        except OSError as exc:
            raise TrackingError(
                f"io error flushing block tracking at {self.path}: {exc}", path=str(self.path)
            ) from exc

    def close(self) -> None:
        """Flush and release the maps. Closing twice is harmless.

        The maps are released even when creating a missing resource array or the flush
        fails; the error then propagates.
        """
        if self._closed:
            return
        try:
            if self._writable:
                # a resource-tracking store always ends with its arrays, even if no block ran
                self.open_stats()
        finally:
            try:
                self.flush()
            finally:
                self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        for view in self._views:
            view.release()
        self._views = []
        self._closed = True
        self._writable = False
        self._arrays = {}
        self._stats = {}
        self._columns = {}
        empty: NDArray[Any] = np.zeros(0, dtype=np.uint8)
        self._done_flat = self._failures_flat = empty
        if self._tracks_resources:
            self._wall_seconds = self._cpu_seconds = self._peak_rss = empty
            self._io_read = self._io_write = self._gpu_util = self._gpu_mem = empty
            self._worker_id = self._sent_at = self._returned_at = self._cpu_children = empty

    def __enter__(self) -> TrackingStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "closed" if self._closed else ("rw" if self._writable else "r")
        return f"TrackingStore({str(self.path)!r}, grid={list(self.grid_shape)}, {mode})"


def delete_store(path: str | os.PathLike[str]) -> str | None:
    """Delete a tracking store (``Task.reset()``): a directory recursively, a file unlinked.

    Returns the deleted path, or None when nothing exists there. ``runs.jsonl`` inside
    the store goes with it. A store a run holds is refused (:class:`TrackingError` naming
    the run): deleting it would lose that run's records.
    """
    display = os.fspath(path)
    target = Path(path)
    if not os.path.lexists(target):
        return None
    try:
        if not target.is_symlink() and (target / LOCK_NAME).is_file():
            lock = StoreLock.acquire(target, display)
            try:
                _rmtree(target)
            finally:
                lock.release()
        else:
            _rmtree(target)
    except OSError as exc:
        raise TrackingError(
            f"failed to clear block tracking at {display}: {exc}", path=display
        ) from exc
    return display
