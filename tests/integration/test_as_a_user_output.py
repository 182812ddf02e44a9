"""Where a run's output lands, seen from a user's script (issue 13 defect 2, issue 14 item 6).

Each test writes a script into ``tmp_path`` and runs it with ``sys.executable``, as a user
would. The execution summary and the panel go to the ``sys.stdout`` in force when they are
printed (``contextlib.redirect_stdout``, pytest's ``capsys``, a notebook cell), and
progress goes to ``sys.stderr``: a user who pipes stdout gets the summary, not progress.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kit.terminal import needs_tmux, run_in_terminal

SCRIPT = """
import contextlib
import io
import sys
from pathlib import Path

import bellis
from bellis import Roi


def speak(block):
    print(f"said-out-{block.block_id[1]}", flush=True)
    print(f"said-err-{block.block_id[1]}", file=sys.stderr, flush=True)


def main():
    mode, how, capture = sys.argv[1], sys.argv[2], sys.argv[3]
    here = Path(__file__).parent
    bellis.logging.set_log_basedir(here / "logs")
    bellis.logging.set_log_mode(mode)
    bellis.set_tracking_basedir(here / "tracking")
    task = bellis.Task(
        "talk",
        total_roi=Roi((0,), (40,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=speak,
        read_write_conflict=False,
        max_workers=2,
        resource_tracking=True,  # a serial run shows the panel only with it
    )
    run = lambda: bellis.run_blockwise(
        [task], multiprocessing=how == "distributed", progress=True
    )
    if capture == "redirect":
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ok = run()
        (here / "captured.out").write_text(out.getvalue())
        (here / "captured.err").write_text(err.getvalue())
    else:
        ok = run()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
"""

SUMMARY = "Execution Summary"
PANEL = "Resource Utilization"
PROGRESS_END = "[bellis] talk: finished ✔ 4/4 done (100.0%)"


def _write_script(tmp_path: Path) -> Path:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    return script


def _user_env() -> dict[str, str]:
    """This environment as a user's shell has it: Python's output buffered as by default."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _logs(tmp_path: Path, suffix: str) -> str:
    logs = tmp_path / "logs" / "talk"
    return "".join(p.read_text() for p in sorted(logs.glob(f"*{suffix}"))) if logs.exists() else ""


@pytest.mark.parametrize("mode", ["file", "console", "both"])
@pytest.mark.parametrize("how", ["serial", "distributed"])
def test_redirect_stdout_gets_the_summary_and_the_panel(
    how: str, mode: str, tmp_path: Path
) -> None:
    script = _write_script(tmp_path)
    done = _run(script, mode, how, "redirect")
    assert done.returncode == 0, done.stderr
    captured_out = (tmp_path / "captured.out").read_text()
    captured_err = (tmp_path / "captured.err").read_text()
    # the summary and the panel reach the redirected stdout, and nothing else does
    assert SUMMARY in captured_out and PANEL in captured_out, captured_out
    assert "talk ✔" in captured_out
    assert done.stdout == "", done.stdout  # the process's real stdout
    assert SUMMARY not in captured_err and PANEL not in captured_err
    # progress (distributed runs only) reaches the redirected stderr, never stdout
    assert "[bellis]" not in captured_out
    if how == "distributed":
        assert PROGRESS_END in captured_err, captured_err
    assert "[bellis]" not in done.stderr
    # worker output: the log files in "file" and "both" modes; the streams in force in
    # "console" and "both" modes
    for k in range(4):
        assert (f"said-out-{k}" in _logs(tmp_path, ".out")) == (mode != "console")
        assert (f"said-err-{k}" in _logs(tmp_path, ".err")) == (mode != "console")
        assert (f"said-out-{k}" in captured_out) == (mode != "file"), captured_out
        assert (f"said-err-{k}" in captured_err) == (mode != "file"), captured_err
        assert f"said-err-{k}" not in done.stderr


def test_a_piped_run_has_progress_on_stderr_and_the_summary_on_stdout(tmp_path: Path) -> None:
    # distributed: a serial run shows no progress
    script = _write_script(tmp_path)
    done = _run(script, "file", "distributed", "plain")
    assert done.returncode == 0, done.stderr
    assert SUMMARY in done.stdout and PANEL in done.stdout, done.stdout
    assert SUMMARY not in done.stderr and PANEL not in done.stderr
    assert "[bellis]" not in done.stdout, done.stdout
    assert PROGRESS_END in done.stderr, done.stderr


@needs_tmux
def test_a_terminal_shows_progress_bars_while_stdout_is_piped_to_a_file(tmp_path: Path) -> None:
    """``python script.py > out.txt`` in a terminal: the bars on the terminal (stderr),
    the summary and the panel in the file, and no progress lines in it."""
    script = _write_script(tmp_path)
    status, pane = run_in_terminal(
        tmp_path,
        f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} file distributed plain"
        " > out.txt",
        setup="unset PYTHONUNBUFFERED\n",
    )
    assert status == "0", pane
    out = (tmp_path / "out.txt").read_text()
    assert SUMMARY in out and PANEL in out, out
    assert "[bellis]" not in out and "♻" not in out, out
    # a terminal on stderr: a tqdm bar that ended at 4/4 with the task's final symbol
    assert "talk ✔ ♻=0" in pane and "4/4" in pane, pane
    assert SUMMARY not in pane and "[bellis]" not in pane, pane


LIVE_SCRIPT = """
import sys
import time
from pathlib import Path

import bellis
from bellis import Roi

GO = Path(__file__).parent / "go"


def wait_for_go(block):
    print("waiting-for-go")  # no flush: a terminal would show it at once
    deadline = time.monotonic() + 60
    while not GO.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the driver never showed the worker's line")
        time.sleep(0.05)


if __name__ == "__main__":
    bellis.logging.set_log_basedir(Path(__file__).parent / "logs")
    bellis.logging.set_log_mode(sys.argv[1])
    task = bellis.Task(
        "live",
        total_roi=Roi((0,), (10,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=wait_for_go,
        max_retries=0,
    )
    sys.exit(0 if bellis.run_blockwise([task], progress=False) else 1)
"""


@pytest.mark.parametrize("mode", ["console", "both"])
def test_worker_lines_reach_the_driver_while_the_block_runs(mode: str, tmp_path: Path) -> None:
    """A worker's print shows while its block runs, as on a terminal, though its output
    passes through a pipe to the driver (the worker runs unbuffered)."""
    script = tmp_path / "live.py"
    script.write_text(LIVE_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        cwd=tmp_path,
        env=_user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == "waiting-for-go":
                (tmp_path / "go").touch()
                break
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(seen) + rest + err
    assert "live ✔" in rest and "never showed" not in rest + err
