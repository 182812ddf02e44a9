"""Progress observers and worker output (log modes) in real runs."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis import logging as blog
from kit.blocks import make_task


def slow(block: Any) -> None:
    time.sleep(0.05)


def _task(task_id: str = "t", n: int = 20, fn: Any = slow) -> Any:
    return make_task(task_id, n, fn, max_workers=2)


def test_json_observer_lines(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    n = 60  # about 1.5 s of blocks: progress ticks every 0.5 s
    up = _task("up", n)
    down = _task("down", n)
    ok = bellis.run_blockwise(
        up + down, progress=bellis.JsonProgressObserver(path=path), summary=False
    )
    assert ok is True
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    keys = {
        "t", "event", "task", "total", "ready", "processing", "completed",
        "skipped", "failed", "orphaned", "restarts", "failures",
    }  # fmt: skip
    assert all(set(d) == keys for d in lines)
    events = [d["event"] for d in lines]
    assert events[:2] == ["start", "start"] and events[-2:] == ["finish", "finish"]
    assert "progress" in events
    finish = {d["task"]: d for d in lines if d["event"] == "finish"}
    assert finish["up"]["completed"] == finish["down"]["completed"] == n
    # progress is monotone per task and never exceeds the total
    for task in ("up", "down"):
        seq = [d["completed"] for d in lines if d["task"] == task]
        assert seq == sorted(seq) and max(seq) == n
    # at most one progress event per task per 500 ms tick (plus the final flush)
    progress_times = [d["t"] for d in lines if d["event"] == "progress" and d["task"] == "up"]
    gaps = [b - a for a, b in itertools.pairwise(progress_times)]
    assert len(gaps) >= 2, progress_times  # at least one gap between two ticks to check
    assert all(g >= 0.4 for g in gaps[:-1]), gaps


def test_plain_progress_on_stderr_when_it_is_not_a_terminal(
    capfd: pytest.CaptureFixture[str],
) -> None:
    bellis.run_blockwise(_task(n=8), progress=True)
    captured = capfd.readouterr()
    assert "[bellis] t: finished ✔ 8/8 done (100.0%)" in captured.err
    assert captured.err.count("[bellis] t:") <= 2  # rate-limited: no line per block
    assert "Execution Summary" in captured.out
    assert "[bellis]" not in captured.out and "Execution Summary" not in captured.err


def test_observer_errors_never_break_a_run(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def on_start(self, states: Any) -> None:
            raise RuntimeError("observer bug")

        def on_progress(self, states: Any) -> None:
            raise RuntimeError("observer bug")

        def on_finish(self, states: Any) -> None:
            raise RuntimeError("observer bug")

    states = bellis.run_blockwise(_task(n=4), progress=Broken(), summary=False, return_states=True)
    assert states["t"].completed_count == 4
    assert sum("observer bug" in r.getMessage() for r in caplog.records) == 1


def speak(block: Any) -> None:
    print(f"said-out-{block.block_id[1]}", flush=True)
    print(f"said-err-{block.block_id[1]}", file=sys.stderr, flush=True)


@pytest.mark.parametrize("mode", ["file", "both", "console"])
@pytest.mark.parametrize("multiprocessing", [True, False])
def test_log_modes_send_worker_output_where_they_say(
    mode: str, multiprocessing: bool, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    blog.set_log_mode(mode)
    task = _task("talk", 4, speak)
    assert bellis.run_blockwise(
        task, multiprocessing=multiprocessing, progress=False, summary=False
    )
    captured = capfd.readouterr()
    logs = tmp_path / "logs" / "talk"
    out_files = "".join(p.read_text() for p in logs.glob("*.out")) if logs.exists() else ""
    err_files = "".join(p.read_text() for p in logs.glob("*.err")) if logs.exists() else ""
    for k in range(4):
        assert (f"said-out-{k}" in out_files) == (mode != "console"), (mode, out_files)
        assert (f"said-err-{k}" in err_files) == (mode != "console"), (mode, err_files)
        assert (f"said-out-{k}" in captured.out) == (mode != "file"), (mode, captured.out)
        assert (f"said-err-{k}" in captured.err) == (mode != "file"), (mode, captured.err)


def use_stdout_as_a_file(block: Any) -> None:
    # what code does with sys.stdout besides writing: its encoding, its descriptor
    assert sys.stdout.encoding
    os.fstat(sys.stdout.fileno())
    print(f"said-out-{block.block_id[1]}")


def test_a_serial_run_in_both_mode_keeps_stdout_a_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    blog.set_log_mode("both")
    task = _task("file", 2, use_stdout_as_a_file)
    assert bellis.run_blockwise(task, multiprocessing=False, progress=False, summary=False)
    assert "said-out-1" in capfd.readouterr().out
    assert "said-out-1" in (tmp_path / "logs" / "file" / "worker_0.out").read_text()
