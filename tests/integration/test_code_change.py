"""Resume after a code change, as a user runs it (issue 26, items 1-3): a 2-task pipeline
script in a subprocess with real stores; then the script (or a helper module beside it,
or its Task(version=...)) is edited and the script rerun."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kit.user_script import run_script

SCRIPT = """
import os
import sys

import bellis as daisy
from funlib.geometry import Roi

import params

THRESHOLD = 0.5


def mark(name):
    folder = os.environ["RECORDS"]
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, name), "w").close()


def upstream(block):
    # upstream writes its blocks
    mark(f"up_{block.block_id[1]}_{THRESHOLD}_{params.SCALE}")


def downstream(block):
    mark(f"down_{block.block_id[1]}")


daisy.set_tracking_basedir("tracking")
policy = os.environ.get("POLICY", "warn")
version = {"model": os.environ["MODEL"]} if "MODEL" in os.environ else None
a = daisy.Task("A", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), upstream,
               on_code_change=policy, version=version)
b = daisy.Task("B", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), downstream,
               upstream_tasks=[a], on_code_change=policy)
ok = daisy.run_blockwise([a, b], multiprocessing=os.environ["MODE"] == "dist")
sys.exit(0 if ok else 3)
"""

MODES = ["serial", "dist"]


def _run(
    tmp_path: Path, text: str, records: str, mode: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    proc = run_script(
        tmp_path, text, name="pipeline.py", env={"RECORDS": records, "MODE": mode, **env}
    )
    folder = tmp_path / records
    return proc, sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _first_run(tmp_path: Path, mode: str, **env: str) -> None:
    (tmp_path / "params.py").write_text("SCALE = 1\n")
    proc, made = _run(tmp_path, SCRIPT, "run1", mode, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(made) == 8


@pytest.mark.parametrize("mode", MODES)
def test_default_warns_names_the_function_and_reruns_nothing(tmp_path: Path, mode: str) -> None:
    _first_run(tmp_path, mode)
    proc, made = _run(tmp_path, SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7"), "run2", mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    out = proc.stdout + proc.stderr
    warnings = [line for line in out.splitlines() if "made by other code" in line]
    # one WARNING and one summary line, for the changed task only
    assert len(warnings) == 2, out
    assert all('"A"' in w or "A:" in w for w in warnings)
    assert all("4 " in w and "function upstream" in w for w in warnings)
    assert all('on_code_change="rerun"' in w and "Task.reset()" in w for w in warnings)
    assert "function downstream" not in out


@pytest.mark.parametrize("mode", MODES)
def test_rerun_runs_exactly_the_changed_tasks_blocks(tmp_path: Path, mode: str) -> None:
    _first_run(tmp_path, mode, POLICY="rerun")
    edited = SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
    proc, made = _run(tmp_path, edited, "run2", mode, POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # A's blocks, then every block of B that reads them (item 4: staleness flows down)
    assert made == [f"down_{i}" for i in range(4)] + [f"up_{i}_0.7_1" for i in range(4)]
    # the new fingerprint was recorded: a third run has nothing to do
    proc, made = _run(tmp_path, edited, "run3", mode, POLICY="rerun")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
    assert "made by other code" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("mode", MODES)
def test_error_raises_before_any_block_runs(tmp_path: Path, mode: str) -> None:
    _first_run(tmp_path, mode, POLICY="error")
    edited = SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
    proc, made = _run(tmp_path, edited, "run2", mode, POLICY="error")
    assert proc.returncode == 1
    assert made == []
    assert "bellis.errors.CodeChangedError" in proc.stderr
    assert 'task "A": 4 done block(s)' in proc.stderr and "function upstream" in proc.stderr


@pytest.mark.parametrize("mode", MODES)
def test_comment_edit_and_moved_function_change_nothing(tmp_path: Path, mode: str) -> None:
    _first_run(tmp_path, mode, POLICY="error")
    edited = SCRIPT.replace("# upstream writes its blocks", "# a reworded comment")
    up = edited[edited.index("def upstream") : edited.index("def downstream")]
    edited = edited.replace(up, "").replace("daisy.set_tracking", up + "\ndaisy.set_tracking")
    proc, made = _run(tmp_path, "\n\n# a header\n" + edited, "run2", mode, POLICY="error")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    assert "made by other code" not in proc.stdout + proc.stderr


def test_helper_module_change_is_detected(tmp_path: Path) -> None:
    _first_run(tmp_path, "serial")
    (tmp_path / "params.py").write_text("SCALE = 2\n")
    proc, made = _run(tmp_path, SCRIPT, "run2", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [f"down_{i}" for i in range(4)] + [f"up_{i}_0.5_2" for i in range(4)]
    assert "file params.py" in proc.stdout


@pytest.mark.parametrize("mode", MODES)
def test_version_dict_behaves_as_a_code_change(tmp_path: Path, mode: str) -> None:
    _first_run(tmp_path, mode, MODEL="v1")
    proc, made = _run(tmp_path, SCRIPT, "run2", mode, MODEL="v2")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
    assert "version key model" in proc.stderr
    proc, made = _run(tmp_path, SCRIPT, "run3", mode, MODEL="v2", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [f"down_{i}" for i in range(4)] + [f"up_{i}_0.5_1" for i in range(4)]


def test_blocks_of_an_older_store_are_unknown_never_a_change(tmp_path: Path) -> None:
    _first_run(tmp_path, "serial")
    for task in ("A", "B"):  # as daisy 2.0.0 or an older bellis left it
        store = tmp_path / "tracking" / task
        subprocess.run(["rm", "-rf", str(store / "code_version")], check=True)
        (store / "code_versions.json").unlink()
    edited = SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
    proc, made = _run(tmp_path, edited, "run2", "serial", POLICY="error")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == []
    # a run with no block to do adds no code version: the store stays as it was
    assert not (tmp_path / "tracking" / "A" / "code_version" / "zarr.json").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_global_computed_at_run_time_is_an_input_not_code(tmp_path: Path, mode: str) -> None:
    """`FOLDER = os.environ[...]` (or `sys.argv[1]`) differs from run to run: a rerun with
    another value is no code change, while a literal constant beside it still is."""
    script = SCRIPT.replace(
        'def mark(name):\n    folder = os.environ["RECORDS"]\n',
        'FOLDER = os.environ["RECORDS"]\n\n\ndef mark(name):\n    folder = FOLDER\n',
    )
    assert "folder = FOLDER" in script
    (tmp_path / "params.py").write_text("SCALE = 1\n")
    proc, made = _run(tmp_path, script, "run1", mode)
    assert proc.returncode == 0 and len(made) == 8, proc.stdout + proc.stderr
    proc, made = _run(tmp_path, script, "run2", mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [] and "made by other code" not in proc.stdout + proc.stderr
    edited = script.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
    proc, made = _run(tmp_path, edited, "run3", mode)
    assert "function upstream" in proc.stdout + proc.stderr


def test_a_lost_table_leaves_its_blocks_of_unrecorded_code(tmp_path: Path) -> None:
    """code_versions.json deleted by hand: the blocks keep indices no entry explains.
    The next run's entry never takes one of them, so they count as other code (the
    safe side), never as made by the current code."""
    _first_run(tmp_path, "serial")
    (tmp_path / "tracking" / "A" / "code_versions.json").unlink()
    proc, made = _run(tmp_path, SCRIPT, "run2", "serial")
    assert proc.returncode == 0 and made == [], proc.stdout + proc.stderr
    assert (
        "A: 4 block(s) skipped as done were made by other code (code the table does not record)"
        in (proc.stdout)
    )
    proc, made = _run(tmp_path, SCRIPT, "run3", "serial", POLICY="rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert made == [f"down_{i}" for i in range(4)] + [f"up_{i}_0.5_1" for i in range(4)]
