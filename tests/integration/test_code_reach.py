"""Resume after an edit of code that the process function only holds (issue 35, item 7):
the user's function kept in a field of a library's task object (a bound method of it), in
a ``functools.partial`` of a library function, or in a library function's closure, as
volara's tasks do. The library is a module in a ``site-packages`` folder beside the
script (installed code, which bellis never hashes); the script runs in a subprocess,
serial and distributed, is edited, and run again.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from kit.user_script import run_script

LIBRARY = '''
import os


class LambdaStep:
    """A library's task object: the user's function is one of its fields."""

    def __init__(self, fn, scale, records):
        self.fn = fn
        self.scale = scale
        self.records = records

    def process(self, block):
        value = round(self.fn(block.block_id[1]) * self.scale, 3)
        os.makedirs(self.records, exist_ok=True)
        open(os.path.join(self.records, f"{block.block_id[1]}_{value}"), "w").close()

    def process_function(self):
        step = self

        def process_block(block):
            step.process(block)

        return process_block


def run_step(step, block):
    step.process(block)
'''

SCRIPT = """
import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))

import bellis as daisy
from funlib.geometry import Roi

import steplib


def process(block):
    step.process(block)


step = steplib.LambdaStep(lambda x: x * 0.5, 2.0, os.environ["RECORDS"])
entry = {
    "method": step.process,
    "partial": functools.partial(steplib.run_step, step),
    "closure": step.process_function(),
    "script": process,
}[os.environ["KIND"]]
daisy.set_tracking_basedir("tracking")
task = daisy.Task("A", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), entry,
                  on_code_change=os.environ["POLICY"])
ok = daisy.run_blockwise([task], multiprocessing=os.environ["MODE"] == "dist")
sys.exit(0 if ok else 3)
"""

MODES = ["serial", "dist"]
KINDS = ["method", "partial", "closure", "script"]


def _run(
    tmp_path: Path, text: str, run: str, mode: str, kind: str, policy: str, seed: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    lib = tmp_path / "site-packages"
    lib.mkdir(exist_ok=True)
    (lib / "steplib.py").write_text(LIBRARY)
    env = {"RECORDS": run, "MODE": mode, "KIND": kind, "POLICY": policy}
    # a fresh process per run, each with its own hash seed: the fingerprint depends on
    # neither (no addresses, no set order)
    proc = run_script(tmp_path, text, name="pipeline.py", env={**env, "PYTHONHASHSEED": seed})
    folder = tmp_path / run
    return proc, sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_an_edit_of_the_held_function_reruns_its_blocks(
    tmp_path: Path, mode: str, kind: str
) -> None:
    proc, made = _run(tmp_path, SCRIPT, "run1", mode, kind, "rerun", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == ["0_0.0", "1_1.0", "2_2.0", "3_3.0"]

    # nothing changed, in a new process: nothing runs, nothing is reported
    proc, made = _run(tmp_path, SCRIPT, "run2", mode, kind, "error", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []

    # the data on the task object is not code: no run, no error
    data_edit = SCRIPT.replace("0.5, 2.0,", "0.5, 3.0,")
    proc, made = _run(tmp_path, data_edit, "run3", mode, kind, "error", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []

    # the user's function held by the task object changed: its blocks run again
    code_edit = SCRIPT.replace("x * 0.5", "x * 0.7")
    proc, made = _run(tmp_path, code_edit, "run4", mode, kind, "rerun", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == ["0_0.0", "1_1.4", "2_2.8", "3_4.2"]
    out = proc.stdout + proc.stderr
    assert "A: 4 block(s) made by other code (function <lambda>)" in out, out

    # and the default policy warns about it, as for a function of the script
    proc, made = _run(tmp_path, SCRIPT, "run5", mode, kind, "warn", "5")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
    warnings = [x for x in (proc.stdout + proc.stderr).splitlines() if "made by other code" in x]
    assert len(warnings) == 2 and all("function <lambda>" in w for w in warnings), warnings


@pytest.mark.parametrize("mode", MODES)
def test_a_docstring_added_to_the_process_function_changes_nothing(
    tmp_path: Path, mode: str
) -> None:
    proc, made = _run(tmp_path, SCRIPT, "run1", mode, "script", "error", "1")
    assert proc.returncode == 0 and len(made) == 4, proc.stdout + proc.stderr
    documented = SCRIPT.replace(
        "def process(block):\n", 'def process(block):\n    """Process one block."""\n'
    )
    proc, made = _run(tmp_path, documented, "run2", mode, "script", "error", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    assert "made by other code" not in proc.stdout + proc.stderr


def test_a_worker_traceback_names_the_script_for_a_held_function(tmp_path: Path) -> None:
    """The code shipped by value inside the task object gets its file back in the worker
    (``_code_origin`` walks as far as the fingerprint): the traceback of the user's
    lambda names the script and its source line, not ``<dynamic-code>``."""
    failing = SCRIPT.replace("lambda x: x * 0.5", "lambda x: [][x] if x == 2 else x * 0.5")
    proc, made = _run(tmp_path, failing, "run1", "dist", "method", "warn", "1")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert made == ["0_0.0", "1_1.0", "3_3.0"]
    assert "<dynamic-code>" not in proc.stdout
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', proc.stdout)
    assert ("pipeline.py", "<lambda>") in [(Path(f).name, fn) for f, fn in frames], proc.stdout
    assert "lambda x: [][x] if x == 2 else x * 0.5" in proc.stdout


@pytest.mark.parametrize("mode", MODES)
def test_blocks_of_an_older_bellis_fingerprint_are_not_reported_as_changed(
    tmp_path: Path, mode: str
) -> None:
    """A fingerprint an older bellis recorded (no ``scheme``; constants hashed by their
    place) differs from today's for the same code. Its blocks count as of unknown code, as
    daisy's do: upgrading bellis neither warns on every run nor reruns a whole volume."""
    proc, made = _run(tmp_path, SCRIPT, "run1", mode, "script", "error", "1")
    assert proc.returncode == 0 and len(made) == 4, proc.stdout + proc.stderr
    table_path = tmp_path / "tracking" / "A" / "code_versions.json"
    table = json.loads(table_path.read_text())
    for entry in table["versions"]:
        assert entry.pop("scheme") == 2
        entry["hash"] = "0" * 32  # what the older scheme computed
    table_path.write_text(json.dumps(table))
    proc, made = _run(tmp_path, SCRIPT, "run2", mode, "script", "error", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    assert "made by other code" not in proc.stdout + proc.stderr
