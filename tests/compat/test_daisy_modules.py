"""Every module path of daisy 2.0.0 is still there (issue 35 item 3).

``daisy_modules.json`` lists the modules of the daisy 2.0.0 wheel (its file list, recorded
by ``tools/record_daisy_modules.py``) with the names of daisy's own objects in each. Each
module must import through the ``bellis as-daisy`` hook (``import daisy._runner``) and,
where bellis has the same path, as ``bellis.<module>`` after ``import bellis as daisy``;
and each public name of the private modules must be there, unless :data:`NOT_OFFERED`
says why not. The hook runs as ``site`` runs it in an environment where it is installed:
the subprocess adds a folder holding its ``.pth`` file with ``site.addsitedir``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bellis._as_daisy import _PTH_TEXT, PTH_NAME

REPO = Path(__file__).resolve().parents[2]
FIXTURE = json.loads(Path(__file__).with_name("daisy_modules.json").read_text())
MODULES: dict[str, dict[str, Any]] = FIXTURE["modules"]
#: daisy's private module paths (the public ones are covered by test_daisy_names)
PRIVATE = sorted(m for m in MODULES if m.split(".")[-1].startswith("_"))

_CORE = "daisy's compiled core's own machinery; bellis has no counterpart"
_SUMMARY = "daisy's end-of-run summary printer; bellis prints its own (docs/output.md)"
_SPAWN = "daisy's worker spawning; bellis starts workers through its launchers"
# (daisy module, name) -> why bellis does not offer it
NOT_OFFERED = {
    ("daisy._daisy", "BlockProfile"): _CORE,
    ("daisy._daisy", "DEFAULT_BLOCK_TIMEOUT_SECS"): _CORE,
    ("daisy._daisy", "EXIT_BLOCK_TIMEOUT"): _CORE,
    ("daisy._daisy", "SyncClient"): _CORE + " (bellis.Client is the client)",
    ("daisy._daisy", "measure_block_stats"): _CORE + " (bellis.profile_block measures)",
    ("daisy._progress", "execution_summary"): _SUMMARY,
    ("daisy._runner", "execution_summary"): _SUMMARY,
    ("daisy._worker_processes", "EXIT_BLOCK_TIMEOUT"): _SPAWN,
    ("daisy._worker_processes", "apply_parent_config"): _SPAWN,
    ("daisy._worker_processes", "make_spawn_function"): _SPAWN,
    ("daisy._worker_processes", "read_payload"): _SPAWN,
}
#: private names that daisy's examples and tests use, which bellis keeps
KEPT_PRIVATE = {("daisy._runner", "_run_serial")}


def _expected_names(module: str) -> list[str]:
    public = [n for n in MODULES[module]["names"] if not n.startswith("_")]
    kept = [n for m, n in KEPT_PRIVATE if m == module]
    return sorted(n for n in public + kept if (module, n) not in NOT_OFFERED)


CHECK = r"""
import importlib
import json
import site
import sys

if sys.argv[1] != "-":
    site.addsitedir(sys.argv[1])  # what `site` does with the hook's .pth at start-up
prefix = sys.argv[2]
expected = json.loads(sys.argv[3])
import daisy  # noqa: E402  (bellis, under either name)

out = {}
for name, names in expected.items():
    path = prefix + name[len("daisy"):]
    try:
        module = importlib.import_module(path)
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    # the attribute path too: `daisy._runner._run_serial` without importing it first
    top = daisy
    for part in name.split(".")[1:]:
        top = getattr(top, part, None)
    out[name] = {
        "module": module.__name__,
        "attribute_is_module": top is module,
        "missing": [n for n in names if not hasattr(module, n)],
    }
print(json.dumps(out))
"""


def _check(tmp_path: Path, hook: bool, prefix: str, modules: list[str]) -> dict[str, Any]:
    site_dir = "-"
    if hook:
        site_dir = str(tmp_path / "site")
        os.makedirs(site_dir)
        (Path(site_dir) / PTH_NAME).write_text(_PTH_TEXT)
    script = tmp_path / "check_paths.py"
    if prefix == "bellis":
        script.write_text(CHECK.replace("import daisy ", "import bellis as daisy "))
    else:
        script.write_text(CHECK)
    expected = {m: _expected_names(m) for m in modules}
    proc = subprocess.run(
        [sys.executable, str(script), site_dir, prefix, json.dumps(expected)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_the_record_is_daisy_2_0_0s_file_list() -> None:
    assert FIXTURE["daisy_version"] == "2.0.0"
    assert {"daisy", "daisy._runner", "daisy._task", "daisy.v2", "daisy._daisy"} <= set(MODULES)
    assert all(not m.endswith("__init__") and "__pycache__" not in m for m in MODULES)


def test_the_record_matches_the_installed_wheel(tmp_path: Path) -> None:
    """Where daisy 2.0.0 itself is installed (``.ci/install_anchors.sh``), the tool
    records the same modules again."""
    try:
        import importlib.metadata

        if importlib.metadata.version("daisy") != "2.0.0":
            pytest.skip("daisy 2.0.0 is not installed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("daisy 2.0.0 is not installed (.ci/install_anchors.sh installs it)")
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "record_daisy_modules.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["modules"] == MODULES


def test_every_daisy_module_imports_through_the_hook(tmp_path: Path) -> None:
    found = _check(tmp_path, True, "daisy", sorted(MODULES))
    for name in MODULES:
        got = found[name]
        assert "error" not in got, (name, got)
        assert got["missing"] == [], (name, got["missing"])
        if name != "daisy":
            assert got["attribute_is_module"], name
            assert got["module"].startswith("bellis."), got


def test_every_private_daisy_module_is_a_bellis_path(tmp_path: Path) -> None:
    """``import bellis as daisy; daisy._runner._run_serial``: bellis has every private path
    of daisy's at the same place (``bellis._task`` is bellis's own module, the others are
    aliases), and its names, except ``_task``'s, which only the hook adds."""
    found = _check(tmp_path, False, "bellis", PRIVATE)
    for name in PRIVATE:
        got = found[name]
        assert "error" not in got, (name, got)
        assert got["attribute_is_module"], name
        assert got["module"] == "bellis" + name[len("daisy") :], got
        if name != "daisy._task":
            assert got["missing"] == [], (name, got["missing"])


RUN_SERIAL = r"""
import json
import site
import sys

site.addsitedir(sys.argv[1])
from daisy._runner import _run_serial  # as daisy's tests/test_done_marker.py

import daisy

calls = []
task = daisy.Task(
    task_id="t",
    total_roi=daisy.Roi([0, 0], [400, 400]),
    read_roi=daisy.Roi([0, 0], [100, 100]),
    write_roi=daisy.Roi([0, 0], [100, 100]),
    process_function=lambda b: calls.append(b.block_id[1]),
    read_write_conflict=False,
    max_retries=0,
    tracking_path=sys.argv[2],
)
first = _run_serial([task])["t"]
again = daisy._runner._run_serial([task])["t"]
print(json.dumps([len(calls), first.completed_count, again.skipped_count]))
"""


def test_run_serial_through_the_hook(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH_NAME).write_text(_PTH_TEXT)
    script = tmp_path / "done_marker_like.py"
    script.write_text(RUN_SERIAL)
    proc = subprocess.run(
        [sys.executable, str(script), str(site_dir), str(tmp_path / "marker")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [16, 16, 16]
