"""Failure handling in distributed runs: crashes, timeouts, memory, clean exits, abandonment,
resources and configuration errors. Every test checks the counters against the record files."""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis.errors import ConfigurationError
from kit.blocks import (
    all_attempts,
    connect_and_return,
    crash_block,
    detach_and_return,
    done_count,
    done_ids,
    exit_once_block,
    hang_block,
    hang_once_block,
    make_task,
    memory_block,
    peak_concurrency,
    read_records,
    sleep_block,
    stop_once_block,
)
from kit.procs import pid_alive

RUN = {"progress": False, "summary": False}


@pytest.fixture
def recdir(tmp_path: Path) -> str:
    d = tmp_path / "rec"
    d.mkdir()
    return str(d)


def assert_each_success_once(recdir: str, task_id: str, n: int) -> dict[Any, Any]:
    recs = read_records(recdir)
    assert done_ids(recs, task_id) == list(range(n))
    for sid in range(n):
        assert done_count(recs, task_id, sid) == 1, sid
    return recs


def _signal_first_block_start(
    recdir: str, signum: int, hit: list[tuple[int, Path]], over: threading.Event
) -> threading.Thread:
    """A thread that sends ``signum`` to the first worker seen inside a block (a record
    file holding only its ``start`` line) and appends ``(pid, record file)`` to ``hit``;
    it gives up once ``over`` is set (the run returned), however long the run took."""

    def run() -> None:
        while not over.is_set():
            for p in Path(recdir).iterdir():
                lines = p.read_text().splitlines()
                if len(lines) == 1 and lines[0].startswith("start"):
                    pid = int(lines[0].split()[1])
                    os.kill(pid, signum)
                    hit.append((pid, p))
                    return
            time.sleep(0.02)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_sigkill_mid_block_retries_and_replaces(recdir: str) -> None:
    task = make_task("a", 6, functools.partial(sleep_block, recdir, 0.4), max_workers=2)
    hit: list[tuple[int, Path]] = []
    over = threading.Event()
    t = _signal_first_block_start(recdir, signal.SIGKILL, hit, over)
    try:
        states = bellis.run_blockwise([task], return_states=True, **RUN)
    finally:
        over.set()
        t.join()
    assert hit
    killed = [pid for pid, _ in hit]
    s = states["a"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (6, 0, 0)
    assert s.worker_failure_count >= 1
    assert s.worker_start_count >= 3  # the killed worker was replaced
    recs = assert_each_success_once(recdir, "a", 6)
    # the killed pid started a block that was retried by another process
    victims = [
        rows for rows in recs.values() if rows[0].pid == killed[0] and rows[0].kind == "start"
    ]
    assert any(any(a.kind == "done" and a.pid != killed[0] for a in rows) for rows in victims)


def test_block_timeout_kills_worker_and_retries(recdir: str, tmp_path: Path) -> None:
    task = make_task(
        "t", 3, functools.partial(hang_once_block, recdir, 1), max_workers=1, timeout=1.0
    )
    states = bellis.run_blockwise([task], return_states=True, progress=False, summary=True)
    s = states["t"]
    assert (s.completed_count, s.failed_count) == (3, 0)
    assert s.timeout_reclaim_count >= 1
    recs = assert_each_success_once(recdir, "t", 3)
    assert len(recs[("t", 1)]) == 3  # start (hung), start, done
    err = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.err"))
    assert "still running after timeout=1s; killing worker process" in err
    workers = task.report().to_json()["workers"]
    assert workers["exits"].get("timeout", 0) >= 1


class _NoKillLauncher(bellis.WorkerLauncher):
    """A user's launcher that starts workers through a LocalLauncher and offers only what
    a launcher must: launch, poll and cancel (no ``kill`` of its own)."""

    name = "no-kill"

    def __init__(self) -> None:
        self.inner = bellis.LocalLauncher(fork_server=False)

    def launch(self, spec: Any) -> Any:
        return self.inner.launch(spec)

    def poll(self, handle: Any) -> Any:
        return self.inner.poll(handle)

    def cancel(self, handles: list[Any], grace_seconds: float) -> None:
        self.inner.cancel(handles, grace_seconds)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("launcher", ["local", "no-kill"])
def test_a_worker_hung_past_its_block_timeout_is_killed_by_the_server(
    recdir: str, launcher: str
) -> None:
    """A worker stopped (SIGSTOP) inside a block cannot end itself at its timeout: the
    server's deadline kills it, through its launcher, while the run goes on; a launcher
    with no ``kill`` of its own gets the base class's (it cancels the worker)."""
    lau = bellis.LocalLauncher() if launcher == "local" else _NoKillLauncher()
    task = make_task(
        "t",
        3,
        functools.partial(stop_once_block, recdir, 0),
        max_workers=1,
        timeout=3.0,
        launcher=lau,
    )
    states = bellis.run_blockwise([task], return_states=True, **RUN)
    assert (states["t"].completed_count, states["t"].failed_count) == (3, 0)
    assert_each_success_once(recdir, "t", 3)
    seen = [p.read_text() for p in sorted(Path(recdir).glob("stopped_worker_seen_by_*"))]
    assert seen == ["gone", "gone"], seen


def test_timeout_summary_mentions_timeout(recdir: str, capfd: pytest.CaptureFixture[str]) -> None:
    task = make_task(
        "t", 2, functools.partial(hang_once_block, recdir, 0), max_workers=1, timeout=1.0
    )
    states = bellis.run_blockwise([task], return_states=True, progress=False, summary=True)
    assert states["t"].completed_count == 2
    out = capfd.readouterr().out
    assert "exceeded the block timeout (1s" in out


def test_memory_limit_failure_is_retried(recdir: str) -> None:
    task = make_task(
        "m", 4, functools.partial(memory_block, recdir, 2), max_workers=1, max_retries=2
    )
    states = bellis.run_blockwise([task], return_states=True, **RUN)
    s = states["m"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (4, 0, 0)
    recs = assert_each_success_once(recdir, "m", 4)
    assert len(recs[("m", 2)]) == 3  # failed start, retry start, done
    assert os.path.exists(os.path.join(recdir, "hogged_2"))


def test_clean_exit_mid_block_is_not_a_failure(recdir: str) -> None:
    task = make_task(
        "c",
        6,
        functools.partial(exit_once_block, recdir, 2, 0.05),
        max_workers=1,
        max_worker_restarts=0,
    )
    states = bellis.run_blockwise([task], return_states=True, **RUN)
    s = states["c"]
    assert (s.completed_count, s.failed_count, s.orphaned_count) == (6, 0, 0)
    assert s.worker_failure_count == 0
    # the worker returned blocks 0 and 1 before it left, so its clean exit gives its start
    # back: the replacement is not a restart (SPEC 8.2 item 15)
    assert s.worker_restart_count == 0
    assert s.worker_start_count == 2
    recs = assert_each_success_once(recdir, "c", 6)
    assert len(recs[("c", 2)]) == 3


def test_restart_cap_abandons_and_orphans_downstream(recdir: str, capfd: Any) -> None:
    # every attempt ends its worker (a block that raises does not: its worker goes on,
    # see tests/integration/test_bad_blocks.py)
    a = make_task(
        "a", 6, functools.partial(crash_block, recdir), max_workers=2, max_worker_restarts=1
    )
    b = make_task("b", 6, functools.partial(sleep_block, recdir, 0.0), max_workers=1)
    pipe = bellis.Pipeline([a, b], [(a, b)])
    with pytest.raises(bellis.TaskAbandonedError) as info:
        bellis.run_blockwise(pipe, progress=False, summary=True)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert str(err).startswith("task 'a' was abandoned (worker restart cap exhausted)")
    states = err.daisy_states  # type: ignore[attr-defined]
    sa, sb = states["a"], states["b"]
    assert sa.abandoned and sb.abandoned
    assert sa.worker_start_count == 3
    assert sa.worker_restart_count == 1
    assert sa.worker_failure_count == 3
    assert sb.abandon_reason == "upstream task abandoned"
    assert sb.worker_start_count == 0
    assert sb.orphaned_count == 6
    assert sa.completed_count == 0
    for st in (sa, sb):
        assert st.ready_count == st.processing_count == st.pending_count == 0
        assert st.failed_count + st.orphaned_count == st.total_block_count
    assert sa.failed_attempt_count == 3
    recs = read_records(recdir)
    assert sum(1 for a_ in all_attempts(recs) if a_.kind == "start") == 3
    assert not any(t == "b" for t, _ in recs)


def test_server_returns_states_on_abandonment(recdir: str) -> None:
    a = make_task(
        "a", 3, functools.partial(crash_block, recdir), max_workers=1, max_worker_restarts=0
    )
    states = bellis.Server().run_blockwise([a], **RUN)
    assert states["a"].abandoned
    assert states["a"].worker_start_count == 1


def test_requires_more_than_budget_is_config_error(recdir: str) -> None:
    task = make_task("g", 2, functools.partial(sleep_block, recdir, 0.0), requires={"gpu": 2})
    with pytest.raises(ConfigurationError) as info:
        bellis.run_blockwise([task], resources={"gpu": 1}, **RUN)
    text = str(info.value)
    assert "gpu: 2" in text and "gpu: 1" in text
    assert os.listdir(recdir) == []


def test_resource_budget_caps_concurrency(recdir: str) -> None:
    task = make_task(
        "r", 8, functools.partial(sleep_block, recdir, 0.2), max_workers=4, requires={"cpu": 1}
    )
    states = bellis.run_blockwise([task], resources={"cpu": 2}, return_states=True, **RUN)
    assert states["r"].completed_count == 8
    recs = assert_each_success_once(recdir, "r", 8)
    assert peak_concurrency(all_attempts(recs)) <= 2
    assert len({a.pid for a in all_attempts(recs)}) <= 2


def test_missing_process_function_is_rejected_at_once() -> None:
    task = make_task("n", 2, None)
    listened: list[Any] = []
    with pytest.raises(ConfigurationError, match="no process_function"):
        bellis.Server(on_listen=listened.append).run_blockwise([task], **RUN)
    assert listened == []  # refused before the run's server even started listening


def test_worker_that_returns_at_once_burns_the_budget() -> None:
    task = make_task("q", 3, connect_and_return, max_workers=1, max_worker_restarts=2)
    states = bellis.Server().run_blockwise([task], **RUN)
    s = states["q"]
    assert s.abandoned
    assert (s.worker_start_count, s.worker_restart_count, s.worker_failure_count) == (3, 2, 0)
    assert s.orphaned_count == 3


def test_every_block_timing_out_abandons_with_the_timeout_in_the_message(recdir: str) -> None:
    task = make_task(
        "h",
        3,
        functools.partial(hang_block, recdir),
        max_workers=1,
        max_worker_restarts=1,
        timeout=0.5,
    )
    with pytest.raises(bellis.TaskAbandonedError) as info:
        bellis.run_blockwise([task], **RUN)
    text = str(info.value)
    assert text.startswith("task 'h' was abandoned (worker restart cap exhausted)")
    assert "2 block attempt(s) exceeded the block timeout (0.5s" in text
    s = info.value.daisy_states["h"]  # type: ignore[attr-defined]
    assert (s.worker_start_count, s.worker_restart_count, s.timeout_reclaim_count) == (2, 1, 2)
    assert s.completed_count == 0
    assert s.failed_count + s.orphaned_count == 3
    recs = read_records(recdir)
    attempts = all_attempts(recs)
    assert len(attempts) == 2 and all(a.kind == "start" for a in attempts)
    assert not any(pid_alive(a.pid) for a in attempts)


_SCRIPT_KILLED_WORKERS_AT_THE_END = """\
import gc, os, sys, time, warnings
import bellis
from bellis import Roi


def hang(block):
    with open(os.path.join(os.environ["PIDS_DIR"], f"pid_{os.getpid()}"), "w"):
        pass
    # a large heap: a killed worker takes a moment to die, past the run's end
    ballast = bytearray(300 << 20)
    time.sleep(60)
    del ballast


if __name__ == "__main__":
    warnings.simplefilter("error", ResourceWarning)
    unraisable = []
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    task = bellis.Task(
        "h", Roi((0,), (3,)), Roi((0,), (1,)), Roi((0,), (1,)), process_function=hang,
        max_workers=1, max_worker_restarts=1, timeout=2.0, read_write_conflict=False,
    )
    try:
        bellis.run_blockwise(task, progress=False, summary=False)
    except bellis.TaskAbandonedError:
        print("ABANDONED")
    # what a notebook's process holds after the run: no worker left unreaped
    for name in sorted(os.listdir(os.environ["PIDS_DIR"])):
        pid = int(name.split("_")[1])
        print("WORKER", pid, "reaped" if not os.path.exists(f"/proc/{pid}") else "NOT REAPED")
    gc.collect()
    print("UNRAISABLE", unraisable)
"""


def test_a_run_that_ends_while_a_killed_worker_dies_reaps_it(tmp_path: Path) -> None:
    """The restart cap abandons the task as the server kills the last hung worker: the run
    ends while that worker is still dying. run_blockwise must reap it before it returns, or
    a long-lived caller (a notebook) gets ``ResourceWarning: subprocess N is still
    running`` when the garbage collector drops it, and a zombie until then."""
    script = tmp_path / "killed_at_the_end.py"
    script.write_text(_SCRIPT_KILLED_WORKERS_AT_THE_END)
    pids = tmp_path / "pids"
    pids.mkdir()
    # spawned workers: each one is the script's own child process
    env = {**os.environ, "BELLIS_WORKER_START": "spawn", "PIDS_DIR": str(pids)}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "ABANDONED" in lines, done.stdout
    workers = [line for line in lines if line.startswith("WORKER ")]
    assert len(workers) == 2, done.stdout  # the first start and its one restart, both killed
    assert all(line.endswith(" reaped") for line in workers), done.stdout
    assert "UNRAISABLE []" in lines, done.stdout


def test_sigterm_to_a_worker_finishes_its_block_then_exits_cleanly(recdir: str) -> None:
    task = make_task("s", 6, functools.partial(sleep_block, recdir, 0.4), max_workers=2)
    signalled: list[tuple[int, Path]] = []
    over = threading.Event()
    t = _signal_first_block_start(recdir, signal.SIGTERM, signalled, over)
    try:
        states = bellis.run_blockwise([task], return_states=True, **RUN)
    finally:
        over.set()
        t.join()
    assert signalled
    pid, path = signalled[0]
    s = states["s"]
    assert (s.completed_count, s.failed_count, s.failed_attempt_count) == (6, 0, 0)
    assert s.worker_failure_count == 0
    assert s.worker_restart_count == 0
    assert_each_success_once(recdir, "s", 6)
    # the signalled worker finished the block it was in, and that result counted
    rows = path.read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith(f"done {pid} ")
    assert not pid_alive(pid)


@pytest.mark.timeout(60)
def test_worker_log_that_cannot_be_created_abandons_the_task_not_the_run(
    recdir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a file where task "down"'s log folder belongs: its workers' logs cannot be created
    (tmp_path / "logs" / "down").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "logs" / "down").write_text("in the way\n")
    up = make_task("up", 40, functools.partial(sleep_block, recdir, 0.0), max_workers=2)
    down = make_task(
        "down",
        10,
        functools.partial(sleep_block, recdir, 0.0),
        max_workers=2,
        max_worker_restarts=1,
        # a launcher of its own: up's workers, once idle, must not move to down and run
        # its blocks (workers shared between tasks, docs/warm_workers.md), which would
        # make the outcome depend on which comes first
        launcher=bellis.LocalLauncher(),
    )
    with pytest.raises(bellis.TaskAbandonedError) as info:
        bellis.run_blockwise(bellis.Pipeline([up, down], [(up, down)]), **RUN)
    text = str(info.value)
    assert text.startswith("task 'down' was abandoned (worker restart cap exhausted)")
    assert "could not start a worker for task 'down'" in text
    states = info.value.daisy_states  # type: ignore[attr-defined]
    su, sd = states["up"], states["down"]
    # the upstream task's blocks were all done once each, none lost in a dropped batch
    assert (su.completed_count, su.failed_count, su.orphaned_count) == (40, 0, 0)
    assert_each_success_once(recdir, "up", 40)
    assert su.worker_failure_count == 0
    # two starts and the one restart allowed, each refused for its log files
    assert sd.completed_count == 0
    assert (sd.worker_start_count, sd.worker_failure_count) == (3, 3)
    assert sd.orphaned_count + sd.failed_count == 10
    assert not any(t == "down" for t, _ in read_records(recdir))
    # its runs.jsonl cannot be written either (same folder): logged, and the report of
    # this run is still what task.report() returns in this process
    assert "could not append this run's report to" in caplog.text
    report = down.report()
    assert report is not None and report.outcome == "abandoned"
    assert report.counters["worker_starts"] == 3


@pytest.mark.parametrize("worker_id", [0, -1])
def test_a_refused_connection_is_the_straggler_case(
    worker_id: int, caplog: pytest.LogCaptureFixture
) -> None:
    # a port nothing listens on: bound, then closed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = bellis.Context(
        hostname="127.0.0.1", port=port, task_id="t", worker_id=worker_id, secret="00" * 32
    )
    # a worker that starts after its run ended (a queued cluster job) ends without blocks,
    # managed or not, and without an error
    client = bellis.Client(ctx)
    assert not client.connected
    with client.acquire_block() as block:
        assert block is None
    assert f"bellis server at 127.0.0.1:{port} is not reachable" in caplog.text


_SCRIPT_WITH_A_FAILING_BLOCK = """\
import bellis
from bellis import Roi


def check(value):
    if value == 3:
        raise ValueError("block three is bad")


def process(block):
    inner = lambda: check(block.block_id[1])  # noqa: E731
    inner()


if __name__ == "__main__":
    task = bellis.Task(
        "tb", Roi((0,), (5,)), Roi((0,), (1,)), Roi((0,), (1,)),
        process_function=process, max_retries=0, max_workers=1,
    )
    bellis.run_blockwise(task, progress=False)
"""


def test_a_worker_traceback_names_the_script_and_starts_at_user_code(tmp_path: Path) -> None:
    script = tmp_path / "my_pipeline.py"
    script.write_text(_SCRIPT_WITH_A_FAILING_BLOCK)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    err = "".join(p.read_text() for p in (tmp_path / "daisy_logs" / "tb").glob("*.err"))
    # (less the header lines that name each worker of the log's slot)
    err = "".join(line for line in err.splitlines(True) if not line.startswith("=== bellis "))
    # the worker's log holds the traceback once (not again on the way out), and so does
    # the summary's error group
    assert err.count("Traceback (most recent call last)") == 1, err
    assert done.stdout.count("Traceback (most recent call last)") == 1, done.stdout
    for text in (err, done.stdout):
        # every frame is the user's own, in their file, with its source line
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text)
        assert [(Path(f).name, fn) for f, _, fn in frames] == [
            ("my_pipeline.py", "process"),
            ("my_pipeline.py", "<lambda>"),
            ("my_pipeline.py", "check"),
        ], text
        assert 'raise ValueError("block three is bad")' in text
        assert "<dynamic-code>" not in text and "bellis" not in text.split("Traceback")[1]


def test_a_worker_that_connects_after_its_spawn_function_returned_stops_the_run() -> None:
    task = make_task("ff", 4, detach_and_return, max_workers=1, max_worker_restarts=1000)
    with pytest.raises(RuntimeError) as info:
        bellis.run_blockwise([task], **RUN)
    assert isinstance(info.value, ConfigurationError)
    text = str(info.value)
    assert "for task 'ff' connected after its spawn function had already returned" in text
    assert "0-arg spawn functions must block until their worker exits" in text


def _raise_old_error(block: Any) -> None:
    raise ValueError("OLD ERROR FROM AN EARLIER RUN")


def _exit_silently(block: Any) -> None:
    os._exit(3)


def test_a_worker_error_quotes_only_its_own_stderr() -> None:
    first = make_task("slot", 1, _raise_old_error, max_workers=1, max_retries=0)
    assert not bellis.run_blockwise([first], **RUN)
    second = make_task("slot", 1, _exit_silently, max_workers=1, max_worker_restarts=0)
    with pytest.raises(bellis.TaskAbandonedError) as info:
        bellis.run_blockwise([second], **RUN)
    state = info.value.daisy_states["slot"]  # type: ignore[attr-defined]
    # the same log files (slot 0 of task "slot") hold the first run's traceback
    assert "OLD ERROR FROM AN EARLIER RUN" in (Path("logs") / "slot" / "worker_0.err").read_text()
    assert state.last_worker_error.startswith("bellis worker subprocess exited with code 3")
    assert "OLD ERROR" not in state.last_worker_error
    assert "OLD ERROR" not in str(info.value)
