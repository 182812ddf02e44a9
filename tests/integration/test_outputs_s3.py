"""Declared outputs on S3 (docs/cloud.md), as a user meets them: a script in a subprocess
writes a zarr v3 array in a bucket of a moto S3 server on 127.0.0.1 (real worker
processes, and serial mode), declared as ``Task(outputs=["s3://..."])`` or as the
``zarr.Array`` opened on S3, with ``verify_outputs=True``, tracked on S3 or locally.

One output chunk object is then deleted outside bellis: ``bellis verify`` (a subprocess)
names its block and exits 1, refuses ``--reset`` while another run's live lease holds the
store, ``--reset`` clears that one block, the rerun redoes exactly it, a last verify
passes, and the array's chunk objects equal, byte for byte, the chunk files of the same
run into a local array. A misaligned output on S3 is refused with the local message.
One moto server per module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3", reason="S3 output tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 output tests need moto[server] (pip install moto[server])")
pytest.importorskip("s3fs", reason="S3 output tests need s3fs (pip install 'bellis[s3]')")

from kit import s3 as kit_s3
from kit.s3 import BUCKET

N, C = 16, 4  # voxels per axis, voxels per chunk (= one block)

PIPELINE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import zarr
    import bellis
    from funlib.geometry import Roi

    OUT, TRACK, MODE, FORM, LOG = sys.argv[1:6]
    N, C = {n}, {c}
    if FORM.startswith("create"):
        zarr.create_array(OUT, shape=(N, N), chunks=(C, C), dtype="uint16", fill_value=0,
                          compressors=None)


    def process(block):
        arr = zarr.open_array(OUT, mode="r+")
        (y, x), (h, w) = block.write_roi.offset, block.write_roi.shape
        values = np.arange(h * w, dtype="uint16").reshape(h, w) + 100 * (y // C * 4 + x // C)
        arr[y : y + h, x : x + w] = values
        with open(LOG, "a") as f:
            f.write(json.dumps([y, x]) + "\\n")


    out = zarr.open_array(OUT, mode="r+") if FORM.endswith("array") else OUT
    task = bellis.Task(
        "w", total_roi=Roi((0, 0), (N, N)), read_roi=Roi((0, 0), (C, C)),
        write_roi=Roi((0, 0), (C, C)), process_function=process, max_workers=2,
        read_write_conflict=False, outputs=[out], verify_outputs=True,
        tracking_path=TRACK,
    )
    ok = bellis.run_blockwise([task], multiprocessing=MODE == "distributed", progress=False)
    sys.exit(0 if ok else 3)
    """
).format(n=N, c=C)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The moto server's environment, and the same pipeline run into a local array (the
    bytes every S3 run must end with)."""
    tmp = tmp_path_factory.mktemp("outputs_s3")
    script = tmp / "pipeline.py"
    script.write_text(PIPELINE)
    with kit_s3.moto_server() as (env, _server):
        ref = tmp / "ref.zarr"
        r = _run(env, tmp, script, str(ref), str(tmp / "ref-track"), "serial", "create-url")
        assert r.returncode == 0, r.stdout + r.stderr
        yield {"env": env, "tmp": tmp, "script": script, "ref": ref}


def _run(
    env: dict[str, str], cwd: Path, *args: str, log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    script, *rest = args
    return subprocess.run(
        [sys.executable, script, *rest, str(log or cwd / "ref.log")],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _bellis(s3: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        env=s3["env"],
        cwd=s3["tmp"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _chunks(s3: dict[str, Any], key: str) -> dict[str, bytes]:
    """The chunk objects of the array at ``key`` (``c/i/j`` -> bytes)."""
    c = kit_s3.client(s3["env"])
    listed = c.list_objects_v2(Bucket=BUCKET, Prefix=f"{key}/c/").get("Contents", [])
    return {
        o["Key"][len(key) + 1 :]: c.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
        for o in listed
    }


def _local_chunks(root: Path) -> dict[str, bytes]:
    return {
        f.relative_to(root).as_posix(): f.read_bytes()
        for f in (root / "c").rglob("*")
        if f.is_file()
    }


def _blocks(log: Path) -> list[list[int]]:
    if not log.exists():
        return []
    return sorted(json.loads(line) for line in log.read_text().splitlines())


@pytest.mark.parametrize(
    ("mode", "form", "tracking"),
    [
        ("distributed", "url", "s3"),
        ("serial", "array", "s3"),
        ("distributed", "array", "local"),
    ],
)
def test_verify_finds_a_deleted_output_chunk_on_s3_and_the_rerun_repairs_it(
    s3: dict[str, Any], mode: str, form: str, tracking: str
) -> None:
    tmp: Path = s3["tmp"]
    name = f"{mode}-{form}-{tracking}"
    key = f"out/{name}/a.zarr"
    out = f"s3://{BUCKET}/{key}"
    track = f"s3://{BUCKET}/track/{name}" if tracking == "s3" else str(tmp / f"track-{name}")
    log = tmp / f"{name}.log"
    script = str(s3["script"])

    r = _run(s3["env"], tmp, script, out, track, mode, f"create-{form}", log=log)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(_blocks(log)) == (N // C) ** 2
    ok = _bellis(s3, "verify", track, "--workers", "1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert _chunks(s3, key) == _local_chunks(s3["ref"])

    # block (1, 2) writes chunk c/1/2: its object goes
    kit_s3.client(s3["env"]).delete_object(Bucket=BUCKET, Key=f"{key}/c/1/2")
    found = _bellis(s3, "verify", track, "--workers", "2")
    assert found.returncode == 1, found.stdout + found.stderr
    assert "missing      block [1, 2] write ROI [4, 8]+[4, 4]" in found.stdout, found.stdout
    assert f"{out}: 1 chunk file(s) absent (c/1/2...)" in found.stdout
    assert found.stdout.count("block [") == 1  # no other block named

    if tracking == "s3" and mode == "distributed":
        # another run's live lease on the store: the reset (a write) is refused, and the
        # lock object is left as it was
        lease = {"run": "other", "host": "elsewhere", "pid": 1, "expires": time.time() + 3600}
        lock_key = f"track/{name}/bellis.lock"
        c = kit_s3.client(s3["env"])
        c.put_object(Bucket=BUCKET, Key=lock_key, Body=json.dumps(lease).encode())
        try:
            refused = _bellis(s3, "verify", track, "--reset", "--workers", "1")
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert f"block tracking at {track} is in use by another run (run other" in (
                refused.stderr
            )
            held = json.loads(c.get_object(Bucket=BUCKET, Key=lock_key)["Body"].read())
            assert held == lease
        finally:
            c.delete_object(Bucket=BUCKET, Key=lock_key)

    reset = _bellis(s3, "verify", track, "--reset", "--workers", "1")
    assert reset.returncode == 1, reset.stdout + reset.stderr
    assert f"reset: 1 done marker(s) cleared in {track}" in reset.stdout

    log.unlink()
    again = _run(s3["env"], tmp, script, out, track, mode, form, log=log)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _blocks(log) == [[4, 8]]  # exactly the reset block ran again
    final = _bellis(s3, "verify", track, "--workers", "1")
    assert final.returncode == 0, final.stdout + final.stderr
    assert _chunks(s3, key) == _local_chunks(s3["ref"])
    if tracking == "s3":  # the records are objects beside the markers
        c = kit_s3.client(s3["env"])
        record = json.loads(
            c.get_object(Bucket=BUCKET, Key=f"track/{name}/outputs.json")["Body"].read()
        )
        assert [o["store"] for o in record["outputs"]] == [out]
        verified = json.loads(
            c.get_object(Bucket=BUCKET, Key=f"track/{name}/verify.json")["Body"].read()
        )
        assert (verified["checked"], verified["verified"]) == ((N // C) ** 2, (N // C) ** 2)


MISALIGNED = textwrap.dedent(
    """
    import json, sys
    import zarr
    import bellis
    from bellis.errors import ConfigurationError
    from funlib.geometry import Roi

    def task(out):
        return bellis.Task(
            "m", total_roi=Roi((0, 0), (12, 12)), read_roi=Roi((0, 0), (6, 6)),
            write_roi=Roi((0, 0), (6, 6)), process_function=lambda b: None,
            outputs=[out], read_write_conflict=False,
        )

    messages = []
    for where in sys.argv[1:]:
        zarr.create_array(where, shape=(12, 12), chunks=(4, 4), dtype="uint8")
        for out in (where, zarr.open_array(where, mode="r")):
            try:
                task(out)
            except ConfigurationError as exc:
                messages.append(str(exc))
            else:
                messages.append(None)
    print(json.dumps(messages))
    """
)


def test_a_misaligned_output_on_s3_is_refused_as_a_local_one(s3: dict[str, Any]) -> None:
    tmp: Path = s3["tmp"]
    (tmp / "misaligned.py").write_text(MISALIGNED)
    local = str(tmp / "mis.zarr")
    remote = f"s3://{BUCKET}/mis/m.zarr"
    r = subprocess.run(
        [sys.executable, str(tmp / "misaligned.py"), local, remote],
        env=s3["env"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    messages = json.loads(r.stdout)
    assert len(messages) == 4 and all(m is not None for m in messages), messages
    loc_url, loc_arr, s3_url, s3_arr = messages
    assert loc_url == loc_arr and s3_url == s3_arr
    assert f"two of its blocks can write into the same chunk of output {remote} " in s3_url
    assert s3_url.replace(remote, "OUT") == loc_url.replace(local, "OUT")
