"""The S3 backend of the tracking stores (``_donemarks.StoreBackend``): what the readers
and ``bellis verify --reset`` do with a store below an ``s3://`` URL (``_s3.S3Store``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .._donemarks import StoreLocation
from ..errors import TrackingError
from ._layout import StoreLayout
from ._s3 import S3Store
from ._s3io import SCHEME, Bucket, S3Lock, read_json, s3_url
from ._s3open import group_of, read_arrays

__all__ = ["S3Stores"]


class S3Stores:
    """Tracking stores below ``s3://`` URLs (``_donemarks.StoreBackend``)."""

    def exists(self, path: StoreLocation) -> bool:
        return Bucket(s3_url(path)).get("zarr.json") is not None

    def is_store(self, path: StoreLocation) -> bool:
        bucket = Bucket(s3_url(path))
        meta = read_json(bucket, "zarr.json")
        return (
            meta is not None
            and meta.get("node_type") == "group"
            and bucket.get("done/zarr.json") is not None
        )

    def find_stores(
        self, root: StoreLocation, max_depth: int | None = None
    ) -> Iterator[StoreLocation]:
        url = s3_url(root)
        if self.is_store(root):
            yield url  # a URL stays a string: Path() would fold its //
            return
        bucket = Bucket(url)
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
                    (found if self.is_store(child_url) else deeper).append(child)
            frontier = deeper
        for child in sorted(found):
            yield f"{base}/{child}"

    def open_readonly(self, path: StoreLocation) -> S3Store:
        return S3Store.open_readonly(path)

    def open(
        self,
        path: StoreLocation,
        layout: StoreLayout,
        *,
        resource_tracking: bool,
        defer_stats: bool,
    ) -> S3Store:
        return S3Store.open(path, layout, resource_tracking=resource_tracking)

    def clear_done(self, path: StoreLocation, grid: tuple[int, ...], cells: Sequence[int]) -> int:
        url = s3_url(path)
        bucket = Bucket(url)
        lock = S3Lock.acquire(bucket)
        try:
            got = bucket.get("zarr.json")
            if got is None:
                raise TrackingError(f"no block tracking store at {url}", path=url)
            group = group_of(url, got[0])
            _, arrays, etags = read_arrays(bucket, url, grid)
            store = S3Store(bucket, url, grid, arrays, etags, group, created=False, lock=lock)
            cleared = store.clear_done(list(cells))
            store.flush()
        finally:
            lock.release()
        return cleared
