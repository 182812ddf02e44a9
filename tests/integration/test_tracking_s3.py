"""Tracking stores on S3 (``s3://``, ``bellis._tracking._s3``) against a moto server on
127.0.0.1: a driver process records blocks, is SIGKILLed, and a resume finds no block
falsely done; the lease lock refuses a second driver and lets a third take over once the
killed driver's lease expired; ``bellis status s3://...`` counts what the bucket holds;
the objects are byte for byte those of a local store (the same zarr v3 layout).

The drivers are scripts in subprocesses that open the store through ``bellis._tracking``
(``open_store``), as the run does: a pipeline with ``tracking_path="s3://..."`` is not
wired yet (docs/cloud.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3", reason="S3 tracking tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tracking tests need moto[server] (pip install moto[server])")

from kit import s3 as kit_s3  # noqa: E402
from kit.s3 import BUCKET  # noqa: E402


@pytest.fixture
def moto_server() -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    """A moto S3 server on 127.0.0.1 with one bucket (``kit.s3``)."""
    with kit_s3.moto_server() as served:
        yield served


@pytest.fixture
def s3_env(moto_server: tuple[dict[str, str], subprocess.Popen[bytes]]) -> dict[str, str]:
    return moto_server[0]


_client = kit_s3.client

CELLS = 40

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from bellis._tracking import StoreLayout, open_store

    url, marks, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4])
    layout = StoreLayout((0,), (n,), (0,), (1,), (0,), (1,), "valid")
    store = open_store(url, layout, resource_tracking=False)
    print("opened", flush=True)
    if mode == "hold":  # a live driver: it renews its lease (at each flush) until killed
        for _ in range(1200):
            store.flush()
            time.sleep(0.5)
    if mode == "stall":  # two blocks return at once, then a long block: nothing returns
        store.record_success(0, None, 0, 0.0, 0.0)
        store.record_success(1, None, 0, 0.0, 0.0)
        print("recorded", flush=True)
        time.sleep(600)
    if mode == "gate":  # two blocks, then the close once the test says so
        store.record_success(0, None, 0, 0.0, 0.0)
        store.record_success(1, None, 0, 0.0, 0.0)
        print("recorded", flush=True)
        while not (marks / "go").exists():
            time.sleep(0.05)
        store.close()
        print("finished", flush=True)
        sys.exit(0)
    for cell in range(n):
        if store.is_done(cell):
            continue
        # the block's work: its success file, durable, before it is recorded
        with open(marks / str(cell), "w") as f:
            f.write("ok")
            f.flush()
            os.fsync(f.fileno())
        store.record_success(cell, None, 0, 0.0, 0.0)
        print("recorded", cell, flush=True)
        time.sleep(float(os.environ.get("BLOCK_SECONDS", "0.05")))
    store.close()
    print("finished", flush=True)
    """
)


@functools.cache
def _cached_client(endpoint: str) -> Any:
    return _client({"AWS_ENDPOINT_URL": endpoint})


def _done_cells(env: dict[str, str], prefix: str) -> set[int]:
    """The done markers as the bucket holds them (the chunk object, read by key)."""
    body = (
        _cached_client(env["AWS_ENDPOINT_URL"])
        .get_object(Bucket=BUCKET, Key=f"{prefix}/done/c/0")["Body"]
        .read()
    )
    assert len(body) == CELLS
    return {i for i, b in enumerate(body) if b}


def _start(tmp: Path, env: dict[str, str], url: str, marks: Path, mode: str = "run", **extra: str):
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    marks.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(script), url, str(marks), mode, str(CELLS)],
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _end(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _wait_line(proc: subprocess.Popen[str], want: str, count: int = 1) -> list[str]:
    seen: list[str] = []
    assert proc.stdout is not None
    while sum(line.startswith(want) for line in seen) < count:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"driver ended before {count}x {want!r}: {proc.stderr.read()}")  # type: ignore[union-attr]
        seen.append(line)
    return seen


def _run_until_taken(tmp: Path, env: dict[str, str], url: str, marks: Path, **extra: str):
    """Run a driver until it gets the store (a killed driver's lease must expire first)."""
    return kit_s3.run_until_taken(lambda: _start(tmp, env, url, marks, **extra), _end)


def test_markers_reach_the_bucket_while_a_long_block_runs(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    """Blocks that returned just before a long block are written within a flush interval,
    though no block returns to trigger the write (the lease thread's timer does): a crash
    during a long block must not lose them."""
    url = f"s3://{BUCKET}/stall"
    marks = tmp_path / "marks"
    proc = _start(tmp_path, s3_env, url, marks, "stall", BELLIS_S3_FLUSH_SECONDS="1")
    try:
        _wait_line(proc, "recorded")
        deadline = time.monotonic() + 60  # the interval is 1 s: this allows a slow machine
        seen: set[int] = set()
        while seen != {0, 1}:
            assert time.monotonic() < deadline, f"markers in the bucket: {seen}"
            time.sleep(0.2)
            with contextlib.suppress(Exception):  # not written yet
                seen = _done_cells(s3_env, "stall")
        assert proc.poll() is None  # still in its long block
    finally:
        _end(proc)


def test_killed_driver_resumes_without_false_done(tmp_path: Path, s3_env: dict[str, str]) -> None:
    url = f"s3://{BUCKET}/run1/task_a"
    marks = tmp_path / "marks"
    proc = _start(tmp_path, s3_env, url, marks, BELLIS_S3_LEASE_SECONDS="3")
    try:
        _wait_line(proc, "recorded", 15)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        _end(proc)
    after_kill = _done_cells(s3_env, "run1/task_a")
    succeeded = {int(p.name) for p in marks.iterdir()}
    assert after_kill, "no flush happened in 15 blocks at a 0.2 s interval"
    assert after_kill <= succeeded  # never marked done before it succeeded
    assert len(after_kill) < CELLS

    out, err = _run_until_taken(tmp_path, s3_env, url, marks, BELLIS_S3_LEASE_SECONDS="3")
    assert "finished" in out
    assert "took over the lock of run" in err and "lease expired" in err, err
    rerun = {int(line.split()[1]) for line in out.splitlines() if line.startswith("recorded")}
    assert not rerun & after_kill  # a resumed run skips what the bucket marks done
    final = _done_cells(s3_env, "run1/task_a")
    assert final == set(range(CELLS))
    assert final <= {int(p.name) for p in marks.iterdir()}
    # the lock is released at a clean end
    keys = {
        o["Key"] for o in _client(s3_env).list_objects_v2(Bucket=BUCKET, Prefix="run1/")["Contents"]
    }
    assert "run1/task_a/bellis.lock" not in keys

    status = subprocess.run(
        [sys.executable, "-m", "bellis", "status", url, "--json"],
        env=s3_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    record = json.loads(status.stdout)
    assert record["done"] == len(final) == CELLS, record


def test_second_driver_refused_third_takes_over(tmp_path: Path, s3_env: dict[str, str]) -> None:
    url = f"s3://{BUCKET}/locked"
    marks = tmp_path / "marks"
    # a short lease that the holder renews: the second driver is refused however late it
    # starts, and the killed holder's lease expires soon after
    holder = _start(tmp_path, s3_env, url, marks, "hold", BELLIS_S3_LEASE_SECONDS="8")
    try:
        _wait_line(holder, "opened")
        second = _start(tmp_path, s3_env, url, marks)
        try:
            out, err = second.communicate(timeout=120)
        finally:
            _end(second)
        assert second.returncode != 0
        assert f"block tracking at {url} is in use by another run (run " in err, err
        assert "lease until" in err and "tracking_path=" in err, err
        assert "opened" not in out
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        _end(holder)
    out, err = _run_until_taken(tmp_path, s3_env, url, marks)
    assert f"block tracking at {url}: took over the lock of run" in err, err
    assert "finished" in out
    assert _done_cells(s3_env, "locked") == set(range(CELLS))


def test_a_lock_taken_over_stays_and_the_close_says_the_run_lost_it(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    # another run took the store over (as after an expired lease): the close writes its
    # markers, leaves the other run's lock object alone (its delete is conditional on
    # the ETag it holds) and says that this run lost the lock
    url = f"s3://{BUCKET}/taken"
    marks = tmp_path / "marks"
    proc = _start(tmp_path, s3_env, url, marks, "gate")
    try:
        _wait_line(proc, "recorded")
        other = b'{"run": "other", "host": "elsewhere", "pid": 1, "expires": 4102444800}\n'
        s3 = _client(s3_env)
        s3.put_object(Bucket=BUCKET, Key="taken/bellis.lock", Body=other)
        (marks / "go").write_text("go")
        out, err = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode != 0 and "finished" not in out
    assert f"block tracking at {url}: this run lost its lock" in err, err
    held = s3.get_object(Bucket=BUCKET, Key="taken/bellis.lock")["Body"].read()
    assert held == other  # not deleted
    assert _done_cells(s3_env, "taken") == {0, 1}


def test_objects_match_a_local_store(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """The same records give the same objects as a local store's files (zarr v3 layout)."""
    script = tmp_path / "both.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from bellis._tracking import StoreLayout, open_store
            layout = StoreLayout((0,), (40,), (0,), (1,), (0,), (1,), "valid")
            for where in sys.argv[1:]:
                store = open_store(where, layout, resource_tracking=False)
                for cell in (0, 3, 39):
                    store.record_success(cell, None, 0, 0.0, 0.0)
                store.record_failure(5)
                store.record_failure(5)
                store.close()
            """
        )
    )
    local = tmp_path / "local"
    url = f"s3://{BUCKET}/same"
    done = subprocess.run(
        [sys.executable, str(script), str(local), url],
        env=s3_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    client = _client(s3_env)
    for name in ("zarr.json", "done/zarr.json", "done/c/0", "failures/zarr.json", "failures/c/0"):
        body = client.get_object(Bucket=BUCKET, Key=f"same/{name}")["Body"].read()
        assert body == (local / name).read_bytes(), name


def test_bad_bucket_url_is_named(tmp_path: Path, s3_env: dict[str, str]) -> None:
    script = tmp_path / "bad.py"
    script.write_text(
        "from bellis._tracking import StoreLayout, open_store\n"
        "layout = StoreLayout((0,), (4,), (0,), (1,), (0,), (1,), 'valid')\n"
        "open_store('s3://ab/x', layout, resource_tracking=False)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=s3_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "TrackingError: tracking_path='s3://ab/x': not an S3 store URL" in done.stderr


@pytest.mark.parametrize("requests", ["auto", "botocore"])
def test_a_missing_bucket_is_named_with_the_fix(
    tmp_path: Path, s3_env: dict[str, str], requests: str
) -> None:
    script = tmp_path / "missing.py"
    script.write_text(
        "from bellis._tracking import StoreLayout, open_store\n"
        "layout = StoreLayout((0,), (4,), (0,), (1,), (0,), (1,), 'valid')\n"
        "open_store('s3://no-such-bucket-here/x', layout, resource_tracking=False)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**s3_env, "BELLIS_S3_CLIENT": requests},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("bellis.errors.TrackingError: block tracking at "), done.stderr
    assert "s3://no-such-bucket-here/x: " in last and "NoSuchBucket" in last, last
    assert "the bucket 'no-such-bucket-here' does not exist at this endpoint" in last, last


def test_endpoint_gone_stops_with_the_url(
    tmp_path: Path, moto_server: tuple[dict[str, str], subprocess.Popen[bytes]]
) -> None:
    """The server stops mid-run: the flush is tried again with backoff, then the driver
    stops with a TrackingError naming the URL (moto keeps its objects in memory, so a
    restarted server could not show the markers kept; docs/cloud.md)."""
    env, server = moto_server
    url = f"s3://{BUCKET}/gone"
    marks = tmp_path / "marks"
    proc = _start(tmp_path, env, url, marks, BLOCK_SECONDS="0.5")
    try:
        _wait_line(proc, "recorded", 2)
        server.terminate()
        server.wait(60)
        out, err = proc.communicate(timeout=300)
    finally:
        _end(proc)
    assert proc.returncode != 0
    assert "finished" not in out
    assert "trying again in 0.5 s" in err, err
    assert f"TrackingError: block tracking at {url}: writing done/c/0 failed, the endpoint " in err
    assert "cannot be reached" in err, err


def test_find_stores_is_store_and_clear_done(tmp_path: Path, s3_env: dict[str, str]) -> None:
    script = tmp_path / "stores.py"
    script.write_text(
        textwrap.dedent(
            """
            import json
            from bellis._tracking import StoreLayout, find_stores, is_store, open_store
            from bellis._tracking import open_readonly, backend_for
            layout = StoreLayout((0,), (40,), (0,), (1,), (0,), (1,), "valid")
            base = "s3://bellis-test/base"
            for name in ("b", "a"):
                store = open_store(f"{base}/{name}", layout, resource_tracking=False)
                for cell in range(10):
                    store.record_success(cell, None, 0, 0.0, 0.0)
                store.close()
            cleared = backend_for(base).clear_done(
                __import__("pathlib").Path(f"{base}/a"), (40,), [1, 2, 30]
            )
            store = open_readonly(f"{base}/a")
            print(json.dumps({
                "found": [str(p) for p in find_stores(base)],
                "base_is_store": is_store(base),
                "a_is_store": is_store(f"{base}/a"),
                "cleared": cleared,
                "done_a": [int(c) for c in store.done.nonzero()[0]],
            }))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=s3_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    # Path folds s3:// to s3:/ in str(); what matters is both stores, in name order
    assert [p.rsplit("/", 1)[1] for p in got["found"]] == ["a", "b"]
    assert got["base_is_store"] is False and got["a_is_store"] is True
    assert got["cleared"] == 2
    assert got["done_a"] == [0, 3, 4, 5, 6, 7, 8, 9]
    assert _done_cells(s3_env, "base/a") == {0, 3, 4, 5, 6, 7, 8, 9}
    assert _done_cells(s3_env, "base/b") == set(range(10))
