"""A worker function that catches its block's exception goes on (issue 25 item 5), as a user
runs it: a script in a subprocess, a 0-argument worker function with its own
``bellis.Client()``, 40 blocks of which every 4th raises, ``max_workers=2``.

Each block attempt appends ``<block> start|done`` to a file named after the pid that ran it,
so the test counts the processes that ran blocks and every attempt of every block; the
script reports the task's counters and the tracking store's ``done`` and ``failures``.

The counts are daisy 2.0.0's, taken from a run of the same script with ``import daisy``:

* the loop catches the exception: 1 process ran blocks (2 started), 30 blocks done, the 10
  raising ones each failed ``max_retries + 1`` times (3), no worker failure or restart;
* the exception leaves the worker function: each raising attempt ends its worker (exit
  code 1), so the 2 free starts and the default 10 restarts run out after 12 failed
  attempts, and the task is abandoned with the 30 other blocks done and the 10 raising
  ones orphaned.

A 1-argument block function that raises is where bellis parts from daisy 2.0.0 (issue 35
item 1): once the function has returned on a block of its worker, bellis's own worker loop
goes on after a failed attempt, as the catching loop does, with the same block counts; only
a worker whose very first block raises ends (daisy ends the worker on every exception).

A block that outlives its timeout, or raises ``MemoryError`` under the worker's memory
limit, still ends its worker when the function catches the exception.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kit.user_script import run_script

BLOCKS = 40

SCRIPT = r"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import zarr

import bellis

HERE = Path(__file__).parent
OUT = HERE / "attempts"
MODE = sys.argv[1]
MAX_RETRIES = int(sys.argv[2])


def raises(i):
    return i % 4 == 3


def record(i, what):
    fd = os.open(OUT / f"{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{i} {what}\n".encode())
    finally:
        os.close(fd)


def first_time(name):
    try:
        fd = os.open(HERE / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def block_fn(block):
    i = block.block_id[1]
    record(i, "start")
    if MODE == "big":  # every block raises, with a message of 120,000 characters
        raise ValueError(f"block {i} raises " + "x" * 120_000)
    if MODE == "last":
        raise ValueError("the only block raises")
    if MODE == "same":  # every block raises the same error
        raise ValueError("the same error")
    if raises(i):
        raise ValueError(f"block {i} raises")
    if MODE == "timeout" and i == 5 and first_time("hung"):
        time.sleep(60)
    if MODE == "oom" and i == 5 and first_time("hogged"):
        data = bytearray(400 * 2**20)  # over the 300M grant: MemoryError
        del data
    record(i, "done")


def catching():
    client = bellis.Client()
    while True:
        try:
            with client.acquire_block() as block:
                if block is None:
                    break
                block_fn(block)
        except (ValueError, MemoryError):
            pass  # the user's loop goes on with its next block


def escaping():
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            block_fn(block)


def main():
    OUT.mkdir()
    fn = {"escape": escaping, "blockfn": block_fn, "last": block_fn}.get(MODE, catching)
    extra = {}
    if MODE == "timeout":
        extra["timeout"] = 2.0
    if MODE == "oom":
        extra.update(memory_limit="300M", max_memory="600M")
    if MODE in ("big", "same"):  # every block raises: the failures' transport, not the rule
        extra.update(max_consecutive_failures=None)
    bellis.logging.set_log_basedir(HERE / "logs")
    roi = bellis.Roi((0,), (400 if MODE in ("big", "same") else BLOCKS,))
    if MODE == "last":  # one block, which raises: the run's last block is a worker's first
        roi = bellis.Roi((0,), (1,))
    task = bellis.Task(
        "t",
        total_roi=roi,
        read_roi=bellis.Roi((0,), (1,)),
        write_roi=bellis.Roi((0,), (1,)),
        process_function=fn,
        max_workers=1 if MODE in ("big", "last") else 2,
        max_retries=MAX_RETRIES,
        tracking_path=HERE / "track",
        **extra,
    )
    try:
        states = bellis.run_blockwise([task], return_states=True, progress=False)
    except bellis.TaskAbandonedError as exc:
        states = exc.daisy_states
    s = states["t"]
    store = zarr.open_group(str(HERE / "track"), mode="r")
    (HERE / "result.json").write_text(json.dumps({
        "completed": s.completed_count,
        "failed": s.failed_count,
        "orphaned": s.orphaned_count,
        "abandoned": s.abandoned,
        "starts": s.worker_start_count,
        "restarts": s.worker_restart_count,
        "worker_failures": s.worker_failure_count,
        "failed_attempts": s.failed_attempt_count,
        "timeouts": s.timeout_reclaim_count,
        "done": np.asarray(store["done"][:]).ravel().tolist(),
        "failures": np.asarray(store["failures"][:]).ravel().tolist(),
    }))


if __name__ == "__main__":
    main()
""".replace("BLOCKS,", f"{BLOCKS},")


def _raises(i: int) -> bool:
    return i % 4 == 3


RAISING = [i for i in range(BLOCKS) if _raises(i)]


def _run(
    tmp_path: Path, mode: str, max_retries: int = 2
) -> tuple[dict[str, Any], dict[int, list[tuple[int, str]]]]:
    """The script's result, and ``{pid: [(block, "start" | "done"), ...]}`` in order."""
    proc = run_script(tmp_path, SCRIPT, mode, str(max_retries), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    attempts: dict[int, list[tuple[int, str]]] = {}
    for f in (tmp_path / "attempts").iterdir():
        rows = [line.split() for line in f.read_text().splitlines()]
        attempts[int(f.stem)] = [(int(i), what) for i, what in rows]
    return result, attempts


def _count(attempts: dict[int, list[tuple[int, str]]], what: str) -> Counter[int]:
    return Counter(i for rows in attempts.values() for i, w in rows if w == what)


@pytest.mark.parametrize("max_retries", [2, 0])
def test_a_worker_function_that_catches_its_blocks_exception_goes_on(
    tmp_path: Path, max_retries: int
) -> None:
    result, attempts = _run(tmp_path, "catch", max_retries)
    # the two workers started at first ran every block: none was replaced
    assert 1 <= len(attempts) <= 2, attempts.keys()
    assert result["starts"] == 2
    assert (result["restarts"], result["worker_failures"]) == (0, 0)
    # the retry rules, as daisy 2.0.0 applies them: a raising block is attempted
    # max_retries + 1 times, then fails for good; every other block is done once
    tries = max_retries + 1
    assert (result["completed"], result["failed"], result["orphaned"]) == (30, 10, 0)
    assert not result["abandoned"]
    assert result["failed_attempts"] == 10 * tries
    assert result["failures"] == [tries if _raises(i) else 0 for i in range(BLOCKS)]
    assert result["done"] == [0 if _raises(i) else 1 for i in range(BLOCKS)]
    assert _count(attempts, "done") == {i: 1 for i in range(BLOCKS) if not _raises(i)}
    assert _count(attempts, "start") == {i: tries if _raises(i) else 1 for i in range(BLOCKS)}


def test_a_block_function_that_raises_goes_on_once_it_did_a_block(tmp_path: Path) -> None:
    # bellis's own loop: the block counts of the catching loop; a worker ends only when
    # its very first block raised (which block a worker gets first depends on timing)
    result, attempts = _run(tmp_path, "blockfn")
    assert (result["completed"], result["failed"], result["orphaned"]) == (30, 10, 0)
    assert not result["abandoned"]
    assert result["failed_attempts"] == 30
    assert result["failures"] == [3 if _raises(i) else 0 for i in range(BLOCKS)]
    assert _count(attempts, "start") == {i: 3 if _raises(i) else 1 for i in range(BLOCKS)}
    ended = [pid for pid, rows in attempts.items() if _raises(rows[0][0])]
    for pid in ended:  # a worker whose first block raised ran nothing after it
        assert attempts[pid] == [attempts[pid][0]], attempts[pid]
    # each such exit is a worker failure, counted as its BYE says it ends, even when
    # that block was the run's last and the run ended before the process exited
    assert result["worker_failures"] == len(ended)
    assert result["starts"] == 2 + result["restarts"] and result["restarts"] <= len(ended)


def test_a_worker_whose_first_block_is_the_runs_last_and_raises_is_counted(
    tmp_path: Path,
) -> None:
    # the worker's first block raised, so it ends; that block was the run's last, so the
    # run ends as its failure comes home, before the process has exited: the failure is
    # still counted (it was not: a worker exit seen after the run's end counts nothing)
    result, attempts = _run(tmp_path, "last", 0)
    assert (result["completed"], result["failed"], result["orphaned"]) == (0, 1, 0)
    assert result["failures"] == [1] and result["done"] == [0]
    ((_pid, rows),) = attempts.items()
    assert rows == [(0, "start")]
    assert (result["starts"], result["restarts"], result["worker_failures"]) == (1, 0, 1)


def test_an_exception_that_leaves_the_function_ends_its_worker(tmp_path: Path) -> None:
    # the worker function lets the exception out: that worker exits with code 1 and
    # another starts, until the starts run out (daisy 2.0.0 ends its workers the same way,
    # with the same counts)
    result, attempts = _run(tmp_path, "escape")
    assert result["abandoned"]
    assert (result["starts"], result["restarts"], result["worker_failures"]) == (12, 10, 12)
    assert (result["completed"], result["failed"], result["orphaned"]) == (30, 0, 10)
    assert result["done"] == [0 if _raises(i) else 1 for i in range(BLOCKS)]
    assert result["failed_attempts"] == sum(result["failures"]) == 12
    assert all(result["failures"][i] >= 1 for i in RAISING)
    assert not any(result["failures"][i] for i in range(BLOCKS) if not _raises(i))
    # each process ran blocks until its first raising block, and no further
    assert len(attempts) == 12
    for rows in attempts.values():
        assert sum(_raises(i) for i, _w in rows) == 1 and _raises(rows[-1][0]), rows


def test_a_block_that_times_out_still_ends_the_worker_that_catches(tmp_path: Path) -> None:
    result, attempts = _run(tmp_path, "timeout")
    # block 5 hung on its first attempt: the watchdog ended that worker, the block ran
    # again elsewhere; the raising blocks did not end their workers
    assert result["timeouts"] == 1
    assert (result["completed"], result["failed"]) == (30, 10)
    (hung,) = [pid for pid, rows in attempts.items() if (5, "start") == rows[-1]]
    assert (5, "done") not in attempts[hung]
    failures = result["failures"]
    assert failures[5] <= 1  # (uncharged when the server reclaimed it with a batch)
    assert [f for i, f in enumerate(failures) if i != 5] == [
        3 if _raises(i) else 0 for i in range(BLOCKS) if i != 5
    ]
    # only the timed-out worker's replacement may spend the restart budget: the raising
    # blocks end no worker. (The other worker may finish every block, block 5 included,
    # before that replacement starts; then the run ends without it, and nothing is spent.)
    assert result["restarts"] <= 1


def test_a_memory_error_under_the_limit_still_ends_the_worker_that_catches(
    tmp_path: Path,
) -> None:
    result, attempts = _run(tmp_path, "oom")
    # block 5 raised MemoryError under the 300M grant: its worker said goodbye and ran
    # nothing after it, and the block ran again (with 600M) on another worker
    assert (result["completed"], result["failed"]) == (30, 10)
    (hog,) = [pid for pid, rows in attempts.items() if rows[-1] == (5, "start")]
    assert sum(rows.count((5, "done")) for rows in attempts.values()) == 1
    assert (5, "done") not in attempts[hog]
    assert [i for i, _w in attempts[hog]].count(5) == 1


def test_a_batch_of_large_failures_fits_in_one_frame(tmp_path: Path) -> None:
    """Every block of a catching worker raises with a huge message: the failures of a
    batch go home in one request, shrunk to fit the server's frame cap, so no worker is
    dropped as a foreign peer and no block runs twice."""
    result, attempts = _run(tmp_path, "big", 0)
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*") if p.is_file())
    assert "outside 1..1048576" not in logs and "does not speak the bellis protocol" not in logs
    n = 10 * BLOCKS  # one worker, 400 blocks: its batches grow to dozens of blocks
    assert (result["completed"], result["failed"], result["orphaned"]) == (0, n, 0)
    assert result["failed_attempts"] == n
    assert _count(attempts, "start") == {i: 1 for i in range(n)}
    assert (result["restarts"], result["worker_failures"]) == (0, 0)


def test_a_catching_worker_s_repeated_error_is_counted_under_one_key(tmp_path: Path) -> None:
    """Every block of two catching workers raises the same error: each worker sends the
    details of its first failures of it, then only the error's key, and the driver writes
    the first records in full and counts the rest under the same distinct error."""
    from bellis._stats._errorlog import FULL_PER_ERROR

    result, attempts = _run(tmp_path, "same", 0)
    n = 10 * BLOCKS
    assert (result["completed"], result["failed"], result["failed_attempts"]) == (0, n, n)
    assert len(attempts) <= 2 and result["restarts"] == 0
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "track"), "--failed", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (group,) = json.loads(proc.stdout)["errors"]
    assert (group["type"], group["message"], group["count"]) == ("ValueError", "the same error", n)
    assert "user_script.py:" in group["where"] and group["where"].endswith(" in block_fn")
    records = [
        json.loads(line) for line in (tmp_path / "track" / "errors.jsonl").read_text().splitlines()
    ]
    full = [r for r in records if "count" not in r]
    assert len(full) == FULL_PER_ERROR
    for r in full:  # the first attempts carry what the worker said about them
        assert "ValueError: the same error" in r["traceback"]
        assert r["log"].endswith(".err") and isinstance(r["log_offset"], int)
        assert isinstance(r["pid"], int) and r["host"]
    assert max(r["count"] for r in records if "count" in r) == n
