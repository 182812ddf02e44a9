"""bellis's lean S3 client (``_tracking._s3http``), pure: its Signature Version 4 against
AWS's published example and against botocore's signer on the same requests, and which
AWS configurations it takes (the rest go to botocore). No sockets: the requests
themselves are exercised against the moto server by the S3 integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from bellis._tracking._s3http import LeanS3, LeanSettings, _query_string, lean_settings, sign
from bellis.errors import TrackingError

EXAMPLE = LeanSettings(
    "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", None, "us-east-1", None
)


def test_the_signature_of_aws_s3_documented_get_object_example() -> None:
    # AWS's S3 API reference, "Signature Calculations for the Authorization Header:
    # Transferring Payload in a Single Chunk", example GET Object
    headers = sign(
        EXAMPLE,
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        {},
        {"Range": "bytes=0-9"},
        b"",
        "20130524T000000Z",
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-content-sha256"] == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


CASES = [
    # method, path as sent, query, headers, body, session token
    ("GET", "/bellis-test/store/zarr.json", {}, {}, b"", None),
    ("PUT", "/bellis-test/store/done/c/0/0", {}, {"if-none-match": "*"}, b"\x00\x01" * 50, None),
    ("PUT", "/b/a%20b/c%2Bd/%C3%A9.json", {}, {"if-match": '"9f2c"'}, b"{}", "session/tok+="),
    ("DELETE", "/bellis-test/store/bellis.lock", {}, {}, b"", None),
    (
        "POST",
        "/bellis-test",
        {"delete": ""},
        {"content-md5": "1B2M2Y8AsgTpgAmY7PhCfg=="},
        b"<x/>",
        None,
    ),
    (
        "GET",
        "/bellis-test",
        {"list-type": "2", "prefix": "store/runs/a b", "continuation-token": "a/b=c+"},
        {},
        b"",
        None,
    ),
]


@pytest.mark.parametrize(("method", "path", "query", "headers", "body", "token"), CASES)
def test_the_signature_is_botocores_for_the_same_request(
    method: str,
    path: str,
    query: dict[str, str],
    headers: dict[str, str],
    body: bytes,
    token: str | None,
) -> None:
    auth_mod = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    settings = LeanSettings(
        "AKIDEXAMPLE",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        token,
        "eu-west-2",
        "http://127.0.0.1:9000",
    )
    amz = "20261206T221500Z"
    ours = sign(settings, method, "127.0.0.1:9000", path, query, headers, body, amz)
    url = "http://127.0.0.1:9000" + path + ("?" + _query_string(query) if query else "")
    request = AWSRequest(
        method, url, data=body, headers={k: v for k, v in ours.items() if k != "authorization"}
    )
    request.context["timestamp"] = amz
    auth = auth_mod.S3SigV4Auth(
        Credentials(settings.access_key, settings.secret_key, token), "s3", "eu-west-2"
    )
    signature = auth.signature(
        auth.string_to_sign(request, auth.canonical_request(request)), request
    )
    assert ours["authorization"].endswith(f", Signature={signature}")
    assert ours["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261206/eu-west-2/s3/aws4_request, "
    )
    assert ("x-amz-security-token" in ours) is (token is not None)


# -- which configuration it takes ------------------------------------------------------
PLAIN = {
    "AWS_ACCESS_KEY_ID": "AKID",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
}


def plain(tmp_path: Path, **changes: str | None) -> dict[str, str]:
    env = {**PLAIN, "HOME": str(tmp_path)}  # no ~/.aws/config there
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def test_static_credentials_a_region_and_an_endpoint_in_the_environment_are_lean(
    tmp_path: Path,
) -> None:
    got = lean_settings(plain(tmp_path, AWS_SESSION_TOKEN="tok", AWS_CA_BUNDLE="/ca.pem"))
    assert got == LeanSettings(
        "AKID", "secret", "tok", "us-east-1", "http://127.0.0.1:5000", "/ca.pem"
    )
    # the S3 endpoint variable wins over the general one; a trailing slash is dropped
    got = lean_settings(plain(tmp_path, AWS_ENDPOINT_URL_S3="https://minio.example:9000/"))
    assert got is not None and got.endpoint == "https://minio.example:9000"
    # no endpoint: AWS itself, in the region AWS_REGION names first
    got = lean_settings(plain(tmp_path, AWS_ENDPOINT_URL=None, AWS_REGION="eu-central-1"))
    assert got is not None and got.endpoint is None and got.region == "eu-central-1"
    got = lean_settings(plain(tmp_path, AWS_IGNORE_CONFIGURED_ENDPOINT_URLS="true"))
    assert got is not None and got.endpoint is None


@pytest.mark.parametrize(
    "changes",
    [
        {"BELLIS_S3_CLIENT": "botocore"},
        {"AWS_ACCESS_KEY_ID": None},  # credentials from a profile, SSO, an instance role
        {"AWS_SECRET_ACCESS_KEY": ""},
        {"AWS_DEFAULT_REGION": None},  # the region from a config file
        {"AWS_PROFILE": "work"},
        {"HTTPS_PROXY": "http://proxy:3128"},
        {"https_proxy": "http://proxy:3128"},
        {"AWS_MAX_ATTEMPTS": "10"},
        {"AWS_USE_FIPS_ENDPOINT": "true"},
        {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000/some/path"},
        {"AWS_ENDPOINT_URL": "ftp://127.0.0.1"},
    ],
)
def test_anything_more_goes_to_botocore(tmp_path: Path, changes: dict[str, str | None]) -> None:
    assert lean_settings(plain(tmp_path, **changes)) is None


def test_an_aws_config_file_goes_to_botocore(tmp_path: Path) -> None:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\ns3 =\n  addressing_style = virtual\n")
    assert lean_settings(plain(tmp_path)) is None
    other = tmp_path / "elsewhere.ini"
    assert lean_settings(plain(tmp_path, AWS_CONFIG_FILE=str(other))) is not None
    other.write_text("[default]\n")
    assert lean_settings(plain(tmp_path, AWS_CONFIG_FILE=str(other))) is None


def test_a_bad_client_choice_names_the_variable_the_value_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(TrackingError) as info:
        lean_settings(plain(tmp_path, BELLIS_S3_CLIENT="boto3"))
    text = str(info.value)
    assert "BELLIS_S3_CLIENT='boto3'" in text and "auto, botocore" in text


# -- where a request goes ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("endpoint", "bucket", "key", "host", "path"),
    [
        # an S3-compatible server: path style, the key encoded once
        ("http://127.0.0.1:5000", "b1", "p/a b+c.json", "127.0.0.1:5000", "/b1/p/a%20b%2Bc.json"),
        ("https://minio.example:9000", "b1", None, "minio.example:9000", "/b1"),
        # AWS: virtual-hosted where the bucket can be a host name, else path style
        (None, "my-bucket", "k/zarr.json", "my-bucket.s3.eu-west-2.amazonaws.com", "/k/zarr.json"),
        (None, "my-bucket", None, "my-bucket.s3.eu-west-2.amazonaws.com", "/"),
        (None, "my.bucket", "k", "s3.eu-west-2.amazonaws.com", "/my.bucket/k"),
        (None, "Legacy_Bucket", "k", "s3.eu-west-2.amazonaws.com", "/Legacy_Bucket/k"),
    ],
)
def test_where_a_request_goes(
    endpoint: str | None, bucket: str, key: str | None, host: str, path: str
) -> None:
    client = LeanS3(LeanSettings("AKID", "secret", None, "eu-west-2", endpoint))
    assert client._where(bucket, key) == (host, path)
