"""Small JSON records beside an S3 store's markers: ``outputs.json`` (the task's declared
outputs, which ``bellis verify`` reads) and ``verify.json`` (what the last verify found),
each one object under the store's prefix, as the files are in a local store's folder.

They are whole documents, written by one writer at a time (the run that holds the store,
``bellis verify``), and read by key. A write reads the object first: an unchanged record is
not written again, a changed one replaces the object it read (``IfMatch`` its ETag; a new
one is created with ``IfNoneMatch="*"``), so two writers at once get a refusal, never a
silently lost record.
"""

from __future__ import annotations

import os

from ..errors import TrackingError
from ._s3io import Bucket, s3_url

__all__ = ["read_object", "write_object"]


def read_object(url: str | os.PathLike[str], name: str) -> bytes | None:
    """The bytes of object ``name`` of the store at ``url``; None when it does not exist."""
    got = Bucket(s3_url(url)).get(name)
    return None if got is None else got[0]


def write_object(url: str | os.PathLike[str], name: str, data: bytes) -> None:
    """Write object ``name`` of the store at ``url`` (unless it already holds ``data``)."""
    bucket = Bucket(s3_url(url))
    got = bucket.get(name)
    if got is not None and got[0] == data:
        return
    if bucket.put(name, data, None if got is None else got[1]) is None:
        raise TrackingError(
            f"block tracking at {bucket.url}: {name} was written by another writer at the "
            "same time (a conditional write was refused, HTTP 412); check that no other "
            "run or verify uses this store, then try again",
            path=bucket.url,
        )
