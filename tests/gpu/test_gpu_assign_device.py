"""Local GPU assignment on a real GPU (issue 30; marked ``gpu``; skipped where NVML finds no
device): with no ``LocalLauncher(gpus=...)`` and no ``CUDA_VISIBLE_DEVICES`` in the driver,
the devices come from NVML, and each worker's CUDA sees exactly the device it was given."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit.nvml import nvml_device_count

pytestmark = [pytest.mark.gpu]


N = nvml_device_count()
if N == 0:
    pytest.skip(
        "NVML finds no GPU here (or nvidia-ml-py is not installed)", allow_module_level=True
    )

SCRIPT = """
import os, sys
sys.path.insert(0, {here!r})
import bellis

def work(block):
    import cuda_load
    seen = cuda_load.device_count()
    cuda_load.busy(0.3, 1 << 24)
    with open(f"records/{{block.block_id[1]}}_{{os.getpid()}}", "w") as f:
        f.write(f"{{os.environ.get('CUDA_VISIBLE_DEVICES')}} {{seen}}")

os.makedirs("records", exist_ok=True)
task = bellis.Task(
    "a", total_roi=bellis.Roi((0,), (8,)), read_roi=bellis.Roi((0,), (1,)),
    write_roi=bellis.Roi((0,), (1,)), process_function=work, read_write_conflict=False,
    max_workers={workers}, requires={{"gpu": {share}}},
)
try:
    ok = bellis.run_blockwise(task, progress=False, summary=False)
except bellis.errors.ConfigurationError as exc:
    print("REFUSED", exc)
    sys.exit(3)
sys.exit(0 if ok else 1)
"""


def _run(tmp_path: Path, workers: int, share: float) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "run.py"
    here = str(Path(__file__).parent)
    script.write_text(textwrap.dedent(SCRIPT).format(here=here, workers=workers, share=share))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )


def test_nvml_devices_one_per_worker(tmp_path: Path) -> None:
    proc = _run(tmp_path, workers=2 * N, share=0.5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen: dict[int, str] = {}
    for f in (tmp_path / "records").iterdir():
        seen[int(f.name.split("_")[1])] = f.read_text()
    assert seen, proc.stderr
    for value in seen.values():
        device, count = value.split()
        assert count == "1", seen  # CUDA shows the worker its one device
        assert device.isdigit() or device.startswith("MIG-"), seen
    # at gpu=0.5 no device has more than two of the workers at once (they may follow each
    # other); every device named is one NVML enumerates
    devices = {v.split()[0] for v in seen.values()}
    assert len(devices) <= N


def test_more_gpus_than_nvml_shows_is_refused(tmp_path: Path) -> None:
    proc = _run(tmp_path, workers=1, share=N + 1)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"requires {{'gpu': {N + 1}}} per worker" in proc.stdout
    assert f"has {N} GPU(s)" in proc.stdout
