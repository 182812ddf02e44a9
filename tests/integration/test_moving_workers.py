"""A shared worker that moves between a pipeline's tasks takes each task's own setup and
declared inputs with it (issues 37 and 38): the old task's teardown, the new task's setup,
the new task's chunk cache.

Each test writes a driver script into ``tmp_path`` and runs it in a subprocess, as a user
runs bellis: real worker processes on 127.0.0.1, real zarr arrays, real files. One worker
(``resources={"cpu": 1}``) makes the order deterministic where a count depends on it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from kit.user_script import run_script

CHUNK = 20
BLOCK = 10
N = 100  # voxels: 10 blocks per task, 5 chunks per input

INPUTS = """
import json, os, sys
import numpy as np
import zarr
import bellis
from bellis import Roi
from bellis._worker import _chunkcache

HERE = os.getcwd()

def make(name):
    def process(block):
        raw = zarr.open_array(os.path.join(HERE, f"raw_{name}.zarr"), mode="r")
        out = zarr.open_array(os.path.join(HERE, f"out_{name}.zarr"), mode="r+")
        inst = _chunkcache.active()
        before = None if inst is None else inst.cache.counters()
        w = block.write_roi
        data = raw[w.offset[0] : w.end[0]]
        after = None if inst is None else inst.cache.counters()
        out[w.offset[0] : w.end[0]] = data.astype("int64") * (2 if name == "a" else 3)
        hits = misses = 0
        if after is not None:
            hits = after["hits"] - before["hits"]
            misses = after["misses"] - before["misses"]
        with open(os.path.join(HERE, "blocks.txt"), "a") as f:
            f.write(f"{name} {w.offset[0] // 10} {os.getpid()} {hits} {misses}\\n")
    return process

tasks = []
for name in ("a", "b"):
    zarr.create_array(os.path.join(HERE, f"out_{name}.zarr"), shape=(100,), chunks=(20,),
                      dtype="int64", fill_value=-1, overwrite=True)
    tasks.append(bellis.Task(
        name, Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)),
        process_function=make(name), read_write_conflict=False, max_workers=1,
        requires={"cpu": 1}, inputs=[os.path.join(HERE, f"raw_{name}.zarr")],
        tracking_path=os.path.join(HERE, "track_" + name),
    ))
ok = bellis.run_blockwise(tasks, resources={"cpu": 1}, progress=False)
with open(os.path.join(HERE, "result.json"), "w") as f:
    json.dump({t.task_id: t.report().input_cache for t in tasks}, f)
sys.exit(0 if ok else 3)
"""


def _inputs(tmp_path: Path) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(38)
    data = {}
    for name in ("a", "b"):
        raw = zarr.create_array(
            tmp_path / f"raw_{name}.zarr", shape=(N,), chunks=(CHUNK,), dtype="uint8"
        )
        data[name] = rng.integers(0, 256, N, dtype=np.uint8)
        raw[...] = data[name]
    return data


def test_a_moved_worker_serves_the_new_tasks_inputs_from_its_cache(tmp_path: Path) -> None:
    data = _inputs(tmp_path)
    proc = run_script(tmp_path, INPUTS, name="inputs.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in (tmp_path / "blocks.txt").read_text().splitlines()]
    blocks = [(t, int(k), int(pid), int(h), int(m)) for t, k, pid, h, m in rows]
    # one worker process ran both tasks: it moved from the first to the second
    assert len({pid for *_x, pid, _h, _m in blocks}) == 1, blocks
    order = [t for t, *_rest in blocks]
    first, second = order[0], order[-1]
    assert first != second and order == [first] * 10 + [second] * 10, order
    for name in ("a", "b"):
        mine = sorted((k, h, m) for t, k, _p, h, m in blocks if t == name)
        # 10-voxel blocks in 20-voxel chunks, one block at a time: each chunk is decoded
        # by the first of its two blocks and served from memory to the second, in both
        # tasks (the second one's blocks ran in the moved worker)
        assert sorted(k for k, _h, _m in mine) == list(range(10))
        assert sum(h for _k, h, _m in mine) == 5 and sum(m for _k, _h, m in mine) == 5, (
            name,
            mine,
        )
        assert all(h + m == 1 for _k, h, m in mine), (name, mine)
        out = zarr.open_array(tmp_path / f"out_{name}.zarr", mode="r")[:]
        factor = 2 if name == "a" else 3
        assert out.tobytes() == (data[name].astype(np.int64) * factor).tobytes()
    result = json.loads((tmp_path / "result.json").read_text())
    for name in ("a", "b"):  # counted per task, as the worker served each
        assert result[name] == {
            "hits": 5,
            "misses": 5,
            "miss_bytes": 5 * CHUNK,
            "bypassed": 0,
        }, result


SETUPS = """
import contextlib, os, sys, time
import bellis
from bellis import Roi

HERE = os.getcwd()
FAIL = os.environ.get("FAIL", "")
HANG = os.environ.get("HANG", "")

def note(line):
    with open(os.path.join(HERE, f"events_{os.getpid()}.txt"), "a") as f:
        f.write(line + "\\n")

def make_setup(name):
    @contextlib.contextmanager
    def setup():
        note(f"setup {name}")
        if name == FAIL:
            raise OSError(f"cannot open the volume of {name}")
        while name == HANG:  # a setup that hangs
            time.sleep(0.05)
        yield {"task": name, "pid": os.getpid()}
        note(f"teardown {name}")
    return setup

def make(name):
    def process(block, ctx):
        assert ctx["task"] == name and ctx["pid"] == os.getpid(), ctx
        note(f"block {name} {block.block_id[1]}")
    return process

SIZES = {"a": 4, "b": int(os.environ.get("B_BLOCKS", "12"))}
tasks = [
    bellis.Task(
        name, Roi((0,), (SIZES[name],)), Roi((0,), (1,)), Roi((0,), (1,)),
        process_function=make(name), setup=make_setup(name), read_write_conflict=False,
        max_workers=int(os.environ.get("MAXW", "2")), requires={"cpu": 1},
        max_worker_restarts=0,
        timeout=float(os.environ["TIMEOUT"]) if name == HANG else None,
        tracking_path=os.path.join(HERE, "track_" + name),
    )
    for name in ("a", "b")
]
bellis.logging.set_log_basedir(os.path.join(HERE, "logs"))
try:
    states = bellis.run_blockwise(tasks, resources={"cpu": int(os.environ["CPUS"])},
                                  progress=False, return_states=True)
except bellis.TaskAbandonedError as exc:
    print("ABANDONED:", exc)
    sys.exit(4)
sys.exit(0 if all(s.completed_count == SIZES[t] for t, s in states.items()) else 3)
"""


def _events(tmp_path: Path) -> dict[int, list[list[str]]]:
    return {
        int(p.stem.split("_")[1]): [line.split() for line in p.read_text().splitlines()]
        for p in tmp_path.glob("events_*.txt")
    }


def test_a_moving_worker_tears_down_its_task_and_sets_up_the_next(tmp_path: Path) -> None:
    # a budget of one worker, so that the move is certain: with two, each task may keep
    # one worker to its end (which one starts first decides), and no worker moves
    env = {"CPUS": "1"}
    proc = run_script(tmp_path, SETUPS, name="setups.py", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = _events(tmp_path)
    assert len(events) == 1, events  # one worker process in all, under the budget
    visits = []
    blocks: dict[str, list[int]] = {"a": [], "b": []}
    for pid, lines in events.items():
        current = None  # the task whose setup ran last in this process, until its teardown
        for line in lines:
            if line[0] == "setup":
                assert current is None, (pid, lines)  # the old task's teardown came first
                current = line[1]
                visits.append((pid, current))
            elif line[0] == "teardown":
                assert line[1] == current, (pid, lines)
                current = None
            else:
                assert line[1] == current, (pid, lines)  # a block between its setup and teardown
                blocks[line[1]].append(int(line[2]))
        assert current is None, (pid, lines)  # every setup got its teardown
    # exactly one setup (and so one teardown) per (worker, task) it visited
    assert len(visits) == len(set(visits)), visits
    assert any(pid == p and t != u for pid, t in visits for p, u in visits), visits  # a move
    assert sorted(blocks["a"]) == list(range(4)) and sorted(blocks["b"]) == list(range(12))


def test_a_setup_that_raises_on_the_task_a_worker_moved_to_is_that_tasks_failure(
    tmp_path: Path,
) -> None:
    # one worker: a (4 blocks, more than b's 2) gets it first; then it moves to b, whose
    # setup raises; b may have one worker and not restart it (max_worker_restarts=0)
    env = {"CPUS": "1", "FAIL": "b", "B_BLOCKS": "2", "MAXW": "1"}
    proc = run_script(tmp_path, SETUPS, name="setups.py", env=env, timeout=300)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    abandoned = out[out.index("ABANDONED:") :]
    assert "setup of task 'b' failed in worker" in abandoned, abandoned
    assert "OSError: cannot open the volume of b" in abandoned, abandoned
    (lines,) = _events(tmp_path).values()  # one process: a's worker, moved to b
    assert lines[0] == ["setup", "a"] and lines[-2:] == [["teardown", "a"], ["setup", "b"]]
    assert sorted(lines[1:-2]) == [["block", "a", str(i)] for i in range(4)], lines
    # a finished all its blocks; b's record names its setup, not a block
    track_a = tmp_path / "track_a"
    assert not (track_a / "errors.jsonl").exists() or not (track_a / "errors.jsonl").read_text()
    records = [
        json.loads(line)
        for line in (tmp_path / "track_b" / "errors.jsonl").read_text().splitlines()
    ]
    full = [r for r in records if "count" not in r]
    assert len(full) == 1 and full[0]["kind"] == "setup failed" and full[0]["block"] == -1
    assert full[0]["type"] == "OSError", full
    status = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "track_b"), "--failed"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "[setup failed] OSError: cannot open the volume of b" in status.stdout, status


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (no longer in /proc, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_setup_that_hangs_on_the_task_a_worker_moved_to_is_killed_at_that_tasks_timeout(
    tmp_path: Path,
) -> None:
    # one worker: a (4 blocks) gets it first, then it moves to b, whose setup hangs; b's
    # timeout (1s) bounds it as it bounds a first setup: the worker is killed, and with no
    # restart left (max_worker_restarts=0) b is abandoned. Without the bound the run would
    # hang: run_script's timeout fails the test then.
    env = {"CPUS": "1", "HANG": "b", "TIMEOUT": "1", "B_BLOCKS": "2", "MAXW": "1"}
    try:
        proc = run_script(tmp_path, SETUPS, name="setups.py", env=env, timeout=120)
    finally:
        left = [pid for pid in _events(tmp_path) if not _gone(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)  # never outlives the test
    assert left == [], left  # the server killed the hung worker
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    abandoned = out[out.index("ABANDONED:") :]
    assert "setup of task 'b' timed out in worker" in abandoned, abandoned
    assert "task's timeout (1s)" in abandoned, abandoned
    (lines,) = _events(tmp_path).values()  # one process: a's worker, moved to b
    assert lines[0] == ["setup", "a"] and lines[-2:] == [["teardown", "a"], ["setup", "b"]]
    assert sorted(lines[1:-2]) == [["block", "a", str(i)] for i in range(4)], lines
    track_a = tmp_path / "track_a"
    assert not (track_a / "errors.jsonl").exists() or not (track_a / "errors.jsonl").read_text()
    records = [
        json.loads(line)
        for line in (tmp_path / "track_b" / "errors.jsonl").read_text().splitlines()
    ]
    full = [r for r in records if "count" not in r]
    assert len(full) == 1 and full[0]["kind"] == "setup timed out", full
    assert full[0]["block"] == -1 and full[0]["task"] == "b", full
