"""What a shared worker's move costs on the wire (issue 37): one round trip, the request
for blocks answered with MOVE, the new task's WELCOME and its first block, on the same
connection; two with a setup (the worker runs the old task's teardown and the new task's
setup before it asks for blocks). Counted from the worker's side (every reply it waits
for: ``bellis._worker._client.round_trips``), never timed.

As a user runs bellis: a script in a subprocess, real worker processes on 127.0.0.1, real
files. One worker (``resources={"cpu": 1}``) serves both tasks, one after the other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.user_script import run_script

SCRIPT = """
import contextlib, os, sys
import bellis
from bellis import Roi
from bellis._worker._client import round_trips

HERE = os.getcwd()
SETUPS = os.environ.get("SETUPS") == "1"

def note(line):
    with open(os.path.join(HERE, "events.txt"), "a") as f:
        f.write(line + "\\n")

def make(name):
    def process(block, *ctx):
        note(f"block {name} {block.block_id[1]} {os.getpid()} {round_trips()}")
    return process

def make_setup(name):
    @contextlib.contextmanager
    def setup():
        note(f"setup {name} {os.getpid()}")
        yield name
        note(f"teardown {name} {os.getpid()}")
    return setup

tasks = [
    bellis.Task(
        name, Roi((0,), (4,)), Roi((0,), (1,)), Roi((0,), (1,)),
        process_function=make(name), read_write_conflict=False, max_workers=1,
        requires={"cpu": 1}, setup=make_setup(name) if SETUPS else None,
    )
    for name in ("a", "b")
]
ok = bellis.run_blockwise(tasks, resources={"cpu": 1}, progress=False)
sys.exit(0 if ok else 3)
"""


@pytest.mark.parametrize("setups", [False, True], ids=["plain", "setups"])
def test_a_move_costs_one_round_trip(tmp_path: Path, setups: bool) -> None:
    proc = run_script(
        tmp_path, SCRIPT, name="move.py", env={"SETUPS": "1" if setups else "0"}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [line.split() for line in (tmp_path / "events.txt").read_text().splitlines()]
    blocks = [
        (t, int(k), int(pid), int(n))
        for _kind, t, k, pid, n in (e for e in events if e[0] == "block")
    ]
    # one worker process did every block of both tasks, each block once
    assert len({pid for *_x, pid, _n in blocks}) == 1, blocks
    assert sorted((t, k) for t, k, _p, _n in blocks) == [(t, k) for t in "ab" for k in range(4)]
    order = [t for t, *_rest in blocks]
    first, second = order[0], order[-1]
    assert order == [first] * 4 + [second] * 4, order
    last_of_first, first_of_second = blocks[3][3], blocks[4][3]
    # plain: the ACQUIRE that returned the last block, answered with MOVE + WELCOME + a
    # block. With setups: that one, then (teardown, setup, SETUP: no reply) an ACQUIRE
    assert first_of_second - last_of_first == (2 if setups else 1), blocks
    if setups:
        steps = [e[:2] for e in events if e[0] != "block"]
        assert steps == [
            ["setup", first],
            ["teardown", first],
            ["setup", second],
            ["teardown", second],
        ], events
