"""Opening an S3 tracking store (``_s3.S3Store.open``): what is read and written, in as
few round trips before the run can start as the order of its writes allows.

* The lock is taken (``_s3io.S3Lock``, a create-only PUT) while the group's
  ``zarr.json`` is read: one round trip. That read may come before the lock, so it only
  says which way to go; what the run then relies on is read or written under the lock.
* **A new store**: nothing needs reading, so the open returns at once and the store is
  written by a thread of its own (:class:`Creation`) while the run starts its workers:
  the base arrays' metadata at once (create-only), then the group's (create-only, last: a store
  whose group exists has its arrays). Every later write of the store waits for it
  (``S3Store._ready``), and the objects beside the arrays (``outputs.json``) are queued
  behind it (``S3Store.after_open``), so nothing precedes the group, and an error
  creating it is raised by the store's next write. A group that exists by then was made
  by a run that held the store between this open's read and its lock (unless it is this
  run's own, its PUT's answer lost and the request sent again: the same bytes, and no
  marker beside it): the markers this run holds in memory would overwrite that run's,
  so the store is not written and the run stops with an error that says to run again
  (and the next open finds the store made).
* **An existing store**: the group, each array's metadata and its one chunk are read at
  once, under the lock (the group again: the one read before the lock may be stale).

Resume thus costs two round trips (seven GETs and the lock's PUT), and a first run one
before its workers start (and two more beside them), whatever the store's size: no
listing (docs/cloud.md).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..errors import TrackingError
from ._codever import CODE_ARRAY
from ._files import cell_count, chunk_parts
from ._layout import (
    ARRAY_DTYPES,
    BASE_ARRAYS,
    StoreLayout,
    array_metadata,
    dump_metadata,
    group_metadata,
    invalid_metadata,
    layout_hash,
    layout_mismatch,
    layout_record,
)
from ._s3io import Bucket, S3Lock, all_of, together

__all__ = [
    "Creation",
    "Opened",
    "chunk_key",
    "conflict",
    "group_of",
    "lock_and_load",
    "read_arrays",
]


class Opened(NamedTuple):
    """What an open found: the grid, the marker arrays with their chunks' ETags (None: no
    chunk yet), the group's metadata, whether this open creates the store, and (a new
    store) the writes that create it, for a :class:`Creation` to make."""

    grid: tuple[int, ...]
    arrays: dict[str, NDArray[Any]]
    etags: dict[str, str | None]
    group: dict[str, Any]
    created: bool
    create: Callable[[], None] | None = None


class Creation:
    """A new store's metadata, written in a thread of its own (module docstring), then
    the writes queued behind them (:meth:`then`)."""

    def __init__(self, create: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._mutex = threading.Lock()
        self._after: list[Callable[[], None]] = []
        self._ended = False
        self._thread = threading.Thread(
            target=self._run, args=(create,), name="bellis-s3-create", daemon=True
        )
        self._thread.start()

    def _run(self, create: Callable[[], None]) -> None:
        try:
            create()
            while True:
                with self._mutex:
                    if not self._after:
                        self._ended = True
                        return
                    write = self._after.pop(0)
                write()
        except BaseException as exc:  # raised by wait(), in the thread that writes next
            self._error = exc
            with self._mutex:
                self._ended = True  # what was queued is not written

    def then(self, write: Callable[[], None]) -> bool:
        """Queue ``write`` behind the metadata; False when the thread has ended (the
        caller writes, once :meth:`wait` said the metadata are there)."""
        with self._mutex:
            if self._ended:
                return False
            self._after.append(write)
            return True

    def wait(self) -> BaseException | None:
        """Once the writes have ended: None, or their error (raised by the caller)."""
        self._thread.join()
        return self._error


def chunk_key(name: str, ndim: int) -> str:
    """The key of an array's one chunk below the store's prefix (``done/c/0/0``)."""
    return "/".join((name, "c", *chunk_parts(ndim)))


def conflict(url: str, name: str) -> TrackingError:
    return TrackingError(
        f"block tracking at {url}: {name} was changed by another writer while this run "
        "held the store (a conditional write was refused, HTTP 412); stopping so that "
        "no done marker is lost or invented. Check that no other run uses this "
        "tracking_path",
        path=url,
    )


def group_of(url: str, data: bytes) -> dict[str, Any]:
    try:
        group = json.loads(data)
    except ValueError:
        raise invalid_metadata(url, "zarr.json is not JSON") from None
    if not isinstance(group, dict) or group.get("node_type") != "group":
        raise invalid_metadata(url, "zarr.json is not a zarr v3 group")
    return group


def lock_and_load(bucket: Bucket, url: str, layout: StoreLayout) -> tuple[S3Lock, Opened]:
    """Take the store's lock and open it (see the module docstring); the lock is released
    again when the open fails."""
    (lock, lock_error), (got, read_error) = together(
        partial(S3Lock.acquire, bucket), partial(bucket.get, "zarr.json")
    )
    if lock_error is not None:
        raise lock_error
    assert isinstance(lock, S3Lock)
    try:
        if read_error is not None:
            raise read_error
        return lock, _load(bucket, url, layout, got)
    except BaseException:
        lock.release()
        raise


def _load(bucket: Bucket, url: str, layout: StoreLayout, got: tuple[bytes, str] | None) -> Opened:
    grid = tuple(layout.grid_shape)
    expected = layout_hash(layout)
    if got is None:
        group = group_metadata(expected, layout_record(layout))
        arrays = {n: np.zeros(cell_count(grid), dtype=ARRAY_DTYPES[n]) for n in BASE_ARRAYS}
        create = partial(_create, bucket, url, grid, group)
        return Opened(grid, arrays, dict.fromkeys(BASE_ARRAYS), group, True, create)
    found: list[dict[str, Any]] = []

    def check(data: bytes | None) -> None:  # the group first: a layout change says so
        if data is None:
            raise conflict(url, "zarr.json")
        group = group_of(url, data)
        stored = group.get("attributes", {}).get("daisy_task_hash")
        if stored != expected:
            raise layout_mismatch(url, str(stored), expected)
        found.append(group)

    _, arrays, etags = read_arrays(bucket, url, grid, check_group=check)
    return Opened(grid, arrays, etags, found[0], False)


def _create(bucket: Bucket, url: str, grid: tuple[int, ...], group: dict[str, Any]) -> None:
    """A new store's metadata: its arrays' at once, then its group's (module docstring).
    (A code-version table that a delete cut short left is not read here: the run's
    create-only write of the table finds it, ``S3Store.use_code``.)"""
    metas = {n: dump_metadata(array_metadata(ARRAY_DTYPES[n], grid)) for n in BASE_ARRAYS}
    written = all_of(
        *(partial(bucket.put, f"{n}/zarr.json", m, None) for n, m in metas.items()),
    )
    for (name, meta), etag in zip(metas.items(), written, strict=True):
        if etag is None:  # it exists: it must be the same array
            existing = bucket.get(f"{name}/zarr.json")
            if existing is None or existing[0] != meta:
                raise invalid_metadata(url, f"{name}/zarr.json is another array's")
    data = dump_metadata(group)
    if bucket.put("zarr.json", data, None) is None and not _ours(bucket, data, len(grid)):
        raise TrackingError(
            f"block tracking at {url}: another run created this store while this run "
            "opened it (its zarr.json appeared between this run's read and its lock); "
            "this run stopped without writing to it. Run again: the next run resumes "
            "from the store that run made",
            path=url,
        )


def _ours(bucket: Bucket, data: bytes, ndim: int) -> bool:
    """The group's create-only PUT was refused: is it this run's own (its answer lost
    and the request sent again, ``_s3io.Bucket``), with no marker of any run beside
    it? Then nothing is lost by going on as the store's maker."""
    got = all_of(
        partial(bucket.get, "zarr.json"),
        *(partial(bucket.get, chunk_key(n, ndim)) for n in (*BASE_ARRAYS, CODE_ARRAY)),
    )
    return got[0] is not None and got[0][0] == data and all(c is None for c in got[1:])


def read_arrays(
    bucket: Bucket,
    url: str,
    grid: tuple[int, ...] | None,
    *,
    check_group: Callable[[bytes | None], None] | None = None,
    rank: int | None = None,
) -> tuple[tuple[int, ...], dict[str, NDArray[Any]], dict[str, str | None]]:
    """The base arrays (and ``code_version`` where a run made it), read by key, every
    metadata and chunk at once; with ``check_group``, the group's ``zarr.json`` too,
    handed to it (its bytes, None when absent) before the arrays are checked. ``grid``
    None: the stored shape; its ``rank`` where the group records it names the chunks'
    keys (else, or where the metadata says another, they are read once it is known)."""
    with_group = check_group is not None
    names = (*BASE_ARRAYS, CODE_ARRAY)
    ndim = len(grid) if grid is not None else rank
    calls = [partial(bucket.get, f"{name}/zarr.json") for name in names]
    if ndim is not None:  # the chunks' keys need the grid's rank
        calls += [partial(bucket.get, chunk_key(name, ndim)) for name in names]
    if with_group:
        calls.append(partial(bucket.get, "zarr.json"))
    got = all_of(*calls)
    if check_group is not None:
        group = got.pop()
        check_group(None if group is None else group[0])
    metas = got[: len(names)]
    chunks: list[tuple[bytes, str] | None] | None = got[len(names) :] if ndim is not None else None
    arrays: dict[str, NDArray[Any]] = {}
    etags: dict[str, str | None] = {}
    for i, name in enumerate(names):
        meta_got = metas[i]
        if meta_got is None and name == CODE_ARRAY:
            continue  # no run recorded code versions yet
        if meta_got is None:
            raise invalid_metadata(url, f"{name}/zarr.json is missing")
        try:
            meta = json.loads(meta_got[0])
            shape = tuple(int(s) for s in meta["shape"])
        except (ValueError, KeyError, TypeError):
            raise invalid_metadata(url, f"{name}/zarr.json is not an array's") from None
        if grid is None:
            grid = shape
        if meta != array_metadata(ARRAY_DTYPES[name], grid):
            raise invalid_metadata(
                url, f"{name}/zarr.json is not a {ARRAY_DTYPES[name]} array of {grid}"
            )
        n = cell_count(grid)
        chunk = (
            chunks[i]
            if chunks is not None and ndim == len(grid)
            else bucket.get(chunk_key(name, len(grid)))
        )
        dtype = np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")
        if chunk is None:
            arrays[name] = np.zeros(n, dtype=dtype)
            etags[name] = None
            continue
        if len(chunk[0]) != n * dtype.itemsize:
            raise invalid_metadata(url, f"{name}'s chunk holds {len(chunk[0])} bytes")
        arrays[name] = np.frombuffer(chunk[0], dtype=dtype).copy()
        etags[name] = chunk[1]
    return grid or (), arrays, etags
