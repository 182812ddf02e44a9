"""Error records as users meet them: a user's pipeline script in a subprocess whose blocks
raise two distinct errors and time out (``kit.failing_pipeline``); ``bellis status
--failed`` / ``--block`` and ``task.report().errors()`` in fresh processes; serial mode;
the bound on the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit.failing_pipeline import run_failing


def _bellis(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_distributed_failures_read_back_by_status_and_report(tmp_path: Path) -> None:
    run = run_failing(tmp_path, "distributed")
    script, store, out = run.script, run.store, run.output
    assert "RESULT False" in out, out
    assert (store / "errors.jsonl").exists()

    proc = _bellis("status", str(store), "--failed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "3 distinct errors, 12 failed attempts" in text, text
    assert "[raised] ValueError: bad voxel size" in text
    assert "[raised] KeyError: 'missing channel'" in text
    assert "[timeout] timeout: exceeded the block timeout (1s)" in text
    # each block by its coordinate and its id (as the summary names blocks)
    assert re.search(r"3 attempts; blocks \(1, 2\) id \d+$", text, re.M), text
    head = {re.sub(r" id \d+", "", line.strip()) for line in text.splitlines()}
    assert "3 attempts; blocks (1, 2)" in head
    assert (
        "6 attempts; blocks (0, 9), (2, 5)" in head or "6 attempts; blocks (2, 5), (0, 9)" in head
    )
    assert "3 attempts; blocks (3, 7)" in head
    assert f'File "{script}", line {run.line_of("LINE_VALUE")}, in process' in text
    assert f'File "{script}", line {run.line_of("LINE_KEY")}, in process' in text
    assert "worker_" in text and ".err, line " in text

    data = json.loads(_bellis("status", str(store), "--failed", "--json", cwd=tmp_path).stdout)
    counts = sorted(g["count"] for g in data["errors"])
    assert counts == [3, 3, 6]

    proc = _bellis("status", str(store), "--block", "1,2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 failed attempts recorded" in proc.stdout
    for n in (1, 2, 3):
        assert f"  attempt {n} at " in proc.stdout
    # the attempt's own lines: its traceback in .err, its prints in .out
    assert "| Traceback (most recent call last):" in proc.stdout
    assert "| start block ('seg', 7) at 1,2" in proc.stdout
    block = json.loads(
        _bellis("status", str(store), "--block", "1,2", "--json", cwd=tmp_path).stdout
    )
    attempts = block["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    for a in attempts:
        assert a["kind"] == "raised" and a["type"] == "ValueError"
        assert a["host"] and isinstance(a["pid"], int) and isinstance(a["worker"], int)
        assert any("ValueError: bad voxel size" in line for line in a["log_lines"])

    timed = json.loads(
        _bellis("status", str(store), "--block", "3,7", "--json", cwd=tmp_path).stdout
    )
    assert [a["kind"] for a in timed["attempts"]] == ["timeout"] * 3
    assert any("still running after timeout" in "".join(a["log_lines"]) for a in timed["attempts"])

    # a fresh process reads the records back through the Python API
    check = textwrap.dedent(
        f"""
        import sys
        sys.argv = ["x", "distributed"]
        sys.path.insert(0, {str(tmp_path)!r})
        import my_pipeline
        report = my_pipeline.task({str(store)!r}).report()
        errors = report.errors()
        print(len(errors), sorted({{e.kind for e in errors}}))
        rec = report.block((1, 2))
        print(len(rec.attempts), rec.attempts[0].type, rec.attempts[0].where)
        print(len(report.block((0, 0)).attempts))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "12 ['raised', 'timeout']"
    assert lines[1].startswith("3 ValueError ") and "my_pipeline.py:" in lines[1]
    assert lines[2] == "0"


def test_serial_failure_has_its_traceback(tmp_path: Path) -> None:
    run = run_failing(tmp_path, "serial")
    script, store, out = run.script, run.store, run.output
    assert "RAISED" in out, out
    records = [json.loads(line) for line in (store / "errors.jsonl").read_text().splitlines()]
    assert len(records) == 1
    (rec,) = records
    assert rec["kind"] == "raised" and rec["attempt"] == 1
    assert rec["worker"] is None and rec.get("host") is None and rec.get("job") is None
    lines = (run.line_of("LINE_VALUE"), run.line_of("LINE_KEY"))
    assert any(f'File "{script}", line {n}, in process' in rec["traceback"] for n in lines)
    assert rec["log"].endswith("worker_0.err")
    proc = _bellis("status", str(store), "--failed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 distinct error, 1 failed attempt" in proc.stdout
    assert str(script) in proc.stdout


BOUND_SCRIPT = textwrap.dedent(
    """
    import sys
    import bellis as daisy

    def process(block):
        block.status = daisy.BlockStatus.FAILED

    task = daisy.Task(
        "many",
        total_roi=daisy.Roi((0,), (100_000,)),
        read_roi=daisy.Roi((0,), (1,)),
        write_roi=daisy.Roi((0,), (1,)),
        process_function=process,
        max_retries=0,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=sys.argv[2],
        max_consecutive_failures=None,  # every block fails: the records, not the rule
    )
    print("RESULT", daisy.run_blockwise([task], multiprocessing=sys.argv[1] != "serial",
                                        progress=False, summary=False))
    """
)


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_many_identical_failures_write_little(tmp_path: Path, mode: str) -> None:
    """100,000 failing attempts of one error write under 1 MiB: the first ones in full,
    with what the worker said about them, then counts."""
    from bellis._stats._errorlog import FULL_PER_ERROR

    script = tmp_path / "many.py"
    script.write_text(BOUND_SCRIPT)
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "RESULT False" in proc.stdout, proc.stdout + proc.stderr
    size = (store / "errors.jsonl").stat().st_size
    assert size < 1 << 20
    proc = _bellis("status", str(store), "--failed", "--json", cwd=tmp_path)
    (group,) = json.loads(proc.stdout)["errors"]
    assert group["count"] == 100_000
    assert group["kind"] == "status FAILED"
    records = [json.loads(line) for line in (store / "errors.jsonl").read_text().splitlines()]
    full = [r for r in records if "count" not in r]
    assert len(full) == FULL_PER_ERROR
    for r in full:
        assert r["kind"] == "status FAILED" and r["log"].endswith(".err")
        assert isinstance(r["log_offset"], int)
        assert (r["worker"] is None) == (mode == "serial")


SLURM_SCRIPT = textwrap.dedent(
    """
    import sys
    import bellis as daisy

    def process(block):
        if int(block.write_roi.offset[0]) == 20:
            raise ValueError("bad voxel size on the cluster")

    task = daisy.Task(
        "seg",
        total_roi=daisy.Roi((0,), (40,)),
        read_roi=daisy.Roi((0,), (10,)),
        write_roi=daisy.Roi((0,), (10,)),
        process_function=process,
        max_retries=1,
        num_workers=1,
        read_write_conflict=False,
        tracking_path=sys.argv[1],
    )
    launcher = daisy.SlurmLauncher(job_name_prefix=sys.argv[2], poll_interval=1.0)
    print("RESULT", daisy.run_blockwise([task], launcher=launcher, progress=False))
    """
)


@pytest.mark.slurm
def test_a_failure_on_slurm_names_its_job(tmp_path: Path) -> None:
    from kit.slurm import active_jobs, job_prefix, slurm_unavailable_reason

    reason = slurm_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    prefix = job_prefix(tmp_path, "err")
    script, store = tmp_path / "cluster_pipeline.py", tmp_path / "store"
    script.write_text(SLURM_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(store), prefix],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert "RESULT False" in proc.stdout, proc.stdout + proc.stderr
    block = json.loads(_bellis("status", str(store), "--block", "2", "--json", cwd=tmp_path).stdout)
    attempts = block["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    for a in attempts:
        assert a["kind"] == "raised" and a["type"] == "ValueError"
        # the SLURM job the attempt ran in: a job id ("123") or an array task ("123_4")
        assert a["job"] and str(a["job"]).replace("_", "").isdigit(), a
        assert any("bad voxel size on the cluster" in line for line in a["log_lines"])
    text = _bellis("status", str(store), "--failed", cwd=tmp_path).stdout
    assert "1 distinct error, 2 failed attempts" in text, text
    assert f'File "{script}", line 7, in process' in text
    assert active_jobs(prefix) == []


SURROGATE_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import bellis as daisy

    NAME = os.fsdecode(b"scan_\\xff.tif")  # a file name with an undecodable byte

    def process(block):
        if int(block.write_roi.offset[0]) % 2:
            raise OSError(f"cannot open {NAME}")

    task = daisy.Task(
        "scans",
        total_roi=daisy.Roi((0,), (6,)),
        read_roi=daisy.Roi((0,), (1,)),
        write_roi=daisy.Roi((0,), (1,)),
        process_function=process,
        max_retries=0,
        max_workers=1,
        read_write_conflict=False,
        tracking_path=sys.argv[2],
    )
    try:
        ok = daisy.run_blockwise([task], multiprocessing=sys.argv[1] != "serial",
                                 progress=False, summary=False)
    except OSError as exc:
        ok = "RAISED " + type(exc).__name__
    print("RESULT", ok)
    """
)


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_a_message_with_a_lone_surrogate_is_recorded_escaped(tmp_path: Path, mode: str) -> None:
    """An error message about a file name with undecodable bytes holds a lone surrogate,
    which UTF-8 cannot encode: the failure still goes home and into ``errors.jsonl``, and
    ``bellis status --failed`` prints it escaped."""
    script = tmp_path / "scans.py"
    script.write_text(SURROGATE_SCRIPT)
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    expected = "RESULT RAISED OSError" if mode == "serial" else "RESULT False"
    assert expected in proc.stdout, proc.stdout + proc.stderr
    raw = (store / "errors.jsonl").read_bytes()
    raw.decode("utf-8")  # valid UTF-8 (JSON escapes, no raw surrogate)
    proc = _bellis("status", str(store), "--failed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[raised] OSError: cannot open scan_\\udcff.tif" in proc.stdout, proc.stdout
    data = json.loads(_bellis("status", str(store), "--failed", "--json", cwd=tmp_path).stdout)
    (group,) = data["errors"]
    assert group["message"] == "cannot open scan_\\udcff.tif"
    assert group["count"] == (1 if mode == "serial" else 3)
    assert "scan_\\udcff.tif" in group["traceback"]
