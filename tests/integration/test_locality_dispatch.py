"""Locality-aware dispatch with real worker processes (issue 38 item 2): a user's script
runs a two-task pipeline of 8 x 8 x 8 blocks each on two workers per task; each worker's
blocks follow on from its previous ones, the run's figure says how much, and conflicts and
the dependencies between the tasks hold."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from kit.user_script import run_script

GRID = 8

SCRIPT = r'''
import json, os, sys, time
import bellis

REC = sys.argv[1]


def record(block):
    """Slower than 20 ms, so each worker gets one block at a time (no batches): the order
    a worker gets its blocks in is the dispatcher's alone."""
    t0 = time.time()
    time.sleep(0.025)
    offset = " ".join(str(int(o)) for o in block.write_roi.offset)
    line = f"{os.getpid()} {t0:.6f} {time.time():.6f} {offset}\n"
    path = os.path.join(REC, f"{block.block_id[0]}_{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def cube(task_id, conflict):
    # blocks of 10^3 written, read with a context of 2 all round
    return bellis.Task(
        task_id,
        bellis.Roi((0, 0, 0), (84, 84, 84)),
        bellis.Roi((0, 0, 0), (14, 14, 14)),
        bellis.Roi((2, 2, 2), (10, 10, 10)),
        process_function=record,
        read_write_conflict=conflict,
        max_workers=2,
    )


if __name__ == "__main__":
    up = cube("up", False)
    down = cube("down", True)
    states = bellis.run_blockwise(
        bellis.Pipeline([up, down], [(up, down)]), progress=False, return_states=True
    )
    out = {
        t: [s.completed_count, s.locality_blocks, s.locality_local, s.locality_steps]
        for t, s in states.items()
    }
    with open("result.json", "w") as f:
        json.dump(out, f)
'''


def _records(recdir: Path, task_id: str) -> dict[str, list[tuple[float, float, tuple[int, ...]]]]:
    """Per worker pid, its blocks in the order it ran them: (start, end, grid position)."""
    out: dict[str, list[tuple[float, float, tuple[int, ...]]]] = {}
    for f in recdir.iterdir():
        tid, pid = f.name.split("_")
        if tid != task_id:
            continue
        rows = []
        for line in f.read_text().splitlines():
            parts = line.split()
            pos = tuple((int(o) - 2) // 10 for o in parts[3:])
            rows.append((float(parts[1]), float(parts[2]), pos))
        out[pid] = rows
    return out


def _steps(seq: list[tuple[int, ...]]) -> list[int]:
    return [max(abs(a - b) for a, b in zip(p, q, strict=True)) for p, q in itertools.pairwise(seq)]


def test_each_worker_gets_a_coherent_stream_and_the_order_rules_hold(tmp_path: Path) -> None:
    recdir = tmp_path / "records"
    recdir.mkdir()
    proc = run_script(tmp_path, SCRIPT, str(recdir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    times: dict[str, dict[tuple[int, ...], tuple[float, float]]] = {}
    for task_id, min_share in (("up", 0.8), ("down", 0.4)):
        per_worker = _records(recdir, task_id)
        assert len(per_worker) == 2, per_worker.keys()  # both workers worked
        ran = [pos for rows in per_worker.values() for _t0, _t1, pos in rows]
        assert sorted(ran) == sorted(itertools.product(range(GRID), repeat=3))  # each once
        times[task_id] = {pos: (t0, t1) for rows in per_worker.values() for t0, t1, pos in rows}
        blocks = local = steps = 0
        for rows in per_worker.values():
            s = _steps([pos for _t0, _t1, pos in rows])
            blocks += len(s)
            local += sum(1 for x in s if x <= 1)
            steps += sum(s)
            # most blocks follow a neighbour on their worker; one block at a time in the
            # FIFO order, the two workers take turns along the grid: none would
            assert sum(1 for x in s if x <= 1) / len(s) >= min_share, (task_id, s)
        # the run's own figure: exactly what the workers' records say
        assert result[task_id] == [GRID**3, blocks, local, steps], (task_id, result)
        assert f"{100.0 * local / blocks:.1f}% of blocks next to their worker's previous one" in (
            proc.stdout
        )
    # conflicts: two "down" blocks where one reads what the other writes never overlap
    down = times["down"]
    for pos, (t0, t1) in down.items():
        for d in itertools.product((-1, 0, 1), repeat=3):
            other = tuple(p + x for p, x in zip(pos, d, strict=True))
            if other != pos and other in down:
                u0, u1 = down[other]
                assert t1 <= u0 or u1 <= t0, (pos, other)
    # dependencies: a "down" block starts after every "up" block it reads is done
    up = times["up"]
    for pos, (t0, _t1) in down.items():
        for d in itertools.product((-1, 0, 1), repeat=3):
            other = tuple(p + x for p, x in zip(pos, d, strict=True))
            if other in up:
                assert up[other][1] <= t0, (pos, other)
