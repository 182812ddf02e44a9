"""Per-block GPU figures on a real GPU (marked ``gpu``; skipped where NVML finds no device).

The load comes from the driver's own libcuda through ctypes (``cuda_load.py``): block 0
allocates 1 GiB and keeps every SM busy for about a second, block 1 of the same worker only
uses the CPU. Run with ``pytest tests/gpu`` on a machine with an NVIDIA GPU and
``pip install 'bellis[gpu]'``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit.nvml import nvml_device_count

pytestmark = [pytest.mark.gpu]


if nvml_device_count() == 0:
    pytest.skip(
        "NVML finds no GPU here (or nvidia-ml-py is not installed)", allow_module_level=True
    )

SCRIPT = """
import sys, time
sys.path.insert(0, {here!r})
import bellis
from funlib.geometry import Roi

def work(block):
    if block.block_id[1] == 0:
        import cuda_load
        cuda_load.busy(1.0, 1 << 30)
    else:
        t = time.perf_counter()
        while time.perf_counter() - t < 1.0:
            pass

task = bellis.Task(
    "g", total_roi=Roi((0,), (2,)), read_roi=Roi((0,), (1,)), write_roi=Roi((0,), (1,)),
    process_function=work, read_write_conflict=False, max_workers=1,
    tracking_path={track!r}, resource_tracking=True,
)
ok = bellis.run_blockwise(task, {serial}progress=False, summary=False)
rep = task.report()
print("GPU", rep.blocks.gpu_util, rep.blocks.gpu_mem)
sys.exit(0 if ok else 1)
"""


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_a_gpu_block_and_a_cpu_block(tmp_path: Path, mode: str) -> None:
    import numpy as np
    import zarr

    track = tmp_path / "track"
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(SCRIPT).format(
            here=str(Path(__file__).parent),
            track=str(track),
            serial="multiprocessing=False, " if mode == "serial" else "",
        )
    )
    argv = [sys.executable, str(script)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    g = zarr.open_group(str(track), mode="r")
    util = np.asarray(g["gpu_util_pct"][:], dtype=float)
    mem = np.asarray(g["gpu_mem_bytes"][:], dtype=np.int64)
    # block 0: 1 GiB held and every SM spinning for about a second
    assert mem[0] >= 1 << 30, (mem, proc.stderr)
    assert util[0] > 50, (util, proc.stderr)
    # block 1: the context is gone, nothing on the device
    assert mem[1] == 0
    assert math.isnan(util[1]) or util[1] < 5
    print(proc.stdout)
