"""A worker's next batch asked for while the last block of its batch runs (``AHEAD``,
``bellis._scheduling._ahead``), with real worker processes and real zarr arrays: a user's
script runs a two-task pipeline of fast blocks (the downstream task with read-write
conflicts) on two workers per task. Every block runs once, the outputs are right, the
conflicts and the dependencies between the tasks hold, and some blocks did run with their
worker's next batch already asked for.

Serial mode has no round trip to hide: this is the distributed path only."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import zarr

from kit.user_script import run_script

GRID = 12  # downstream blocks per axis (upstream: GRID + 1)

SCRIPT = r"""
import json, os, sys, time
import numpy as np
import zarr
import bellis
from bellis._worker import _client  # whether an AHEAD was out while a block ran

REC, OUT = sys.argv[1], sys.argv[2]
G = int(sys.argv[3])


def note(block, t0):
    # white box: the worker's client asked for its next batch before this block started
    ahead = any(getattr(c, "_ahead_sent", False) for c in list(_client._live))
    offset = " ".join(str(int(o)) for o in block.write_roi.offset)
    line = f"{t0:.6f} {time.time():.6f} {int(ahead)} {offset}\n"
    path = os.path.join(REC, f"{block.block_id[0]}_{os.getpid()}")
    with open(path, "a") as f:
        f.write(line)


def arrays():
    return [zarr.open_array(f"{OUT}/{name}.zarr", mode="r+") for name in ("up", "down")]


def up(block, arrs):
    t0 = time.time()
    x, y = (int(o) for o in block.write_roi.offset)
    arrs[0][x : x + 4, y : y + 4] = np.uint16(1 + x * 100 + y)
    note(block, t0)


def down(block, arrs):
    t0 = time.time()
    x, y = (int(o) for o in block.write_roi.offset)
    seen = arrs[0][x - 2 : x + 6, y - 2 : y + 6]
    if not seen.all():
        raise RuntimeError(f"block at {x},{y} read upstream data not written yet")
    arrs[1][x - 2 : x + 2, y - 2 : y + 2] = seen[2:6, 2:6] * 2
    note(block, t0)


if __name__ == "__main__":
    n = 4 * (G + 1)
    for name, size in (("up", n), ("down", 4 * G)):
        zarr.create_array(
            f"{OUT}/{name}.zarr", shape=(size, size), chunks=(4, 4), dtype="uint16", fill_value=0
        )
    t_up = bellis.Task(
        "up", bellis.Roi((0, 0), (n, n)), bellis.Roi((0, 0), (4, 4)), bellis.Roi((0, 0), (4, 4)),
        process_function=up, setup=arrays, read_write_conflict=False, max_workers=2,
    )
    t_down = bellis.Task(
        "down", bellis.Roi((0, 0), (4 * G + 4, 4 * G + 4)), bellis.Roi((0, 0), (8, 8)),
        bellis.Roi((2, 2), (4, 4)),
        process_function=down, setup=arrays, read_write_conflict=True, max_workers=2,
    )
    states = bellis.run_blockwise(
        bellis.Pipeline([t_up, t_down], [(t_up, t_down)]), progress=False, return_states=True
    )
    out = {t: [s.completed_count, s.failed_count] for t, s in states.items()}
    with open("result.json", "w") as f:
        json.dump(out, f)
"""


def _records(recdir: Path, task_id: str) -> list[tuple[str, float, float, bool, tuple[int, int]]]:
    rows = []
    for f in recdir.iterdir():
        tid, pid = f.name.split("_")
        if tid != task_id:
            continue
        for line in f.read_text().splitlines():
            t0, t1, ahead, x, y = line.split()
            rows.append((pid, float(t0), float(t1), ahead == "1", (int(x), int(y))))
    return rows


def test_blocks_sent_ahead_run_once_and_keep_conflicts_and_dependencies(tmp_path: Path) -> None:
    recdir = tmp_path / "records"
    recdir.mkdir()
    proc = run_script(tmp_path, SCRIPT, str(recdir), str(tmp_path), str(GRID))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"up": [(GRID + 1) ** 2, 0], "down": [GRID**2, 0]}
    up_rows, down_rows = _records(recdir, "up"), _records(recdir, "down")
    # each block once, on two workers per task
    assert sorted(r[4] for r in up_rows) == [
        (4 * i, 4 * j) for i, j in itertools.product(range(GRID + 1), repeat=2)
    ]
    assert sorted(r[4] for r in down_rows) == [
        (2 + 4 * i, 2 + 4 * j) for i, j in itertools.product(range(GRID), repeat=2)
    ]
    # the bytes on disk: every upstream value, and each downstream block twice it
    n = 4 * (GRID + 1)
    up_arr = np.asarray(zarr.open_array(str(tmp_path / "up.zarr"), mode="r")[:])
    ii, jj = np.meshgrid(np.arange(n) // 4 * 4, np.arange(n) // 4 * 4, indexing="ij")
    assert np.array_equal(up_arr, (1 + ii * 100 + jj).astype(np.uint16))
    down_arr = np.asarray(zarr.open_array(str(tmp_path / "down.zarr"), mode="r")[:])
    assert np.array_equal(down_arr, up_arr[2 : 2 + 4 * GRID, 2 : 2 + 4 * GRID] * 2)
    # conflicts: two downstream blocks where one reads what the other writes never overlap
    times = {r[4]: (r[1], r[2]) for r in down_rows}
    for (x, y), (t0, t1) in times.items():
        for dx, dy in itertools.product((-4, 0, 4), repeat=2):
            other = (x + dx, y + dy)
            if other != (x, y) and other in times:
                u0, u1 = times[other]
                assert t1 <= u0 or u1 <= t0, ((x, y), other)
    # dependencies: a downstream block starts after every upstream block it reads ended
    ups = {r[4]: r[2] for r in up_rows}
    for (x, y), (t0, _t1) in times.items():
        for i, j in itertools.product((x - 2, x + 2), (y - 2, y + 2)):
            assert ups[(i, j)] <= t0, ((x, y), (i, j))
    # and the thing itself: fast blocks ran with their worker's next batch asked for
    assert sum(r[3] for r in up_rows + down_rows) > 0
