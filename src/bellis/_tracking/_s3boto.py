"""The requests of an S3 tracking store made by botocore (``_s3http.Requests``), where the
AWS configuration is more than the lean client follows (``_s3http.lean_settings``):
profiles, SSO, instance roles, config files, proxies. Imported by the driver only, when
such a store is opened; botocore's errors become ``_s3http``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ._s3http import S3Error, Unreachable

__all__ = ["BotoRequests"]

_T = TypeVar("_T")


class BotoRequests:
    """A botocore S3 client behind the store's requests. Thread-safe (botocore's clients
    are)."""

    def __init__(self) -> None:
        # botocore's own session, not boto3's: a boto3 S3 client also imports its
        # transfer manager (s3transfer), which these requests never use
        import botocore.session
        from botocore.config import Config
        from botocore.exceptions import (
            ClientError,
            ConnectionError as BotoConnectionError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        self._client: Any = botocore.session.get_session().create_client(
            "s3", config=Config(retries={"max_attempts": 3, "mode": "standard"})
        )
        self._client_error = ClientError
        self._unreachable = (BotoConnectionError, EndpointConnectionError, ReadTimeoutError)

    def _do(self, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except self._unreachable as exc:
            raise Unreachable(type(exc).__name__) from None
        except self._client_error as exc:
            response = getattr(exc, "response", None) or {}
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            code = str(response.get("Error", {}).get("Code", ""))
            message = str(response.get("Error", {}).get("Message", ""))
            headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
            region = str(headers.get("x-amz-bucket-region", ""))
            raise S3Error(status, code, message, region) from None

    def get(self, bucket: str, key: str) -> tuple[bytes, str] | None:
        try:
            r = self._do(lambda: self._client.get_object(Bucket=bucket, Key=key))
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        return r["Body"].read(), str(r["ETag"])

    def put(self, bucket: str, key: str, data: bytes, etag: str | None) -> str | None:
        cond: dict[str, str] = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            r = self._do(lambda: self._client.put_object(Bucket=bucket, Key=key, Body=data, **cond))
        except S3Error as exc:
            if exc.code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return None
            raise
        return str(r["ETag"])

    def delete(self, bucket: str, key: str, etag: str | None = None) -> bool:
        cond: dict[str, str] = {"IfMatch": etag} if etag is not None else {}
        try:
            self._do(lambda: self._client.delete_object(Bucket=bucket, Key=key, **cond))
        except S3Error as exc:
            if etag is not None and (
                exc.status in (404, 412) or exc.code in ("PreconditionFailed", "NoSuchKey")
            ):
                return False
            raise
        return True

    def delete_many(self, bucket: str, keys: list[str]) -> list[tuple[str, str]]:
        r = self._do(
            lambda: self._client.delete_objects(
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
            )
        )
        return [(str(e.get("Key", "?")), str(e.get("Code", "?"))) for e in r.get("Errors") or []]

    def list(self, bucket: str, prefix: str, delimiter: str) -> tuple[list[str], list[str]]:
        def send() -> tuple[list[str], list[str]]:
            keys: list[str] = []
            prefixes: list[str] = []
            extra = {"Delimiter": delimiter} if delimiter else {}
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix, **extra
            )
            for page in pages:
                keys.extend(str(o["Key"]) for o in page.get("Contents", []))
                prefixes.extend(str(p["Prefix"]) for p in page.get("CommonPrefixes", []))
            return keys, prefixes

        return self._do(send)
