"""``Task(setup=...)`` at the edges of a worker's life (issue 37): a setup that hangs, a
SIGTERM while a worker waits for blocks or runs one, and workers started by hand with
``bellis worker``. As a user runs bellis: scripts in subprocesses, real worker processes
on 127.0.0.1, real files. Setups and teardowns write a file named by their process's pid,
one line per call, so the files count the calls per process.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from kit.user_script import run_script

#: how long the tests wait for what a run must do on its own, at most: a loaded machine's
#: worker start-up, never a figure the outcome depends on
PATIENCE = 120.0


def _calls(rec: Path, kind: str) -> dict[int, int]:
    """Per pid, how many times ``kind`` (setup, teardown) ran in it."""
    return {
        int(p.name.split("_")[1]): len(p.read_text().splitlines())
        for p in rec.iterdir()
        if p.name.startswith(kind + "_")
    }


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (no longer in /proc, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_for(what: str, done: object, proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``done()`` until it is true; fail after :data:`PATIENCE` seconds, or when
    ``proc`` ended first (with its output)."""
    deadline = time.monotonic() + PATIENCE
    while not done():  # type: ignore[operator]
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before {what}: rc {proc.returncode}\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {PATIENCE:g}s")
        time.sleep(0.02)


def _end_all(pids: Iterable[int]) -> list[int]:
    """Wait up to :data:`PATIENCE` seconds for each of ``pids`` to end; kill those that
    do not, and return them (the processes a run left behind)."""
    left = []
    deadline = time.monotonic() + PATIENCE
    for pid in pids:
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not _gone(pid):
            left.append(pid)
            os.kill(pid, signal.SIGKILL)
    return left


def _records(tmp_path: Path, task: str) -> list[dict[str, object]]:
    path = tmp_path / "tracking" / task / "errors.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


# -- a setup that hangs -------------------------------------------------------------------

HANGING = """
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
MODE = os.environ["MODE"]
SETUP_SECONDS = float(os.environ["SETUP_SECONDS"])  # inf: it hangs


def open_volume():
    with open(REC / f"setup_{os.getpid()}", "a") as f:
        f.write("x\\n")
    t0 = time.monotonic()
    while time.monotonic() - t0 < SETUP_SECONDS:
        time.sleep(0.05)
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
        total_roi=Roi((0,), (4,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=1,
        max_worker_restarts=1,
        timeout=float(os.environ["TIMEOUT"]),
        setup=open_volume,
    )
    try:
        ok = bellis.run_blockwise([task], multiprocessing=MODE == "dist", progress=False)
    except bellis.TaskAbandonedError as exc:
        print("ABANDONED:", exc)
        sys.exit(4)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def test_a_hung_setup_is_killed_at_the_tasks_timeout_and_ends_the_run(tmp_path: Path) -> None:
    # the bound is timeout=1s per worker start (1 start + 1 restart); the slack, PATIENCE,
    # is what a loaded machine needs to start two workers. Without the bound the run would
    # never end: the subprocess's own timeout fails the test then.
    env = {"MODE": "dist", "SETUP_SECONDS": "inf", "TIMEOUT": "1"}
    try:
        proc = run_script(tmp_path, HANGING, name="hanging.py", env=env, timeout=PATIENCE)
    finally:
        # whatever happened, no hung worker outlives the test
        left = _end_all(_calls(tmp_path / "records", "setup"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out
    assert not list((tmp_path / "done").iterdir())
    setups = _calls(tmp_path / "records", "setup")
    assert len(setups) == 2 and set(setups.values()) == {1}  # a start and its one restart
    abandoned = out[out.index("ABANDONED:") :]
    assert "worker restart cap exhausted" in abandoned, abandoned
    assert "setup of task 'A' timed out in worker" in abandoned, abandoned
    assert "task's timeout (1s)" in abandoned and "Task(timeout=...)" in abandoned, abandoned
    records = [r for r in _records(tmp_path, "A") if "count" not in r]
    assert len(records) == 2, records
    assert {r["kind"] for r in records} == {"setup timed out"}
    assert all(r["block"] == -1 for r in records)
    assert all("timed out after 1s" in str(r["message"]) for r in records), records
    status = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(tmp_path / "tracking" / "A"), "--failed"],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert "[setup timed out]" in status.stdout, status.stdout + status.stderr
    assert "2 worker starts failed in the setup; no block ran" in status.stdout, status.stdout
    # the server killed its workers: none was left for the finally above to kill
    assert left == [], left


def test_serial_mode_does_not_bound_the_setup(tmp_path: Path) -> None:
    # serial mode runs the setup in the driver, as it runs the blocks: there is no worker
    # to kill, so timeout= bounds neither (a hung one waits for Ctrl-C). A setup slower
    # than the timeout finishes, and the blocks run.
    env = {"MODE": "serial", "SETUP_SECONDS": "1.5", "TIMEOUT": "0.5"}
    proc = run_script(tmp_path, HANGING, name="hanging.py", env=env, timeout=PATIENCE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == [
        f"{i}_volume" for i in range(4)
    ]
    assert list(_calls(tmp_path / "records", "setup").values()) == [1]
    assert _records(tmp_path, "A") == []


# -- SIGTERM ------------------------------------------------------------------------------

PIPELINE = """
import contextlib
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
DONE = HERE / "done"
GO = HERE / "go"


def note(kind):
    with open(REC / f"{kind}_{os.getpid()}", "a") as f:
        f.write("x\\n")


@contextlib.contextmanager
def warm():
    note("setup")
    yield os.getpid()
    note("teardown")


def up(block):
    if block.block_id[1] == 1:  # held back until the test says: down's block 1 waits
        while not GO.exists():
            time.sleep(0.02)
    (DONE / f"up_{block.block_id[1]}").touch()


def down(block, pid):
    assert pid == os.getpid(), "the context was made in another process"
    if block.block_id[1] == 0 and os.environ.get("HOLD_DOWN"):
        first = not list(REC.glob("started_*"))
        (REC / f"started_{os.getpid()}").touch()
        while first and not GO.exists():  # its first attempt runs until the test says
            time.sleep(0.02)
    (DONE / f"down_{block.block_id[1]}_{os.getpid()}").touch()


def main():
    REC.mkdir()
    DONE.mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    geometry = dict(
        total_roi=Roi((0,), (2,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        read_write_conflict=False,
    )
    a = bellis.Task("up", process_function=up, max_workers=2, **geometry)
    b = bellis.Task(
        "down",
        process_function=down,
        setup=warm,
        upstream_tasks=[a],
        max_workers=1,
        max_worker_restarts=2,
        **geometry,
    )
    ok = bellis.run_blockwise([a, b], progress=False)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""

#: recvfrom and recvmsg: the system calls a worker waiting for its next blocks is in
_RECV_CALLS = {"x86_64": {45, 47}, "aarch64": {207, 212}}


def _waits_for_blocks(pid: int) -> bool:
    """Whether worker ``pid``'s main thread waits in a socket read (its request for blocks
    went out, no reply yet). True when that cannot be seen here (the test then goes on)."""
    calls = _RECV_CALLS.get(platform.machine())
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return True
    if calls is None or not fields or not fields[0].isdigit():
        return calls is None
    return int(fields[0]) in calls


def _start_pipeline(tmp_path: Path, hold_down: bool) -> subprocess.Popen[str]:
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE)
    env = {**os.environ}
    if hold_down:
        env["HOLD_DOWN"] = "1"
    return subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(tmp_path: Path) -> dict[str, list[str]]:
    """Per block (``up_0``, ``down_1``, ...), the pids that finished it."""
    out: dict[str, list[str]] = {}
    for p in (tmp_path / "done").iterdir():
        task, sid, *pid = p.name.split("_")
        out.setdefault(f"{task}_{sid}", []).append("_".join(pid))
    return out


def test_sigterm_while_a_worker_waits_for_blocks_runs_its_teardown_once(tmp_path: Path) -> None:
    proc = _start_pipeline(tmp_path, hold_down=False)
    rec, done = tmp_path / "records", tmp_path / "done"
    try:
        # down's worker did block 0; block 1 waits for up's block 1, which the test holds
        _wait_for("down block 0", lambda: done.exists() and list(done.glob("down_0_*")), proc)
        (first,) = (int(p.name.split("_")[2]) for p in done.glob("down_0_*"))
        _wait_for("its request for blocks", lambda: _waits_for_blocks(first), proc)
        os.kill(first, signal.SIGTERM)
        _wait_for("the worker's end", lambda: _gone(first), proc)
        # its teardown ran before it exited, once
        assert _calls(rec, "teardown") == {first: 1}
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=PATIENCE)
    finally:
        _end(proc)
    assert proc.returncode == 0, out + err
    blocks = _done(tmp_path)
    assert sorted(blocks) == ["down_0", "down_1", "up_0", "up_1"], blocks
    assert all(len(v) == 1 for v in blocks.values()), blocks  # each block once
    (second,) = (int(pid) for pid in blocks["down_1"])
    assert second != first  # a new worker finished the task
    assert _calls(rec, "setup") == {first: 1, second: 1}
    assert _calls(rec, "teardown") == {first: 1, second: 1}


MOVING = """
import contextlib
import os
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

HERE = Path(__file__).parent
REC = HERE / "records"
DONE = HERE / "done"
GO = HERE / "go"


def note(pid, line):
    with open(REC / f"events_{pid}", "a") as f:
        f.write(line + "\\n")


def make_setup(name):
    @contextlib.contextmanager
    def setup():
        note(os.getpid(), f"setup {name}")
        yield name
        note(os.getpid(), f"teardown {name}")
    return setup


def slow(block):
    # an unshared task (another resource): its block 1 waits until the test says, and so
    # does b's block 1, downstream of it
    if block.block_id[1] == 1:
        while not GO.exists():
            time.sleep(0.02)
    (DONE / f"slow_{block.block_id[1]}").touch()


def make(name):
    def process(block, ctx):
        assert ctx == name, ctx
        if name == "a" and block.block_id[1] == 1:
            # b's block 0 is ready when a runs out: its worker moves to b
            while not (DONE / "slow_0").exists():
                time.sleep(0.02)
        note(os.getpid(), f"block {name} {block.block_id[1]}")
    return process


def main():
    REC.mkdir()
    DONE.mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    geometry = dict(
        total_roi=Roi((0,), (2,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        read_write_conflict=False,
    )
    s = bellis.Task("slow", process_function=slow, requires={"io": 1}, **geometry)
    tasks = [
        bellis.Task(
            name,
            process_function=make(name),
            setup=make_setup(name),
            upstream_tasks=[s] if name == "b" else [],
            max_workers=1,
            max_worker_restarts=2,
            requires={"cpu": 1},
            **geometry,
        )
        for name in ("a", "b")
    ]
    ok = bellis.run_blockwise([s, *tasks], resources={"cpu": 1, "io": 1}, progress=False)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
"""


def _events(rec: Path) -> dict[int, list[str]]:
    return {
        int(p.name.split("_")[1]): p.read_text().splitlines()
        for p in rec.iterdir()
        if p.name.startswith("events_")
    }


def test_sigterm_after_a_move_runs_the_new_tasks_teardown_once(tmp_path: Path) -> None:
    script = tmp_path / "moving.py"
    script.write_text(MOVING)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rec = tmp_path / "records"

    def did_b0() -> list[int]:
        if not rec.exists():
            return []
        return [pid for pid, lines in _events(rec).items() if "block b 0" in lines]

    try:
        # the cpu worker did a's blocks, moved to b, did b's block 0; b's block 1 waits
        _wait_for("b's block 0", did_b0, proc)
        (first,) = did_b0()
        _wait_for("its request for blocks", lambda: _waits_for_blocks(first), proc)
        os.kill(first, signal.SIGTERM)
        _wait_for("the worker's end", lambda: _gone(first), proc)
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=PATIENCE)
    finally:
        _end(proc)
    assert proc.returncode == 0, out + err
    events = _events(rec)
    lines = events.pop(first)
    # a's teardown ran once, at the move; b's ran once, at the SIGTERM
    assert lines[0] == "setup a" and sorted(lines[1:3]) == ["block a 0", "block a 1"], lines
    assert lines[3:] == ["teardown a", "setup b", "block b 0", "teardown b"], lines
    # b's block 1 ran in a new worker, with its own setup and teardown
    (second,) = events.values()
    assert second == ["setup b", "block b 1", "teardown b"], second


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_worker_stopped_in_a_block_does_not_lose_it(tmp_path: Path, sig: str) -> None:
    proc = _start_pipeline(tmp_path, hold_down=True)
    rec = tmp_path / "records"
    try:
        started = lambda: rec.exists() and list(rec.glob("started_*"))  # noqa: E731
        _wait_for("down block 0's start", started, proc)
        (first,) = (int(p.name.split("_")[1]) for p in rec.glob("started_*"))
        os.kill(first, getattr(signal, sig))  # a SIGTERM: the block goes on until "go"
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=PATIENCE)
    finally:
        _end(proc)
    assert proc.returncode == 0, out + err
    assert _gone(first)
    blocks = _done(tmp_path)
    assert sorted(blocks) == ["down_0", "down_1", "up_0", "up_1"], blocks
    assert all(len(v) == 1 for v in blocks.values()), blocks  # each block done once
    (by,) = (int(pid) for pid in blocks["down_0"])
    if sig == "SIGTERM":
        # it finished the block it was in, which stays done, then left: teardown once
        assert by == first
        assert _calls(rec, "teardown")[first] == 1
    else:
        # killed: the block was not done; it ran again in another worker, and nothing
        # could run the killed worker's teardown
        assert by != first
        assert first not in _calls(rec, "teardown")
        assert _calls(rec, "teardown")[by] == 1
    assert set(_calls(rec, "setup").values()) == {1}


# -- workers started by hand --------------------------------------------------------------

MODULE = """
import os
from pathlib import Path

HERE = Path(__file__).parent


def open_volume():
    with open(HERE / "records" / f"setup_{os.getpid()}", "a") as f:
        f.write("x\\n")
    return {"pid": os.getpid()}


def process(block, ctx):
    (HERE / "done" / f"{block.block_id[1]}_{os.getpid()}_{ctx['pid']}").touch()
"""

BY_HAND = """
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import bellis
from bellis import Roi

import blocks_mod

HERE = Path(__file__).parent
HOW = os.environ["HOW"]


def in_script():  # a setup the worker cannot import by name: --setup names one it can
    raise AssertionError("the worker ran the driver's own setup")


def main():
    (HERE / "records").mkdir()
    (HERE / "done").mkdir()
    bellis.logging.set_log_basedir(HERE / "logs")
    bellis.set_tracking_basedir(HERE / "tracking")
    task = bellis.Task(
        "ext",
        total_roi=Roi((0,), (5,)),
        read_roi=Roi((0,), (1,)),
        write_roi=Roi((0,), (1,)),
        process_function=None,
        read_write_conflict=False,
        setup=blocks_mod.open_volume if HOW == "task" else in_script,
        max_workers=1,
    )
    procs = []

    def start(server, setup):
        cmd = [sys.executable, "-m", "bellis", "worker", "--function", "blocks_mod:process"]
        if setup:
            cmd += ["--setup", "blocks_mod:open_volume"]
        cmd += ["--context", server.worker_context("ext")]
        procs.append(subprocess.Popen(cmd, cwd=HERE, stderr=subprocess.PIPE, text=True))

    def after_the_first(server):
        # the first worker cannot import the task's setup; it ends, and one with --setup
        # takes the blocks
        err = procs[0].communicate(timeout=60)[1]
        (HERE / "first.json").write_text(json.dumps({"rc": procs[0].returncode, "err": err}))
        start(server, True)

    def on_listen(server):
        start(server, HOW == "option")
        if HOW == "missing":
            threading.Thread(target=after_the_first, args=(server,), daemon=True).start()

    server = bellis.Server(external_workers=True, on_listen=on_listen)
    try:
        states = server.run_blockwise([task], progress=False, summary=False)
    finally:
        for p in procs:
            p.communicate(timeout=60)
    (HERE / "worker.json").write_text(
        json.dumps({"pid": procs[-1].pid, "rc": procs[-1].returncode})
    )
    sys.exit(0 if states["ext"].completed_count == 5 else 3)


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("how", ["task", "option", "missing"])
def test_a_worker_started_by_hand_runs_the_setup(tmp_path: Path, how: str) -> None:
    # "task": the worker imports the task's own setup by the name the server gives;
    # "option": the task's setup lives in the driver's script, and --setup names one;
    # "missing": as "option", but the first worker is not given --setup: its setup fails
    # with an error that says why, and a second one, given --setup, does the blocks
    (tmp_path / "blocks_mod.py").write_text(MODULE)
    proc = run_script(tmp_path, BY_HAND, name="by_hand.py", env={"HOW": how}, timeout=PATIENCE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker = json.loads((tmp_path / "worker.json").read_text())
    assert worker["rc"] == 0
    # the setup ran exactly once, in the worker's own process
    assert _calls(tmp_path / "records", "setup") == {worker["pid"]: 1}
    # every block once, in that process, with what the setup made there
    done = sorted(p.name for p in (tmp_path / "done").iterdir())
    assert done == [f"{i}_{worker['pid']}_{worker['pid']}" for i in range(5)]
    if how == "missing":
        first = json.loads((tmp_path / "first.json").read_text())
        assert first["rc"] == 1, first
        assert "setup of task 'ext' failed in worker -1" in first["err"], first
        assert "cannot import by name" in first["err"] and "--setup" in first["err"], first
        (rec,) = _records(tmp_path, "ext")
        assert rec["kind"] == "setup failed" and rec["type"] == "ConfigurationError"


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("os:getpid", "--setup os:getpid cannot go with a worker function"),
        ("nocolon", "--setup must look like module:attribute"),
        ("no_such_module:f", "--setup no_such_module:f: no module named 'no_such_module'"),
    ],
)
def test_a_setup_a_worker_started_by_hand_cannot_use_is_a_clean_error(
    tmp_path: Path, setup: str, says: str
) -> None:
    # os:getcwd takes no argument: a worker function, which takes no setup
    context = "hostname=127.0.0.1:port=9:task_id=t:secret=00"
    args = ["worker", "--function", "os:getcwd", "--setup", setup, "--context", context]
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("bellis worker: ") and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
