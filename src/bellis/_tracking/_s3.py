"""Tracking stores on S3 (``s3://bucket/prefix``): the done markers held in memory by the
driver and flushed as zarr v3 chunk objects with conditional writes (docs/cloud.md).

On the bucket, the same layout as a local store (SPEC §4.2)::

    <prefix>/zarr.json           group; attributes daisy_task_hash and bellis_layout
    <prefix>/<array>/zarr.json   array metadata (``_layout.array_metadata``)
    <prefix>/<array>/c/0[/0...]  the chunk: the raw little-endian element array
    <prefix>/bellis.lock         the run lock: holder and lease (JSON)

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

Opening reads the objects by key (no listing); only :meth:`S3Stores.find_stores` and the
readers of the per-run objects list.
``boto3`` is imported here only, by the driver; the endpoint and credentials come from
the standard AWS configuration (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...), never from a
bellis option, and are never printed or stored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from .._donemarks import HotWriter
from ..errors import TrackingError
from ._codever import CODE_ARRAY, TABLE_NAME, add_entry
from ._files import cell_count, chunk_parts, clear_cells
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

__all__ = ["S3Store", "S3Stores", "flush_seconds", "is_s3_url", "lease_seconds", "s3_url"]

_log = logging.getLogger("bellis.tracking")

SCHEME = "s3://"
LOCK_KEY = "bellis.lock"
#: one object per run: its ``runs.jsonl`` line(s) and its ``errors.jsonl`` (no append on S3)
RUNS_PREFIX = "runs/"
ERRORS_PREFIX = "errors/"
RUNS_FILE = "runs.jsonl"
ERRORS_FILE = "errors.jsonl"
FLUSH_ENV = "BELLIS_S3_FLUSH_SECONDS"
LEASE_ENV = "BELLIS_S3_LEASE_SECONDS"
_DEFAULT_FLUSH = 5.0
_DEFAULT_LEASE = 120.0
#: waits between the tries of a request that could not reach the endpoint (seconds)
_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)

_T = TypeVar("_T")


def is_s3_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an S3 store (``s3://...``; ``Path`` folds it to ``s3:/...``)."""
    text = os.fspath(path)
    return text.startswith(("s3://", "s3:/"))


def s3_url(path: str | os.PathLike[str]) -> str:
    """The canonical ``s3://bucket/prefix`` of ``path`` (no trailing slash)."""
    text = os.fspath(path)
    rest = text[5:] if text.startswith("s3://") else text[4:]
    return SCHEME + rest.strip("/")


def _split(url: str) -> tuple[str, str]:
    rest = url[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    if len(bucket) < 3:
        raise TrackingError(
            f"tracking_path={url!r}: not an S3 store URL; pass s3://<bucket>/<prefix> "
            "(a bucket name has at least 3 characters)",
            path=url,
        )
    return bucket, prefix.strip("/")


def _chunk_key(name: str, ndim: int) -> str:
    """The key of an array's one chunk below the store's prefix (``done/c/0/0``)."""
    return "/".join((name, "c", *chunk_parts(ndim)))


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise TrackingError(f"{name}={raw!r}: must be a number of seconds > 0 (e.g. {default})")
    return value


def flush_seconds() -> float:
    """At most how long a done marker stays in the driver's memory only."""
    return _env_seconds(FLUSH_ENV, _DEFAULT_FLUSH)


def lease_seconds() -> float:
    """How long the run lock holds without a renewal."""
    return _env_seconds(LEASE_ENV, _DEFAULT_LEASE)


class _Bucket:
    """The requests of one store: keys below its prefix, errors as ``TrackingError``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = _split(url)
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise TrackingError(
                f"block tracking at {url}: S3 stores need boto3; install it with "
                "pip install 'bellis[s3]'",
                path=url,
            ) from None
        self._client = boto3.client(
            "s3", config=Config(retries={"max_attempts": 3, "mode": "standard"})
        )

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn()``, tried again with backoff while the endpoint cannot be reached."""
        from botocore.exceptions import (
            ConnectionError as BotoConnectionError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        for wait in (*_BACKOFF, None):
            try:
                return fn()
            except (BotoConnectionError, EndpointConnectionError, ReadTimeoutError) as exc:
                if wait is None:
                    raise TrackingError(
                        f"block tracking at {self.url}: {what} failed, the endpoint cannot "
                        f"be reached ({type(exc).__name__}) after {len(_BACKOFF) + 1} tries; "
                        "the done markers not yet written are lost and their blocks run "
                        "again on resume",
                        path=self.url,
                    ) from None
                _log.warning(
                    "block tracking at %s: %s failed (%s); trying again in %.1f s",
                    self.url,
                    what,
                    type(exc).__name__,
                    wait,
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def get(self, name: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None when it does not exist."""
        from botocore.exceptions import ClientError

        def fetch() -> tuple[bytes, str] | None:
            try:
                r = self._client.get_object(Bucket=self.bucket, Key=self.key(name))
            except ClientError as exc:
                if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                    return None
                raise self._error(f"reading {name}", exc) from None
            return r["Body"].read(), str(r["ETag"])

        return self._call(f"reading {name}", fetch)

    def put(self, name: str, data: bytes, etag: str | None) -> str | None:
        """Write ``name`` if it is still as this store last saw it (``etag``; None: absent).
        Returns the new ETag, None when another writer changed it (412)."""
        from botocore.exceptions import ClientError

        cond: dict[str, str] = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}

        def send() -> str | None:
            try:
                r = self._client.put_object(
                    Bucket=self.bucket, Key=self.key(name), Body=data, **cond
                )
            except ClientError as exc:
                if self._code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                    return None
                raise self._error(f"writing {name}", exc) from None
            return str(r["ETag"])

        return self._call(f"writing {name}", send)

    def delete(self, name: str) -> None:
        from botocore.exceptions import ClientError

        def send() -> None:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=self.key(name))
            except ClientError as exc:
                raise self._error(f"deleting {name}", exc) from None

        self._call(f"deleting {name}", send)

    def children(self, prefix: str) -> list[str]:
        """The "folders" right below ``prefix`` (a listing: only ``find_stores`` asks)."""
        from botocore.exceptions import ClientError

        base = f"{prefix}/" if prefix else ""

        def send() -> list[str]:
            out: list[str] = []
            try:
                pages = self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=base, Delimiter="/"
                )
                for page in pages:
                    out.extend(str(p["Prefix"]).rstrip("/") for p in page.get("CommonPrefixes", []))
            except ClientError as exc:
                raise self._error("listing", exc) from None
            return sorted(out)

        return self._call("listing", send)

    def names(self, prefix: str) -> list[str]:
        """The object names below ``prefix`` (relative to the store; a listing: only the
        per-run objects are listed, never the markers)."""
        from botocore.exceptions import ClientError

        base = self.key(prefix)

        def send() -> list[str]:
            out: list[str] = []
            try:
                pages = self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=base
                )
                for page in pages:
                    out.extend(
                        prefix + str(o["Key"])[len(base) :] for o in page.get("Contents", [])
                    )
            except ClientError as exc:
                raise self._error("listing", exc) from None
            return sorted(out)

        return self._call("listing", send)

    def _error(self, what: str, exc: Exception) -> TrackingError:
        return TrackingError(
            f"block tracking at {self.url}: {what} failed: {self._code(exc) or exc}",
            path=self.url,
        )


class S3Lock:
    """The run lock of an S3 store: an object with the holder and a lease (see above)."""

    def __init__(self, bucket: _Bucket, etag: str, record: dict[str, Any], lease: float) -> None:
        self._bucket = bucket
        self._etag: str | None = etag
        self._record = record
        self._lease = lease

    @staticmethod
    def _body(record: dict[str, Any]) -> bytes:
        return (json.dumps(record, sort_keys=True) + "\n").encode()

    @classmethod
    def acquire(cls, bucket: _Bucket) -> S3Lock:
        lease = lease_seconds()
        record = {
            "run": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "expires": time.time() + lease,
        }
        etag = bucket.put(LOCK_KEY, cls._body(record), None)
        if etag is not None:
            return cls(bucket, etag, record, lease)
        held = bucket.get(LOCK_KEY)
        holder: dict[str, Any] = {}
        if held is not None:
            try:
                loaded = json.loads(held[0])
                holder = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                holder = {}
        expires = holder.get("expires")
        who = (
            f"run {holder.get('run', '?')} on {holder.get('host', '?')}, "
            f"pid {holder.get('pid', '?')}"
        )
        if held is not None and isinstance(expires, int | float) and expires < time.time():
            etag = bucket.put(LOCK_KEY, cls._body(record), held[1])
            if etag is not None:
                _log.warning(
                    "block tracking at %s: took over the lock of %s, whose lease expired "
                    "%.0f s ago (that run stopped without releasing it)",
                    bucket.url,
                    who,
                    time.time() - expires,
                )
                return cls(bucket, etag, record, lease)
        until = (
            time.strftime(" until %Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            if isinstance(expires, int | float)
            else ""
        )
        raise TrackingError(
            f"block tracking at {bucket.url} is in use by another run ({who}, lease"
            f"{until}). Two runs on one store would process every block twice: wait for "
            "that run to end or stop it (a stopped run's lease expires, then the next run "
            "takes the store over), or give this run another tracking_path=",
            path=bucket.url,
        )

    @property
    def lease(self) -> float:
        """The lease this lock is renewed for (seconds)."""
        return self._lease

    @property
    def run_id(self) -> str:
        return str(self._record["run"])

    def renew(self) -> None:
        if self._etag is None:
            return
        self._record["expires"] = time.time() + self._lease
        etag = self._bucket.put(LOCK_KEY, self._body(self._record), self._etag)
        if etag is None:
            self._etag = None
            raise TrackingError(
                f"block tracking at {self._bucket.url}: this run lost its lock (another run "
                "took the store over after this run's lease expired); stopping so that two "
                f"runs do not write one store. Raise {LEASE_ENV} above the longest pause "
                "between flushes",
                path=self._bucket.url,
            )
        self._etag = etag

    def release(self) -> None:
        if self._etag is None:
            return
        held = self._bucket.get(LOCK_KEY)
        if held is not None and held[1] == self._etag:
            self._bucket.delete(LOCK_KEY)
        self._etag = None


class S3Store:
    """One task's tracking store on S3 (``_donemarks.BlockStore``), held in memory."""

    def __init__(
        self,
        bucket: _Bucket | None,
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
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
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

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], layout: StoreLayout) -> S3Store:
        url = s3_url(path)
        bucket = _Bucket(url)
        lock = S3Lock.acquire(bucket)
        try:
            store = cls._load(bucket, url, layout, lock)
        except BaseException:
            lock.release()
            raise
        store._start_renewer()
        return store

    @classmethod
    def _load(cls, bucket: _Bucket, url: str, layout: StoreLayout, lock: S3Lock) -> S3Store:
        grid = tuple(layout.grid_shape)
        expected = layout_hash(layout)
        got = bucket.get("zarr.json")
        if got is None:
            group = group_metadata(expected, layout_record(layout))
            for name in BASE_ARRAYS:
                meta = dump_metadata(array_metadata(ARRAY_DTYPES[name], grid))
                if bucket.put(f"{name}/zarr.json", meta, None) is None:
                    existing = bucket.get(f"{name}/zarr.json")
                    if existing is None or existing[0] != meta:
                        raise invalid_metadata(url, f"{name}/zarr.json is another array's")
            if bucket.put("zarr.json", dump_metadata(group), None) is None:
                raise cls._conflict(url, "zarr.json")
            arrays = {n: np.zeros(cell_count(grid), dtype=ARRAY_DTYPES[n]) for n in BASE_ARRAYS}
            etags: dict[str, str | None] = dict.fromkeys(BASE_ARRAYS)
            return cls(bucket, url, grid, arrays, etags, group, created=True, lock=lock)
        group = cls._group_of(url, got[0])
        stored = group.get("attributes", {}).get("daisy_task_hash")
        if stored != expected:
            raise layout_mismatch(url, str(stored), expected)
        _, arrays, etags = cls._read_arrays(bucket, url, grid)
        return cls(bucket, url, grid, arrays, etags, group, created=False, lock=lock)

    @staticmethod
    def _group_of(url: str, data: bytes) -> dict[str, Any]:
        try:
            group = json.loads(data)
        except ValueError:
            raise invalid_metadata(url, "zarr.json is not JSON") from None
        if not isinstance(group, dict) or group.get("node_type") != "group":
            raise invalid_metadata(url, "zarr.json is not a zarr v3 group")
        return group

    @staticmethod
    def _read_arrays(
        bucket: _Bucket, url: str, grid: tuple[int, ...] | None
    ) -> tuple[tuple[int, ...], dict[str, NDArray[Any]], dict[str, str | None]]:
        """The base arrays (and ``code_version`` where a run made it), read by key;
        ``grid`` None: the stored shape."""
        arrays: dict[str, NDArray[Any]] = {}
        etags: dict[str, str | None] = {}
        for name in (*BASE_ARRAYS, CODE_ARRAY):
            got = bucket.get(f"{name}/zarr.json")
            if got is None and name == CODE_ARRAY:
                continue  # no run recorded code versions yet
            if got is None:
                raise invalid_metadata(url, f"{name}/zarr.json is missing")
            try:
                meta = json.loads(got[0])
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
            chunk = bucket.get(_chunk_key(name, len(grid)))
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

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> S3Store:
        url = s3_url(path)
        bucket = _Bucket(url)
        got = bucket.get("zarr.json")
        if got is None:
            raise TrackingError(f"no block tracking store at {url}", path=url)
        group = cls._group_of(url, got[0])
        grid, arrays, etags = cls._read_arrays(bucket, url, None)
        return cls(bucket, url, grid, arrays, etags, group, created=False, lock=None)

    @staticmethod
    def _conflict(url: str, name: str) -> TrackingError:
        return TrackingError(
            f"block tracking at {url}: {name} was changed by another writer while this run "
            "held the store (a conditional write was refused, HTTP 412); stopping so that "
            "no done marker is lost or invented. Check that no other run uses this "
            "tracking_path",
            path=url,
        )

    # -- the BlockStore surface -------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self._url)

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
        stem = f"{int(self._opened * 1000):015d}-{self._lock.run_id}"
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
                raise self._conflict(self._url, key)
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

    @property
    def stats(self) -> dict[str, NDArray[Any]]:
        return {}

    def is_done(self, cell: int) -> bool:
        return 0 <= cell < self._cells and bool(self._arrays["done"][cell])

    def code_versions(self) -> NDArray[Any] | None:
        codes = self._arrays.get(CODE_ARRAY)
        return None if codes is None else codes.reshape(self._grid)

    def checksums(self) -> NDArray[Any] | None:
        return None

    def grants(self) -> NDArray[Any] | None:
        return None

    def hot_writer(self) -> HotWriter | None:
        return None  # every block goes through record_success, which flushes on time

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
        inside = cells[(cells >= 0) & (cells < self._cells)]
        if self._code_index is not None:
            self._arrays[CODE_ARRAY][inside] = self._code_index
            self._dirty.add(CODE_ARRAY)
        self._arrays["done"][inside] = 1
        self._changed("done")

    def record_grant(self, cell: int, megabytes: int) -> None:
        self._writable()  # memory grants are not kept on S3 yet (docs/cloud.md)

    def record_checksum(self, cell: int, checksum: int) -> None:
        self._writable()  # output checksums are not kept on S3 yet (docs/cloud.md)

    def clear_done(self, cells: Sequence[int] | NDArray[np.intp]) -> int:
        self._writable()
        cleared = clear_cells(self._arrays["done"], cells)
        if cleared and not self._scratch:
            self._dirty.add("done")
            self.flush()  # at once: a cleared marker back after a crash would be "done"
        return cleared

    def code_table(self) -> list[dict[str, Any]]:
        """The store's code-version table (the object ``code_versions.json``)."""
        if self._table is None:
            got = None if self._bucket is None else self._bucket.get(TABLE_NAME)
            table: list[dict[str, Any]] = []
            if got is not None:
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
                table = [
                    v for v in versions if isinstance(v, dict) and isinstance(v.get("index"), int)
                ]
                self._table_etag = got[1]
            self._table = table
        return list(self._table)

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
        if text is not None:
            etag = self._bucket.put(TABLE_NAME, text, self._table_etag)
            if etag is None:
                raise self._conflict(self._url, TABLE_NAME)
            self._table_etag = etag
        if CODE_ARRAY not in self._arrays:
            meta = dump_metadata(array_metadata(ARRAY_DTYPES[CODE_ARRAY], self._grid))
            if self._bucket.put(f"{CODE_ARRAY}/zarr.json", meta, None) is None:
                existing = self._bucket.get(f"{CODE_ARRAY}/zarr.json")
                if existing is None or existing[0] != meta:
                    raise invalid_metadata(self._url, f"{CODE_ARRAY}/zarr.json is another array's")
            self._arrays[CODE_ARRAY] = np.zeros(self._cells, dtype=ARRAY_DTYPES[CODE_ARRAY])
            self._etags[CODE_ARRAY] = None
        self._code_index = index
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
        lock = self._lock
        if lock is None:
            return
        period = max(0.05, lock.lease / 3)
        while not self._stop.wait(period):
            with self._renewing:
                if self._lock is None or self._stop.is_set():
                    return
                try:
                    self._lock.renew()
                except TrackingError as exc:
                    # refused (another run took over) or the endpoint is gone: the next
                    # write of this run raises it
                    self._lost = exc
                    _log.error("%s", exc)
                    return
                except Exception as exc:  # a thread must not die silently
                    self._lost = TrackingError(
                        f"block tracking at {self._url}: renewing the lock's lease failed: {exc}",
                        path=self._url,
                    )
                    _log.error("%s", self._lost)
                    return

    def _stop_renewer(self) -> None:
        self._stop.set()
        thread, self._renewer = self._renewer, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def flush(self) -> None:
        """Write the changed chunks (conditional on their last ETag), this run's
        runs.jsonl / errors.jsonl objects where they changed, and renew the lease."""
        if self._lock is None or self._bucket is None:
            return
        if self._lost is not None:
            raise self._lost
        nd = len(self._grid)
        for name in sorted(self._dirty):
            data = self._arrays[name].astype(self._arrays[name].dtype.newbyteorder("<")).tobytes()
            key = _chunk_key(name, nd)
            etag = self._bucket.put(key, data, self._etags.get(name))
            if etag is None:
                raise self._conflict(self._url, key)
            self._etags[name] = etag
        self._dirty.clear()
        self._upload_logs()
        with self._renewing:
            self._lock.renew()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self._stop_renewer()
        try:
            self.flush()
        except BaseException:
            self._closed = True
            lock, self._lock = self._lock, None
            if lock is not None:
                try:
                    lock.release()
                except TrackingError as exc:  # the flush's error is the one to raise
                    _log.warning("%s (its lease expires by itself)", exc)
            raise
        self._closed = True
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3Store({self._url!r}, grid={self._grid})"


class S3Stores:
    """Tracking stores below ``s3://`` URLs (``_donemarks.StoreBackend``)."""

    def exists(self, path: Path) -> bool:
        return _Bucket(s3_url(path)).get("zarr.json") is not None

    def is_store(self, path: Path) -> bool:
        bucket = _Bucket(s3_url(path))
        got = bucket.get("zarr.json")
        if got is None:
            return False
        try:
            meta = json.loads(got[0])
        except ValueError:
            return False
        return (
            isinstance(meta, dict)
            and meta.get("node_type") == "group"
            and bucket.get("done/zarr.json") is not None
        )

    def find_stores(self, root: Path, max_depth: int | None = None) -> Iterator[Path]:
        url = s3_url(root)
        if self.is_store(root):
            yield Path(url)
            return
        bucket = _Bucket(url)
        base = SCHEME + bucket.bucket
        frontier = [bucket.prefix]
        depth = 0
        found: list[str] = []
        while frontier and (max_depth is None or depth < max_depth):
            depth += 1
            deeper: list[str] = []
            for prefix in frontier:
                for child in bucket.children(prefix):
                    child_url = f"{base}/{child}"
                    (found if self.is_store(Path(child_url)) else deeper).append(child)
            frontier = deeper
        for child in sorted(found):
            yield Path(f"{base}/{child}")

    def open_readonly(self, path: Path) -> S3Store:
        return S3Store.open_readonly(path)

    def open(
        self, path: Path, layout: StoreLayout, *, resource_tracking: bool, defer_stats: bool
    ) -> S3Store:
        if resource_tracking:
            url = s3_url(path)
            raise TrackingError(
                f"block tracking at {url}: resource_tracking=True is not supported on S3 "
                "stores yet (docs/cloud.md); pass resource_tracking=False or a local "
                "tracking_path",
                path=url,
            )
        return S3Store.open(path, layout)

    def clear_done(self, path: Path, grid: tuple[int, ...], cells: Sequence[int]) -> int:
        url = s3_url(path)
        bucket = _Bucket(url)
        lock = S3Lock.acquire(bucket)
        try:
            got = bucket.get("zarr.json")
            if got is None:
                raise TrackingError(f"no block tracking store at {url}", path=url)
            group = S3Store._group_of(url, got[0])
            _, arrays, etags = S3Store._read_arrays(bucket, url, grid)
            store = S3Store(bucket, url, grid, arrays, etags, group, created=False, lock=lock)
            cleared = store.clear_done(list(cells))
            store.flush()
        finally:
            lock.release()
        return cleared
