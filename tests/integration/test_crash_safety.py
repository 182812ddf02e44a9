"""Crash safety of the tracking store: SIGKILL a distributed driver at random moments.

A driver subprocess runs a tracked distributed task whose block function appends the
block id to a file (``O_APPEND``, fsync) *after* its work. The test kills the driver and
its workers at seeded random moments (after a random number of new records), then
reruns until a run completes, and checks:

* every cell the store marks done has a success record (done is only written after the
  block's work finished);
* no run re-executes a block that was marked done when the run started;
* the final run executes exactly the blocks not done before it, each once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

GRID = (10, 10)

DRIVER = textwrap.dedent(
    """
    import os
    import sys
    import time

    import bellis
    from bellis import logging as blog

    records, store, logs = sys.argv[1], sys.argv[2], sys.argv[3]
    blog.set_log_basedir(logs)


    def process(block):
        time.sleep(0.01 + (block.block_id[1] % 7) * 0.004)
        fd = os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            y, x = (int(v) // 10 for v in block.write_roi.offset)
            os.write(fd, f"{y * 10 + x}\\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    task = bellis.Task(
        "crash",
        total_roi=bellis.Roi((0, 0), (100, 100)),
        read_roi=bellis.Roi((0, 0), (10, 10)),
        write_roi=bellis.Roi((0, 0), (10, 10)),
        process_function=process,
        max_workers=3,
        tracking_path=store,
    )
    states = bellis.run_blockwise(
        [task], multiprocessing=True, progress=False, return_states=True, summary=False
    )
    state = states["crash"]
    ok = state.completed_count == state.total_block_count and state.failed_count == 0
    sys.exit(0 if ok else 3)
    """
)


def _marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (the driver and its workers)."""
    needle = f"BELLIS_CRASH_TEST={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :].startswith(b"Z"):
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _kill_everything(proc: subprocess.Popen[bytes], marker: str) -> None:
    proc.kill()  # SIGKILL the driver first: the crash being simulated
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 10.0
    while True:
        pids = _marked_pids(marker)
        pids = [p for p in pids if p != proc.pid]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > deadline:
            pytest.fail(f"could not kill the crash test's workers: {pids}")
        time.sleep(0.02)
    proc.wait(timeout=10)


def _records(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(x) for x in path.read_text().split()]


def _done(store: Path) -> np.ndarray[Any, Any]:
    if not (store / "zarr.json").exists() or not (store / "done" / "zarr.json").exists():
        return np.zeros(GRID, dtype=np.uint8)
    group: Any = zarr.open_group(str(store), mode="r")
    return np.asarray(group["done"][:])


@pytest.mark.slow
def test_sigkill_at_random_moments_never_loses_or_repeats_done_blocks(tmp_path: Path) -> None:
    rng = random.Random(20240517)
    work = tmp_path / "work"
    work.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    records = tmp_path / "records.txt"
    store = tmp_path / "track" / "crash"
    marker = uuid.uuid4().hex
    env = {**os.environ, "BELLIS_CRASH_TEST": marker}
    total = GRID[0] * GRID[1]

    kills = 0
    finished = False
    for attempt in range(30):
        done_before = _done(store).reshape(-1).copy()
        seen_before = len(_records(records))
        crash = attempt < 8
        proc = subprocess.Popen(
            [sys.executable, str(driver), str(records), str(store), str(tmp_path / "logs")],
            cwd=work,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if crash:
            # kill once this run has recorded a random number of new blocks, plus a random
            # fraction of a block: mid-run whatever this machine's speed
            target = seen_before + rng.randint(1, 8)
            linger = rng.uniform(0.0, 0.03)
            deadline = time.monotonic() + 60
            while (
                proc.poll() is None
                and len(_records(records)) < target
                and time.monotonic() < deadline
            ):
                time.sleep(0.005)
            time.sleep(linger)
            if proc.poll() is None:
                _kill_everything(proc, marker)
                kills += 1
            else:
                _kill_everything(proc, marker)
        else:
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                _kill_everything(proc, marker)
                pytest.fail("the uninterrupted run did not finish")
            assert proc.returncode == 0, err.decode(errors="replace")
            finished = True
        if proc.stderr is not None:
            proc.stderr.close()

        all_records = _records(records)
        this_run = all_records[seen_before:]
        done_after = _done(store).reshape(-1)
        recorded = set(all_records)
        # 1. done implies a success record (written before the worker reported success)
        missing = [c for c in np.flatnonzero(done_after).tolist() if c not in recorded]
        assert missing == [], f"cells marked done without a success record: {missing}"
        # 2. nothing marked done before this run started was executed again in it
        repeated = sorted({b for b in this_run if done_before[b]})
        assert repeated == [], f"run {attempt} re-executed blocks already done: {repeated}"
        # done never goes back
        assert (done_after >= done_before).all()
        if finished:
            # 3. the final run executed exactly the rest, once each
            expected = sorted(np.flatnonzero(done_before == 0).tolist())
            assert sorted(this_run) == expected
            assert Counter(this_run).most_common(1)[0][1] == 1 if this_run else True
            assert (done_after == 1).all()
            break
    assert finished
    assert kills >= 3, f"only {kills} runs were actually interrupted"
    assert set(_records(records)) == set(range(total))
    assert _marked_pids(marker) == []
