"""What a worker process imports (issue 14 item 5): never numpy, never ``v1_compat``, unless
the user's code asks for them; never plotly (issue 16: the HTML report's alone), and
neither does the driver's ``run_blockwise``.

A script written into ``tmp_path`` runs a distributed pipeline through ``import bellis as
daisy`` (or ``import bellis.v2 as daisy``); each worker writes its sorted ``sys.modules`` to
a file once its work is done. One task has a block function; the others have worker
functions (a ``Client`` loop) that each touch one public name through the module, as
``daisy.<name>`` in a daisy script does.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

# names whose modules compute with numpy (the driver's side: tasks, pipelines, the
# scheduler, the runner, reports, skip masks, the dependency graph): touching one loads
# numpy, with a reason. All other public names must load neither numpy nor v1_compat.
NEEDS_NUMPY = {
    "BlockRecord",
    "BlockwiseDependencyGraph",
    "DependencyGraph",
    "Pipeline",
    "RunReport",
    "Scheduler",
    "SerialServer",
    "Server",
    "Stat",
    "Task",
    "TaskReport",
    "WorkerRecord",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "skip_mask_from_rois",
    "skip_mask_from_volume",
    "write_report",
    "write_trace",  # a report function, like write_report: it reads stores with numpy
}
# the two classes v1_compat itself defines (they accept daisy 1.x's forms)
DEFINED_IN_V1_COMPAT = {"Task", "Scheduler"}

SCRIPT = r"""
import importlib
import os
import sys

OUT = sys.argv[1]
NAMES = sys.argv[2].split(",")
# `import bellis as daisy`, or `import bellis.v2 as daisy` (daisy's advice for v2 code)
daisy = importlib.import_module(sys.argv[3])


def record(label):
    with open(os.path.join(OUT, f"{label}.{os.getpid()}"), "w") as f:
        f.write("\n".join(sorted(sys.modules)))


def block_function(block):
    assert isinstance(block, daisy.Block) and block.write_roi.size > 0
    if block.block_id[1] == 0:
        record("block-function")


def make_worker_function(name):
    def worker_function():
        getattr(daisy, name)  # what `daisy.<name>` in a worker function does
        client = daisy.Client()
        while True:
            with client.acquire_block() as block:
                if block is None:
                    break
        record(name)

    return worker_function


def main():
    roi = daisy.Roi((0,), (4,))
    block_roi = daisy.Roi((0,), (2,))
    tasks = [
        daisy.Task("block-function", roi, block_roi, block_roi, block_function,
                   max_workers=1)
    ]
    for i, name in enumerate(NAMES):
        tasks.append(
            daisy.Task(f"worker-{i}", roi, block_roi, block_roi,
                       make_worker_function(name), max_workers=1)
        )
    assert daisy.run_blockwise(tasks, progress=False, summary=False)
    # the HTML report's plotting library is the report's alone (issue 16)
    assert not any(m == "plotly" or m.startswith("plotly.") for m in sys.modules), "plotly"


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("surface", ["bellis", "bellis.v2"])
def test_workers_load_neither_numpy_nor_v1_compat(tmp_path: Path, surface: str) -> None:
    names = sorted(importlib.import_module(surface).__all__)
    script = tmp_path / "imports.py"
    script.write_text(SCRIPT)
    out = tmp_path / "modules"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), str(out), ",".join(names), surface],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found: dict[str, set[str]] = {}
    for path in out.iterdir():
        label = path.name.rsplit(".", 1)[0]
        assert label not in found, f"{label} recorded by two workers"
        found[label] = set(path.read_text().split("\n"))
    assert set(found) == {"block-function", *names}

    problems = []
    for label, modules in sorted(found.items()):
        if surface not in modules:
            problems.append(f"{label}: the worker did not import {surface}?")
        numpy_ok = label in NEEDS_NUMPY
        compat_ok = surface == "bellis" and label in DEFINED_IN_V1_COMPAT
        if "numpy" in modules and not numpy_ok:
            problems.append(f"{label}: the worker imported numpy")
        if "bellis.v1_compat" in modules and not compat_ok:
            problems.append(f"{label}: the worker imported bellis.v1_compat")
        if "zarr" in modules:
            problems.append(f"{label}: the worker imported zarr")
        if "plotly" in modules:
            problems.append(f"{label}: the worker imported plotly")
    assert not problems, "\n".join(problems)
