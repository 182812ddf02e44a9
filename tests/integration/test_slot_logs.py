"""Worker log files go per slot, not per worker started (issue 14, item 7).

Each test writes a driver script into ``tmp_path`` and runs it with ``sys.executable``, as a
user runs bellis: real worker processes, real log files. A replacement worker appends to the
files of the slot it takes, after a header line that names it, its start time and why it was
started; ``task.report().worker(i)`` and the panel say which files hold which worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

_PREAMBLE = """
import json, os, signal, sys
import bellis
from bellis import logging as blog

def crash_after_one_block():
    # a worker function: one block, then the process dies (by signal or exit code 3)
    wid = int(bellis.Context.from_env()["worker_id"])
    client = bellis.Client()
    with client.acquire_block() as block:
        if block is None:
            return
        sid = int(block.block_id[1])
        how = "signal" if sid % 3 == 0 else "code"
        print(f"OUT worker {wid} block {sid} {how}", flush=True)
        print(f"ERR worker {wid} block {sid} {how}", file=sys.stderr, flush=True)
    client.close()  # the block's result goes home before the process dies
    if how == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)

def print_block(block):
    wid = int(bellis.Context.from_env()["worker_id"])
    print(f"OUT worker {wid} block {block.block_id[1]}", flush=True)
    print(f"ERR worker {wid} block {block.block_id[1]}", file=sys.stderr, flush=True)

def make_task(task_id, n, fn, **kwargs):
    return bellis.Task(
        task_id,
        bellis.Roi((0,), (10 * n,)),
        bellis.Roi((0,), (10,)),
        bellis.Roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        **kwargs,
    )

def dump_workers(task, path):
    report = task.report()
    workers = {}
    for record in report.workers.records:
        again = report.worker(record.worker_id)
        workers[record.worker_id] = {
            "slot": getattr(again, "slot", None),
            "log_files": getattr(again, "log_files", None),
        }
    with open(path, "w") as f:
        json.dump(workers, f)

blog.set_log_basedir("logs")
"""

_HEADER = re.compile(
    r"^=== bellis worker (\d+) \(slot (\d+)\) started "
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d): (.*) ===$"
)


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "driver.py"
    script.write_text(_PREAMBLE + body)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _sections(path: Path) -> list[tuple[tuple[int, int, str], list[str]]]:
    """The file as (worker id, slot, reason) headers, each with the lines that follow it."""
    sections: list[tuple[tuple[int, int, str], list[str]]] = []
    for line in path.read_text().splitlines():
        m = _HEADER.match(line)
        if m is not None:
            sections.append(((int(m[1]), int(m[2]), m[4]), []))
        else:
            assert sections, f"{path} has output before the first header: {line!r}"
            sections[-1][1].append(line)
    return sections


def test_fifty_restarts_on_two_slots_leave_four_log_files(tmp_path: Path) -> None:
    blocks = 52  # each worker does one block and dies: 52 starts, 50 of them restarts
    done = _run(
        tmp_path,
        f"""
task = make_task("crashy", {blocks}, crash_after_one_block, max_workers=2,
                 max_worker_restarts=200, max_retries=10)
states = bellis.run_blockwise([task], progress=False, return_states=True)
state = states["crashy"]
print("COUNTS", state.completed_count, state.worker_restart_count, state.worker_start_count)
dump_workers(task, "workers.json")
""",
    )
    counts = re.search(r"^COUNTS (\d+) (\d+) (\d+)$", done.stdout, re.M)
    assert counts is not None, done.stdout
    completed, restarts, starts = map(int, counts.groups())
    assert completed == blocks
    assert restarts >= 50 and starts == restarts + 2

    logdir = tmp_path / "logs" / "crashy"
    worker_files = sorted(p.name for p in logdir.iterdir() if p.name.startswith("worker_"))
    assert worker_files == ["worker_0.err", "worker_0.out", "worker_1.err", "worker_1.out"]
    # nothing else per worker: the task's run log is the only other file
    assert sorted(p.name for p in logdir.iterdir()) == sorted([*worker_files, "runs.jsonl"])

    workers = {int(k): v for k, v in json.loads((tmp_path / "workers.json").read_text()).items()}
    assert len(workers) == starts
    seen: dict[int, int] = {}  # worker id -> its slot, from the headers
    for slot in (0, 1):
        files = {kind: logdir / f"worker_{slot}.{kind}" for kind in ("out", "err")}
        out_sections = _sections(files["out"])
        err_sections = _sections(files["err"])
        # both files carry the same headers, one per worker that held the slot
        assert [h for h, _ in out_sections] == [h for h, _ in err_sections]
        previous: tuple[int, str] | None = None
        for kind, sections in (("out", out_sections), ("err", err_sections)):
            previous = None
            for (wid, header_slot, reason), lines in sections:
                assert header_slot == slot
                seen[wid] = slot
                # every line after a worker's header is that worker's own output
                for line in lines:
                    assert line.startswith(f"{kind.upper()} worker {wid} block "), (wid, line)
                if previous is None:
                    assert reason == "first start", reason
                else:
                    prev_wid, prev_how = previous
                    ended = {
                        "signal": "which died of signal SIGKILL",
                        "code": "which exited with code 3",
                        "none": "which exited cleanly",  # it was told to stop at once
                    }[prev_how]
                    expected = f"replacing worker {prev_wid}, {ended}"
                    assert reason == expected, (reason, expected)
                how = lines[0].split()[-1] if lines else "none"
                previous = (wid, how)
        # the workers started in turn: the ids in a slot's file only grow
        ids = [h[0] for h, _ in out_sections]
        assert ids == sorted(ids)
    # every worker started has exactly one header, in the slot the report names
    assert sorted(seen) == sorted(workers)
    for wid, info in workers.items():
        assert info["slot"] == seen[wid]
        out, err = info["log_files"]
        assert Path(tmp_path, out).resolve() == (logdir / f"worker_{seen[wid]}.out").resolve()
        assert Path(tmp_path, err).resolve() == (logdir / f"worker_{seen[wid]}.err").resolve()
    # the panel names the files and gives each worker's slot
    # (the log basedir is pinned to its absolute path for the run: a block function that
    # changes directory must not move the logs)
    logs_line = f"logs        {logdir.resolve()}{os.sep}worker_<slot>.out and .err"
    assert logs_line in done.stdout, done.stdout
    assert re.search(r"^\s+id\s+slot\s+startup", done.stdout, re.M), done.stdout


def test_a_second_run_appends_to_the_same_slot_files(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
for _ in range(2):
    task = make_task("again", 3, print_block, max_workers=1)
    task.reset()
    assert bellis.run_blockwise([task], progress=False, summary=False)
""",
    )
    logdir = tmp_path / "logs" / "again"
    assert sorted(p.name for p in logdir.iterdir() if p.name.startswith("worker_")) == [
        "worker_0.err",
        "worker_0.out",
    ]
    for kind in ("out", "err"):
        lines = (logdir / f"worker_0.{kind}").read_text().splitlines()
        headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
        separators = [i for i, line in enumerate(lines) if line.startswith("=== bellis run ")]
        # run 1: header, output; run 2: the run separator, then a fresh header
        assert headers[0] == 0 and len(headers) == 2 and len(separators) == 1
        assert separators[0] == headers[1] - 1
        for start, end in ((0, separators[0]), (headers[1], len(lines))):
            m = _HEADER.match(lines[start])
            assert m is not None and m[4] == "first start"
            body = lines[start + 1 : end]
            assert len(body) == 3
            assert all(line.startswith(f"{kind.upper()} worker {m[1]} block ") for line in body)


def test_dask_workers_write_per_slot_files(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    _run(
        tmp_path,
        """
from distributed import Client, LocalCluster

if __name__ == "__main__":
    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                           dashboard_address=":0", scheduler_port=0, host="127.0.0.1",
                           silence_logs=40)
    client = Client(cluster)
    try:
        task = make_task("dask", 8, crash_after_one_block, max_workers=2,
                         max_worker_restarts=50, max_retries=10)
        states = bellis.run_blockwise([task], launcher=bellis.DaskLauncher(client),
                                      progress=False, summary=False, return_states=True)
        state = states["dask"]
        assert state.completed_count == 8, state
        assert state.worker_start_count >= 8, state
        dump_workers(task, "workers.json")
    finally:
        client.close()
        cluster.close()
""",
    )
    logdir = tmp_path / "logs" / "dask"
    assert sorted(p.name for p in logdir.iterdir() if p.name.startswith("worker_")) == [
        "worker_0.err",
        "worker_0.out",
        "worker_1.err",
        "worker_1.out",
    ]
    workers = json.loads((tmp_path / "workers.json").read_text())
    headers = {}
    for slot in (0, 1):
        for (wid, _, _), lines in _sections(logdir / f"worker_{slot}.out"):
            headers[wid] = slot
            assert all(line.startswith(f"OUT worker {wid} block ") for line in lines)
    assert {int(k): v["slot"] for k, v in workers.items()} == headers


def test_a_worker_replaced_after_a_block_timeout_says_so(tmp_path: Path) -> None:
    _run(
        tmp_path,
        """
import time

def hang_once(block):
    print_block(block)
    if block.block_id[1] == 1 and not os.path.exists("hung"):
        open("hung", "w").close()
        time.sleep(60)

task = make_task("slow", 3, hang_once, max_workers=1, timeout=1.5, max_retries=2)
states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
assert states["slow"].completed_count == 3, states["slow"]
dump_workers(task, "workers.json")
""",
    )
    logdir = tmp_path / "logs" / "slow"
    headers: dict[int, tuple[int, str]] = {}
    for path in sorted(logdir.glob("worker_*.out")):
        for (wid, slot, reason), lines in _sections(path):
            headers[wid] = (slot, reason)
            assert all(line.startswith(f"OUT worker {wid} block ") for line in lines)
    assert headers[0] == (0, "first start")
    # the replacement appends to slot 0 once worker 0 is seen to end; until then that
    # slot is held and it takes a new one
    assert headers[1] in (
        (0, "replacing worker 0, whose block exceeded the block timeout"),
        (1, "restart in a new slot (the worker it replaces has not ended yet)"),
    ), headers
    workers = json.loads((tmp_path / "workers.json").read_text())
    assert {int(k): v["slot"] for k, v in workers.items()} == {
        wid: slot for wid, (slot, _) in headers.items()
    }
