"""Which kind of store a path holds, and the package-wide ways to reach one.

A backend (``bellis._donemarks.StoreBackend``) is what a kind of tracking store offers
before one is open: tell a store from other folders, find stores below a folder, open
one read-only, clear done markers of a store no run holds. :func:`backend_for` picks the
backend of a path; today every path is a local directory (:class:`LocalStores`, the
zarr v3 layout of SPEC §4.2 that ``_store`` writes and daisy 2.0.0 reads). The functions
below are what the rest of the package calls, so a second backend is one more class here
and one more branch in :func:`backend_for`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from .._donemarks import BlockStore, StoreBackend, StoreLocation, store_location
from ._disk import is_run_in_progress as _local_in_progress, read_lock_holder as _local_holder
from ._files import write_outputs_record
from ._layout import StoreLayout
from ._reset import clear_done as _clear_done
from ._s3 import S3Store, is_s3_url
from ._s3io import LOCK_KEY, Bucket, S3Lock, lease_alive, read_lease, s3_url
from ._s3stores import S3Stores
from ._store import TrackingStore, delete_store as _delete_local

__all__ = [
    "LocalStores",
    "TrackingBackend",
    "backend_for",
    "delete_store",
    "find_stores",
    "is_run_in_progress",
    "is_store",
    "lease_holder",
    "open_readonly",
    "open_store",
    "read_lock_holder",
    "record_outputs",
    "store_exists",
]


class TrackingBackend(StoreBackend, Protocol):
    """A backend as ``_tracking`` sees it: a :class:`StoreBackend` that also opens a store
    for a run (the layout is ``_tracking``'s own type, so this part lives here)."""

    def open(
        self,
        path: StoreLocation,
        layout: StoreLayout,
        *,
        resource_tracking: bool,
        defer_stats: bool,
    ) -> BlockStore:
        """Open (create, check, migrate) the store at ``path`` for a run of ``layout``,
        holding it for that run until it closes."""
        ...


class LocalStores:
    """Tracking stores in local directories: a zarr v3 group with a ``done`` array."""

    def exists(self, path: StoreLocation) -> bool:
        return (Path(path) / "zarr.json").exists()

    def is_store(self, path: StoreLocation) -> bool:
        path = Path(path)
        try:
            meta = json.loads((path / "zarr.json").read_text())
        except (OSError, ValueError):
            return False
        return (
            isinstance(meta, dict)
            and meta.get("node_type") == "group"
            and (path / "done" / "zarr.json").is_file()
        )

    def find_stores(
        self, root: StoreLocation, max_depth: int | None = None
    ) -> Iterator[StoreLocation]:
        """``root`` itself when it is a store, else every store below it, sorted, down to
        ``max_depth`` folders (None: all); a store's own folders are not searched."""
        if self.is_store(root):
            yield root
            return
        found: list[Path] = []
        frontier = [Path(root)]
        depth = 0
        while frontier and (max_depth is None or depth < max_depth):
            depth += 1
            deeper: list[Path] = []
            for d in frontier:
                try:
                    children = sorted(c for c in d.iterdir() if c.is_dir())
                except OSError:
                    continue
                for c in children:
                    (found if self.is_store(c) else deeper).append(c)
            frontier = deeper
        yield from sorted(found)

    def open_readonly(self, path: StoreLocation) -> TrackingStore:
        return TrackingStore.open_readonly(path)

    def open(
        self,
        path: StoreLocation,
        layout: StoreLayout,
        *,
        resource_tracking: bool,
        defer_stats: bool,
    ) -> TrackingStore:
        return TrackingStore.open(
            path, layout, resource_tracking=resource_tracking, defer_stats=defer_stats
        )

    def clear_done(self, path: StoreLocation, grid: tuple[int, ...], cells: Sequence[int]) -> int:
        return _clear_done(path, grid, cells)


_LOCAL = LocalStores()
_S3 = S3Stores()


def backend_for(path: str | os.PathLike[str]) -> TrackingBackend:
    """The backend of the store at ``path``: :class:`~bellis._tracking._s3stores.S3Stores` for
    an ``s3://`` URL (docs/cloud.md), :class:`LocalStores` for a local directory."""
    return _S3 if is_s3_url(path) else _LOCAL


def store_exists(path: str | os.PathLike[str]) -> bool:
    """Whether something at ``path`` claims to be a store: a folder to open as one (and
    to get its error from), not to search for stores below."""
    return backend_for(path).exists(store_location(path))


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a tracking store (a group with done markers)."""
    return backend_for(path).is_store(store_location(path))


def find_stores(root: str | os.PathLike[str], max_depth: int | None = None) -> list[StoreLocation]:
    """The stores at or below ``root`` (:meth:`LocalStores.find_stores`); [] when none:
    ``Path``s, or the URL strings of stores on S3 (``store_location``)."""
    return list(backend_for(root).find_stores(store_location(root), max_depth))


def open_readonly(path: str | os.PathLike[str]) -> BlockStore:
    """Open the store at ``path`` for reading; safe while a run writes it. Raises
    :class:`~bellis.errors.TrackingError` when it holds no valid store."""
    return backend_for(path).open_readonly(store_location(path))


def open_store(
    path: str | os.PathLike[str],
    layout: StoreLayout,
    *,
    resource_tracking: bool,
    defer_stats: bool = False,
) -> BlockStore:
    """Open the store at ``path`` for a run of ``layout`` (created if absent, checked,
    migrated to a grown volume), holding its run lock until it closes
    (:meth:`TrackingStore.open`)."""
    return backend_for(path).open(
        store_location(path),
        layout,
        resource_tracking=resource_tracking,
        defer_stats=defer_stats,
    )


def delete_store(path: str | os.PathLike[str]) -> str | None:
    """Delete a tracking store (``Task.reset()``): a local folder (``_store.delete_store``),
    or every object below an ``s3://`` URL's prefix. Returns the path (the URL), or None
    when nothing is there. A store a run holds is refused with the run lock's message
    (:class:`~bellis.errors.TrackingError`): on S3, while its lock object's lease is alive."""
    if not is_s3_url(path):
        return _delete_local(path)
    url = s3_url(path)
    bucket = Bucket(url)
    # a listing: fine here, this is no resume path (its prefix ends in "/": a sibling
    # store whose name starts with this one's is not touched)
    names = [n for n in bucket.names("") if n != LOCK_KEY]
    if not names:
        return None
    lock = S3Lock.acquire(bucket)  # refused while another run's lease is alive
    try:
        # the marker chunks first, then the group, then the rest: a delete cut short
        # leaves a store whose blocks all run again, never a block falsely done
        chunks = [n for n in names if "/c/" in n]
        rest = [n for n in names if "/c/" not in n and n != "zarr.json"]
        bucket.delete_many(chunks)
        if "zarr.json" in names:
            bucket.delete_many(["zarr.json"])
        bucket.delete_many(rest)
    finally:
        lock.release()
    return url


def read_lock_holder(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What the run that last locked the store wrote into its lock (pid, host, started;
    on S3 also run and expires), or None when there is no lock record. Read only."""
    if is_s3_url(path):
        return read_lease(Bucket(s3_url(path)))
    return _local_holder(Path(path))


def is_run_in_progress(path: str | os.PathLike[str]) -> bool | None:
    """Whether a run holds the store at ``path``, tested without taking its lock: on
    S3, whether its lock object's lease is still alive; None where it cannot be told
    (a local store without a lock file or file locks)."""
    if is_s3_url(path):
        return lease_alive(read_lease(Bucket(s3_url(path))), time.time())
    return _local_in_progress(Path(path))


def lease_holder(url: str) -> str | None:
    """Who holds the S3 store at ``url`` (its lock's lease is alive), as a report names a
    run in flight; None when no run does."""
    record = read_lease(Bucket(s3_url(url)))
    if record is None or not lease_alive(record, time.time()):
        return None
    return (
        f"run {record.get('run', '?')}, pid {record.get('pid', '?')} on host "
        f"{record.get('host', '?')}, started {record.get('started', '?')}"
    )


def record_outputs(store: BlockStore, path: StoreLocation, record: dict[str, Any]) -> None:
    """Write the store's ``outputs.json`` (``_files.write_outputs_record``): on a new S3
    store, once its metadata are written (``S3Store.after_open``: never before its
    group, and not at all when making it failed)."""
    if isinstance(store, S3Store):
        store.after_open(partial(write_outputs_record, store.url, record))
    else:
        write_outputs_record(path, record)
