"""User scripts from the wider sweep of issue 13, run as a user runs them: a script file in
a subprocess, through the public API only, with real workers, sockets and stores.

* Ctrl-C while a resume of a large store is still skipping done blocks;
* a block function or a worker function that forks its own ``multiprocessing.Pool``
  (fork and spawn), or forks a child that leaves with ``sys.exit``;
* a block function that changes the working directory and ``sys.path``.

Each ends with the right result or a clean interrupt, and with nothing lost, nothing
counted twice and no process left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

MODES = ["serial", "distributed"]
MARKER = "BELLIS_SWEEP_MARKER"


def marked_processes(marker: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose environment carries ``MARKER=marker``: a driver
    script, its workers and whatever those started."""
    needle = f"{MARKER}={marker}\0".encode()
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == os.getpid():
            continue
        try:
            with open(f"/proc/{e}/environ", "rb") as f:
                env = f.read() + b"\0"
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env and stat[stat.rfind(b")") + 2 :].split()[0] != b"Z":
            out.append((int(e), cmd))
    return out


def assert_no_process_left(marker: str) -> None:
    deadline = time.monotonic() + 10
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(marker)
    for pid, _cmd in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def script_env(marker: str) -> dict[str, str]:
    env = dict(os.environ)
    env[MARKER] = marker
    return env


def run_script(
    script: Path, *args: str, marker: str, cwd: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        cwd=cwd or script.parent,
        env=script_env(marker),
        timeout=timeout,
    )
    return proc


def done_array(path: Path) -> np.ndarray[Any, Any]:
    return np.asarray(zarr.open_group(str(path), mode="r")["done"][...])


# -- Ctrl-C during the resume pre-check --------------------------------------------------

N_BLOCKS = 1_000_000
FIRST_RUN_DONE = 500_000  # the first run got this far
LEFT = 5  # the blocks whose output does not exist yet

PRECHECK = """
import atexit
import os
import signal
import sys
import time

import bellis
from bellis import logging as blog

# as at a terminal: a test runner may start this script with SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)

HERE = os.path.dirname(os.path.abspath(__file__))
N, FIRST, LEFT = {n}, {first}, {left}
phase, mode = sys.argv[1], sys.argv[2]
calls = [0]


def count_calls():
    with open(os.path.join(HERE, phase + ".calls"), "w") as f:
        f.write(str(calls[0]))


atexit.register(count_calls)


def first_run_check(block):
    # the outputs of the first FIRST blocks exist
    return block.block_id[1] < FIRST


def check(block):
    # the outputs of all but the last LEFT blocks exist
    calls[0] += 1
    if calls[0] == 1000 and phase == "interrupt":
        # tell the test we are in the pre-check, and wait for its Ctrl-C
        open(os.path.join(HERE, "in_precheck"), "w").close()
        while not os.path.exists(os.path.join(HERE, "sigint_sent")):
            time.sleep(0.005)
    return block.block_id[1] < N - LEFT


def process(block):
    if phase == "first":
        raise RuntimeError("the first run stops at its first block to process")
    with open(os.path.join(HERE, "processed"), "a") as f:
        f.write(f"{{block.block_id[1]}}\\n")


if __name__ == "__main__":
    blog.set_log_basedir(os.path.join(HERE, "logs"))
    task = bellis.Task(
        "big",
        bellis.Roi((0,), (N,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=process,
        check_function=first_run_check if phase == "first" else check,
        read_write_conflict=False,
        max_workers=1,
        tracking_path=os.path.join(HERE, "track"),
    )
    try:
        ok = bellis.run_blockwise(task, multiprocessing=mode == "distributed", progress=False)
    except RuntimeError as exc:
        if phase != "first":
            raise
        print("first run stopped:", exc)
    else:
        print("result", ok)
"""


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_during_the_resume_precheck(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "resume.py"
    script.write_text(textwrap.dedent(PRECHECK).format(n=N_BLOCKS, first=FIRST_RUN_DONE, left=LEFT))
    marker = str(tmp_path)
    track = tmp_path / "track"
    # a first run marks the first half done (its check says so), then stops
    first = run_script(script, "first", "serial", marker=marker)
    assert first.returncode == 0, first.stderr
    assert "first run stopped" in first.stdout
    before = done_array(track)
    assert before[:FIRST_RUN_DONE].all() and not before[FIRST_RUN_DONE:].any()

    # the rerun skips the first half in bulk, then checks the rest one by one: Ctrl-C there
    proc = subprocess.Popen(
        [sys.executable, str(script), "interrupt", mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=script_env(marker),
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "in_precheck").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the rerun never reached the pre-check"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        (tmp_path / "sigint_sent").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # a clean interrupt: Python's own exit for an unhandled Ctrl-C
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert err.rstrip().splitlines()[-1].startswith("KeyboardInterrupt"), err
    if mode == "distributed":
        assert "KeyboardInterrupt: run aborted by SIGINT" in err
        assert "Run interrupted; counts at shutdown:" in out
        line = json.loads((track / "runs.jsonl").read_text().splitlines()[-1])
        assert line["outcome"] == "interrupted"
    assert_no_process_left(marker)
    # it stopped in the pre-check, long before its end, and processed nothing
    calls = int((tmp_path / "interrupt.calls").read_text())
    assert 1000 <= calls < N_BLOCKS - FIRST_RUN_DONE - LEFT, calls
    assert not (tmp_path / "processed").exists()
    # the store: blocks done before stay done; blocks checked done before the interrupt
    # are marked (a prefix of the checked ones), nothing else is. The block the first run
    # failed on comes last in a resume (blocks never tried go first), so the prefix starts
    # after it and it is not marked
    after = done_array(track)
    assert after[:FIRST_RUN_DONE].all()
    assert not after[FIRST_RUN_DONE]
    marked = int(np.count_nonzero(after[FIRST_RUN_DONE:]))
    assert marked <= calls
    assert after[FIRST_RUN_DONE + 1 : FIRST_RUN_DONE + 1 + marked].all()
    assert not after[N_BLOCKS - LEFT :].any()

    # running it again resumes: only the blocks not marked done are checked, and only the
    # blocks whose output is missing are processed, once each
    rerun = run_script(script, "rerun", mode, marker=marker)
    assert rerun.returncode == 0, rerun.stderr
    assert "result True" in rerun.stdout
    calls_rerun = int((tmp_path / "rerun.calls").read_text())
    assert calls_rerun == N_BLOCKS - FIRST_RUN_DONE - marked
    processed = sorted(int(x) for x in (tmp_path / "processed").read_text().split())
    assert processed == list(range(N_BLOCKS - LEFT, N_BLOCKS))
    assert done_array(track).all()
    assert_no_process_left(marker)


# -- a worker that forks its own processes ------------------------------------------------

POOL_MODULE = """
import multiprocessing
import os
import sys

import bellis


def square(x):
    return x * x


def expected(sid):
    return sum(x * x for x in range(sid, sid + 4))


def record(out, sid, value):
    with open(os.path.join(out, str(sid)), "a") as f:
        f.write(f"{value} {os.getpid()}\\n")


def pool_block(out, method, block):
    # a block function with its own pool of processes
    sid = block.block_id[1]
    with multiprocessing.get_context(method).Pool(2) as pool:
        value = sum(pool.map(square, range(sid, sid + 4)))
    record(out, sid, value)


def fork_exit_block(out, block):
    # a child forked by hand that leaves with sys.exit, unwinding through bellis
    sid = block.block_id[1]
    pid = os.fork()
    if pid == 0:
        open(os.path.join(out, f"child_{sid}"), "w").close()
        sys.exit(0)
    os.waitpid(pid, 0)
    record(out, sid, expected(sid))


def pool_check(method, block):
    # a check_function (it runs in the driver, during the run) with its own pool
    with multiprocessing.get_context(method).Pool(2) as pool:
        return sum(pool.map(square, [1, 2])) < 0  # never done


def plain_block(out, block):
    sid = block.block_id[1]
    record(out, sid, expected(sid))


def pool_worker(out, method):
    # a worker function: one pool for all its blocks
    client = bellis.Client()
    with multiprocessing.get_context(method).Pool(2) as pool:
        while True:
            with client.acquire_block() as block:
                if block is None:
                    break
                sid = block.block_id[1]
                record(out, sid, sum(pool.map(square, range(sid, sid + 4))))


def pool_between_worker(out, method):
    # a worker function that starts a pool between two blocks, while the block it just
    # finished has not been sent home yet
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            sid = block.block_id[1]
        with multiprocessing.get_context(method).Pool(1) as pool:
            value = sum(pool.map(square, range(sid, sid + 4)))
        record(out, sid, value)
"""

POOL_DRIVER = """
import functools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bellis
import poolwork
from bellis import logging as blog

N = {n}

if __name__ == "__main__":
    pattern, method, mode = sys.argv[1:4]
    blog.set_log_basedir(os.path.join(HERE, "logs"))
    out = os.path.join(HERE, "out")
    os.makedirs(out)
    check = None
    if pattern == "fork_exit_block":
        fn = functools.partial(poolwork.fork_exit_block, out)
    elif pattern == "pool_check":
        fn = functools.partial(poolwork.plain_block, out)
        check = functools.partial(poolwork.pool_check, method)
    else:
        fn = functools.partial(getattr(poolwork, pattern), out, method)
    task = bellis.Task(
        "pool",
        bellis.Roi((0,), (N,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=fn,
        check_function=check,
        read_write_conflict=False,
        max_workers=2,
        timeout=60,
        tracking_path=os.path.join(HERE, "track"),
    )
    states = bellis.run_blockwise(
        task, multiprocessing=mode == "distributed", progress=False, return_states=True
    )
    s = states["pool"]
    print("STATES " + json.dumps({{
        "completed": s.completed_count,
        "failed_attempts": s.failed_attempt_count,
        "worker_failures": s.worker_failure_count,
        "worker_restarts": s.worker_restart_count,
    }}))
"""

POOL_BLOCKS = 6
POOL_CASES = [
    pytest.param("pool_block", "fork", "distributed", id="block-fn-fork"),
    pytest.param("pool_block", "spawn", "distributed", id="block-fn-spawn"),
    pytest.param("pool_block", "fork", "serial", id="block-fn-fork-serial"),
    pytest.param("pool_block", "spawn", "serial", id="block-fn-spawn-serial"),
    pytest.param("pool_worker", "fork", "distributed", id="worker-fn-fork"),
    pytest.param("pool_worker", "spawn", "distributed", id="worker-fn-spawn"),
    pytest.param("pool_between_worker", "fork", "distributed", id="worker-fn-between-fork"),
    pytest.param("fork_exit_block", "fork", "distributed", id="os-fork-sys-exit"),
    pytest.param("pool_check", "fork", "distributed", id="check-fn-fork-in-driver"),
]


@pytest.mark.parametrize(("pattern", "method", "mode"), POOL_CASES)
def test_worker_forks_its_own_processes(
    pattern: str, method: str, mode: str, tmp_path: Path
) -> None:
    (tmp_path / "poolwork.py").write_text(textwrap.dedent(POOL_MODULE))
    script = tmp_path / "pool_driver.py"
    script.write_text(textwrap.dedent(POOL_DRIVER).format(n=POOL_BLOCKS))
    marker = str(tmp_path)
    try:
        proc = run_script(script, pattern, method, mode, marker=marker, timeout=180)
    except subprocess.TimeoutExpired:
        for pid, _cmd in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the run with a {method} pool ({pattern}, {mode}) hung")
    assert proc.returncode == 0, proc.stderr
    states = json.loads(proc.stdout.split("STATES ", 1)[1].splitlines()[0])
    # every block ran once, in a worker that neither failed nor had to be replaced
    assert states == {
        "completed": POOL_BLOCKS,
        "failed_attempts": 0,
        "worker_failures": 0,
        "worker_restarts": 0,
    }, (states, proc.stderr)
    out = tmp_path / "out"
    for sid in range(POOL_BLOCKS):
        lines = (out / str(sid)).read_text().splitlines()
        assert len(lines) == 1, (sid, lines)
        assert int(lines[0].split()[0]) == sum(x * x for x in range(sid, sid + 4))
    if pattern == "fork_exit_block":
        assert sorted(p.name for p in out.glob("child_*")) == sorted(
            f"child_{sid}" for sid in range(POOL_BLOCKS)
        )
    assert done_array(tmp_path / "track").all()
    line = json.loads((tmp_path / "track" / "runs.jsonl").read_text().splitlines()[-1])
    assert line["outcome"] == "completed"
    if mode == "distributed":
        assert set(line["workers"]["exits"]) == {"clean"}, line["workers"]["exits"]
        logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.err"))
        assert "failed" not in logs and "Traceback" not in logs, logs
    assert_no_process_left(marker)


# -- a block function that changes directory and sys.path --------------------------------

CHDIR_MODULE = """
import os
import sys


def chdir_block(out, elsewhere, block):
    sid = block.block_id[1]
    os.chdir(elsewhere)
    sys.path.insert(0, "not-a-directory")
    # imported on first use, after the change of directory (in a worker: found through
    # the relative "helpers" entry the driver put on its sys.path before the run)
    import blockhelpers

    print(f"block {block.block_id} in {os.getcwd()}")
    with open(os.path.join(out, f"{block.block_id[0]}_{sid}"), "a") as f:
        f.write(f"{blockhelpers.value(sid)}\\n")
"""

CHDIR_DRIVER = """
import functools
import json
import os
import sys

# relative paths, as a user writes them, resolved against the directory the run starts in
sys.path.insert(0, "lib")
sys.path.append("helpers")  # searched last: first used by a block, after its chdir

import bellis
import blockmod
from bellis import logging as blog

N = {n}

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "serial":
        # serial block functions run in this process, whose sys.path is the user's
        import blockhelpers  # noqa: F401
    blog.set_log_basedir("logs")
    bellis.set_tracking_basedir("track")
    os.makedirs("elsewhere")
    fn = functools.partial(
        blockmod.chdir_block, os.path.abspath("out"), os.path.abspath("elsewhere")
    )
    os.makedirs("out")
    tasks = [
        bellis.Task(
            tid,
            bellis.Roi((0,), (N,)),
            bellis.Roi((0,), (1,)),
            bellis.Roi((0,), (1,)),
            process_function=fn,
            read_write_conflict=False,
            max_workers=1,
        )
        for tid in ("a", "b")
    ]
    ok = bellis.run_blockwise(
        bellis.Pipeline(tasks, [(tasks[0], tasks[1])]),
        multiprocessing=mode == "distributed",
        progress=False,
    )
    print("RESULT " + json.dumps({{
        "ok": ok,
        "cwd": os.getcwd(),
        "log_basedir": str(blog.get_log_basedir()),
    }}))
"""


@pytest.mark.parametrize("mode", MODES)
def test_block_function_changes_directory_and_sys_path(mode: str, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "lib").mkdir(parents=True)
    (proj / "lib" / "blockmod.py").write_text(textwrap.dedent(CHDIR_MODULE))
    (proj / "helpers").mkdir()
    (proj / "helpers" / "blockhelpers.py").write_text("def value(sid):\n    return 3 * sid + 1\n")
    script = proj / "run.py"
    n = 4
    script.write_text(textwrap.dedent(CHDIR_DRIVER).format(n=n))
    marker = str(tmp_path)
    proc = run_script(script, mode, marker=marker, cwd=proj)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["ok"] is True, proc.stdout
    # the user's relative log directory is still the user's setting after the run
    assert result["log_basedir"] == "logs"
    if mode == "serial":
        assert result["cwd"] == str(proj / "elsewhere")  # the block function's chdir stays
    for tid in ("a", "b"):
        for sid in range(n):
            assert (proj / "out" / f"{tid}_{sid}").read_text() == f"{3 * sid + 1}\n"
        # the store, its run report and the logs are where the relative paths pointed at
        # run start, and nothing landed in the directory the blocks moved to
        assert done_array(proj / "track" / tid).all()
        line = json.loads((proj / "track" / tid / "runs.jsonl").read_text().splitlines()[-1])
        assert line["outcome"] == "completed"
        logged = "".join(p.read_text() for p in (proj / "logs" / tid).glob("worker_*.out"))
        assert logged.count(f"block ('{tid}', ") == n, logged
    assert sorted(p.name for p in (proj / "elsewhere").iterdir()) == []
    assert_no_process_left(marker)
