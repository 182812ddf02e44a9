"""The S3 store's URLs and settings (``bellis._tracking._s3``), sans I/O: which paths
name an S3 store, their canonical URL, and the flush/lease settings' errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bellis._tracking import backend_for
from bellis._tracking._backends import LocalStores
from bellis._tracking._s3 import flush_seconds, is_s3_url, lease_seconds, s3_url
from bellis._tracking._s3stores import S3Stores
from bellis.errors import TrackingError


def test_s3_urls_and_their_path_form_pick_the_s3_backend() -> None:
    assert is_s3_url("s3://bucket/a/b")
    assert is_s3_url(Path("s3://bucket/a/b"))  # Path folds it to s3:/bucket/a/b
    assert not is_s3_url("/data/s3/bucket")
    assert not is_s3_url("s3-bucket/x")
    assert s3_url(Path("s3://bucket/a/b/")) == "s3://bucket/a/b"
    assert s3_url("s3://bucket/a/b/") == "s3://bucket/a/b"
    assert isinstance(backend_for("s3://bucket/p"), S3Stores)
    assert isinstance(backend_for("/tmp/track"), LocalStores)


def test_settings_default_and_bad_values_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BELLIS_S3_FLUSH_SECONDS", raising=False)
    monkeypatch.delenv("BELLIS_S3_LEASE_SECONDS", raising=False)
    assert flush_seconds() == 5.0
    assert lease_seconds() == 120.0
    monkeypatch.setenv("BELLIS_S3_FLUSH_SECONDS", "0.5")
    assert flush_seconds() == 0.5
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("BELLIS_S3_LEASE_SECONDS", bad)
        with pytest.raises(TrackingError, match=r"BELLIS_S3_LEASE_SECONDS='.*': must be a"):
            lease_seconds()
