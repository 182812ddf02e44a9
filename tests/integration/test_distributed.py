"""Distributed runs with real worker subprocesses over TCP on 127.0.0.1."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis.errors import WorkerStartError
from kit.blocks import (
    all_attempts,
    client_worker,
    context_worker,
    done_count,
    done_ids,
    fail_block,
    make_task,
    peak_concurrency,
    read_records,
    sleep_block,
)


@pytest.fixture
def recdir(tmp_path: Path) -> str:
    d = tmp_path / "rec"
    d.mkdir()
    return str(d)


def test_block_function_runs_in_worker_processes(recdir: str) -> None:
    task = make_task("a", 8, functools.partial(sleep_block, recdir, 0.01), max_workers=2)
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    s = states["a"]
    assert (s.completed_count, s.failed_count, s.total_block_count) == (8, 0, 8)
    recs = read_records(recdir)
    assert done_ids(recs, "a") == list(range(8))
    pids = {a.pid for a in all_attempts(recs)}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2
    assert s.worker_failure_count == 0


@pytest.mark.parametrize("fn", [client_worker, context_worker], ids=["client", "context"])
def test_zero_arg_worker_functions(recdir: str, fn: Any) -> None:
    task = make_task("w", 6, functools.partial(fn, recdir), max_workers=2)
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    assert states["w"].completed_count == 6
    recs = read_records(recdir)
    assert done_ids(recs, "w") == list(range(6))
    assert all(a.pid != os.getpid() for a in all_attempts(recs))


def test_max_workers_is_honoured(recdir: str) -> None:
    task = make_task("a", 12, functools.partial(sleep_block, recdir, 0.15), max_workers=3)
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    assert states["a"].completed_count == 12
    recs = read_records(recdir)
    attempts = all_attempts(recs)
    assert peak_concurrency(attempts) <= 3
    assert peak_concurrency(attempts) >= 2  # it did run in parallel
    assert len({a.pid for a in attempts}) <= 3


def test_three_task_pipeline_with_contexts_and_conflicts(recdir: str) -> None:
    roi = bellis.Roi
    fn = functools.partial(sleep_block, recdir, 0.01)
    # a: 6 independent blocks; b: read context 10 on each side, with conflicts; c: like a
    a = make_task("a", 6, fn, max_workers=2)
    b = bellis.Task(
        "b",
        roi((0,), (60,)),
        roi((0,), (30,)),
        roi((10,), (10,)),
        process_function=fn,
        read_write_conflict=True,
        max_workers=2,
    )
    # c: reads exactly what b writes, [10, 50)
    c = bellis.Task(
        "c",
        roi((10,), (40,)),
        roi((0,), (10,)),
        roi((0,), (10,)),
        process_function=fn,
        read_write_conflict=False,
        max_workers=2,
    )
    pipe = bellis.Pipeline([a, b, c], [(a, b), (b, c)])
    states = bellis.run_blockwise(pipe, progress=False, summary=False, return_states=True)
    assert states["a"].completed_count == 6
    assert states["b"].total_block_count == 4
    assert states["b"].completed_count == 4
    assert states["c"].completed_count == 4
    recs = read_records(recdir)
    assert done_ids(recs, "a") == list(range(6))
    assert len(done_ids(recs, "c")) == 4
    for key, rows in recs.items():
        assert done_count(recs, *key) == 1, key
        assert len(rows) == 2, key
    end = {k: rows[-1].t1 for k, rows in recs.items()}
    start = {k: rows[0].t0 for k, rows in recs.items()}
    b_ids = sorted(sid for t, sid in recs if t == "b")
    # b block with write [10+10i, 20+10i) reads [10i, 30+10i): needs a blocks i, i+1, i+2
    for i, sid in enumerate(b_ids):
        for j in (i, i + 1, i + 2):
            assert end[("a", j)] <= start[("b", sid)]
    # conflicts: b blocks whose read regions overlap the neighbour's write never overlap
    for i in range(len(b_ids) - 1):
        x, y = ("b", b_ids[i]), ("b", b_ids[i + 1])
        assert end[x] <= start[y] or end[y] <= start[x]
    # c block i (write [10 + 10i, 20 + 10i)) needs exactly b block i
    c_ids = sorted(sid for t, sid in recs if t == "c")
    for bs, cs in zip(b_ids, c_ids, strict=True):
        assert end[("b", bs)] <= start[("c", cs)]


def _run_with_one_external_worker(
    task: Any, on_listen: Any, procs: list[subprocess.Popen[bytes]], recdir: str, n: int
) -> None:
    """Run ``task`` on a Server whose only worker is the process ``on_listen`` starts;
    check that it did all ``n`` blocks, each once, and exited cleanly."""
    server = bellis.Server(external_workers=True, on_listen=on_listen)
    try:
        states = server.run_blockwise([task], progress=False, summary=False)
    finally:
        for p in procs:
            p.wait(timeout=20)
    assert procs[0].returncode == 0
    assert states[task.task_id].completed_count == n
    recs = read_records(recdir)
    assert done_ids(recs, task.task_id) == list(range(n))
    assert {a.pid for a in all_attempts(recs)} == {procs[0].pid}


def test_external_worker_joins(recdir: str, tmp_path: Path) -> None:
    task = make_task("ext", 5, None, max_workers=1)
    procs: list[subprocess.Popen[bytes]] = []
    script = (
        "import functools, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "import bellis\n"
        "from kit import blocks\n"
        "ctx = bellis.Context.from_env_string(sys.argv[1])\n"
        "blocks.context_worker(sys.argv[3], context=ctx)\n"
    )

    def on_listen(server: Any) -> None:
        assert server.hostname == "127.0.0.1"
        ctx = bellis.Context(
            hostname=server.hostname,
            port=server.port,
            task_id="ext",
            worker_id=-1,
            secret=server.secret.hex(),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, ctx.to_env(), str(Path(__file__).parents[1]), recdir]
            )
        )

    _run_with_one_external_worker(task, on_listen, procs, recdir, 5)


@pytest.mark.parametrize("how", ["script", "module"])
def test_external_worker_through_the_cli(recdir: str, how: str) -> None:
    task = make_task("cli", 4, None, max_workers=1)
    procs: list[subprocess.Popen[bytes]] = []
    if how == "script":
        cmd = [str(Path(sys.executable).parent / "bellis"), "worker"]
    else:
        cmd = [sys.executable, "-m", "bellis.worker"]

    def on_listen(server: Any) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).parents[1])
        env["BELLIS_TEST_RECDIR"] = recdir
        ctx = server.worker_context("cli")
        args = [*cmd, "--function", "kit.blocks:env_sleep_block", "--context", ctx]
        procs.append(subprocess.Popen(args, env=env))

    _run_with_one_external_worker(task, on_listen, procs, recdir, 4)


def test_unpicklable_function_fails_at_start(recdir: str) -> None:
    lock = threading.Lock()

    def fn(block: Any) -> None:
        with lock:
            pass

    task = make_task("bad", 3, fn)
    with pytest.raises(WorkerStartError, match="could not serialize"):
        bellis.run_blockwise([task], progress=False, summary=False)
    assert os.listdir(recdir) == []


def test_worker_logs_hold_stdout_and_tracebacks(recdir: str, tmp_path: Path) -> None:
    task = make_task(
        "logs", 4, functools.partial(fail_block, recdir, (2,)), max_workers=1, max_retries=0
    )
    states = bellis.run_blockwise([task], progress=False, summary=False, return_states=True)
    s = states["logs"]
    assert (s.completed_count, s.failed_count) == (3, 1)
    logdir = tmp_path / "logs"
    outs = list(logdir.rglob("*.out"))
    errs = list(logdir.rglob("*.err"))
    assert outs and errs
    err_text = "".join(p.read_text() for p in errs)
    assert "Traceback" in err_text
    assert "injected failure in block 2" in err_text


def test_worker_logs_capture_block_stdout(recdir: str, tmp_path: Path) -> None:
    task = make_task("out", 3, functools.partial(sleep_block, recdir, 0.0), max_workers=1)
    assert bellis.run_blockwise([task], progress=False, summary=False)
    out_text = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.out"))
    for sid in range(3):
        assert f"processed block {sid}" in out_text


def test_task_run_blockwise_runs_the_task_alone(
    recdir: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """``Task.run_blockwise`` (bellis's, not daisy's) is ``run_blockwise(task)``: it runs the
    task's blocks in workers, returns False when a block failed and prints the summary; in
    serial mode a block's error propagates, as ``run_blockwise(task, multiprocessing=False)``
    does."""
    task = make_task("alone", 6, functools.partial(fail_block, recdir, (4,)), max_retries=0)
    assert task.run_blockwise(progress=False) is False
    recs = read_records(recdir)
    assert done_ids(recs, "alone") == [0, 1, 2, 3, 5]
    assert all(a.pid != os.getpid() for a in all_attempts(recs))
    out = capfd.readouterr().out
    assert "Execution Summary" in out and "alone ✗" in out
    assert "ValueError: injected failure in block 4" in out
    serial = make_task("serial", 3, functools.partial(fail_block, recdir, (1,)))
    with pytest.raises(ValueError, match="injected failure in block 1"):
        serial.run_blockwise(multiprocessing=False, progress=False)
