"""``Task.reset()`` of a task tracked on S3 (docs/cloud.md), through the public API in
subprocesses, against a moto server on 127.0.0.1 (and, on the way, a ``CodeChangedError``
naming the store by its URL, ``BlockStore.path``): refused with the run lock's message
while another run's lease is alive (nothing deleted), then every object of the store's
prefix deleted (a sibling prefix left alone, an expired lease taken over), and the next
run redoes every block.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="S3 tracking tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tracking tests need moto[server] (pip install moto[server])")

from kit import s3 as kit_s3
from kit.s3 import BUCKET

N = 8

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import bellis as daisy
    from bellis.errors import CodeChangedError, TrackingError
    from funlib.geometry import Roi

    url, marks, action = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

    def process(block):
        (marks / f"b-{block.write_roi.offset[0]}").write_text("1")

    task = daisy.Task(
        "seg",
        total_roi=Roi((0,), (__N__,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=url,
        version="2" if action == "changed" else "1",
        on_code_change="error",
    )
    if action == "reset":
        try:
            print("reset:", task.reset())
            print("again:", task.reset())  # nothing left: None
        except TrackingError as exc:
            print("refused:", exc)
            sys.exit(4)
    elif action == "changed":  # other code, on_code_change="error": refused, by path
        try:
            daisy.run_blockwise([task])
        except CodeChangedError as exc:
            print("changed:", exc.path)
            sys.exit(5)
    else:
        ok = daisy.run_blockwise([task], multiprocessing=(action == "dist"))
        sys.exit(0 if ok else 3)
    """
).replace("__N__", str(N))


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    with kit_s3.moto_server() as (env, _server):
        yield env


def _keys(env: dict[str, str], prefix: str) -> list[str]:
    listed = kit_s3.client(env).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _script(
    tmp: Path, env: dict[str, str], url: str, action: str
) -> subprocess.CompletedProcess[str]:
    script = tmp / "reset_s3.py"
    script.write_text(SCRIPT)
    marks = tmp / "marks"
    marks.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script), url, str(marks), action],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _ran(tmp: Path) -> set[int]:
    marks = tmp / "marks"
    got = {int(p.name.split("-")[1]) for p in marks.glob("b-*")}
    for p in marks.glob("b-*"):
        p.unlink()
    return got


def test_reset_on_s3(tmp_path: Path, s3_env: dict[str, str]) -> None:
    url = f"s3://{BUCKET}/seg"
    c = kit_s3.client(s3_env)
    # a sibling store whose name starts with this one's: never touched
    c.put_object(Bucket=BUCKET, Key="seg2/zarr.json", Body=b"{}")

    first = _script(tmp_path, s3_env, url, "dist")
    assert first.returncode == 0, first.stdout + first.stderr
    assert _ran(tmp_path) == set(range(N))
    stored = _keys(s3_env, "seg/")
    assert "seg/done/c/0" in stored and "seg/zarr.json" in stored
    assert any(k.startswith("seg/runs/") for k in stored), stored

    # other code with on_code_change="error": the error names the store by its URL
    # (BlockStore.path of an S3 store), not a Path's folded "s3:/..."
    changed = _script(tmp_path, s3_env, url, "changed")
    assert changed.returncode == 5, changed.stdout + changed.stderr
    assert f"changed: {url}\n" in changed.stdout, changed.stdout
    assert _ran(tmp_path) == set()  # nothing ran

    # another run's live lease: refused with the run lock's message, nothing deleted
    lease = {"run": "other", "host": "elsewhere", "pid": 1, "expires": time.time() + 3600}
    lock_key = "seg/bellis.lock"
    c.put_object(Bucket=BUCKET, Key=lock_key, Body=json.dumps(lease).encode())
    refused = _script(tmp_path, s3_env, url, "reset")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert f"refused: block tracking at {url} is in use by another run (run other" in (
        refused.stdout
    ), refused.stdout
    assert _keys(s3_env, "seg/") == sorted([*stored, lock_key])
    assert json.loads(c.get_object(Bucket=BUCKET, Key=lock_key)["Body"].read()) == lease

    # that run's lease expired (it was killed): the reset takes the lock over, deletes
    # every object of the store, and leaves no lock behind
    expired = {**lease, "expires": time.time() - 60}
    c.put_object(Bucket=BUCKET, Key=lock_key, Body=json.dumps(expired).encode())
    reset = _script(tmp_path, s3_env, url, "reset")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert f"reset: {url}" in reset.stdout, reset.stdout
    assert "took over the lock of run other" in reset.stderr, reset.stderr
    assert _keys(s3_env, "seg/") == []
    assert _keys(s3_env, "seg2/") == ["seg2/zarr.json"]

    assert "again: None" in reset.stdout, reset.stdout

    # the next run (serial this time) redoes every block
    rerun = _script(tmp_path, s3_env, url, "serial")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert _ran(tmp_path) == set(range(N))
    done = c.get_object(Bucket=BUCKET, Key="seg/done/c/0")["Body"].read()
    assert done == b"\x01" * N
