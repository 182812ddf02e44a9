"""``Task(setup=...)`` (issue 37, item 1) as a user runs it: a script in a subprocess, real
worker processes on 127.0.0.1, real files. The setup and its teardown write a file named by
the process's pid for each call, so the files count the calls per process; the block
function writes one file per block that names its process and what the setup made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.user_script import run_script

SCRIPT = """
import contextlib
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
FORM = os.environ["FORM"]
MODE = os.environ["MODE"]


def note(kind):
    # one line per call, in a file per process: the lines count the calls
    with open(REC / f"{kind}_{os.getpid()}", "a") as f:
        f.write("x\\n")


def plain_setup():
    note("setup")
    time.sleep(0.2)
    return {"pid": os.getpid(), "volume": "opened"}


@contextlib.contextmanager
def cm_setup():
    note("setup")
    time.sleep(0.2)
    yield {"pid": os.getpid(), "volume": "opened"}
    note("teardown")


class Volume:
    def __init__(self):
        note("setup")
        time.sleep(0.2)

    def __enter__(self):
        return {"pid": os.getpid(), "volume": "opened"}

    def __exit__(self, *exc):
        note("teardown")


SETUPS = {"plain": plain_setup, "contextmanager": cm_setup, "class": Volume}


def with_ctx(block, ctx):
    assert ctx["pid"] == os.getpid(), "the context was made in another process"
    (REC / f"A_{block.block_id[1]}_{os.getpid()}_{ctx['volume']}").touch()


def without_ctx(block):
    (REC / f"B_{block.block_id[1]}_{os.getpid()}").touch()


def main():
    REC.mkdir()
    (REC / f"driver_{os.getpid()}").touch()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    common = dict(
        total_roi=Roi((0,), (40,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        read_write_conflict=False,
        max_workers=2,
        setup=SETUPS[FORM],
    )
    a = bellis.Task("A", process_function=with_ctx, **common)
    b = bellis.Task("B", process_function=without_ctx, **common)
    ok = bellis.run_blockwise([a, b], multiprocessing=MODE == "dist", progress=False)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def _calls(rec: Path, kind: str) -> dict[int, int]:
    """Per pid, how many times ``kind`` (setup, teardown) ran in it."""
    return {
        int(p.name.split("_")[1]): len(p.read_text().splitlines())
        for p in rec.iterdir()
        if p.name.startswith(kind + "_")
    }


def _blocks(rec: Path, task: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for p in rec.iterdir():
        if p.name.startswith(task + "_"):
            _t, sid, *rest = p.name.split("_")
            out.setdefault(int(sid), []).append("_".join(rest))
    return out


def _run(tmp_path: Path, form: str, mode: str) -> subprocess.CompletedProcess[str]:
    return run_script(tmp_path, SCRIPT, name="warm.py", env={"FORM": form, "MODE": mode})


@pytest.mark.parametrize("form", ["contextmanager", "plain", "class"])
@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_setup_runs_once_per_process_and_reaches_the_block_function(
    tmp_path: Path, mode: str, form: str
) -> None:
    proc = _run(tmp_path, form, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = tmp_path / "records"
    (driver,) = (int(p.name.split("_")[1]) for p in rec.iterdir() if p.name.startswith("driver_"))
    a, b = _blocks(rec, "A"), _blocks(rec, "B")
    assert sorted(a) == sorted(b) == list(range(40))
    assert all(len(v) == 1 for v in (*a.values(), *b.values()))  # every block once
    a_pids = {int(v[0].split("_")[0]) for v in a.values()}
    b_pids = {int(v[0].split("_")[0]) for v in b.values()}
    # fn(block, ctx) saw what the setup made, in its own process
    assert {v[0].split("_", 1)[1] for v in a.values()} == {"opened"}
    setups = _calls(rec, "setup")
    # exactly once per process and task: a worker serves one task here, the driver both
    if mode == "serial":
        assert a_pids == b_pids == {driver}
        assert setups == {driver: 2}  # A's setup and B's, once each
    else:
        assert driver not in a_pids | b_pids
        assert not a_pids & b_pids  # task-bound workers
        assert a_pids | b_pids <= set(setups)
        assert set(setups.values()) == {1}, setups
        assert 2 <= len(setups) <= 4  # 2 per task at most, started as the tasks need them
    teardowns = _calls(rec, "teardown")
    if form == "plain":
        assert teardowns == {}  # a plain function's value is kept: no teardown
    else:
        assert teardowns == setups, (teardowns, setups)  # once per clean leave
    if mode == "dist":
        # the report's worker phases: each worker's setup apart from start-up and blocks
        for task in ("A", "B"):
            line = json.loads((tmp_path / "tracking" / task / "runs.jsonl").read_text())
            records = line["workers"]["records"]
            assert records and all(r["task_setup"] >= 0.2 for r in records), records
            assert line["workers"]["task_setup"]["n"] == len(records)


FAILING = """
import os
import sys
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
FAIL_TIMES = int(os.environ["FAIL_TIMES"])


def open_volume():
    n = len(list(REC.iterdir()))
    (REC / f"setup_{n}_{os.getpid()}").touch()
    if n < FAIL_TIMES:
        raise ValueError("cannot open the volume")
    return "volume"


def process(block, volume):
    (HERE / "done" / f"{block.block_id[1]}_{volume}").touch()


def main():
    REC.mkdir()
    (HERE / "done").mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "A",
        total_roi=Roi((0,), (6,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=1,
        max_worker_restarts=2,
        setup=open_volume,
    )
    try:
        ok = bellis.run_blockwise(
            [task], multiprocessing=os.environ["MODE"] == "dist", progress=False
        )
    except bellis.TaskAbandonedError as exc:
        print("ABANDONED:", exc)
        sys.exit(4)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def _run_failing(tmp_path: Path, mode: str, fail_times: int) -> subprocess.CompletedProcess[str]:
    env = {"MODE": mode, "FAIL_TIMES": str(fail_times)}
    return run_script(tmp_path, FAILING, name="failing.py", env=env)


def _records(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "tracking" / "A" / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _status_failed(tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "tracking" / "A"), "--failed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_setup_that_raises_is_retried_within_the_restart_budget(tmp_path: Path) -> None:
    proc = _run_failing(tmp_path, "dist", 1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == [
        f"{i}_volume" for i in range(6)
    ]
    starts = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert len(starts) == 2 and starts[0].startswith("setup_0_")  # failed once, then ran
    (rec,) = _records(tmp_path)
    assert rec["kind"] == "setup failed" and rec["block"] == -1
    assert rec["type"] == "ValueError" and rec["message"] == "cannot open the volume"
    assert 'raise ValueError("cannot open the volume")' in str(rec["traceback"])
    assert rec["pid"] == int(starts[0].split("_")[2])
    out = _status_failed(tmp_path)
    assert "[setup failed] ValueError: cannot open the volume" in out, out
    assert "1 worker start failed in the setup; no block ran" in out, out
    assert 'raise ValueError("cannot open the volume")' in out, out


def test_a_setup_that_keeps_raising_ends_the_run_with_an_error_naming_it(
    tmp_path: Path,
) -> None:
    proc = _run_failing(tmp_path, "dist", 99)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert not (tmp_path / "done").exists() or not list((tmp_path / "done").iterdir())
    # 1 start and 2 restarts (max_worker_restarts=2), each one setup that raised
    assert len(list((tmp_path / "records").iterdir())) == 3
    abandoned = out[out.index("ABANDONED:") :]
    assert "worker restart cap exhausted" in abandoned, abandoned
    assert "Last worker error: \n" not in abandoned
    assert "setup of task 'A' failed in worker" in abandoned, abandoned
    assert "Task(setup=...) raised before any block ran" in abandoned, abandoned
    assert "ValueError: cannot open the volume" in abandoned, abandoned
    records = _records(tmp_path)
    full = [r for r in records if "count" not in r]
    assert len(full) == 3 and {r["kind"] for r in full} == {"setup failed"}
    status = _status_failed(tmp_path)
    assert "3 worker starts failed in the setup; no block ran" in status, status


def test_a_setup_that_raises_in_serial_mode_propagates_and_is_recorded(tmp_path: Path) -> None:
    proc = _run_failing(tmp_path, "serial", 99)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ValueError: cannot open the volume" in proc.stderr
    assert "raised by the setup of task 'A' (Task(setup=...))" in proc.stderr
    assert len(list((tmp_path / "records").iterdir())) == 1  # once, no retry
    (rec,) = _records(tmp_path)
    assert rec["kind"] == "setup failed" and rec["type"] == "ValueError"


CODE = """
import os
import sys
from pathlib import Path

import bellis as daisy
from funlib.geometry import Roi

HERE = Path(__file__).parent


def open_volume():
    return {"scale": 2}


def process(block, ctx):
    out = HERE / os.environ["RUN"]
    out.mkdir(exist_ok=True)
    (out / f"{block.block_id[1]}_{ctx['scale']}").touch()


daisy.set_tracking_basedir(HERE / "tracking")
task = daisy.Task("A", Roi((0,), (40,)), Roi((0,), (10,)), Roi((0,), (10,)), process,
                  on_code_change=os.environ["POLICY"], setup=open_volume)
ok = daisy.run_blockwise([task], multiprocessing=os.environ["MODE"] == "dist")
sys.exit(0 if ok else 3)
"""


def _made(tmp_path: Path, text: str, run: str, mode: str, policy: str) -> list[str]:
    env = {"RUN": run, "MODE": mode, "POLICY": policy}
    proc = run_script(tmp_path, text, name="pipeline.py", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / run
    made = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    if policy == "rerun" and run == "run3":
        assert "A: 4 block(s) made by other code (function open_volume)" in proc.stdout + (
            proc.stderr
        ), proc.stdout + proc.stderr
    return made


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_a_change_of_the_setups_code_marks_the_blocks_stale(tmp_path: Path, mode: str) -> None:
    assert _made(tmp_path, CODE, "run1", mode, "rerun") == ["0_2", "1_2", "2_2", "3_2"]
    assert _made(tmp_path, CODE, "run2", mode, "error") == []  # nothing changed
    edited = CODE.replace('return {"scale": 2}', 'return {"scale": 3}')
    assert _made(tmp_path, edited, "run3", mode, "rerun") == ["0_3", "1_3", "2_3", "3_3"]


WALLTIME = """
import contextlib
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"


@contextlib.contextmanager
def open_volume():
    (REC / f"setup_{os.getpid()}").touch()
    yield "volume"
    (REC / f"teardown_{os.getpid()}").touch()


def process(block, volume):
    (REC / f"block_{block.block_id[1]}").touch()


def main():
    REC.mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    # the workers' job ended a second ago: each leaves for its time limit before a block
    os.environ["SLURM_JOB_END_TIME"] = str(int(time.time()) - 1)
    os.environ["BELLIS_WALLTIME_MARGIN"] = "0"
    task = bellis.Task(
        "A",
        total_roi=Roi((0,), (4,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=1,
        max_worker_restarts=1,
        setup=open_volume,
    )
    try:
        bellis.run_blockwise([task], progress=False)
    except bellis.TaskAbandonedError:
        sys.exit(4)


if __name__ == "__main__":
    main()
"""


def test_the_teardown_runs_when_a_worker_leaves_for_its_job_time_limit(tmp_path: Path) -> None:
    proc = run_script(tmp_path, WALLTIME, name="walltime.py")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    rec = tmp_path / "records"
    assert not [p for p in rec.iterdir() if p.name.startswith("block_")]
    setups = sorted(p.name.split("_")[1] for p in rec.iterdir() if p.name.startswith("setup_"))
    teardowns = sorted(
        p.name.split("_")[1] for p in rec.iterdir() if p.name.startswith("teardown_")
    )
    assert len(setups) == 2 and teardowns == setups  # each worker left, each tore down
    logs = "".join(p.read_text() for p in (tmp_path / "logs" / "A").glob("*.err"))
    assert logs.count("bellis worker leaves before its job time limit") == 2, logs
