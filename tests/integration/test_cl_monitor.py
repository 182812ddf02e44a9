"""``bellis.cl_monitor.CLMonitor(server)``: daisy 1.x's command-line monitor, as volara uses it
(``server = daisy.SerialServer(); CLMonitor(server); server.run_blockwise(tasks)``)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bellis
from bellis import Roi
from bellis.cl_monitor import CLMonitor

SCRIPT_HEAD = """
import sys
import warnings
import bellis as daisy
from bellis.cl_monitor import CLMonitor

warnings.simplefilter("ignore", DeprecationWarning)

def process(block):
    pass

def task(name, n):
    return daisy.Task(
        name,
        total_roi=daisy.Roi((0,), (10 * n,)),
        read_roi=daisy.Roi((0,), (10,)),
        write_roi=daisy.Roi((0,), (10,)),
        process_function=process,
        read_write_conflict=False,
        max_workers=2,
    )
"""


def _run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "monitor_script.py"
    script.write_text(SCRIPT_HEAD + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


FINISHED = re.compile(r"^\[bellis\] (\w+): finished ✔ (\d+)/(\d+) done", re.MULTILINE)


def test_serial_server_with_monitor_reports_each_task_on_stderr(tmp_path: Path) -> None:
    proc = _run_script(
        tmp_path,
        """
        server = daisy.SerialServer()
        monitor = CLMonitor(server)
        up = task("up", 12)
        down = task("down", 7)
        states = server.run_blockwise(up + down)
        assert all(s.completed_count == s.total_block_count for s in states.values())
        print("RESULT", sorted((k, s.completed_count) for k, s in states.items()))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RESULT [('down', 7), ('up', 12)]" in proc.stdout
    # one finish line per task, in task order, on stderr; none on stdout
    assert FINISHED.findall(proc.stderr) == [("up", "12", "12"), ("down", "7", "7")]
    assert not FINISHED.findall(proc.stdout)


def test_distributed_server_with_monitor_replaces_the_default_display(tmp_path: Path) -> None:
    proc = _run_script(
        tmp_path,
        """
        server = daisy.Server()
        CLMonitor(server)
        states = server.run_blockwise(task("a", 9) + task("b", 5))
        print("RESULT", sorted((k, s.completed_count) for k, s in states.items()))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RESULT [('a', 9), ('b', 5)]" in proc.stdout
    # the monitor's lines, once per task: the server's own display is not shown as well
    assert FINISHED.findall(proc.stderr) == [("a", "9", "9"), ("b", "5", "5")]
    assert not FINISHED.findall(proc.stdout)


def _serial_task(task_id: str, n: int) -> bellis.Task:
    return bellis.Task(
        task_id,
        total_roi=Roi((0,), (10 * n,)),
        read_roi=Roi((0,), (10,)),
        write_roi=Roi((0,), (10,)),
        process_function=lambda block: None,
        read_write_conflict=False,
    )


def test_monitor_stream_gets_progress_and_each_run_of_the_server(tmp_path: Path) -> None:
    stream = io.StringIO()
    with pytest.warns(DeprecationWarning, match="SerialServer"):
        server = bellis.SerialServer()
    monitor = CLMonitor(server, stream, min_interval_seconds=0)
    assert monitor.server is server
    server.run_blockwise([_serial_task("first", 4)])
    server.run_blockwise([_serial_task("second", 3)])
    text = stream.getvalue()
    assert FINISHED.findall(text) == [("first", "4", "4"), ("second", "3", "3")]
    # with no interval, the progress lines in between are written too
    assert re.search(r"^\[bellis\] first: \d/4 done", text, re.MULTILINE)
    server.unregister_observer(monitor)
    server.run_blockwise([_serial_task("third", 2)])
    assert "third" not in stream.getvalue()


def test_monitor_needs_a_server() -> None:
    with pytest.raises(TypeError, match=r"CLMonitor\(server\).*got object"):
        CLMonitor(object())
