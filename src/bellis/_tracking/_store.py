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

Opening (SPEC §4.4: the stored hash against the layout's, a grown volume migrated, the
arrays checked and mapped) is ``_opening.py``; this module is the open store: its arrays,
the per-block records (the scheduler's hot path) and its lifetime. The file primitives
(atomic writes, the mapped chunks) are in ``_files.py``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._block import STATS_ARRAYS
from .._donemarks import HotWriter
from ..errors import TrackingError
from ._codever import CODE_ARRAY, read_table, register
from ._disk import (
    LOCK_NAME,
    StoreLock,
)
from ._files import (
    cell_count,
    chunk_files,
    clear_cells,
    create_array,
    make_dir,
    map_array,
    open_error,
    rmtree,
)
from ._layout import (
    ARRAY_DTYPES,
    BASE_ARRAYS,
    CACHE_ARRAYS,
    CHECKSUM_ARRAY,
    GRANT_ARRAY,
    NO_WORKER,
    STAT_ARRAYS,
    StoreLayout,
)
from ._opening import open_readable, open_writable

__all__ = ["TrackingStore", "delete_store"]

_log = logging.getLogger("bellis")

_U32_MAX = 2**32 - 1
_NAN = float("nan")
_MEMORYVIEW_FORMATS = {
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "float32": "f",
    "float64": "d",
}


class TrackingStore:
    """One task's open tracking group.

    Build it with :meth:`open` (the scheduler's writable store, created or checked
    against a layout) or :meth:`open_readonly` (inspection). ``done``, ``failures`` and
    the arrays in ``stats`` are ``numpy.memmap`` views of the chunk files, shaped as the
    tracking grid. Cells are C-order flat indices into ``grid_shape``.
    """

    __slots__ = (
        "_arrays",
        "_cache_flats",
        "_cell_count",
        "_checksum_flat",
        "_closed",
        "_code_flat",
        "_code_index",
        "_columns",
        "_cpu_children",
        "_cpu_seconds",
        "_done_flat",
        "_failures_flat",
        "_gpu_mem",
        "_gpu_util",
        "_hot",
        "_io_read",
        "_io_write",
        "_lock",
        "_missing_stats",
        "_peak_rss",
        "_returned_at",
        "_scratch",
        "_sent_at",
        "_stats",
        "_tracks_resources",
        "_views",
        "_wall_seconds",
        "_worker_id",
        "_writable",
        "created",
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
        #: True when this open created the ``done`` array: no block is done yet, and a
        #: reader need not scan it
        self.created = False
        self.runs_jsonl = path / "runs.jsonl"
        self.task_hash = task_hash
        self.record = record
        self._arrays = arrays
        self._stats = {n: arrays[n] for n in STAT_ARRAYS if n in arrays}
        self._cell_count = cell_count(grid_shape)
        self._writable = writable
        self._closed = False
        self._tracks_resources = tracks_resources
        self._done_flat = self._flat("done")
        self._failures_flat = self._flat("failures")
        self._missing_stats: tuple[str, ...] = ()
        self._views: list[memoryview] = []
        self._columns: dict[str, NDArray[Any]] = {}
        self._code_flat: Any = None
        self._code_index = 0
        self._checksum_flat: Any = None
        self._cache_flats: list[NDArray[Any]] | None = None
        self._hot: HotWriter | None = None
        self._scratch = False

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
        cannot follow it (a grown volume can, see ``_opening``), and
        :class:`TrackingError` for invalid metadata and IO errors: a full disk (every
        chunk's blocks are reserved here), a read-only filesystem, and a store that another
        run holds (its lock is held from here to :meth:`close`).
        """
        display = os.fspath(path)
        root = Path(path)
        names = BASE_ARRAYS + (STAT_ARRAYS if resource_tracking else ())
        files = chunk_files(root, layout.grid_shape, names)
        try:
            lock = StoreLock.acquire(make_dir(root), display)
        except OSError as exc:
            raise open_error(display, exc, files) from exc
        try:
            store = cls._open(root, display, layout, resource_tracking, lock)
        except OSError as exc:
            lock.release()
            raise open_error(display, exc, files) from exc
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
        opened = open_writable(root, display, layout, resource_tracking)
        store = cls(
            root,
            layout,
            opened.grid,
            opened.arrays,
            writable=True,
            tracks_resources=resource_tracking,
            task_hash=opened.task_hash,
            record=opened.record,
            migrated_from=opened.migrated_from,
            lock=lock,
        )
        store._missing_stats = opened.missing
        store.created = opened.created
        if not opened.missing and resource_tracking:
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
                self._arrays[name] = create_array(self.path, name, self.grid_shape)
        except OSError as exc:
            files = chunk_files(self.path, self.grid_shape, missing)
            raise open_error(str(self.path), exc, files) from exc
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

    def _fast(self, name: str, array: Any = None) -> Any:
        """A flat, writable view of array ``name`` for per-block stores.

        A typed ``memoryview`` takes a Python number about three times faster than a
        numpy scalar assignment, and ``record_success`` writes eleven per block. The
        chunks are little-endian, so that is only used on little-endian hosts.
        """
        flat = self._flat(name) if array is None else array.reshape(-1).view(np.ndarray)
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
            opened = open_readable(Path(path), display)
        except OSError as exc:
            raise TrackingError(
                f"io error opening block tracking at {display}: {exc}", path=display
            ) from exc
        return cls(
            Path(path),
            None,
            opened.grid,
            opened.arrays,
            writable=False,
            tracks_resources=False,
            task_hash=opened.task_hash,
            record=opened.record,
        )

    def scratch(self) -> TrackingStore:
        """This read-only store with its done markers as a private, writable copy: what a
        dry run's scheduler finds after the clears of ``on_code_change="rerun"``
        (:meth:`clear_done` takes them; the store on disk is never written)."""
        if self._writable:
            raise TrackingError(
                f"block tracking at {self.path}: only a read-only store has a scratch copy",
                path=str(self.path),
            )
        copy = np.array(self._array("done")).view(np.memmap)
        store = TrackingStore(
            self.path,
            self.layout,
            self.grid_shape,
            {**self._arrays, "done": copy},
            writable=False,
            tracks_resources=False,
            task_hash=self.task_hash,
            record=self.record,
        )
        store._scratch = True
        return store

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

    def hot_writer(self) -> HotWriter | None:
        """The scheduler's per-block fast path for blocks that come back unmeasured
        (``bellis._donemarks``): ``writer.done[cell] = 1`` (after ``writer.code[cell] =
        writer.code_index``) instead of a :meth:`record_success` call. Typed
        ``memoryview``s of the mapped chunks, released when the store closes; None for a
        store that cannot take writes. A new writer after :meth:`use_code`."""
        if not self._writable:
            return None
        if self._hot is None:
            self._hot = HotWriter(
                self._view(self._done_flat, "uint8"), self._code_flat, self._code_index
            )
        return self._hot

    def is_done(self, cell: int) -> bool:
        """Whether ``cell`` is marked done; False for a cell outside the grid."""
        if self._closed:
            raise self._refuse_write()
        return 0 <= cell < self._cell_count and bool(self._done_flat[cell])

    def grants(self) -> np.memmap[Any, Any] | None:
        """The ``memory_grant_mb`` array, or None for a store that never recorded one."""
        self._array("done")  # a closed store raises
        array = self._arrays.get(GRANT_ARRAY)
        if array is None and self._writable and (self.path / GRANT_ARRAY / "zarr.json").exists():
            array = self._optional_array(GRANT_ARRAY)
        return array

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
        gpu_util, gpu_mem, cpu_children (the GPU figures are NaN and 0 where the block's
        process could not measure them). A cell outside the grid is not addressable and is
        ignored (SPEC §4.3).
        """
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        if self._code_flat is not None:
            self._code_flat[cell] = self._code_index
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
        self._gpu_util[cell] = stats[5] if len(stats) > 7 else _NAN
        self._gpu_mem[cell] = stats[6] if len(stats) > 7 else 0
        self._cpu_children[cell] = stats[7] if len(stats) > 7 else 0.0
        # serial runs and unmanaged clients have no worker id (-1): stored as NO_WORKER
        self._worker_id[cell] = worker_id if worker_id >= 0 else NO_WORKER
        self._sent_at[cell] = sent_at
        self._returned_at[cell] = returned_at

    def record_skip(self, cell: int) -> None:
        """Mark ``cell`` done for a ``check_function`` that found its output: only the done
        byte. Its ``code_version`` keeps what it holds (the code of the run that made the
        block, unknown 0 if none): a check says that the output exists, not which code made
        it. A cell outside the grid is ignored."""
        if not self._writable:
            raise self._refuse_write()
        if 0 <= cell < self._cell_count:
            self._done_flat[cell] = 1

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
        inside the grid), GPU figures included. The caller marks
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
        for name in STATS_ARRAYS:
            columns[name][cells] = table[name]
        columns["worker_id"][cells] = worker_id if worker_id >= 0 else NO_WORKER
        columns["sent_at"][cells] = sent_at
        columns["returned_at"][cells] = returned_at

    def record_grant(self, cell: int, megabytes: int) -> None:
        """Record the memory grant ``cell`` succeeded with after it ran out of memory (the
        ``memory_grant_mb`` array, created by the first such record)."""
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        array = self._optional_array(GRANT_ARRAY)
        array.reshape(-1)[cell] = min(megabytes, _U32_MAX)

    def _optional_array(self, name: str) -> np.memmap[Any, Any]:
        """Array ``name``, mapped, or created when the store lacks it."""
        array = self._arrays.get(name)
        if array is None:
            try:
                if (self.path / name / "zarr.json").exists():
                    array = map_array(self.path, name, self.grid_shape)
                else:
                    array = create_array(self.path, name, self.grid_shape)
            except OSError as exc:
                files = chunk_files(self.path, self.grid_shape, (name,))
                raise open_error(str(self.path), exc, files) from exc
            self._arrays[name] = array
        return array

    def record_checksum(self, cell: int, checksum: int) -> None:
        """Record the checksum of ``cell``'s outputs as its worker read them back
        (``output_checksum``, created by the first record), before the done marker."""
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        flat = self._checksum_flat
        if flat is None:
            flat = self._checksum_flat = self._flat_of(self._optional_array(CHECKSUM_ARRAY))
        flat[cell] = checksum

    def record_cache(self, cell: int, counts: Sequence[int]) -> None:
        """Record what the worker's decoded-chunk cache did for ``cell`` (hits, misses,
        miss_bytes, bypassed: ``CACHE_ARRAYS``, created by the first record)."""
        if not self._writable:
            raise self._refuse_write()
        if not 0 <= cell < self._cell_count:
            return
        flats = self._cache_flats
        if flats is None:
            flats = self._cache_flats = [
                self._flat_of(self._optional_array(name)) for name in CACHE_ARRAYS
            ]
        for flat, count in zip(flats, counts, strict=True):
            flat[cell] = min(int(count), _U32_MAX) if flat.dtype.itemsize == 4 else int(count)

    def cache_counts(self) -> dict[str, np.memmap[Any, Any]] | None:
        """The ``cache_*`` arrays (``CACHE_ARRAYS``) by name, or None for a store that
        never recorded one."""
        self._array("done")  # a closed store raises
        out = {}
        for name in CACHE_ARRAYS:
            array = self._arrays.get(name)
            if array is None and self._writable and (self.path / name / "zarr.json").exists():
                array = self._optional_array(name)
            if array is None:
                return None
            out[name] = array
        return out

    @staticmethod
    def _flat_of(array: np.memmap[Any, Any]) -> NDArray[Any]:
        return array.reshape(-1).view(np.ndarray)

    def checksums(self) -> np.memmap[Any, Any] | None:
        """The ``output_checksum`` array, or None for a store that never recorded one."""
        self._array("done")  # a closed store raises
        array = self._arrays.get(CHECKSUM_ARRAY)
        if array is None and self._writable and (self.path / CHECKSUM_ARRAY / "zarr.json").exists():
            array = self._optional_array(CHECKSUM_ARRAY)
        return array

    def code_versions(self) -> np.memmap[Any, Any] | None:
        """The ``code_version`` array (``_codever``), or None for a store without it."""
        self._array("done")  # a closed store raises
        array = self._arrays.get(CODE_ARRAY)
        if array is None and self._writable and (self.path / CODE_ARRAY / "zarr.json").exists():
            array = self._optional_array(CODE_ARRAY)
        return array

    def use_code_version(self, index: int) -> None:
        """Record every block marked done from now on as made by fingerprint ``index``
        (the ``code_version`` array, created by the first call on a store)."""
        if not self._writable:
            raise self._refuse_write()
        self._code_index = index
        self._code_flat = self._fast(CODE_ARRAY, self._optional_array(CODE_ARRAY))
        self._hot = None

    def code_table(self) -> list[dict[str, Any]]:
        """The store's code-version table (``_codever.read_table``)."""
        return read_table(self.path)

    def use_code(self, record: dict[str, Any], started: float, floor: int = 0) -> int:
        """Register this run's code in the table (``_codever.register``) and record every
        block marked done from now on with its index; returns the index."""
        if not self._writable:
            raise self._refuse_write()
        index, _table = register(self.path, record, started, floor)
        self.use_code_version(index)
        return index

    def clear_done(self, cells: Sequence[int] | NDArray[np.intp]) -> int:
        """Clear the done markers of flat ``cells`` (``on_code_change="rerun"``); returns
        how many were done. Cells outside the grid are ignored. Only the done byte: the
        failure counts, figures and code versions stay."""
        if not (self._writable or self._scratch) or self._closed:
            raise self._refuse_write()
        return clear_cells(self._done_flat, cells)

    @property
    def code_index(self) -> int:
        """The fingerprint index blocks marked done now are recorded with (0: none)."""
        return self._code_index

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
            # a copy: the run loop's flusher thread flushes while the driver may still
            # record, and a first record of an optional array adds it to the dict
            for array in list(self._arrays.values()):
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
        self._code_flat = None
        self._checksum_flat = None
        self._cache_flats = None
        self._hot = None
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
                rmtree(target)
            finally:
                lock.release()
        else:
            rmtree(target)
    except OSError as exc:
        raise TrackingError(
            f"failed to clear block tracking at {display}: {exc}", path=display
        ) from exc
    return display
