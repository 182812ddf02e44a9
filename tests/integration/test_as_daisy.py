"""``bellis as-daisy``: daisy code, and volara 1.0.5, running on bellis in a fresh environment.

One virtual environment is made for the whole module, with this checkout installed into it
(editable) by the pip of the interpreter running the tests. The tests then use that
environment's own ``bellis`` command and python, as a user would.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PTH_NAME = "bellis_as_daisy.pth"
INSTALL_TIMEOUT_SECONDS = 1200
RUN_TIMEOUT_SECONDS = 600

# installing into a fresh environment takes minutes on a busy machine: pip's own timeout and
# the one on each subprocess bound it instead of the suite's per-test limits
pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS)]


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        self.bellis = root / "bin" / "bellis"
        purelib = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.site_packages = Path(purelib)

    def run(
        self, *args: str | Path, cwd: Path | None = None, timeout: float = RUN_TIMEOUT_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        return subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )

    def pip_install(self, *args: str) -> subprocess.CompletedProcess[str]:
        """pip of the test interpreter, installing into this environment (no pip of its own)."""
        # a long install is not a hang: no traceback dump (faulthandler_timeout) while it runs;
        # pytest arms the dump again for the next test
        faulthandler.cancel_dump_traceback_later()
        return self.run(
            sys.executable,
            "-m",
            "pip",
            "--python",
            self.python,
            "install",
            "--disable-pip-version-check",
            "-q",
            *args,
            timeout=INSTALL_TIMEOUT_SECONDS,
        )

    def as_daisy(self, action: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.bellis, "as-daisy", action)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("as_daisy") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    env = Venv(root)
    proc = env.pip_install("-e", str(REPO))
    if proc.returncode != 0:
        pytest.skip(f"could not pip install this checkout into a fresh venv:\n{_tail(proc.stderr)}")
    return env


BLOCKWISE_SCRIPT = """
import os
import sys
from pathlib import Path

import daisy
import daisy.v2
from daisy.cl_monitor import CLMonitor

import bellis

out = Path(sys.argv[1])
out.mkdir()


def process(block):
    import daisy

    assert daisy.__version__.startswith("2.0.0+bellis."), daisy.__version__
    assert daisy.Block is bellis.Block
    name = out / f"block_{block.block_id[1]}"
    name.write_text(f"{os.getpid()} {daisy.__version__}")


task = daisy.v2.Task(
    "aliased",
    total_roi=daisy.Roi((0, 0), (40, 30)),
    read_roi=daisy.Roi((0, 0), (10, 10)),
    write_roi=daisy.Roi((0, 0), (10, 10)),
    process_function=process,
    read_write_conflict=False,
    max_workers=2,
)
server = daisy.Server()
CLMonitor(server)
states = server.run_blockwise([task])
print("DRIVER", os.getpid(), daisy.__version__, daisy.Task is bellis.Task)
print("STATES", states["aliased"].completed_count, states["aliased"].total_block_count)
"""


def test_install_run_uninstall(venv: Venv, tmp_path: Path) -> None:
    assert venv.run(venv.python, "-c", "import daisy").returncode != 0
    status = venv.as_daisy("status")
    assert status.returncode == 1, status.stdout + status.stderr
    assert "not installed" in status.stdout

    installed = venv.as_daisy("install")
    assert installed.returncode == 0, installed.stderr
    pth = venv.site_packages / PTH_NAME
    assert f"installed: {pth}" in installed.stdout
    assert pth.is_file()
    # nothing is written into any other environment (the one running the tests)
    assert not (Path(sysconfig.get_paths()["purelib"]) / PTH_NAME).exists()
    status = venv.as_daisy("status")
    assert status.returncode == 0 and f"installed: {pth}" in status.stdout

    # a process that never imports daisy does not import bellis either
    light = venv.run(venv.python, "-c", "import sys; print('bellis' in sys.modules)")
    assert light.stdout.strip() == "False", light.stderr

    script = tmp_path / "uses_daisy.py"
    script.write_text(BLOCKWISE_SCRIPT)
    out = tmp_path / "blocks"
    proc = venv.run(venv.python, script, out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    driver = re.search(r"^DRIVER (\d+) (\S+) (\w+)$", proc.stdout, re.MULTILINE)
    assert driver is not None, proc.stdout
    driver_pid, version, same_task = driver.groups()
    assert re.fullmatch(r"2\.0\.0\+bellis\.[0-9A-Za-z.]+", version)
    assert same_task == "True"
    assert "STATES 12 12" in proc.stdout
    assert re.search(r"^\[bellis\] aliased: finished ✔ 12/12", proc.stderr, re.MULTILINE)
    records = [p.read_text().split() for p in sorted(out.iterdir())]
    assert len(records) == 12
    worker_pids = {pid for pid, _ in records}
    assert driver_pid not in worker_pids  # the blocks ran in worker processes
    assert {v for _, v in records} == {version}

    removed = venv.as_daisy("uninstall")
    assert removed.returncode == 0 and f"uninstalled: removed {pth}" in removed.stdout
    assert not pth.exists()
    gone = venv.run(venv.python, "-c", "import daisy")
    assert gone.returncode == 1 and "No module named 'daisy'" in gone.stderr
    again = venv.as_daisy("uninstall")
    assert again.returncode == 0 and "not installed" in again.stdout
    assert venv.as_daisy("status").returncode == 1


MODULES_SCRIPT = r"""
import importlib
import json
import sys
from pathlib import Path

modules = json.loads(Path(sys.argv[1]).read_text())["modules"]
failed = {}
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
from daisy._runner import _run_serial  # as daisy's own tests/test_done_marker.py

import daisy

calls = []
roi, block = daisy.Roi([0, 0], [40, 40]), daisy.Roi([0, 0], [10, 10])
task = daisy.Task(
    task_id="t",
    total_roi=roi,
    read_roi=block,
    write_roi=block,
    process_function=lambda b: calls.append(b.block_id[1]),
    read_write_conflict=False,
    tracking_path=sys.argv[2],
)
states = _run_serial([task])
again = daisy._runner._run_serial([task])
print(json.dumps({
    "failed": failed,
    "runner": daisy._runner.__name__,
    "counts": [len(calls), states["t"].completed_count, again["t"].skipped_count],
}))
"""


def test_every_daisy_module_path_imports_through_the_hook(venv: Venv, tmp_path: Path) -> None:
    """Every module of the daisy 2.0.0 wheel (tests/compat/daisy_modules.json) imports in
    an environment with the hook installed, and ``daisy._runner._run_serial`` runs."""
    installed = venv.as_daisy("install")
    assert installed.returncode == 0, installed.stderr
    try:
        script = tmp_path / "daisy_paths.py"
        script.write_text(MODULES_SCRIPT)
        listing = REPO / "tests" / "compat" / "daisy_modules.json"
        proc = venv.run(venv.python, script, listing, tmp_path / "marker", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = json.loads(proc.stdout.splitlines()[-1])
        assert got["failed"] == {}
        assert got["runner"] == "bellis._runner"
        assert got["counts"] == [16, 16, 16]
    finally:
        venv.as_daisy("uninstall")


def test_install_refuses_when_a_real_daisy_is_installed(venv: Venv) -> None:
    proc = venv.pip_install("--no-deps", "daisy==2.0.0")
    if proc.returncode != 0:
        pytest.skip(f"daisy 2.0.0 could not be installed from PyPI:\n{_tail(proc.stderr)}")
    try:
        refused = venv.as_daisy("install")
        assert refused.returncode == 2
        assert "a real daisy is installed in this environment (daisy 2.0.0 at" in refused.stderr
        assert "pip uninstall daisy" in refused.stderr
        assert not (venv.site_packages / PTH_NAME).exists()
    finally:
        venv.run(sys.executable, "-m", "pip", "--python", venv.python, "uninstall", "-y", "daisy")


# ----------------------------------------------------------------------------------------
# volara 1.0.5

VOLARA_DEPENDENCIES = [
    # volara's own requirements, less daisy (pinned <2) and what this test does not reach:
    # click (its CLI), polars (benchmark reports), iohub (OME-Zarr input)
    "funlib.geometry>=0.3",
    "funlib.persistence>=0.7.0",
    "mwatershed>=0.5.2",
    "pydantic>=2.6.3",
    "numpy>=2.0",
    "numba>=0.59.0",
    "scipy>=1.15.3",
    "scikit-image>=0.25.2",
    "cloud-volume>=12.4.1",
    "cloudpickle>=3.0",
    "psutil>=7.0.0",
    "networkx",
    "funlib.math",  # imported by volara, not declared
]

VOLARA_SCRIPT = """
import json
import sys
from pathlib import Path

import daisy
import numpy as np
from funlib.persistence import open_ds, prepare_ds
from volara.blockwise import Argmax, Threshold
from volara.datasets import Labels, Raw
from volara.logging import set_log_basedir

mode = sys.argv[1]
work = Path(sys.argv[2])
set_log_basedir(work / f"logs-{mode}")

probs_path = work / "probs.zarr"
if not probs_path.exists():
    probs = prepare_ds(
        probs_path,
        shape=(3, 40, 32, 24),
        offset=(0, 0, 0),
        voxel_size=(4, 2, 2),
        axis_names=["c^", "z", "y", "x"],
        units=["nm", "nm", "nm"],
        chunk_shape=(3, 8, 8, 8),
        dtype=np.float32,
        mode="w",
    )
    probs[probs.roi] = np.random.default_rng(7).random(probs.shape, dtype=np.float32)

argmax = Argmax(
    probs_data=Raw(store=probs_path),
    sem_data=Labels(store=work / f"sem-{mode}"),
    block_size=(8, 8, 8),
    num_workers=2,
)
threshold = Threshold(
    in_data=Raw(store=work / f"sem-{mode}"),
    mask=Labels(store=work / f"mask-{mode}"),
    threshold=0.5,
    block_size=(8, 8, 8),
    num_workers=2,
)
(argmax + threshold).run_blockwise(multiprocessing=(mode == "distributed"))

done = {}
for task in (argmax, threshold):
    marks = open_ds(task.block_ds, mode="r")
    done[task.task_name] = int(np.count_nonzero(marks[marks.roi]))
print("RESULT " + json.dumps({"version": daisy.__version__, "done": done}))
"""

COMPARE_SCRIPT = """
import json
import sys
from pathlib import Path

import numpy as np
from funlib.persistence import open_ds

work = Path(sys.argv[1])
probs = open_ds(work / "probs.zarr")
arrays = {}
for name in ("sem", "mask"):
    for mode in ("distributed", "serial"):
        a = open_ds(work / f"{name}-{mode}")
        arrays[name, mode] = a[a.roi]
expected_sem = np.argmax(probs[probs.roi], axis=0)
print(json.dumps({
    "sem_equal": bool(np.array_equal(arrays["sem", "distributed"], arrays["sem", "serial"])),
    "mask_equal": bool(np.array_equal(arrays["mask", "distributed"], arrays["mask", "serial"])),
    "sem_expected": bool(np.array_equal(arrays["sem", "distributed"], expected_sem)),
    "mask_expected": bool(np.array_equal(arrays["mask", "distributed"], expected_sem > 0.5)),
    "sem_values": sorted(int(v) for v in np.unique(arrays["sem", "distributed"])),
}))
"""


@pytest.fixture(scope="module")
def volara_venv(venv: Venv) -> Venv:
    proc = venv.pip_install("--no-deps", "volara==1.0.5")
    if proc.returncode == 0:
        proc = venv.pip_install(*VOLARA_DEPENDENCIES)
    if proc.returncode != 0:
        pytest.skip(
            f"volara 1.0.5 and its dependencies could not be installed:\n{_tail(proc.stderr)}"
        )
    return venv


@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 2 * RUN_TIMEOUT_SECONDS)
def test_volara_pipeline_distributed_matches_serial(volara_venv: Venv, tmp_path: Path) -> None:
    venv = volara_venv
    installed = venv.as_daisy("install")
    assert installed.returncode == 0, installed.stderr
    try:
        script = tmp_path / "volara_pipeline.py"
        script.write_text(VOLARA_SCRIPT)
        work = tmp_path / "work"
        work.mkdir()
        results = {}
        for mode in ("distributed", "serial"):
            proc = venv.run(venv.python, script, mode, work, cwd=tmp_path)
            assert proc.returncode == 0, _tail(proc.stderr, 40)
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            results[mode] = json.loads(line[len("RESULT ") :])
            # 5 x 4 x 3 blocks of 8 voxels per task, every one processed by bellis
            for task in (f"sem-{mode}-argmax", f"mask-{mode}-threshold"):
                assert results[mode]["done"][task] == 60
                assert re.search(rf"^\s*{task} ✔\s+60\s+60\s+0\s+0\s+0\s*$", proc.stdout, re.M)
                if mode == "serial":
                    # volara's CLMonitor(SerialServer()) reported the task on stderr
                    finished = rf"^\[bellis\] {task}: finished ✔ 60/60"
                    assert re.search(finished, proc.stderr, re.M), _tail(proc.stderr)
            assert results[mode]["version"].startswith("2.0.0+bellis.")
        # distributed: the blocks ran in worker processes, which left their log files
        for task in ("sem-distributed-argmax", "mask-distributed-threshold"):
            assert list((work / "logs-distributed" / task).glob("worker_*.err")), task
        compare = venv.run(venv.python, "-c", COMPARE_SCRIPT, work, cwd=tmp_path)
        assert compare.returncode == 0, compare.stderr
        assert json.loads(compare.stdout) == {
            "sem_equal": True,
            "mask_equal": True,
            "sem_expected": True,
            "mask_expected": True,
            "sem_values": [0, 1, 2],
        }
    finally:
        venv.as_daisy("uninstall")


LAMBDA_SCRIPT = """
import json
import sys
from pathlib import Path

import daisy
import numpy as np
from funlib.persistence import open_ds, prepare_ds
from volara.blockwise import LambdaTask
from volara.datasets import Raw
from volara.logging import set_log_basedir

mode = sys.argv[1]
work = Path(sys.argv[2])
set_log_basedir(work / f"logs-{mode}")
daisy.set_tracking_basedir(work / f"tracking-{mode}")

raw_path = work / "raw.zarr"
if not raw_path.exists():
    raw = prepare_ds(
        raw_path,
        shape=(32, 32, 8),
        offset=(0, 0, 0),
        voxel_size=(1, 1, 1),
        axis_names=["z", "y", "x"],
        units=["nm", "nm", "nm"],
        chunk_shape=(8, 8, 8),
        dtype=np.float32,
        mode="w",
    )
    raw[raw.roi] = np.random.default_rng(7).random(raw.shape, dtype=np.float32)

task = LambdaTask(
    in_data=Raw(store=raw_path),
    out_data=Raw(store=work / f"mask-{mode}"),
    lambda_func=lambda data: (data > 0.5).astype(np.uint8),
    out_array_dtype=np.dtype("uint8"),
    block_size=(8, 8, 8),
    num_workers=2,
)
task.run_blockwise(multiprocessing=(mode == "distributed"))
print("RESULT " + json.dumps({"task": task.task_name}))
"""


@pytest.mark.parametrize("mode", ["serial", "distributed"])
@pytest.mark.timeout(INSTALL_TIMEOUT_SECONDS + 3 * RUN_TIMEOUT_SECONDS)
def test_volara_lambda_task_edit_is_seen(volara_venv: Venv, tmp_path: Path, mode: str) -> None:
    """Issue 35, item 7: volara hands bellis its own process function (a bound method of
    the task object, or a closure over it); the user's function is the task's
    ``lambda_func``. An edit of it (a threshold from 0.5 to 0.7) is a code change, as it
    is for a plain ``daisy.Task``; an unchanged rerun still skips everything silently."""
    venv = volara_venv
    installed = venv.as_daisy("install")
    assert installed.returncode == 0, installed.stderr
    try:
        work = tmp_path / "work"
        work.mkdir()
        script = tmp_path / "lambda_task.py"

        def run(text: str) -> str:
            script.write_text(text)
            proc = venv.run(venv.python, script, mode, work, cwd=tmp_path)
            assert proc.returncode == 0, _tail(proc.stderr, 40)
            return proc.stdout + proc.stderr

        first = run(LAMBDA_SCRIPT)
        # 4 x 4 x 1 blocks of 8 voxels, every one processed by bellis
        finished = r"^\[bellis\] mask-\S+-lambda: finished ✔ 16/16 done \(100.0%{}\)"
        assert re.search(finished.format(""), first, re.M), first
        assert "made by other code" not in first

        # nothing changed, in a new process: every block is skipped, without a word
        again = run(LAMBDA_SCRIPT)
        assert re.search(finished.format(", 16 skipped"), again, re.M), again
        assert "made by other code" not in again

        edited = run(LAMBDA_SCRIPT.replace("data > 0.5", "data > 0.7"))
        changed = [line for line in edited.splitlines() if "made by other code" in line]
        # one WARNING and one summary line, as for a plain daisy.Task
        assert len(changed) == 2, edited
        assert all("16 " in line and "(function <lambda>)" in line for line in changed), changed
        assert any('on_code_change="rerun"' in line for line in changed), changed
    finally:
        venv.as_daisy("uninstall")
