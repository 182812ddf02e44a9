"""The requests of an S3 tracking store (``_s3``): URLs, settings, the bucket client with
its retries and conditional writes, and the run lock as a lease object (docs/cloud.md).

The requests themselves are made by bellis's lean client or by botocore (``_s3http``,
``_s3boto``), in the driver only; the endpoint and credentials come from the standard AWS
configuration, never from a bellis option.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from ..errors import TrackingError
from ._s3http import (
    BOTOCORE_ONLY,
    CLIENT_ENV,
    LeanS3,
    Requests,
    S3Error,
    Unreachable,
    lean_settings,
)

__all__ = [
    "FLUSH_ENV",
    "LEASE_ENV",
    "LOCK_KEY",
    "SCHEME",
    "Bucket",
    "S3Lock",
    "all_of",
    "flush_seconds",
    "is_s3_url",
    "lease_alive",
    "lease_seconds",
    "read_json",
    "read_lease",
    "s3_url",
    "together",
]

_log = logging.getLogger("bellis.tracking")

SCHEME = "s3://"
LOCK_KEY = "bellis.lock"
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


#: the environment that picks a client's endpoint, credentials and region: a client is
#: made once per process for each set of them (see :func:`_client`)
_CLIENT_ENV = (
    CLIENT_ENV,
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_CA_BUNDLE",
    *BOTOCORE_ONLY,
)
_clients: dict[tuple[str | None, ...], Requests] = {}
_clients_lock = threading.Lock()


def _client(url: str) -> Requests:
    """The process's S3 client, made on first use and kept, so that every store, lock and
    status read of a process shares one: bellis's lean client where the AWS configuration
    is plain, else botocore's (``_s3http``; making a botocore client resolves the endpoint
    rules and reads the AWS configuration: seconds on a loaded machine). A new one is made
    only when the AWS environment changed."""
    key = tuple(os.environ.get(name) for name in _CLIENT_ENV)
    with _clients_lock:
        found = _clients.get(key)
        if found is not None:
            return found
        settings = lean_settings(os.environ)
        made: Requests
        if settings is not None:
            made = LeanS3(settings)
        else:
            try:
                from ._s3boto import BotoRequests

                made = BotoRequests()
            except ImportError:
                raise TrackingError(
                    f"block tracking at {url}: this AWS configuration needs botocore "
                    "(a profile, a config file, a proxy or no static credentials in the "
                    "environment); install it with pip install 'bellis[s3]'",
                    path=url,
                ) from None
        _clients[key] = made
        return made


def together(*calls: Callable[[], Any]) -> list[tuple[Any, BaseException | None]]:
    """Run ``calls`` at once, each but the first in a thread of its own (each mostly waits
    for its answer: one round trip for all instead of one each), and wait for all:
    each one's result and exception (None: it returned), in order."""
    out: list[tuple[Any, BaseException | None]] = [(None, None)] * len(calls)

    def one(i: int) -> None:
        try:
            out[i] = (calls[i](), None)
        except BaseException as exc:  # handed to the caller, which raises or handles it
            out[i] = (None, exc)

    threads = [
        threading.Thread(target=one, args=(i,), name="bellis-s3-request", daemon=True)
        for i in range(1, len(calls))
    ]
    for t in threads:
        t.start()
    if calls:
        one(0)
    for t in threads:
        t.join()
    return out


def all_of(*calls: Callable[[], Any]) -> list[Any]:
    """:func:`together`'s results, raising the first exception (in call order) once all
    have ended."""
    out = together(*calls)
    for _, exc in out:
        if exc is not None:
            raise exc
    return [value for value, _ in out]


class Bucket:
    """The requests of one store: keys below its prefix, errors as ``TrackingError``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = _split(url)
        self._client = _client(url)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn()``, tried again with backoff while the endpoint cannot be reached; an
        error answer is a ``TrackingError`` naming ``what`` and the store."""
        for wait in (*_BACKOFF, None):
            try:
                return fn()
            except S3Error as exc:
                raise TrackingError(
                    f"block tracking at {self.url}: {what} failed: {exc}{self._hint(exc)}",
                    path=self.url,
                ) from None
            except Unreachable as exc:
                if wait is None:
                    raise TrackingError(
                        f"block tracking at {self.url}: {what} failed, the endpoint cannot "
                        f"be reached ({exc}) after {len(_BACKOFF) + 1} tries; "
                        "the done markers not yet written are lost and their blocks run "
                        "again on resume",
                        path=self.url,
                    ) from None
                _log.warning(
                    "block tracking at %s: %s failed (%s); trying again in %.1f s",
                    self.url,
                    what,
                    exc,
                    wait,
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _hint(self, exc: S3Error) -> str:
        """What to do about an error answer, where its code says."""
        if exc.code == "NoSuchBucket":
            return (
                f"; the bucket {self.bucket!r} does not exist at this endpoint: create it, "
                "or fix the URL (or AWS_ENDPOINT_URL)"
            )
        if exc.region or exc.code in ("PermanentRedirect", "AuthorizationHeaderMalformed"):
            where = f" is in region {exc.region!r}" if exc.region else " is in another region"
            return f"; the bucket{where}: set AWS_REGION to it"
        if exc.code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"):
            return (
                "; check the AWS credentials this process has (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or the profile) and their rights on the bucket"
            )
        return ""

    def get(self, name: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None when it does not exist."""
        key = self.key(name)
        return self._call(f"reading {name}", lambda: self._client.get(self.bucket, key))

    def put(self, name: str, data: bytes, etag: str | None) -> str | None:
        """Write ``name`` if it is still as this store last saw it (``etag``; None: absent).
        Returns the new ETag, None when another writer changed it (412)."""
        key = self.key(name)
        return self._call(f"writing {name}", lambda: self._client.put(self.bucket, key, data, etag))

    def delete(self, name: str, etag: str | None = None) -> bool:
        """Delete ``name`` (if it is still ``etag``, where given: False when it is not)."""
        key = self.key(name)
        return self._call(f"deleting {name}", lambda: self._client.delete(self.bucket, key, etag))

    def delete_many(self, names: list[str]) -> None:
        """Delete the objects ``names`` (relative to the store), 1,000 a request."""
        for start in range(0, len(names), 1000):
            keys = [self.key(n) for n in names[start : start + 1000]]
            failed = self._call(
                "deleting objects", partial(self._client.delete_many, self.bucket, keys)
            )
            if failed:
                key, code = failed[0]
                raise TrackingError(
                    f"block tracking at {self.url}: deleting {key} failed: {code} "
                    f"({len(failed)} objects not deleted)",
                    path=self.url,
                )

    def children(self, prefix: str) -> list[str]:
        """The "folders" right below ``prefix`` (a listing: only ``find_stores`` asks)."""
        base = f"{prefix}/" if prefix else ""
        _keys, prefixes = self._call("listing", lambda: self._client.list(self.bucket, base, "/"))
        return sorted(p.rstrip("/") for p in prefixes)

    def names(self, prefix: str) -> list[str]:
        """The object names below ``prefix`` (relative to the store; a listing: only the
        per-run objects are listed, never the markers)."""
        base = self.key(prefix)
        keys, _prefixes = self._call("listing", lambda: self._client.list(self.bucket, base, ""))
        return sorted(prefix + k[len(base) :] for k in keys)


class S3Lock:
    """The run lock of an S3 store: an object with the holder and a lease (see above)."""

    def __init__(self, bucket: Bucket, etag: str, record: dict[str, Any], lease: float) -> None:
        self._bucket = bucket
        self._etag: str | None = etag
        self._record = record
        self._lease = lease
        #: when the lease was taken or last renewed (``time.monotonic``)
        self._renewed = time.monotonic()

    @staticmethod
    def _body(record: dict[str, Any]) -> bytes:
        return (json.dumps(record, sort_keys=True) + "\n").encode()

    @classmethod
    def acquire(cls, bucket: Bucket) -> S3Lock:
        lease = lease_seconds()
        now = time.time()
        record = {
            "run": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "expires": now + lease,
            # as a local store's lock file says it: `bellis status --watch` rates from it
            "started": datetime.datetime.fromtimestamp(now)
            .astimezone()
            .isoformat(timespec="seconds"),
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

    def renew_due(self) -> bool:
        """Whether a third of the lease has passed since it was taken or renewed (the
        renewer's period): before that, no other run can have taken the store over."""
        return time.monotonic() - self._renewed >= self._lease / 3

    def renew(self) -> None:
        if self._etag is None:
            return
        self._renewed = time.monotonic()
        self._record["expires"] = time.time() + self._lease
        etag = self._bucket.put(LOCK_KEY, self._body(self._record), self._etag)
        if etag is None:
            self._etag = None
            raise self._lost()
        self._etag = etag

    def _lost(self) -> TrackingError:
        return TrackingError(
            f"block tracking at {self._bucket.url}: this run lost its lock (another run "
            "took the store over after this run's lease expired); stopping so that two "
            f"runs do not write one store. Raise {LEASE_ENV} above the longest pause "
            "between flushes",
            path=self._bucket.url,
        )

    def release(self, *, strict: bool = False) -> None:
        """Delete the lock object if it is still this run's: one DELETE conditional on
        the lock's ETag, so a lock another run took over stays. ``strict``: raise the
        lost lock's error when it was taken over, as a renewal would (the close of a run
        renews no more: this tells the same)."""
        etag, self._etag = self._etag, None
        if etag is None:
            return
        if not self._bucket.delete(LOCK_KEY, etag) and strict:
            raise self._lost()


def read_json(bucket: Bucket, name: str) -> dict[str, Any] | None:
    """Object ``name`` of the store as a JSON object; None when it is absent or holds
    no JSON object."""
    got = bucket.get(name)
    if got is None:
        return None
    try:
        value = json.loads(got[0])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_lease(bucket: Bucket) -> dict[str, Any] | None:
    """The record of the store's lock object (run, host, pid, expires, started), read
    without taking it; None when there is none (no run holds the store) or it holds no
    record."""
    return read_json(bucket, LOCK_KEY)


def lease_alive(record: dict[str, Any] | None, now: float) -> bool:
    """Whether the lock ``record`` still holds the store at ``now``: a lease that expired
    is a run that stopped without releasing it (the next run takes it over)."""
    expires = None if record is None else record.get("expires")
    return isinstance(expires, int | float) and expires >= now
