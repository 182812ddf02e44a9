"""A moto S3 server on 127.0.0.1 for the tests of tracking on S3 (docs/cloud.md).

``moto_server()`` starts ``python -m moto.server`` on a free port and makes one bucket,
``BUCKET``; it gives the environment that reaches it (the standard AWS variables, as a
user's would be) and the server's process, and stops the server at its end. A test
module makes its fixture of it and skips itself, with a reason, when boto3 or moto is
absent (``pytest.importorskip`` before importing this).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

BUCKET = "bellis-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_clients: dict[str, Any] = {}


def client(env: dict[str, str]) -> Any:
    """The boto3 client of the server ``env`` reaches, made once per server: making one
    loads the endpoint rules (``botocore/endpoint_provider.py``), seconds on a loaded
    machine, and the tests call this in their polling loops."""
    endpoint = env["AWS_ENDPOINT_URL"]
    found = _clients.get(endpoint)
    if found is None:
        import boto3

        found = _clients[endpoint] = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
    return found


@contextlib.contextmanager
def moto_server() -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    """A moto S3 server on 127.0.0.1 with one bucket: the environment that reaches it, and
    its process."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the moto server did not start")
                time.sleep(0.2)
        env = dict(os.environ)
        env.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            BELLIS_S3_FLUSH_SECONDS="0.2",
        )
        # a user's environment as the tests expect it: no profile, config file or proxy
        # of the machine's (bellis's lean client takes this one; ``_s3http``)
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
            env.pop(name, None)
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env.pop(name, None)
            env.pop(name.lower(), None)
        env["AWS_CONFIG_FILE"] = os.devnull + ".absent"
        env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull + ".absent"
        client(env).create_bucket(Bucket=BUCKET)
        yield env, server
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_until_taken(
    start: Callable[[], subprocess.Popen[str]],
    end: Callable[[subprocess.Popen[str]], object],
    limit: float = 240,
) -> tuple[str, str]:
    """Start a driver (``start()``) again and again until it gets the store: a killed
    driver's lease must expire first, and until then each one is refused with the lock's
    message. Its output, once one ran to the end; ``end`` reaps each one in a finally."""
    deadline = time.monotonic() + limit
    while True:
        proc = start()
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            end(proc)
        if proc.returncode == 0:
            return out, err
        assert "is in use by another run" in err, err
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.5)
