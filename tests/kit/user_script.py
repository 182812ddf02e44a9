"""Tests that run bellis as a user does: a script in a subprocess, in the test's own
folder, and what it leaves there (its run line in the tracking store, its records)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
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


def hog_script(
    *,
    hog_mb: int,
    who: str,
    grant: str,
    launcher: str | None = None,
    hold: float = 0,
    task_args: Sequence[str] = (),
    results: Sequence[str] = (),
) -> str:
    """A user's script (for :func:`run_script`) that runs task ``t``, 20 blocks on 2
    workers, where block 7 touches ``hog_mb`` megabytes (and holds them ``hold`` seconds:
    long enough for a batch system's memory poll to see them). Each block that ends writes
    the file ``records/<block id>_<who>`` holding ``grant`` (both Python expressions, in a
    block). It runs on ``launcher`` (an expression; None: the local default), with the
    script's first argument as ``arg``, and more ``bellis.Task`` arguments in ``task_args``
    (each ``"name=value"``); it writes ``result.json`` (``ok``, the task's report as JSON,
    and what the statements ``results`` add to the dict ``result``, ``report`` at hand) and
    exits 0 only where the run succeeded."""
    hold_line = f"        time.sleep({hold:g})\n" if hold else ""
    run_on = "" if launcher is None else f"launcher={launcher}, "
    more_args = "".join(f"        {arg},\n" for arg in task_args)
    more_results = "".join(f"    {line}\n" for line in results)
    return f"""
import json
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
HOG = 7


def block_fn(block):
    sid = block.block_id[1]
    if sid == HOG:
        data = bytearray({hog_mb} * 2**20)
        for i in range(0, len(data), 4096):
            data[i] = 1  # touched: resident, not only reserved
{hold_line}    who = {who}
    grant = {grant}
    (HERE / "records" / f"{{sid}}_{{who}}").write_text(str(grant))


def main():
    arg = sys.argv[1]
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    (HERE / "records").mkdir()
    task = bellis.Task(
        "t",
        total_roi=Roi((0,), (20,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=block_fn,
        read_write_conflict=False,
        max_workers=2,
{more_args}    )
    ok = bellis.run_blockwise([task], {run_on}progress=False)
    report = task.report()
    result = {{"ok": ok, "report": report.to_json()}}
{more_results}    (HERE / "result.json").write_text(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""


def check_memory_ladder(
    tmp_path: Path, proc: subprocess.CompletedProcess[str], request_mb: int
) -> tuple[int, dict[str, Any]]:
    """Check what a :func:`hog_script` run on a batch launcher with ``mem`` of
    ``request_mb`` leaves: it succeeded, every block ran, block 7 ran out of memory and
    succeeded alone in a job with twice (or four times) the memory, the run said so, and
    its report counts that grant's success. The hog's grant (megabytes) and the report."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = grant_records(tmp_path)
    assert sorted(records) == list(range(20))
    _big_job, mem = ran_alone(records, 7, request_mb)
    assert mem in (2 * request_mb, 4 * request_mb)
    assert (
        f"block t/7 ran out of memory with {request_mb}M; it runs again on a worker with "
        f"{2 * request_mb}M"
    ) in proc.stderr
    report: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())["report"]
    assert report["memory"]["succeeded"] == {f"{mem}M": 1}
    return mem, report
