"""Retry with more memory after an out-of-memory death (issue 17 item 1), as a user runs
it: a script in a subprocess with ``Task(memory_limit="300M")``, real worker processes
under ``RLIMIT_AS``, real files.

One block in 20 touches 400 MB: at 300M it raises ``MemoryError``; it runs again on a
worker with 600M and succeeds there. No other block runs on that big worker, and the OOM
retry shows in the report, the panel, ``runs.jsonl`` and the block records of the
tracking store. With
``max_memory="300M"`` the same block fails for good with a message that names the grant
and the cap.

(A forked worker's address space is about 100 MB before the block runs, so 400 MB fits
in 600M and not in 300M.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bellis._stats._runlog import validate_run_line
from kit.user_script import grant_records, hog_script, ran_alone, run_script

SCRIPT = hog_script(
    hog_mb=400,
    who="os.getpid()",
    grant='os.environ.get("BELLIS_MEMORY_LIMIT")',
    task_args=['memory_limit="300M"', "max_memory=arg"],
    results=[
        'result["grants"] = {r.coord[0]: r.memory_grant for r in report.block_records()}',
        '(HERE / "panel.txt").write_text(report.panel())',
    ],
)

MB = 2**20


def _run(
    tmp_path: Path, cap: str
) -> tuple[subprocess.CompletedProcess[str], dict[int, list[tuple[str, int]]]]:
    proc = run_script(tmp_path, SCRIPT, cap, name="run.py", timeout=300)
    return proc, grant_records(tmp_path)


def test_a_block_out_of_memory_succeeds_on_a_worker_with_twice_the_grant(tmp_path: Path) -> None:
    proc, records = _run(tmp_path, "1200M")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(records) == list(range(20))
    # the hog ran to the end only on a 600M worker, and that worker ran nothing else
    _big_pid, grant = ran_alone(records, 7, 300 * MB)
    assert grant == 600 * MB
    assert "block t/7 ran out of memory with 300M; it runs again on a worker with 600M" in (
        proc.stderr
    )
    # the report, runs.jsonl and the panel count the retry per grant
    lines = (tmp_path / "tracking" / "t" / "runs.jsonl").read_text().splitlines()
    (line,) = [json.loads(x) for x in lines]
    assert validate_run_line(line) == []
    result = json.loads((tmp_path / "result.json").read_text())
    report = result["report"]
    # the block records keep the grant the block succeeded with (None: the request)
    assert result["grants"] == {str(k): (600 * MB if k == 7 else None) for k in range(20)}
    for data in (line, report):
        assert data["counters"]["oom_retries"] == 1
        assert data["memory"] == {"retries": {"600M": 1}, "succeeded": {"600M": 1}, "failed": 0}
    assert (
        "1 block attempt(s) in task 't' ran out of memory and ran again with more (1 with "
        "600M); succeeded after it: 1 with 600M"
    ) in proc.stdout
    panel = (tmp_path / "panel.txt").read_text()
    assert "oom retries" in panel and "600M 1" in panel
    # and the HTML report's run history, built by the CLI as a user does
    page = tmp_path / "run.html"
    built = subprocess.run(
        [sys.executable, "-m", "bellis", "report", str(tmp_path / "tracking"), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    html = page.read_text(encoding="utf-8")
    assert "<th>oom retries</th>" in html and "<td>1 (600M 1)</td>" in html


def test_a_block_out_of_memory_at_the_cap_fails_naming_the_grant(tmp_path: Path) -> None:
    proc, records = _run(tmp_path, "300M")
    assert proc.returncode != 0
    assert 7 not in records and sorted(records) == [k for k in range(20) if k != 7]
    text = proc.stdout + proc.stderr
    assert "block t/7 ran out of memory with 300M, the largest grant" in text
    assert "raise max_memory" in text
    # a store without the grant array (as every store before this feature) reads as before
    assert not (tmp_path / "tracking" / "t" / "memory_grant_mb").exists()
    grants = json.loads((tmp_path / "result.json").read_text())["grants"]
    assert len(grants) == 19 and set(grants.values()) == {None}
