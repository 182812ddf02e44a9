"""The requests of an S3 tracking store, made by one of two clients (``_s3io.Bucket``'s):

* :class:`LeanS3`, this module's own: the six requests a store makes (GET, a conditional
  PUT, DELETE, a batch DELETE, a listing), signed with AWS Signature Version 4 over
  ``http.client``. It is hand-written on purpose: botocore's import and client cost the
  driver 0.3-0.4 s on an idle machine (RESULTS.md, "#40: the lean S3 client"), more than a
  whole run of 10^4 no-op blocks tracked on local disk, and this client imports the
  standard library only. It is used only where the configuration is plain
  (:func:`lean_settings`): static credentials, a region and, at most, an endpoint, all in
  the environment, and no AWS config file or proxy;
* botocore's (``_s3boto.BotoRequests``) everywhere else: profiles, SSO, instance roles,
  config files, proxies. ``BELLIS_S3_CLIENT=botocore`` picks it always.

Both raise :class:`Unreachable` when the endpoint cannot be reached (``Bucket`` tries
again with backoff) and :class:`S3Error` for an answer that is an error.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import os
import random
import re
import ssl
import threading
import time
from base64 import b64encode
from collections.abc import Mapping
from typing import NamedTuple, Protocol
from urllib.parse import quote, urlsplit
from xml.etree import ElementTree

from ..errors import TrackingError

__all__ = [
    "BOTOCORE_ONLY",
    "CLIENT_ENV",
    "LeanS3",
    "LeanSettings",
    "Requests",
    "S3Error",
    "Unreachable",
    "lean_settings",
    "sign",
]

#: which client makes the requests: ``auto`` (the lean one where it can) or ``botocore``
CLIENT_ENV = "BELLIS_S3_CLIENT"
_CLIENT_CHOICES = ("auto", "botocore")

#: a setting in any of these is one the lean client does not follow: botocore does
BOTOCORE_ONLY = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)
#: an answer with one of these statuses is tried again (botocore's standard retry mode
#: does the same): 3 tries in all, ``random() * 2**attempt`` seconds apart
_RETRY_STATUS = frozenset((429, 500, 502, 503, 504))
_TRIES = 3
#: seconds to connect and to wait for an answer (botocore's defaults)
_TIMEOUT = 60.0
_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
#: a bucket name that can be a host name below AWS's S3 endpoint (virtual-hosted style)
_VIRTUAL_HOST = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


class Unreachable(Exception):
    """The endpoint could not be reached: the connection was refused, reset or timed out."""


class S3Error(Exception):
    """An error answer: its HTTP status and S3 error code (``NoSuchKey``, ...)."""

    def __init__(self, status: int, code: str, message: str = "", region: str = "") -> None:
        super().__init__(f"{code or status}: {message}" if message else code or str(status))
        self.status = status
        self.code = code
        #: the bucket's region where the answer named it (``x-amz-bucket-region``)
        self.region = region


class Requests(Protocol):
    """What a store asks of its client (keys are whole object keys)."""

    def get(self, bucket: str, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag; None when it does not exist."""

    def put(self, bucket: str, key: str, data: bytes, etag: str | None) -> str | None:
        """Write if the object is still ``etag`` (None: absent); the new ETag, None on 412."""

    def delete(self, bucket: str, key: str, etag: str | None = None) -> bool:
        """Delete the object (only if it is still ``etag``, where given): False when it
        was not (412) or is gone (404) under that condition."""

    def delete_many(self, bucket: str, keys: list[str]) -> list[tuple[str, str]]:
        """Delete up to 1,000 objects: the (key, code) of those not deleted."""

    def list(self, bucket: str, prefix: str, delimiter: str) -> tuple[list[str], list[str]]:
        """The keys below ``prefix`` and, with a ``delimiter``, the common prefixes."""


class LeanSettings(NamedTuple):
    access_key: str
    secret_key: str
    token: str | None
    region: str
    #: ``scheme://host[:port]`` of a custom endpoint (path-style requests), or None: AWS
    endpoint: str | None
    #: the certificates HTTPS trusts (``AWS_CA_BUNDLE``), or None: the system's
    ca_bundle: str | None = None


def lean_settings(environ: Mapping[str, str]) -> LeanSettings | None:
    """The settings of the lean client from ``environ``, or None where botocore must make
    the requests (see the module docstring)."""
    choice = environ.get(CLIENT_ENV, "auto") or "auto"
    if choice not in _CLIENT_CHOICES:
        raise TrackingError(
            f"{CLIENT_ENV}={choice!r}: must be one of {', '.join(_CLIENT_CHOICES)} (auto: "
            "bellis's own client where the AWS configuration is plain, else botocore)"
        )
    if choice == "botocore" or any(environ.get(name) for name in BOTOCORE_ONLY):
        return None
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if not key or not secret or not region:
        return None
    config = environ.get("AWS_CONFIG_FILE") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".aws", "config"
    )
    if os.path.exists(os.path.expanduser(config)):  # it may set an endpoint, a style, ...
        return None
    endpoint = None
    if environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() != "true":
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None  # botocore says what is wrong with it
        if parts.path not in ("", "/") or parts.query or parts.username:
            return None
        endpoint = f"{parts.scheme}://{parts.netloc}"
    return LeanSettings(
        key,
        secret,
        environ.get("AWS_SESSION_TOKEN") or None,
        region,
        endpoint,
        environ.get("AWS_CA_BUNDLE") or None,
    )


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def sign(
    settings: LeanSettings,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: bytes,
    amz_date: str,
) -> dict[str, str]:
    """The headers of a request signed with AWS Signature Version 4 for S3: ``headers``
    (every one signed) with ``host``, ``x-amz-date`` (``amz_date``, ``YYYYMMDDTHHMMSSZ``),
    ``x-amz-content-sha256`` (the body's), the session token if any, and
    ``Authorization``. ``path`` is the encoded path as sent."""
    payload = hashlib.sha256(body).hexdigest()
    signed = {k.lower(): str(v) for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = amz_date
    signed["x-amz-content-sha256"] = payload
    if settings.token is not None:
        signed["x-amz-security-token"] = settings.token
    names = sorted(signed)
    canonical = "\n".join(
        (
            method,
            path,
            _query_string(query),
            "".join(f"{n}:{' '.join(signed[n].split())}\n" for n in names),
            ";".join(names),
            payload,
        )
    )
    day = amz_date[:8]
    scope = f"{day}/{settings.region}/s3/aws4_request"
    to_sign = "\n".join(
        (
            "AWS4-HMAC-SHA256",
            amz_date,
            scope,
            hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        )
    )
    k = _hmac(("AWS4" + settings.secret_key).encode("utf-8"), day)
    for part in (settings.region, "s3", "aws4_request"):
        k = _hmac(k, part)
    signature = hmac.new(k, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={settings.access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed


def _query_string(query: Mapping[str, str]) -> str:
    return "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
    )


def _xml(data: bytes) -> ElementTree.Element:
    """An S3 answer's XML, its tags without their namespace (S3 names one; not every
    S3-compatible server does)."""
    root = ElementTree.fromstring(data)
    for e in root.iter():
        if isinstance(e.tag, str) and e.tag.startswith("{"):
            e.tag = e.tag.partition("}")[2]
    return root


def _error_code(data: bytes) -> tuple[str, str]:
    """The ``Code`` and ``Message`` of an S3 error document ("" where it has none)."""
    try:
        root = _xml(data)
    except ElementTree.ParseError:
        return "", ""
    return (root.findtext("Code") or "", root.findtext("Message") or "")


class LeanS3:
    """The store's requests over ``http.client``, signed (see the module docstring).
    Thread-safe: each request takes an idle connection of the pool or opens one."""

    def __init__(self, settings: LeanSettings) -> None:
        self.settings = settings
        #: host -> the kept connections not in use (a request takes one, gives it back)
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        if settings.endpoint is not None:
            parts = urlsplit(settings.endpoint)
            self._https = parts.scheme == "https"
            self._netloc = parts.netloc
        else:
            self._https = True
            self._netloc = ""
        self._ssl = ssl.create_default_context(cafile=settings.ca_bundle) if self._https else None

    # -- where a request goes -----------------------------------------------------------
    def _where(self, bucket: str, key: str | None) -> tuple[str, str]:
        """The host and the encoded path of ``key`` in ``bucket`` (None: the bucket)."""
        tail = "" if key is None else quote(key, safe="/~")
        if self.settings.endpoint is not None:  # an S3-compatible server: path style
            return self._netloc, f"/{bucket}/{tail}" if key is not None else f"/{bucket}"
        aws = f"s3.{self.settings.region}.amazonaws.com"
        if not _VIRTUAL_HOST.fullmatch(bucket):
            # a dotted name would break TLS as a host name, a legacy name with capitals
            # or underscores is no host name at all: path style, as botocore does
            return aws, f"/{bucket}/{tail}" if key is not None else f"/{bucket}"
        return f"{bucket}.{aws}", f"/{tail}"

    # -- one request ----------------------------------------------------------------------
    def _connection(self, host: str) -> tuple[http.client.HTTPConnection, bool]:
        """An idle kept connection to ``host`` (True: reused) or a new one (False)."""
        with self._lock:
            kept = self._idle.get(host)
            if kept:
                return kept.pop(), True
        if self._https:
            return http.client.HTTPSConnection(host, timeout=_TIMEOUT, context=self._ssl), False
        return http.client.HTTPConnection(host, timeout=_TIMEOUT), False

    def _send(
        self,
        method: str,
        host: str,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: bytes,
    ) -> tuple[int, dict[str, str], bytes]:
        """One try: the status, headers (lower-case names) and body of the answer."""
        target = path + ("?" + _query_string(query) if query else "")
        for _ in range(2):  # a kept connection the server closed meanwhile: once more, fresh
            conn, reused = self._connection(host)
            amz = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
            signed = sign(self.settings, method, host, path, query, headers, body, amz)
            signed["user-agent"] = "bellis"
            try:
                sent = body if body or method in ("PUT", "POST") else None
                conn.request(method, target, body=sent, headers=signed)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused:
                    continue
                raise Unreachable(f"{type(exc).__name__}: {exc}") from None
            answer = {k.lower(): v for k, v in resp.getheaders()}
            if resp.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.setdefault(host, []).append(conn)
            return resp.status, answer, data
        raise AssertionError("unreachable")

    def _request(
        self,
        method: str,
        bucket: str,
        key: str | None,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> tuple[int, dict[str, str], bytes]:
        host, path = self._where(bucket, key)
        for attempt in range(_TRIES):
            status, answer, data = self._send(method, host, path, query or {}, headers or {}, body)
            if status not in _RETRY_STATUS or attempt == _TRIES - 1:
                return status, answer, data
            time.sleep(random.random() * 2**attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def _raise(status: int, data: bytes, answer: Mapping[str, str] | None = None) -> S3Error:
        code, message = _error_code(data)
        region = "" if answer is None else answer.get("x-amz-bucket-region", "")
        return S3Error(
            status, code or ("PermanentRedirect" if status == 301 else ""), message, region
        )

    # -- the store's requests -------------------------------------------------------------
    def get(self, bucket: str, key: str) -> tuple[bytes, str] | None:
        status, answer, data = self._request("GET", bucket, key)
        if status == 200:
            return data, answer.get("etag", "")
        if status == 404 and _error_code(data)[0] in ("NoSuchKey", ""):
            return None
        raise self._raise(status, data, answer)

    def put(self, bucket: str, key: str, data: bytes, etag: str | None) -> str | None:
        cond = {"if-match": etag} if etag is not None else {"if-none-match": "*"}
        status, answer, body = self._request("PUT", bucket, key, headers=cond, body=data)
        if status == 200:
            return answer.get("etag", "")
        if status == 412:
            return None
        if status == 409 and _error_code(body)[0] == "ConditionalRequestConflict":
            return None
        raise self._raise(status, body, answer)

    def delete(self, bucket: str, key: str, etag: str | None = None) -> bool:
        cond = {"if-match": etag} if etag is not None else None
        status, answer, data = self._request("DELETE", bucket, key, headers=cond)
        if status in (200, 204):
            return True
        if etag is not None and (status == 412 or _error_code(data)[0] == "NoSuchKey"):
            return False
        raise self._raise(status, data, answer)

    def delete_many(self, bucket: str, keys: list[str]) -> list[tuple[str, str]]:
        root = ElementTree.Element("Delete", xmlns=_XMLNS)
        ElementTree.SubElement(root, "Quiet").text = "true"
        for k in keys:
            ElementTree.SubElement(ElementTree.SubElement(root, "Object"), "Key").text = k
        body = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
        md5 = b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        status, answer, data = self._request(
            "POST", bucket, None, {"delete": ""}, {"content-md5": md5}, body
        )
        if status != 200:
            raise self._raise(status, data, answer)
        return [
            (e.findtext("Key") or "?", e.findtext("Code") or "?") for e in _xml(data).iter("Error")
        ]

    def list(self, bucket: str, prefix: str, delimiter: str) -> tuple[list[str], list[str]]:
        keys: list[str] = []
        prefixes: list[str] = []
        query = {"list-type": "2", "prefix": prefix}
        if delimiter:
            query["delimiter"] = delimiter
        while True:
            status, answer, data = self._request("GET", bucket, None, query)
            if status != 200:
                raise self._raise(status, data, answer)
            root = _xml(data)
            keys.extend(e.findtext("Key") or "" for e in root.iter("Contents"))
            prefixes.extend(e.findtext("Prefix") or "" for e in root.iter("CommonPrefixes"))
            token = root.findtext("NextContinuationToken")
            if root.findtext("IsTruncated") != "true" or not token:
                return keys, prefixes
            query["continuation-token"] = token
