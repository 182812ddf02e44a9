"""GPU figures where there is no GPU (CI's machines, most laptops): the seed's NaN and 0
exactly, no GPU lines anywhere, and nothing GPU-related imported beyond bellis's own
probe. (With a GPU: ``tests/gpu``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

SCRIPT = """
import json, sys
import bellis
from funlib.geometry import Roi

def work(block):
    with open({seen!r} + "/" + str(block.block_id[1]), "w") as f:
        json.dump(sorted(m for m in sys.modules if "nvml" in m or m == "torch"), f)

task = bellis.Task(
    "g", total_roi=Roi((0,), (6,)), read_roi=Roi((0,), (1,)), write_roi=Roi((0,), (1,)),
    process_function=work, read_write_conflict=False, max_workers=2,
    tracking_path={track!r}, resource_tracking=True,
)
ok = bellis.run_blockwise(task, {serial}progress=False)
rep = task.report()
print("GPU-STATS", rep.blocks.gpu_util, rep.blocks.gpu_mem)
sys.exit(0 if ok else 1)
"""


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_no_gpu_keeps_nan_and_zero_and_prints_no_gpu_line(tmp_path: Path, mode: str) -> None:
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA driver: tests/gpu covers it")
    track = tmp_path / "track"
    seen = tmp_path / "seen"
    seen.mkdir()
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(SCRIPT).format(
            seen=str(seen),
            track=str(track),
            serial="multiprocessing=False, " if mode == "serial" else "",
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    g = zarr.open_group(str(track), mode="r")
    util = np.asarray(g["gpu_util_pct"][:])
    mem = np.asarray(g["gpu_mem_bytes"][:])
    assert util.shape == (6,) and np.isnan(util).all()
    assert (mem == 0).all()
    # measured figures next to them are real: the store is not simply untouched
    assert (np.asarray(g["wall_seconds"][:]) > 0).all()
    assert "GPU-STATS None None" in proc.stdout
    assert "gpu util" not in proc.stdout and "gpu mem" not in proc.stdout
    assert "peak RSS" in proc.stdout  # the panel was printed, without GPU lines
    line = json.loads((track / "runs.jsonl").read_text().splitlines()[-1])
    assert line["schema"] == 2
    assert line["blocks"]["gpu_util"] is None and line["blocks"]["gpu_mem"] is None
    for f in seen.iterdir():
        assert json.loads(f.read_text()) == [], f"block {f.name} ran with an NVML module loaded"
