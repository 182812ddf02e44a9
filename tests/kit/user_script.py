"""Tests that run bellis as a user does: a script in a subprocess, in the test's own
folder, and what it leaves there (its run line in the tracking store, its records)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bellis._stats._runlog import validate_run_line


def run_script(
    tmp_path: Path,
    text: str,
    *args: str,
    name: str = "user_script.py",
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Write ``text`` to ``tmp_path / name`` and run it there with ``args`` and this
    process's environment updated with ``env``; its output is captured."""
    script = tmp_path / name
    script.write_text(text)
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
    )


def run_to_result(
    tmp_path: Path, text: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``run_script``, which must succeed; its output and the ``result.json`` it wrote."""
    proc = run_script(tmp_path, text, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads((tmp_path / "result.json").read_text())


def runs_line(tmp_path: Path, task_id: str = "t") -> dict[str, Any]:
    """The one line of ``runs.jsonl`` of ``task_id`` in ``tmp_path / "tracking"``, valid."""
    lines = (tmp_path / "tracking" / task_id / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    line: dict[str, Any] = json.loads(lines[0])
    assert validate_run_line(line) == []
    return line


def grant_records(tmp_path: Path) -> dict[int, list[tuple[str, int]]]:
    """``{block id: [(who ran it, its grant)]}`` from the files ``<block id>_<who>`` in
    ``tmp_path / "records"``, each holding the grant, a whole number, its block ran with."""
    records: dict[int, list[tuple[str, int]]] = {}
    for f in (tmp_path / "records").iterdir():
        sid, who = f.name.split("_", 1)
        records.setdefault(int(sid), []).append((who, int(f.read_text())))
    return records


def ran_alone(records: dict[int, list[tuple[str, int]]], hog: int, grant: int) -> tuple[str, int]:
    """Check that block ``hog`` ran to its end once, on a worker (or job) that ran no other
    block, and that every other block ran with ``grant``; the hog's worker and grant."""
    ((big, big_grant),) = records[hog]
    others = [r for sid, rs in records.items() if sid != hog for r in rs]
    assert all(g == grant for _who, g in others), others
    assert big not in {who for who, _g in others}
    return big, big_grant
