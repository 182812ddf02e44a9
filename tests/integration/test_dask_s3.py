"""The cloud recipe of docs/cloud.md ("Workers on Kubernetes") with a real
``distributed.LocalCluster`` standing in for dask-kubernetes' ``KubeCluster``: workers are
dask tasks (``DaskLauncher``), the tracking store and the declared output both live on
S3 (moto's server on 127.0.0.1), and no path of the run is shared between the driver
and the workers but the bucket. Run by a script in a subprocess, as a user runs it;
checked: the output array's values read back by zarr, ``bellis status`` and ``bellis
verify`` on the URL, the lock released, and a second run skipping every block.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="dask.distributed is not installed")
pytest.importorskip("boto3", reason="S3 tests need boto3 (pip install boto3)")
pytest.importorskip("moto", reason="S3 tests need moto[server] (pip install moto[server])")
pytest.importorskip("s3fs", reason="zarr writes s3:// through s3fs (pip install 'bellis[s3]')")

from kit import s3 as kit_s3
from kit.s3 import BUCKET

pytestmark = [pytest.mark.dask]

N, C = 16, 4  # voxels per axis, voxels per chunk (= one block)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import zarr
    from distributed import Client, LocalCluster
    import bellis
    from funlib.geometry import Roi

    OUT, TRACK = sys.argv[1:3]
    N, C = {n}, {c}


    def process(block):
        arr = zarr.open_array(OUT, mode="r+")
        (y, x), (h, w) = block.write_roi.offset, block.write_roi.shape
        arr[y : y + h, x : x + w] = np.full((h, w), 1 + y // C * 4 + x // C, "uint16")
        print("pid", os.getpid(), flush=True)


    if __name__ == "__main__":
        zarr.create_array(OUT, shape=(N, N), chunks=(C, C), dtype="uint16", fill_value=0,
                          compressors=None, overwrite=True)
        cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                               dashboard_address=":0", scheduler_port=0, host="127.0.0.1",
                               silence_logs=40)
        client = Client(cluster)
        try:
            task = bellis.Task(
                "seg", total_roi=Roi((0, 0), (N, N)), read_roi=Roi((0, 0), (C, C)),
                write_roi=Roi((0, 0), (C, C)), process_function=process, num_workers=2,
                read_write_conflict=False, outputs=[OUT], verify_outputs=True,
                tracking_path=TRACK,
            )
            launcher = bellis.DaskLauncher(client)
            first = bellis.run_blockwise([task], launcher=launcher, return_states=True)
            again = bellis.run_blockwise([task], launcher=launcher, return_states=True)
            print(json.dumps({{
                "first": [first["seg"].completed_count, first["seg"].skipped_count],
                "again": [again["seg"].completed_count, again["seg"].skipped_count],
                "cluster": sorted(client.run(os.getpid).values()),
                "driver": os.getpid(),
            }}), flush=True)
        finally:
            client.close()
            cluster.close()
    """
).format(n=N, c=C)


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    with kit_s3.moto_server() as (env, _server):
        yield env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


def test_dask_workers_with_tracking_and_outputs_on_s3(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    out_url, track_url = f"s3://{BUCKET}/vol/seg.zarr", f"s3://{BUCKET}/track/seg"
    script = tmp_path / "cloud_run.py"
    script.write_text(SCRIPT)
    r = _run([sys.executable, str(script), out_url, track_url], s3_env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    blocks = (N // C) ** 2
    assert got["first"] == [blocks, 0] and got["again"] == [blocks, blocks]
    assert got["driver"] not in got["cluster"]

    reader = textwrap.dedent(
        """
        import json, sys, zarr
        print(json.dumps(zarr.open_array(sys.argv[1], mode="r")[:].tolist()))
        """
    )
    r = _run([sys.executable, "-c", reader, out_url], s3_env, tmp_path)
    assert r.returncode == 0, r.stderr
    values = json.loads(r.stdout)
    for y in range(N):
        for x in range(N):
            assert values[y][x] == 1 + y // C * 4 + x // C, (y, x)

    status = _run([sys.executable, "-m", "bellis", "status", track_url, "--json"], s3_env, tmp_path)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    row = data[0] if isinstance(data, list) else data
    assert row["done"] == blocks and row["path"] == track_url
    verify = _run([sys.executable, "-m", "bellis", "verify", track_url], s3_env, tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    s3 = kit_s3.client(s3_env)
    keys = {
        o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="track/seg/").get("Contents", [])
    }
    assert "track/seg/bellis.lock" not in keys
    assert len([k for k in keys if k.startswith("track/seg/runs/")]) == 2
