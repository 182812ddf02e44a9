"""What a worker process imports (issue 14 item 5): never numpy, never ``v1_compat``, unless
the user's code asks for them; never plotly (issue 16: the HTML report's alone), and
neither does the driver's ``run_blockwise``; a block-function worker loads nothing it does
not need to start (issue 37: no OpenSSL, no idna codec, no shutil).

A script written into ``tmp_path`` runs a distributed pipeline through ``import bellis as
daisy`` (or ``import bellis.v2 as daisy``); each worker writes its sorted ``sys.modules`` to
a file once its work is done. One task has a block function; the others have worker
functions (a ``Client`` loop) that each touch one public name through the module, as
``daisy.<name>`` in a daisy script does.

And how bellis imports numpy (in the driver, where it must): with OpenBLAS's idle spin
bounded, in this process only; three fresh interpreters read it from ``/proc``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# names whose modules compute with numpy (the driver's side: tasks, pipelines, the
# scheduler, the runner, reports, skip masks, the dependency graph, and planning, which
# counts a run through the scheduler): touching one loads numpy, with a reason. All other
# public names must load neither numpy nor v1_compat.
NEEDS_NUMPY = {
    "BlockRecord",
    "BlockwiseDependencyGraph",
    "DependencyGraph",
    "Pipeline",
    "Plan",
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
    "plan",
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
# what a block-function worker needs neither to start nor to run its blocks (issue 37):
# OpenSSL (hashlib, hmac: the handshake's HMAC uses the built-in SHA-256), the idna codec
# and unicodedata (a numeric or ASCII host is resolved without them), shutil and its
# compression modules (only clear_logs() uses it)
NOT_BEFORE_FIRST_BLOCK = {
    "_hashlib",
    "hashlib",
    "hmac",
    "encodings.idna",
    "unicodedata",
    "stringprep",
    "shutil",
    "bz2",
    "lzma",
}

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
        if label == "block-function" and modules & NOT_BEFORE_FIRST_BLOCK:
            unneeded = sorted(modules & NOT_BEFORE_FIRST_BLOCK)
            problems.append(f"{label}: the worker imported {unneeded}")
    assert not problems, "\n".join(problems)


# -- how bellis imports numpy -------------------------------------------------------------
needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PROBE = r"""
import json, os, sys, time

seen = {}


class Recorder:
    # a meta-path finder that notes the environment at the moment numpy is imported
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            seen["numpy"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
        return None


sys.meta_path.insert(0, Recorder())
if sys.argv[1] == "numpy-first":
    import numpy
import bellis

bellis.Task  # the public surface loads numpy on first use
time.sleep(0.5)
helpers = threads = 0
for tid in os.listdir("/proc/self/task"):
    if int(tid) == os.getpid():
        continue
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    helpers += int(fields[11]) + int(fields[12])
    threads += 1
print(json.dumps({
    "during_import": seen.get("numpy"),
    "after": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
    "helper_ticks": helpers,
    "helper_threads": threads,
}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=full, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_proc
def test_numpy_is_loaded_with_the_spin_bounded_and_the_environment_restored() -> None:
    r = _probe("bellis-first")
    assert r["during_import"] == "20"
    assert r["after"] is None  # nothing leaks into this process's children
    # OpenBLAS's helper threads went to sleep instead of spinning for ~0.1 s of CPU
    # each (bounded: well under a millisecond each)
    tick = os.sysconf("SC_CLK_TCK")
    spent_ms = int(r["helper_ticks"]) * 1000 // tick  # type: ignore[call-overload]
    assert spent_ms <= 20 + 2 * int(r["helper_threads"]), r  # type: ignore[call-overload]


@needs_proc
def test_a_value_the_user_chose_is_kept() -> None:
    r = _probe("bellis-first", OPENBLAS_THREAD_TIMEOUT="26")
    assert r["during_import"] == "26" and r["after"] == "26"


@needs_proc
def test_numpy_imported_before_bellis_is_left_alone() -> None:
    r = _probe("numpy-first")
    assert r["during_import"] is None and r["after"] is None
