"""Tracking stores on S3 (``s3://bucket/prefix``): the done markers held in memory by the
driver and flushed as zarr v3 chunk objects with conditional writes (docs/cloud.md).

On the bucket, the same layout as a local store (SPEC §4.2)::

    <prefix>/zarr.json           group; attributes daisy_task_hash and bellis_layout
    <prefix>/<array>/zarr.json   array metadata (``_layout.array_metadata``)
    <prefix>/<array>/c/0[/0...]  the chunk: the raw little-endian element array
    <prefix>/bellis.lock         the run lock: holder and lease (JSON)
    <prefix>/code_versions.json  the code-version table (``_codever``), written at once
    <prefix>/code_version/...    which run's code made each done block (after a run's
                                 ``use_code``), flushed before ``done``
    <prefix>/runs/, errors/      one object per run (below)
    <prefix>/stats/              the per-block figures: one object per flush that had
                                 new ones (``_s3stats``), merged by the readers

An object store has no memory map and no append: the driver keeps every array in memory,
records a block there, and writes the changed chunks back at most every
``BELLIS_S3_FLUSH_SECONDS`` (default 5) seconds, at :meth:`S3Store.flush` and at
:meth:`S3Store.close`. A marker is set only after its block succeeded, so a crash loses
at most the markers of the last interval (those blocks run again) and never marks a
block done that did not finish. Clearing markers (a stale block, ``verify --reset``) is
written at once: a cleared marker that came back after a crash would be a false "done".

Every chunk write is conditional: ``IfMatch`` the ETag this store last wrote or read
(``IfNoneMatch="*"`` for a chunk that did not exist). A 412 means another writer changed
the chunk: the run stops with a :class:`~bellis.errors.TrackingError` naming the URL.

The lock is an object created with ``IfNoneMatch="*"`` that holds the run's id and a
lease (an expiry time, ``BELLIS_S3_LEASE_SECONDS``, default 120), renewed with
``IfMatch`` at each flush and by a daemon thread every third of the lease, so a run whose
blocks take longer than the lease keeps its lock. A second run is refused while the lease
runs; a lease that has expired (its run was killed) is taken over with a compare-and-swap,
and a warning says so.

A run's ``runs.jsonl`` line and its ``errors.jsonl`` are appended to files in a local
staging folder and written as one object per run (``runs/<start>-<run id>.json``,
``errors/<start>-<run id>.jsonl``) at each flush where they changed and at the close;
a reader (:attr:`S3Store.runs_jsonl` of a read-only store) merges them in start order.

Opening reads the objects by key (no listing); only
:meth:`_s3stores.S3Stores.find_stores` and the readers of the per-run objects list.
The requests and the lock are ``_s3io``'s (made by bellis's lean client or botocore,
``_s3http``), by the driver; the endpoint and
credentials come from the standard AWS configuration (``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, ...), never from a bellis option, and are never printed or stored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._donemarks import HotWriter
from ..errors import TrackingError
from ._codever import CODE_ARRAY, TABLE_NAME, add_entry
from ._files import cell_count, clear_cells
from ._layout import (
    ARRAY_DTYPES,
    CACHE_ARRAYS,
    CHECKSUM_ARRAY,
    GRANT_ARRAY,
    STAT_ARRAYS,
    StoreLayout,
    array_metadata,
    dump_metadata,
    invalid_metadata,
)
from ._s3io import (
    Bucket,
    S3Lock,
    all_of,
    flush_seconds,
    is_s3_url,
    lease_seconds,
    s3_url,
    together,
)
from ._s3open import Creation, chunk_key, conflict, group_of, lock_and_load, read_arrays
from ._s3stats import STATS_PREFIX, StatsLog, encode_stats, read_stats

__all__ = ["S3Store", "flush_seconds", "is_s3_url", "lease_seconds", "s3_url"]

_log = logging.getLogger("bellis.tracking")

#: one object per run: its ``runs.jsonl`` line(s) and its ``errors.jsonl`` (no append on S3)
RUNS_PREFIX = "runs/"
ERRORS_PREFIX = "errors/"
RUNS_FILE = "runs.jsonl"
ERRORS_FILE = "errors.jsonl"


#: the arrays the scheduler's fast path writes (:meth:`S3Store.hot_writer`)
_HOT_ARRAYS = frozenset(("done", CODE_ARRAY))


def _chunk_bytes(arr: NDArray[Any]) -> bytes:
    """An array's one chunk as written: its values, little-endian."""
    return arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def _differs(data: bytes, written: bytes | None) -> bool:
    """Whether a chunk's ``data`` differs from the bytes last written (None: none, all
    zeros)."""
    return data.strip(b"\0") != b"" if written is None else data != written


class S3Store:
    """One task's tracking store on S3 (``_donemarks.BlockStore``), held in memory."""

    def __init__(
        self,
        bucket: Bucket | None,
        url: str,
        grid: tuple[int, ...],
        arrays: dict[str, NDArray[Any]],
        etags: dict[str, str | None],
        group: dict[str, Any],
        *,
        created: bool,
        lock: S3Lock | None,
        scratch: bool = False,
    ) -> None:
        self._bucket = bucket
        self._url = url
        self._grid = grid
        self._arrays = arrays
        self._etags = etags
        self._group = group
        self._created = created
        self._lock = lock
        self._scratch = scratch
        self._dirty: set[str] = set()
        self._interval = flush_seconds() if lock is not None else 0.0
        self._last_flush = time.monotonic()
        self._closed = False
        self._cells = cell_count(grid)
        #: the lease renewal: the flush and the renewer thread take turns
        self._renewing = threading.Lock()
        #: the marker writes: the driver's flush and the renewer's timer take turns
        self._flushing = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        #: a new store's metadata being written (``_s3open.Creation``); every write waits
        self._creation: Creation | None = None
        #: this run's runs.jsonl / errors.jsonl objects: one writer at a time
        self._uploading = threading.Lock()
        #: the renewer's refusal (another run took the store over): raised by the next write
        self._lost: TrackingError | None = None
        #: the run's runs.jsonl / errors.jsonl, staged locally (writable) or merged (read)
        self._staging: str | None = None
        self._opened = time.time()
        self._log_etags: dict[str, str | None] = {}
        self._log_sizes: dict[str, int] = {}
        #: the code-version table (``_codever``; loaded at first use) and its ETag
        self._table: list[dict[str, Any]] | None = None
        self._table_etag: str | None = None
        #: blocks marked done are recorded with this code index (after :meth:`use_code`)
        self._code_index: int | None = None
        #: the per-block figures (``_s3stats``): this run's, written one object per flush
        self._tracks = False
        self._log = StatsLog(self._cells) if lock is not None else None
        self._stats_seq = 0
        #: a read-only store's figures, every run's objects merged (at first use)
        self._merged: dict[str, NDArray[Any]] | None = None
        #: the scheduler's fast path (:meth:`hot_writer`), its views released at the close
        self._hot: HotWriter | None = None
        self._views: list[memoryview] = []
        #: each hot-written array's bytes as last written to (or read from) the bucket,
        #: None: no chunk there (all zeros); a flush writes the arrays that differ
        self._written: dict[str, bytes | None] = {
            n: (_chunk_bytes(a) if etags.get(n) is not None else None)
            for n, a in arrays.items()
            if n in _HOT_ARRAYS
        }

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike[str], layout: StoreLayout, *, resource_tracking: bool = False
    ) -> S3Store:
        url = s3_url(path)
        bucket = Bucket(url)
        lock, (grid, arrays, etags, group, created, create) = lock_and_load(bucket, url, layout)
        store = cls(bucket, url, grid, arrays, etags, group, created=created, lock=lock)
        if create is not None:  # a new store: written while the run starts (``_s3open``)
            store._creation = Creation(create)
        if resource_tracking and store._log is not None:  # the figures (``_s3stats``)
            store._tracks = True
            store._log.declare(STAT_ARRAYS)
        store._start_renewer()
        return store

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> S3Store:
        url = s3_url(path)
        bucket = Bucket(url)
        got = bucket.get("zarr.json")
        if got is None:
            raise TrackingError(f"no block tracking store at {url}", path=url)
        group = group_of(url, got[0])
        record = group.get("attributes", {}).get("bellis_layout")
        shape = record.get("grid_shape") if isinstance(record, dict) else None
        rank = len(shape) if isinstance(shape, list) else None  # the chunks read at once
        grid, arrays, etags = read_arrays(bucket, url, None, rank=rank)
        return cls(bucket, url, grid, arrays, etags, group, created=False, lock=None)

    # -- the BlockStore surface -------------------------------------------------------
    @property
    def path(self) -> str:
        """The store's URL (a ``Path`` would fold its ``//``), as :attr:`url`."""
        return self._url

    @property
    def url(self) -> str:
        return self._url

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return self._grid

    @property
    def created(self) -> bool:
        return self._created

    @property
    def is_writable(self) -> bool:
        return (self._lock is not None or self._scratch) and not self._closed

    def _staged(self) -> Path:
        """The local folder of this store's runs.jsonl and errors.jsonl (made once,
        removed at the close or when the store is collected)."""
        if self._staging is None:
            self._staging = tempfile.mkdtemp(prefix="bellis-s3-")
            weakref.finalize(self, shutil.rmtree, self._staging, True)
        return Path(self._staging)

    @property
    def runs_jsonl(self) -> Path:
        """A local file: a run appends its line (and ``errors.jsonl`` beside it) there,
        written to the bucket as this run's objects at the flushes and the close; a
        read-only store's file holds every run's lines, merged in start order."""
        staged = self._staged()
        path = staged / RUNS_FILE
        if self._lock is None and self._bucket is not None and not path.exists():
            self._merge_runs(path)
        return path

    def _merge_runs(self, path: Path) -> None:
        assert self._bucket is not None
        parts: list[bytes] = []
        for name in self._bucket.names(RUNS_PREFIX):
            got = self._bucket.get(name)
            if got is not None and got[0].strip():
                parts.append(got[0] if got[0].endswith(b"\n") else got[0] + b"\n")
        path.write_bytes(b"".join(parts))
        errors: list[bytes] = []
        for name in self._bucket.names(ERRORS_PREFIX):
            got = self._bucket.get(name)
            if got is not None and got[0].strip():
                errors.append(got[0] if got[0].endswith(b"\n") else got[0] + b"\n")
        if errors:
            (path.parent / ERRORS_FILE).write_bytes(b"".join(errors))

    def _upload_logs(self) -> None:
        """This run's runs.jsonl and errors.jsonl, as its objects, where they changed."""
        if self._staging is None or self._bucket is None or self._lock is None:
            return
        self._ready()
        with self._uploading:
            self._upload_staged(self._lock.run_id)

    def _upload_staged(self, run_id: str) -> None:
        assert self._bucket is not None and self._staging is not None
        stem = f"{int(self._opened * 1000):015d}-{run_id}"
        for local, key in (
            (RUNS_FILE, f"{RUNS_PREFIX}{stem}.json"),
            (ERRORS_FILE, f"{ERRORS_PREFIX}{stem}.jsonl"),
        ):
            path = Path(self._staging) / local
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise TrackingError(
                    f"block tracking at {self._url}: reading the staged {local} failed: {exc}",
                    path=self._url,
                ) from exc
            if not data or self._log_sizes.get(key) == len(data):
                continue
            etag = self._bucket.put(key, data, self._log_etags.get(key))
            if etag is None:
                raise conflict(self._url, key)
            self._log_etags[key] = etag
            self._log_sizes[key] = len(data)

    @property
    def task_hash(self) -> str | None:
        value = self._group.get("attributes", {}).get("daisy_task_hash")
        return value if isinstance(value, str) else None

    @property
    def record(self) -> dict[str, Any] | None:
        value = self._group.get("attributes", {}).get("bellis_layout")
        return value if isinstance(value, dict) else None

    @property
    def done(self) -> NDArray[Any]:
        return self._arrays["done"].reshape(self._grid)

    @property
    def failures(self) -> NDArray[Any]:
        return self._arrays["failures"].reshape(self._grid)

    def _figures(self, names: Sequence[str]) -> dict[str, NDArray[Any]]:
        """Arrays ``names`` that the store has, shaped as the grid: a writable store's
        are this run's records; a read-only store's every run's ``stats/`` objects,
        listed once and merged at the first read (``_s3stats``)."""
        if self._log is not None:
            found = self._log.arrays(names)
        elif self._bucket is None:
            found = {}
        else:
            if self._merged is None:
                self._merged = read_stats(self._bucket, self._url, self._cells)
            found = {n: self._merged[n] for n in names if n in self._merged}
        return {n: a.reshape(self._grid) for n, a in found.items()}

    @property
    def stats(self) -> dict[str, NDArray[Any]]:
        if self._log is not None and not self._tracks:
            return {}
        return self._figures(STAT_ARRAYS)

    def is_done(self, cell: int) -> bool:
        return 0 <= cell < self._cells and bool(self._arrays["done"][cell])

    def code_versions(self) -> NDArray[Any] | None:
        codes = self._arrays.get(CODE_ARRAY)
        return None if codes is None else codes.reshape(self._grid)

    def checksums(self) -> NDArray[Any] | None:
        return self._figures((CHECKSUM_ARRAY,)).get(CHECKSUM_ARRAY)

    def grants(self) -> NDArray[Any] | None:
        return self._figures((GRANT_ARRAY,)).get(GRANT_ARRAY)

    def cache_counts(self) -> dict[str, NDArray[Any]] | None:
        found = self._figures(CACHE_ARRAYS)
        return found if len(found) == len(CACHE_ARRAYS) else None

    def hot_writer(self) -> HotWriter | None:
        """The scheduler's per-block fast path (``bellis._donemarks``): typed views of the
        in-memory ``done`` and ``code_version`` arrays. Nothing marks them changed: a
        flush (on time by the renewer's thread, and at the close) compares them with what
        it last wrote. None for a store that takes no writes; a new writer after
        :meth:`use_code`."""
        if self._lock is None or self._closed:
            return None
        if self._hot is None:
            done: Any = memoryview(self._arrays["done"]).cast("B")  # type: ignore[arg-type]
            code: Any = None
            if self._code_index is not None and CODE_ARRAY in self._arrays:
                raw: Any = memoryview(self._arrays[CODE_ARRAY].view(np.uint8))  # type: ignore[arg-type]
                code = raw.cast("H")
                self._views.append(code)
            self._views.append(done)
            self._hot = HotWriter(done, code, self._code_index or 0)
        return self._hot

    def _hot_changed(self) -> bool:
        """Whether a hot-written array differs from what was last written."""
        for name in _HOT_ARRAYS:
            arr = self._arrays.get(name)
            if arr is not None and _differs(_chunk_bytes(arr), self._written.get(name)):
                return True
        return False

    def _writable(self) -> None:
        if self._lost is not None:
            raise self._lost
        if not self.is_writable:
            raise TrackingError(f"block tracking at {self._url} is open read-only", path=self._url)

    def _changed(self, name: str) -> None:
        self._dirty.add(name)
        if self._lock is not None and time.monotonic() - self._last_flush >= self._interval:
            self.flush()

    def record_success(
        self,
        cell: int,
        stats: tuple[Any, ...] | None,
        worker_id: int,
        sent_at: float,
        returned_at: float,
    ) -> None:
        self._writable()
        if 0 <= cell < self._cells:
            if stats is not None and self._tracks and self._log is not None:
                self._log.record_block(cell, stats, worker_id, sent_at, returned_at)
            if self._code_index is not None:  # before the done byte: flushed first
                self._arrays[CODE_ARRAY][cell] = self._code_index
                self._dirty.add(CODE_ARRAY)
            self._arrays["done"][cell] = 1
            self._changed("done")

    def record_skip(self, cell: int) -> None:
        self.record_success(cell, None, -1, 0.0, 0.0)

    def record_failure(
        self, cell: int, worker_id: int = -1, sent_at: float = 0.0, returned_at: float = 0.0
    ) -> None:
        self._writable()
        if 0 <= cell < self._cells:
            log = self._log  # a cell not done keeps the stamps of its last failed attempt
            if returned_at > 0.0 and self._tracks and log and not self._arrays["done"][cell]:
                log.record_stamps(cell, worker_id, sent_at, returned_at)
            self._arrays["failures"][cell] += 1
            self._changed("failures")

    def record_measured(
        self,
        cells: NDArray[np.intp],
        table: NDArray[Any],
        worker_id: int,
        sent_at: NDArray[np.float64],
        returned_at: NDArray[np.float64],
    ) -> None:
        self._writable()
        keep = (cells >= 0) & (cells < self._cells)
        inside = cells[keep]
        if self._tracks and self._log is not None and len(inside):
            self._log.record_many(inside, table[keep], worker_id, sent_at[keep], returned_at[keep])
        if self._code_index is not None:
            self._arrays[CODE_ARRAY][inside] = self._code_index
            self._dirty.add(CODE_ARRAY)
        self._arrays["done"][inside] = 1
        self._changed("done")

    def record_grant(self, cell: int, megabytes: int) -> None:
        self._writable()
        if self._log is not None and 0 <= cell < self._cells:
            self._log.record(GRANT_ARRAY, cell, megabytes)

    def record_checksum(self, cell: int, checksum: int) -> None:
        self._writable()
        if self._log is not None and 0 <= cell < self._cells:
            self._log.record(CHECKSUM_ARRAY, cell, checksum)

    def record_cache(self, cell: int, counts: Sequence[int]) -> None:
        self._writable()
        if self._log is not None and 0 <= cell < self._cells:
            self._log.record_cache(cell, counts)

    def clear_done(self, cells: Sequence[int] | NDArray[np.intp]) -> int:
        self._writable()
        cleared = clear_cells(self._arrays["done"], cells)
        if cleared and not self._scratch:
            self._dirty.add("done")
            self.flush()  # at once: a cleared marker back after a crash would be "done"
        return cleared

    def code_table(self) -> list[dict[str, Any]]:
        """The store's code-version table (the object ``code_versions.json``; a store this
        run makes has none yet)."""
        if self._table is None:
            got = None if self._bucket is None or self._created else self._bucket.get(TABLE_NAME)
            self._table = self._parse_table(got)
        return list(self._table)

    def _parse_table(self, got: tuple[bytes, str] | None) -> list[dict[str, Any]]:
        """The entries of a table read (its bytes and ETag; None: there is none), whose
        ETag the next write of it is conditional on."""
        if got is None:
            return []
        try:
            doc = json.loads(got[0])
            versions = doc["versions"]
            if not isinstance(versions, list):
                raise TypeError("versions is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            raise TrackingError(
                f"cannot read the code-version table {self._url}/{TABLE_NAME}: "
                f"{exc}; restore it, or delete it and the store's code_version "
                "array (its done blocks then count as made by unknown code)",
                path=self._url,
            ) from None
        self._table_etag = got[1]
        return [v for v in versions if isinstance(v, dict) and isinstance(v.get("index"), int)]

    def _add_to_left_table(self, record: dict[str, Any], started: float, floor: int) -> int:
        """A store this run made already held a code-version table: one that a delete cut
        short left (it stops after the group, ``_backends.delete_store``). This run's
        entry is added to it (not refused as another writer's); its index."""
        assert self._bucket is not None
        got = self._bucket.get(TABLE_NAME)
        if got is None:  # refused, then gone: not a leftover
            raise conflict(self._url, TABLE_NAME)
        self._table = self._parse_table(got)
        index, text = add_entry(self._table, record, started, floor)
        if text is not None:
            etag = self._bucket.put(TABLE_NAME, text, got[1])
            if etag is None:
                raise conflict(self._url, TABLE_NAME)
            self._table_etag = etag
        return index

    def use_code(self, record: dict[str, Any], started: float, floor: int = 0) -> int:
        """Add this run's entry to the code-version table (written at once, before any
        block names it) and record every block marked done from now on with its index."""
        self._writable()
        self.code_table()
        assert self._table is not None
        index, text = add_entry(self._table, record, started, floor)
        if self._bucket is None:  # a scratch copy: in memory only
            self._arrays.setdefault(
                CODE_ARRAY, np.zeros(self._cells, dtype=ARRAY_DTYPES[CODE_ARRAY])
            )
            self._code_index = index
            return index
        self._ready()
        bucket, writes = self._bucket, []
        meta = dump_metadata(array_metadata(ARRAY_DTYPES[CODE_ARRAY], self._grid))
        if text is not None:
            writes.append(partial(bucket.put, TABLE_NAME, text, self._table_etag))
        if CODE_ARRAY not in self._arrays:
            writes.append(partial(bucket.put, f"{CODE_ARRAY}/zarr.json", meta, None))
        # the table and the array's metadata at once: both precede any chunk naming index
        done = all_of(*writes)
        if text is not None:
            etag = done.pop(0)
            if etag is not None:
                self._table_etag = etag
            elif self._created and self._table_etag is None:  # its first write of it
                index = self._add_to_left_table(record, started, floor)
            else:
                raise conflict(self._url, TABLE_NAME)
        if CODE_ARRAY not in self._arrays:
            if done[0] is None:
                existing = bucket.get(f"{CODE_ARRAY}/zarr.json")
                if existing is None or existing[0] != meta:
                    raise invalid_metadata(self._url, f"{CODE_ARRAY}/zarr.json is another array's")
            self._arrays[CODE_ARRAY] = np.zeros(self._cells, dtype=ARRAY_DTYPES[CODE_ARRAY])
            self._etags[CODE_ARRAY] = None
            self._written[CODE_ARRAY] = None
        self._code_index = index
        self._hot = None  # the next writer records this index
        return index

    def scratch(self) -> S3Store:
        arrays = {n: a.copy() for n, a in self._arrays.items()}
        copy = S3Store(
            None,
            self._url,
            self._grid,
            arrays,
            dict(self._etags),
            self._group,
            created=self._created,
            lock=None,
            scratch=True,
        )
        copy._table = self.code_table()
        return copy

    # -- lifetime ------------------------------------------------------------------------
    def open_stats(self) -> None:
        return None

    def after_open(self, write: Callable[[], None]) -> None:
        """``write`` (an object of the store beside its arrays: ``outputs.json``) once a
        new store's metadata are written: by the thread that writes them, its error
        raised by the store's next write; at once where they are."""
        if self._creation is None or not self._creation.then(write):
            self._ready()
            write()

    def _ready(self) -> None:
        """Before any write: a new store's metadata are written (or their error raised)."""
        creation = self._creation
        if creation is not None:
            error = creation.wait()
            if error is not None:
                raise error

    def _start_renewer(self) -> None:
        """Renew the lease every third of it, in a daemon thread, whether or not blocks
        return: a block longer than the lease must not cost the run its lock."""
        if self._lock is None:
            return
        self._renewer = threading.Thread(
            target=self._renew_loop, name="bellis-s3-lease", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self) -> None:
        """Renew the lease every third of it, and write markers that waited a flush
        interval while no block returned (a long block must not hold the markers of the
        blocks before it in memory only)."""
        lock = self._lock
        if lock is None:
            return
        period = max(0.05, lock.lease / 3)
        tick = max(0.05, min(period, self._interval or period))
        renewed = time.monotonic()
        while not self._stop.wait(tick):
            now = time.monotonic()
            try:
                if self._has_changes() and now - self._last_flush >= self._interval:
                    self._flush_markers()
                if now - renewed < period:
                    continue
                with self._renewing:
                    if self._lock is None or self._stop.is_set():
                        return
                    self._lock.renew()
                renewed = now
            except TrackingError as exc:
                # refused (another run took over) or the endpoint is gone: the next
                # write of this run raises it
                self._lost = exc
                _log.error("%s", exc)
                return
            except Exception as exc:  # a thread must not die silently
                self._lost = TrackingError(
                    f"block tracking at {self._url}: writing the markers or renewing the "
                    f"lock's lease failed: {exc}",
                    path=self._url,
                )
                _log.error("%s", self._lost)
                return

    def _stop_renewer(self) -> None:
        self._stop.set()
        thread, self._renewer = self._renewer, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def flush(self, *, renew: bool = True) -> None:
        """Write the changed chunks (conditional on their last ETag), this run's
        runs.jsonl / errors.jsonl objects where they changed, and renew the lease where
        a third of it passed (``renew=False``: not at all)."""
        lock = self._lock  # once: a close (another thread) may end the store meanwhile
        if lock is None or self._bucket is None or self._closed:
            return
        if self._lost is not None:
            raise self._lost
        self._flush_markers()
        self._upload_logs()
        if renew and lock.renew_due():  # a lease taken or renewed lately holds
            with self._renewing:
                lock.renew()

    def _has_changes(self) -> bool:
        return (
            bool(self._dirty)
            or (self._log is not None and self._log.has_pending())
            or (self._hot is not None and self._hot_changed())
        )

    def _flush_stats(self) -> None:
        """The figures recorded since the last flush, as one object (``_s3stats``): one
        PUT, create-only, and none when nothing was recorded."""
        log, bucket, lock = self._log, self._bucket, self._lock
        if log is None or bucket is None or lock is None or not log.has_pending():
            return
        taken = log.take()
        key = f"{STATS_PREFIX}{int(self._opened * 1000):015d}-{lock.run_id}-{self._stats_seq:06d}"
        try:
            if bucket.put(f"{key}.bin", encode_stats(taken), None) is None:
                raise conflict(self._url, f"{key}.bin")
        except BaseException:
            log.restore(taken)  # written by the next flush, or lost with the run
            raise
        self._stats_seq += 1

    def _flush_markers(self) -> None:
        """Write the figures recorded since the last write (one object), then the marker
        arrays changed since it. The driver's thread and the renewer's timer both call
        this; one at a time. The changed names are taken before the arrays are read, so
        a marker set meanwhile marks its array changed again and goes out with the next
        write."""
        assert self._bucket is not None
        nd = len(self._grid)
        self._ready()
        with self._flushing:
            self._flush_stats()  # before the done chunk: a done block's figures first
            names: set[str] = set()
            while self._dirty:  # one pop at a time: a name added meanwhile is never lost
                names.add(self._dirty.pop())
            # the bytes to write, done's taken first: the scheduler (another thread) sets
            # a block's code before its done byte, so every block done in this copy has
            # its code in the copy taken after it
            snaps: dict[str, bytes] = {}
            for name in ("done", *sorted(n for n in self._arrays if n != "done")):
                hot = name in _HOT_ARRAYS
                if name not in names and not hot:
                    continue
                data = _chunk_bytes(self._arrays[name])  # one copy: compared, then written
                if name in names or _differs(data, self._written.get(name)):
                    snaps[name] = data
            try:
                # done last: a block marked done on the bucket has its code version
                # there (its checksum went with the figures above)
                for name in sorted(snaps, key=lambda n: (n == "done", n)):
                    data = snaps[name]
                    key = chunk_key(name, nd)
                    etag = self._bucket.put(key, data, self._etags.get(name))
                    if etag is None:
                        raise conflict(self._url, key)
                    self._etags[name] = etag
                    if name in _HOT_ARRAYS:
                        self._written[name] = data
                    names.discard(name)
            finally:
                self._dirty.update(names)  # what was not written is still to write
            self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self._stop_renewer()
        if self._creation is not None:  # the lock is released only after it (its error:
            self._creation.wait()  # raised by the flush below)
        lock = self._lock
        try:
            if lock is not None and self._bucket is not None:
                if self._lost is not None:
                    raise self._lost
                self._flush_markers()  # before the release: the next run starts from them
                # the run's objects and the lock's release (conditional on its ETag: a
                # lock another run took over stays, and this run says so) at once
                for _, exc in together(self._upload_logs, partial(lock.release, strict=True)):
                    if exc is not None:
                        raise exc
        except BaseException:
            self._closed = True
            self._release_views()
            lock, self._lock = self._lock, None
            if lock is not None:
                try:
                    lock.release()
                except TrackingError as exc:  # the first error is the one to raise
                    _log.warning("%s (its lease expires by itself)", exc)
            raise
        self._closed = True
        self._lock = None
        self._release_views()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)

    def _release_views(self) -> None:
        """The hot writer takes no more writes (one through it now raises)."""
        self._hot = None
        for view in self._views:
            view.release()
        self._views.clear()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3Store({self._url!r}, grid={self._grid})"
