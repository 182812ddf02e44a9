"""A pipeline tracked on S3 (``Task(tracking_path="s3://...")``) through the public API,
against a moto server on 127.0.0.1 (docs/cloud.md): a 2-task pipeline run by a script in
a subprocess, distributed (2 local workers) and serial; the driver SIGKILLed mid-run and
resumed: no block falsely done, every block done at the end, ``bellis status s3://...``
counts what the bucket holds, each run's report an object of its own; and the lease
renewed while no block returns (a second driver is refused even when the blocks take
longer than the lease).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3", reason="S3 tracking tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tracking tests need moto[server] (pip install moto[server])")

from kit import s3 as kit_s3
from kit.s3 import BUCKET

client = kit_s3.client


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    """The environment that reaches a moto S3 server on 127.0.0.1 (``kit.s3``)."""
    with kit_s3.moto_server() as (env, _server):
        yield env


N = 40

PIPELINE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import bellis as daisy
    from funlib.geometry import Roi

    base, marks, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4])
    gate = os.environ.get("GATE")  # blocks of b after the first 5 wait for this file
    release = os.environ.get("RELEASE")  # every block waits for this file

    def work(task):
        def process(block):
            x = block.write_roi.offset[0]
            if release:
                (marks / "started").write_text("1")
                while not os.path.exists(release):
                    time.sleep(0.05)
            if gate and task == "b" and not os.path.exists(gate):
                # the first 5 blocks of b to start (whichever they are) take a token and
                # finish; every later one waits for the gate
                for i in range(5):
                    try:
                        os.close(os.open(marks / f"token-{i}", os.O_CREAT | os.O_EXCL))
                        break
                    except FileExistsError:
                        pass
                else:
                    while not os.path.exists(gate):
                        time.sleep(0.05)
            # the block's work: its success file, durable, before it returns
            with open(marks / f"{task}-{x}", "w") as f:
                f.write("ok")
                f.flush()
                os.fsync(f.fileno())
        return process

    def task(name, upstream):
        return daisy.Task(
            name,
            total_roi=Roi((0,), (n,)),
            read_roi=Roi((0,), (1,)),
            write_roi=Roi((0,), (1,)),
            process_function=work(name),
            num_workers=2,
            read_write_conflict=False,
            upstream_tasks=upstream,
            tracking_path=f"{base}/{name}",
        )

    a = task("a", None)
    b = task("b", [a])
    ok = daisy.run_blockwise([a, b], multiprocessing=(mode == "dist"))
    print("ok" if ok else "failed", flush=True)
    print("botocore imported", "botocore" in sys.modules, flush=True)
    print("report", a.report() is not None, flush=True)
    sys.exit(0 if ok else 3)
    """
)


def _start(tmp: Path, env: dict[str, str], base: str, marks: Path, mode: str, **extra: str):
    script = tmp / "pipeline.py"
    script.write_text(PIPELINE)
    marks.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, str(script), base, str(marks), mode, str(N)],
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its workers too are ended with it (killpg)
    )


def _end(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Kill ``proc``'s process group if it still runs, reap it, return its output."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    out, err = proc.communicate()
    return out, err


def _finished(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Wait for ``proc`` (at most 300 s; its process group is killed either way) and
    return its output."""
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        _end(proc)
    return out, err


def _run_script(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    """Run a driver script (``argv``) in a session of its own to its end: the process
    (its ``returncode``), its stdout and stderr."""
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return (proc, *_finished(proc))


@functools.cache
def _cached_client(endpoint: str) -> Any:
    return client({"AWS_ENDPOINT_URL": endpoint})


def _chunk(env: dict[str, str], key: str) -> bytes | None:
    """An object's bytes; None before it was first flushed."""
    try:
        return bytes(
            _cached_client(env["AWS_ENDPOINT_URL"])
            .get_object(Bucket=BUCKET, Key=key)["Body"]
            .read()
        )
    except Exception:  # not flushed yet
        return None


def _done(env: dict[str, str], prefix: str, n: int = N) -> set[int]:
    body = _chunk(env, f"{prefix}/done/c/0")
    if body is None:
        return set()
    assert len(body) == n
    return {i for i, b in enumerate(body) if b}


def _coded(env: dict[str, str], prefix: str, n: int = N) -> set[int]:
    """The cells whose code version (uint16, little-endian) is on the bucket."""
    body = _chunk(env, f"{prefix}/code_version/c/0")
    if body is None:
        return set()
    assert len(body) == 2 * n
    return {i for i in range(n) if int.from_bytes(body[2 * i : 2 * i + 2], "little")}


def _succeeded(marks: Path, task: str) -> set[int]:
    return {int(p.name.split("-")[1]) for p in marks.glob(f"{task}-*")}


def _wait(what: str, cond: Any, proc: subprocess.Popen[str], limit: float = 200) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the driver ended before {what}: {out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _lock_expires(env: dict[str, str], prefix: str) -> float | None:
    try:
        body = client(env).get_object(Bucket=BUCKET, Key=f"{prefix}/bellis.lock")["Body"].read()
    except Exception:
        return None
    return float(json.loads(body)["expires"])


def _status(env: dict[str, str], url: str) -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "bellis", "status", url, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    return data[0] if isinstance(data, list) else data


def _kill_mid_run(
    tmp: Path, env: dict[str, str], base: str, marks: Path, mode: str, gate: Path
) -> None:
    """Run the pipeline into ``base`` and SIGKILL its driver once 5 blocks of b ran (so
    their a blocks too) and a's markers reached the bucket. The rest of b waits for
    ``gate``, so the driver is surely mid-run when killed. Which blocks of a and b ran
    first is the scheduler's choice (a serial run may interleave them): none is named."""
    prefix = base.removeprefix(f"s3://{BUCKET}/")
    proc = _start(tmp, env, base, marks, mode, GATE=str(gate))
    try:
        _wait(
            "5 blocks of b",
            lambda: len(_succeeded(marks, "b")) >= 5 and _done(env, f"{prefix}/a"),
            proc,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        _end(proc)


def _resume(tmp: Path, env: dict[str, str], base: str, marks: Path, mode: str) -> tuple[str, str]:
    """Run the pipeline again until it is no longer refused (the killed driver's lease
    must expire first); its output, once it ran to the end."""
    return kit_s3.run_until_taken(lambda: _start(tmp, env, base, marks, mode), _end, 300)


@pytest.mark.parametrize(
    ("mode", "requests"), [("dist", "auto"), ("serial", "auto"), ("dist", "botocore")]
)
def test_pipeline_on_s3_killed_and_resumed(
    tmp_path: Path, s3_env: dict[str, str], mode: str, requests: str
) -> None:
    # auto: bellis's lean client makes the requests (static credentials in the
    # environment); botocore: BELLIS_S3_CLIENT picks botocore's, as a profile would
    base = f"s3://{BUCKET}/pipe"
    marks = tmp_path / "marks"
    gate = tmp_path / "gate"
    env = {**s3_env, "BELLIS_S3_LEASE_SECONDS": "3", "BELLIS_S3_CLIENT": requests}
    _kill_mid_run(tmp_path, env, base, marks, mode, gate)
    for task in ("a", "b"):
        marked = _done(s3_env, f"pipe/{task}")
        assert marked <= _succeeded(marks, task), task  # never done before it succeeded
        # and never done on the bucket before its code version is there (the run
        # writes them on time from another thread while blocks keep coming back)
        assert marked <= _coded(s3_env, f"pipe/{task}"), task
    assert len(_done(s3_env, "pipe/b")) < N

    gate.write_text("open")
    out, err = _resume(tmp_path, env, base, marks, mode)
    assert "ok" in out and "report True" in out, out
    assert f"botocore imported {requests == 'botocore'}" in out, out
    assert "took over the lock of run" in err, err

    s3 = client(s3_env)
    for task in ("a", "b"):
        prefix = f"pipe/{task}"
        assert _done(s3_env, prefix) == set(range(N)) == _coded(s3_env, prefix)
        assert _succeeded(marks, task) == set(range(N))
        status = _status(s3_env, f"{base}/{task}")
        assert status["done"] == len(_done(s3_env, prefix)) == N
        assert status["path"] == f"{base}/{task}"
        # one object per run that ended (the killed run wrote none): the resumed run's
        runs = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/runs/").get("Contents", [])
        assert len(runs) == 1 and status["runs"] == 1
        line = json.loads(s3.get_object(Bucket=BUCKET, Key=runs[0]["Key"])["Body"].read())
        assert line["task_id"] == task
        # the lock was released at the end
        assert _lock_expires(s3_env, prefix) is None


def test_lease_renewed_while_blocks_outlast_it(tmp_path: Path, s3_env: dict[str, str]) -> None:
    base = f"s3://{BUCKET}/lease"
    marks = tmp_path / "marks"
    release = tmp_path / "release"
    # renewed every third of its length: a 10 s lease bears a stall of the driver's
    # renewal thread of several seconds on a loaded machine
    env = {**s3_env, "BELLIS_S3_LEASE_SECONDS": "10"}
    first = _start(tmp_path, env, base, marks, "dist", RELEASE=str(release))
    second = None
    try:
        _wait("the first block", lambda: (marks / "started").exists(), first)
        granted = _lock_expires(s3_env, "lease/a")
        assert granted is not None
        # past the lease the lock was first given: without a renewal it has expired now
        _wait("the first lease's end", lambda: time.time() > granted + 2, first)
        assert not _succeeded(marks, "a")  # no block returned meanwhile
        other = tmp_path / "other"
        second = _start(tmp_path, env, base, other, "dist")
        out, err = second.communicate(timeout=300)
        assert second.returncode != 0, out
        assert "is in use by another run" in err, err
        assert not _succeeded(other, "a")  # the second driver ran nothing
        release.write_text("go")
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
        assert "took over" not in err
    finally:
        _end(first)
        if second is not None:
            _end(second)
    assert _done(s3_env, "lease/a") == set(range(N))
    assert _done(s3_env, "lease/b") == set(range(N))


CODE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import bellis as daisy
    from funlib.geometry import Roi

    url, marks, mode, version = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]

    def process(block):
        (marks / f"c-{block.write_roi.offset[0]}").write_text("ok")

    task = daisy.Task(
        "c",
        total_roi=Roi((0,), (20,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=url,
        version=version,
        on_code_change="rerun",
    )
    sys.exit(0 if daisy.run_blockwise([task], multiprocessing=(mode == "dist")) else 3)
    """
)


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_code_change_detected_on_s3(tmp_path: Path, s3_env: dict[str, str], mode: str) -> None:
    """The code-version table and array live on S3 too: a run of other code (another
    ``version=``) with ``on_code_change="rerun"`` redoes the done blocks; the same code
    skips them."""
    script = tmp_path / "code.py"
    script.write_text(CODE)
    marks = tmp_path / "marks"
    marks.mkdir()
    url = f"s3://{BUCKET}/code"

    def run(version: str) -> set[int]:
        for p in marks.iterdir():
            p.unlink()
        proc, out, err = _run_script(
            [sys.executable, str(script), url, str(marks), mode, version], s3_env
        )
        assert proc.returncode == 0, out + err
        return _succeeded(marks, "c")

    assert run("1") == set(range(20))
    assert run("1") == set()  # the same code: every block is done
    assert run("2") == set(range(20))  # other code: every block made by "1" runs again
    table = json.loads(
        client(s3_env).get_object(Bucket=BUCKET, Key="code/code_versions.json")["Body"].read()
    )
    assert len({e["hash"] for e in table["versions"]}) == 2  # "1" and "2"
    status = _status(s3_env, url)
    assert status["done"] == 20
    assert status["code_versions"], status  # bellis status reads the table on S3 too


FAILING = textwrap.dedent(
    """
    import sys
    import bellis as daisy
    from funlib.geometry import Roi

    url, mode = sys.argv[1], sys.argv[2]

    def process(block):
        if block.write_roi.offset[0] == 3:
            raise ValueError("block three is broken")

    task = daisy.Task(
        "f",
        total_roi=Roi((0,), (8,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        num_workers=2,
        max_retries=0,
        read_write_conflict=False,
        tracking_path=url,
    )
    try:
        ok = daisy.run_blockwise([task], multiprocessing=(mode == "dist"))
    except ValueError as exc:  # serial mode raises the block's exception, as daisy's does
        print("raised", exc)
    else:
        print("ok" if ok else "failed")
    """
)


def test_run_report_and_errors_are_objects(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """No append on S3: the run's report and its errors.jsonl are one object each
    (distributed: a serial run raises the block's exception, as daisy's does)."""
    mode = "dist"
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    url = f"s3://{BUCKET}/fail"
    _proc, out, err = _run_script([sys.executable, str(script), url, mode], s3_env)
    assert "failed" in out, out + err
    s3 = client(s3_env)

    def objects(prefix: str) -> list[bytes]:
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"fail/{prefix}").get("Contents", [])
        return [s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed]

    runs = objects("runs/")
    assert len(runs) == 1
    assert json.loads(runs[0])["task_id"] == "f"
    errors = objects("errors/")
    assert len(errors) == 1 and b"block three is broken" in errors[0], errors
    assert _done(s3_env, "fail", 8) == set(range(8)) - {3}
    status = _status(s3_env, url)
    assert status["runs"] == 1 and status["failed"] == 1 and status["done"] == 7


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_a_new_store_that_cannot_be_made_stops_the_run_before_any_block(
    tmp_path: Path, s3_env: dict[str, str], mode: str
) -> None:
    """A first run writes its store's metadata while its workers start (``_s3open``): an
    error there (here a ``done`` array of another shape left at the prefix, with no
    group) still stops the run before any block runs, names the object, releases the
    lock and leaves no group, and a run after the fix starts the store afresh."""
    s3 = client(s3_env)
    prefix = f"made-{mode}"
    wrong = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [7],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [7]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}],
    }
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/a/done/zarr.json", Body=json.dumps(wrong))
    marks = tmp_path / "marks"
    proc = _start(tmp_path, s3_env, f"s3://{BUCKET}/{prefix}", marks, mode)
    out, err = _finished(proc)
    assert proc.returncode not in (0, None), out + err
    assert "done/zarr.json is another array's" in err, err
    assert f"s3://{BUCKET}/{prefix}/a" in err, err
    assert _succeeded(marks, "a") == set() and _succeeded(marks, "b") == set()
    keys = {
        o["Key"]
        for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/a/").get("Contents", [])
    }
    assert f"{prefix}/a/bellis.lock" not in keys  # released: the next run is not refused
    assert f"{prefix}/a/zarr.json" not in keys  # no group over arrays that are not its own
    assert not any("/c/" in k for k in keys), keys  # no chunk either
    s3.delete_object(Bucket=BUCKET, Key=f"{prefix}/a/done/zarr.json")
    proc = _start(tmp_path, s3_env, f"s3://{BUCKET}/{prefix}", marks, mode)
    out, err = _finished(proc)
    assert proc.returncode == 0, out + err
    assert _done(s3_env, f"{prefix}/a") == set(range(N)) == _succeeded(marks, "a")
    assert _done(s3_env, f"{prefix}/b") == set(range(N)) == _succeeded(marks, "b")


ZARR_READER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import zarr

    url, endpoint = sys.argv[1], sys.argv[2]
    group = zarr.open_group(
        url, mode="r", storage_options={"endpoint_url": endpoint, "anon": False}
    )
    done = group["done"][:]
    print(json.dumps({
        "done": np.flatnonzero(done).tolist(),
        "hash": group.attrs.get("daisy_task_hash"),
        "arrays": sorted(name for name, _ in group.arrays()),
    }))
    """
)


def _zarr_read(env: dict[str, str], url: str) -> dict[str, Any]:
    """The store at ``url`` as zarr itself reads it (its ``FsspecStore`` over s3fs), in
    a process of its own, as a user's notebook would."""
    r = subprocess.run(
        [sys.executable, "-c", ZARR_READER, url, env["AWS_ENDPOINT_URL"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def test_a_zarr_reader_sees_the_markers_bellis_status_counts(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    """The store on S3 is a zarr v3 group that zarr's own reader opens: mid-run (the
    driver killed) and after the resume, its ``done`` array names the blocks bellis
    status counts, none without its success file."""
    pytest.importorskip("s3fs", reason="zarr reads s3:// through s3fs (pip install 'bellis[s3]')")
    base = f"s3://{BUCKET}/zr"
    marks = tmp_path / "marks"
    gate = tmp_path / "gate"
    env = {**s3_env, "BELLIS_S3_LEASE_SECONDS": "3"}
    _kill_mid_run(tmp_path, env, base, marks, "dist", gate)
    for task in ("a", "b"):
        seen = _zarr_read(s3_env, f"{base}/{task}")  # no chunk yet: zarr reads zeros
        assert set(seen["done"]) == _done(s3_env, f"zr/{task}") <= _succeeded(marks, task)
        assert _status(s3_env, f"{base}/{task}")["done"] == len(seen["done"])
        assert {"done", "failures"} <= set(seen["arrays"]) and seen["hash"]
    gate.write_text("open")
    _resume(tmp_path, env, base, marks, "dist")
    for task in ("a", "b"):
        seen = _zarr_read(s3_env, f"{base}/{task}")
        assert seen["done"] == list(range(N)) == sorted(_succeeded(marks, task))
        assert _status(s3_env, f"{base}/{task}")["done"] == N


TAKEN_OVER = textwrap.dedent(
    """
    import os, sys
    import bellis as daisy
    from funlib.geometry import Roi

    url, counter, other, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    n = 20

    def process(block):
        # the last block to start hands the store to "another run", as a takeover after
        # an expired lease does: the run's blocks finish, its close finds the lock gone
        with open(counter, "a") as f:
            f.write("x")
        if os.path.getsize(counter) == n:
            import boto3

            bucket, key = url[len("s3://"):].split("/", 1)
            boto3.client("s3").put_object(
                Bucket=bucket, Key=key + "/bellis.lock", Body=open(other, "rb").read()
            )

    task = daisy.Task(
        "t",
        total_roi=Roi((0,), (n,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=url,
    )
    ok = daisy.run_blockwise([task], multiprocessing=(mode == "dist"))
    print("returned", ok, flush=True)
    """
)


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_a_run_that_lost_its_lock_prints_its_summary_then_raises(
    tmp_path: Path, s3_env: dict[str, str], mode: str
) -> None:
    """An S3 store is closed (the run's record, the lock's release) while the summary is
    printed: a close that fails (the lock another run took) still ends the run with its
    error, after the summary, and leaves that run's lock object in place."""
    s3 = client(s3_env)
    url = f"s3://{BUCKET}/lost-{mode}"
    other = b'{"run": "other", "host": "elsewhere", "pid": 1, "expires": 4102444800}\n'
    (tmp_path / "other").write_bytes(other)
    script = tmp_path / "taken.py"
    script.write_text(TAKEN_OVER)
    # a lease far longer than the run: no renewal finds the takeover before the close
    proc, out, err = _run_script(
        [sys.executable, str(script), url, str(tmp_path / "count"), str(tmp_path / "other"), mode],
        {**s3_env, "BELLIS_S3_LEASE_SECONDS": "600"},
    )
    assert (tmp_path / "count").read_text() == "x" * 20  # every block ran once
    assert proc.returncode == 1, out + err
    assert "returned" not in out, out
    # the summary first (stdout), with what ran, then the close's error (stderr)
    row = next(line for line in out.splitlines() if line.strip().startswith("t "))
    # task, status, blocks, completed, skipped, failed, orphaned
    assert row.split()[2:] == ["20", "20", "0", "0", "0"], out
    assert f"TrackingError: block tracking at {url}: this run lost its lock" in err, err
    held = s3.get_object(Bucket=BUCKET, Key=f"lost-{mode}/bellis.lock")["Body"].read()
    assert held == other  # the other run's lock is left alone
