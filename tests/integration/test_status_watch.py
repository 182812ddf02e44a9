"""``bellis status PATH --watch``: in a real terminal (tmux), piped, and on Ctrl-C."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kit.terminal import Terminal, exit_status, needs_tmux, terminal_script

FIXTURE = Path(__file__).parent.parent / "compat" / "daisy_store_fixture"

# 48 blocks of 0.4 s on 2 workers: about 10 s of blocks
SLOW_RUN = textwrap.dedent(
    """
    import sys, time
    import bellis
    from bellis import Roi

    def f(block):
        time.sleep(0.4)

    task = bellis.Task("slow", total_roi=Roi((0, 0), (60, 80)), read_roi=Roi((0, 0), (10, 10)),
                       write_roi=Roi((0, 0), (10, 10)), process_function=f,
                       read_write_conflict=False, max_workers=2,
                       resource_tracking=sys.argv[2] == "1", tracking_path=sys.argv[1])
    print("ok" if bellis.run_blockwise([task], progress=False, summary=False) else "failed")
    """
)


def _wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _done_count(store: Path) -> int:
    chunk = store / "done" / "c" / "0" / "0"
    if not chunk.exists():
        return 0
    return int(np.fromfile(chunk, dtype=np.uint8).sum())


@pytest.fixture
def slow_run(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A distributed run in progress (at least one block done); yields its store."""
    tracking = getattr(request, "param", True)
    script = tmp_path / "slow.py"
    script.write_text(SLOW_RUN)
    store = tmp_path / "track" / "slow"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(store), "1" if tracking else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: _done_count(store) >= 1, 120, "the first block")
        yield store, proc
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "ok", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _watch_cmd(store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bellis", "status", str(store), "--watch", *extra]


@needs_tmux
def test_watch_redraws_in_a_terminal_and_exits_when_the_run_ends(
    tmp_path: Path, slow_run: tuple[Path, subprocess.Popen[str]]
) -> None:
    store, run = slow_run
    script = terminal_script(tmp_path, shlex.join(_watch_cmd(store, "0.5")))
    with Terminal(f"sh {shlex.quote(str(script))}", 120, 50) as term:
        capture = term.capture

        def done_in_pane(text: str) -> int | None:
            m = re.search(r"^\s+done\s+(\d+)\s*$", text, re.MULTILINE)
            return None if m is None else int(m.group(1))

        first: list[str] = []
        _wait_for(
            lambda: done_in_pane(t := capture()) is not None and first.append(t) is None,
            60,
            "the first frame",
        )
        n1 = done_in_pane(first[0])
        assert n1 is not None and n1 < 48, first[0]
        assert "run in progress" in first[0] and "blocks/s" in first[0], first[0]
        assert "\x1b" not in first[0]  # the pane holds the drawn screen, not the codes
        second: list[str] = []
        _wait_for(
            lambda: (done_in_pane(t := capture()) or 0) > n1 and second.append(t) is None,
            120,
            "the done count to move",
        )
        # redrawn in place: one frame on the screen, not one per redraw
        assert second[0].count("block tracking at") == 1, second[0]
        assert run.poll() is None or (done_in_pane(second[0]) or 0) == 48
        # it exits by itself, 0, once the run ends
        assert exit_status(tmp_path) == "0"
        assert run.wait(timeout=300) == 0
        final = capture()
        assert done_in_pane(final) == 48 and "run ended" in final, final


@pytest.mark.parametrize("slow_run", [True, False], indirect=True, ids=["stamps", "no-stamps"])
def test_watch_prints_plain_lines_when_piped(slow_run: tuple[Path, subprocess.Popen[str]]) -> None:
    store, _run = slow_run
    proc = subprocess.run(_watch_cmd(store, "0.3"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if " blocks done " in line]
    counts = [int(re.search(r": (\d+) of 48 blocks done", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert len(set(counts)) >= 2 and counts == sorted(counts), proc.stdout
    assert counts[-1] == 48
    assert any("blocks/s" in line and "ETA" in line for line in lines[:-1]), proc.stdout
    assert proc.stdout.rstrip().endswith("run ended")
    assert "    ########" in proc.stdout  # the full status (and its map) at the end


def test_watch_of_a_store_no_run_holds(tmp_path: Path) -> None:
    store = tmp_path / "track" / "slow"
    script = tmp_path / "slow.py"
    script.write_text(SLOW_RUN.replace("time.sleep(0.4)", "pass"))
    subprocess.run([sys.executable, str(script), str(store), "1"], check=True, timeout=300)
    proc = subprocess.run(_watch_cmd(store), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "48 of 48 blocks done" in proc.stdout and "no run in progress" in proc.stdout
    assert proc.stdout.rstrip().endswith("no run holds the store")


def test_watch_stops_quietly_on_ctrl_c(tmp_path: Path) -> None:
    # a daisy-written store has no bellis.lock: the watch cannot tell the run's end and
    # goes on until it is interrupted
    store = tmp_path / "daisy"
    shutil.copytree(FIXTURE, store)
    proc = subprocess.Popen(
        _watch_cmd(store, "0.2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert " cells done (" in first and "blocks unknown" in first, first
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert err == "", err


# the watch started as a background job of a shell script starts it: SIGINT ignored,
# inherited through exec (what `pytest ... &` gives every process a test starts)
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.parametrize("wait_for_store", [False, True], ids=["store", "no-store-yet"])
def test_watch_started_with_sigint_ignored_still_stops_on_it(
    tmp_path: Path, wait_for_store: bool
) -> None:
    """A watch of a daisy store ends only on Ctrl-C. Started with SIGINT ignored (a
    background job of a script, a test suite run with `&`), it used to run on for ever
    after SIGINT. Its first output (the first frame, or the line saying that it waits for
    the store) says that it takes SIGINT from then on."""
    store = tmp_path / "daisy"
    if not wait_for_store:
        shutil.copytree(FIXTURE, store)
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORING_SIGINT, *_watch_cmd(store, "0.2")[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = (proc.stderr if wait_for_store else proc.stdout).readline()
        expected = "waiting for a run to create it" if wait_for_store else " cells done ("
        assert expected in first, first
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err


def test_watch_refuses_a_bad_interval(tmp_path: Path) -> None:
    proc = subprocess.run(_watch_cmd(tmp_path, "0"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--watch takes a positive number of seconds, got 0" in proc.stderr
