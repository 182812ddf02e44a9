"""A few raising blocks must not stall a run for good (issue 35 item 1), as a user runs it:
a script in a subprocess over a 10 x 10 grid of fast blocks, ``max_workers=2``,
``max_retries=1`` and the default ``max_worker_restarts=10``.

* 21 of the 100 blocks raise ``ValueError``: each is a failed attempt, retried once, and the
  workers go on; the 79 good blocks are done, the 21 bad ones recorded as failed, and no
  worker start is spent per failure (before the fix every exception ended its worker, and
  after 12 deaths the task was abandoned with 56 blocks never tried). Only a worker whose
  very first block raises ends, as in daisy 2.0.0 (which block a worker gets first depends
  on timing, so the test counts those workers from the attempts).
* A function that raises on every block still stops fast: the task is abandoned once 10
  blocks failed in a row (``Task(max_consecutive_failures=10)``), and the message names that
  rule, the option that changes it and whether a rerun can get further.
* A resume after that abandonment runs the blocks never tried first, and the ones that
  failed before last (before the fix it tried the failed blocks first, which killed every
  worker start again: zero progress on every rerun). Serial mode, where a block's exception
  propagates (daisy 2.0.0), gets further on each rerun the same way.

Each attempt appends ``<block index> <pid>`` to ``attempts-<run>.txt`` (one ``write`` with
``O_APPEND``), so the test sees which blocks ran, in which order, in which process.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from kit.user_script import run_script

GRID = 10
BAD = sorted(random.Random(35).sample(range(GRID * GRID), 21))

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
MODE, RUN = sys.argv[1], sys.argv[2]
BAD = set(json.loads(sys.argv[3]))
WORKERS = int(sys.argv[4])
MULTI = sys.argv[5] == "distributed"
GRID = 10


def index_of(block):
    off = block.write_roi.offset
    return int(off[0]) // 10 * GRID + int(off[1]) // 10


def process(block):
    i = index_of(block)
    fd = os.open(HERE / f"attempts-{RUN}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, f"{i} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    time.sleep(0.005)
    if MODE == "broken" or i in BAD:
        raise ValueError(f"corrupt tile {i}")


def main():
    bellis.logging.set_log_basedir(HERE / "logs")
    task = bellis.Task(
        "t",
        total_roi=bellis.Roi((0, 0), (10 * GRID, 10 * GRID)),
        read_roi=bellis.Roi((0, 0), (10, 10)),
        write_roi=bellis.Roi((0, 0), (10, 10)),
        process_function=process,
        max_workers=WORKERS,
        max_retries=1,
        tracking_path=HERE / "track",
    )
    result = {"message": None, "raised": None, "returned": None}
    states = None
    try:
        states = bellis.run_blockwise([task], multiprocessing=MULTI, return_states=True)
    except bellis.TaskAbandonedError as exc:
        states = exc.daisy_states
        result["message"] = str(exc)
    except ValueError as exc:  # serial mode: the block's own exception
        result["raised"] = f"{type(exc).__name__}: {exc}"
    if states is not None:
        s = states["t"]
        result.update(
            completed=s.completed_count,
            failed=s.failed_count,
            orphaned=s.orphaned_count,
            abandoned=s.abandoned,
            reason=s.abandon_reason,
            starts=s.worker_start_count,
            restarts=s.worker_restart_count,
            worker_failures=s.worker_failure_count,
            failed_attempts=s.failed_attempt_count,
        )
    store = zarr.open_group(str(HERE / "track"), mode="r")
    result["done"] = np.asarray(store["done"][:]).ravel().tolist()
    result["failures"] = np.asarray(store["failures"][:]).ravel().tolist()
    (HERE / f"result-{RUN}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
"""


def _run(
    tmp_path: Path,
    mode: str,
    run: str,
    bad: list[int],
    workers: int = 2,
    where: str = "distributed",
) -> tuple[dict[str, Any], list[tuple[int, int]], str]:
    """The script's result, its attempts ``[(block index, pid)]`` in order, and its output."""
    proc = run_script(
        tmp_path,
        SCRIPT,
        mode,
        run,
        json.dumps(bad),
        str(workers),
        where,
        name="bad_blocks.py",
        timeout=300,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    result = json.loads((tmp_path / f"result-{run}.json").read_text())
    rows = (tmp_path / f"attempts-{run}.txt").read_text().splitlines()
    attempts = [(int(i), int(pid)) for i, pid in (row.split() for row in rows)]
    return result, attempts, text


def _first_block_failures(attempts: list[tuple[int, int]], bad: list[int]) -> int:
    """How many worker processes ran a bad block first; each of those ran nothing else."""
    by_pid: dict[int, list[int]] = {}
    for i, pid in attempts:
        by_pid.setdefault(pid, []).append(i)
    ended = [rows for rows in by_pid.values() if rows[0] in bad]
    for rows in ended:
        assert len(rows) == 1, rows
    return len(ended)


def _longest_run(bad: list[int]) -> int:
    best = run = 0
    for i in range(GRID * GRID):
        run = run + 1 if i in bad else 0
        best = max(best, run)
    return best


def test_a_few_raising_blocks_fail_and_every_other_block_is_done(tmp_path: Path) -> None:
    assert _longest_run(BAD) < 10  # far from the broken-function rule
    result, attempts, text = _run(tmp_path, "scenario", "1", BAD)
    assert result["message"] is None, result["message"]
    assert not result["abandoned"], text
    good = [i for i in range(GRID * GRID) if i not in BAD]
    # all 79 good blocks done, the 21 bad ones failed after max_retries + 1 attempts
    assert (result["completed"], result["failed"], result["orphaned"]) == (79, 21, 0)
    assert result["done"] == [0 if i in BAD else 1 for i in range(GRID * GRID)]
    assert result["failures"] == [2 if i in BAD else 0 for i in range(GRID * GRID)]
    assert result["failed_attempts"] == 42
    # no worker start was spent per failure: only a worker whose very first block
    # raised ended (none, or one or two when a worker started late)
    ended = _first_block_failures(attempts, BAD)
    assert result["worker_failures"] == ended
    assert result["starts"] == 2 + result["restarts"] and result["restarts"] <= ended
    assert len({pid for _i, pid in attempts}) <= 2 + ended
    assert sorted(i for i, _pid in attempts) == sorted(good + BAD + BAD)
    # the summary lists the failures; no abandonment
    assert "21 blocks failed in task 't'" in text, text
    assert "abandoned" not in text


def test_a_broken_function_still_stops_fast_and_names_the_rule(tmp_path: Path) -> None:
    result, attempts, text = _run(tmp_path, "broken", "1", [])
    assert result["abandoned"] and result["reason"] == "10 blocks failed in a row"
    # stopped on the 10th block failed in a row: 10 failed attempts, no retry; each
    # worker ended on its first block, as daisy's do, and no more than 12 started
    assert result["failed_attempts"] == 10 and sum(result["failures"]) == 10
    assert result["completed"] == 0 and sum(result["done"]) == 0
    assert _first_block_failures(attempts, list(range(GRID * GRID))) == len(attempts)
    assert 10 <= len(attempts) <= 12  # (a block in hand when it stopped ran too)
    assert result["starts"] <= 12 and result["worker_failures"] <= 10
    message = result["message"]
    assert message.startswith("task 't' was abandoned (10 blocks failed in a row)"), message
    assert "100 of 100 blocks were lost" in message, message
    assert "The rule that fired: 10 blocks failed in a row" in message, message
    assert "Task(max_consecutive_failures=10)" in message, message
    assert "Task(max_consecutive_failures=...) (a larger number, or None" in message, message
    assert "A rerun can get further: it runs the 90 block(s) never tried first" in message
    assert "ValueError: corrupt tile" in message, message
    # the summary says the same, and the log line names the option
    assert "Task 't' was abandoned (10 blocks failed in a row)" in text, text
    assert "To change it: Task(max_consecutive_failures=...)" in text, text
    assert "Task(max_consecutive_failures=10) sets the rule" in text, text
    line = json.loads((tmp_path / "track" / "runs.jsonl").read_text().splitlines()[-1])
    assert line["outcome"] == "abandoned"
    assert line["abandoned"]["untried"] == 90 and line["abandoned"]["can_progress"] is True


def test_a_resume_after_an_abandonment_runs_never_tried_blocks_first(tmp_path: Path) -> None:
    first, _attempts, _text = _run(tmp_path, "broken", "1", [])
    assert first["abandoned"]
    failed = [i for i, n in enumerate(first["failures"]) if n]
    assert failed
    good = [i for i in range(GRID * GRID) if i not in failed]
    # the blocks that failed are corrupt; every other block is good. One worker: the order
    # its blocks start in is the order they were handed out
    result, attempts, text = _run(tmp_path, "scenario", "2", failed, workers=1)
    assert result["message"] is None, result["message"]
    assert not result["abandoned"], text
    assert (result["completed"], result["failed"]) == (len(good), len(failed))
    assert result["done"] == [0 if i in failed else 1 for i in range(GRID * GRID)]
    order = [i for i, _pid in attempts]
    assert sorted(order[: len(good)]) == good
    assert sorted(order[len(good) :]) == sorted(failed + failed)  # last, max_retries + 1
    assert (result["starts"], result["restarts"]) == (1, 0)


def test_serial_mode_propagates_and_each_rerun_gets_further(tmp_path: Path) -> None:
    # daisy 2.0.0's serial mode: the block's exception propagates at once; bellis records
    # it as the block's failed attempt, so the rerun runs every block never tried first
    bad = [3]
    first, attempts, _text = _run(tmp_path, "scenario", "1", bad, workers=1, where="serial")
    assert first["raised"] == "ValueError: corrupt tile 3"
    assert [i for i, _pid in attempts] == [0, 1, 2, 3]
    assert first["failures"][3] == 1 and sum(first["done"]) == 3
    second, attempts, _text = _run(tmp_path, "scenario", "2", bad, workers=1, where="serial")
    assert second["raised"] == "ValueError: corrupt tile 3"
    assert [i for i, _pid in attempts] == [*range(4, GRID * GRID), 3]
    assert second["done"] == [0 if i == 3 else 1 for i in range(GRID * GRID)]
    assert second["failures"][3] == 2


DAISY_SCRIPT = r"""
import json
import sys

import bellis as daisy


def always_fails(block):
    raise RuntimeError("the function is broken")


task = daisy.Task(
    "broken",
    total_roi=daisy.Roi((0,), (80,)),
    read_roi=daisy.Roi((0,), (10,)),
    write_roi=daisy.Roi((0,), (10,)),
    process_function=always_fails,
    read_write_conflict=False,
    max_workers=1,
    max_retries=0,
    max_worker_restarts=3,
)
s = daisy.Server().run_blockwise([task], progress=False)["broken"]
print("RESULT " + json.dumps([s.worker_restart_count, s.worker_failure_count, s.failed_count,
                              s.orphaned_count, s.completed_count, s.abandon_reason]))
"""


def test_a_function_failing_from_its_first_block_spends_the_restarts_as_daisy(
    tmp_path: Path,
) -> None:
    # daisy 2.0.0's fast stop, kept for a worker whose first block raises: each such
    # worker ends (a start), so 8 always-failing blocks with 3 restarts end as daisy's do
    proc = run_script(tmp_path, DAISY_SCRIPT, name="daisy_broken.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line[7:]) == [3, 4, 4, 4, 0, "worker restart cap exhausted"]
