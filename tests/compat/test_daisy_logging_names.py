"""daisy's ``daisy.logging`` names in ``bellis.logging``, with daisy's semantics (issue 14
item 4): ``LOG_BASEDIR``, ``logger``, ``current_slot_files()`` and ``close_all_log_files()``."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import bellis.logging as blog


def test_log_basedir_reads_and_assigns_the_basedir(tmp_path: Path) -> None:
    assert blog.LOG_BASEDIR == blog.get_log_basedir() == tmp_path / "logs"  # conftest's
    blog.set_log_basedir(tmp_path / "elsewhere")
    assert blog.LOG_BASEDIR == tmp_path / "elsewhere"
    # daisy scripts assign the global; that is set_log_basedir
    blog.LOG_BASEDIR = tmp_path / "assigned"
    assert blog.get_log_basedir() == tmp_path / "assigned"
    blog.LOG_BASEDIR = str(tmp_path / "as-text")  # type: ignore[assignment]
    assert blog.get_log_basedir() == tmp_path / "as-text"
    blog.LOG_BASEDIR = None
    assert blog.get_log_basedir() is None and blog.get_log_mode() == "console"
    assert "LOG_BASEDIR" in dir(blog)


def test_logger_is_the_library_logger() -> None:
    assert blog.logger is logging.getLogger("bellis")
    before = blog.logger.level
    try:
        blog.set_log_level("INFO")
        assert blog.logger.level == logging.INFO == blog.get_log_level()
    finally:
        blog.logger.setLevel(before)


def test_no_slot_files_outside_worker_code() -> None:
    assert blog.current_slot_files() is None
    blog.close_all_log_files()  # nothing bound: harmless
    assert blog.current_slot_files() is None


SCRIPT = r"""
import os
import subprocess
import sys

import bellis as daisy

mode, logs, marks = sys.argv[1], sys.argv[2], sys.argv[3]
daisy.logging.LOG_BASEDIR = logs  # daisy's global, assigned as daisy scripts do
if mode.endswith("console"):
    daisy.logging.set_log_mode("console")
CHILD = (
    "import sys; print('child out', sys.argv[1]); "
    "print('child err', sys.argv[1], file=sys.stderr)"
)


def mark(name):
    open(os.path.join(marks, name), "w").close()


def block_function(block):
    sid = block.block_id[1]
    files = daisy.logging.current_slot_files()
    if files is None:
        mark(f"none-{sid}")
        return
    out, err = files
    out.flush()
    err.flush()
    subprocess.run([sys.executable, "-c", CHILD, str(sid)], stdout=out, stderr=err, check=True)
    print(f"buffered {sid}", end="", file=out)
    daisy.logging.close_all_log_files()  # flushes the slot's streams
    with open(os.readlink(f"/proc/self/fd/{out.fileno()}")) as f:
        if f"buffered {sid}" in f.read():
            mark(f"flushed-{sid}")
    print(file=out)
    assert daisy.logging.current_slot_files() == (out, err)


assert daisy.logging.current_slot_files() is None
roi = daisy.Roi((0,), (6,))
block = daisy.Roi((0,), (2,))
task = daisy.Task("slots", roi, block, block, block_function, max_workers=2)
assert daisy.run_blockwise(task, multiprocessing=mode.startswith("distributed"), progress=False)
assert daisy.logging.current_slot_files() is None
"""


def _run(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    script = tmp_path / "slots.py"
    script.write_text(SCRIPT)
    logs, marks = tmp_path / "worker-logs", tmp_path / "marks"
    marks.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(logs), str(marks)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return logs, marks


pytestmark_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/fd"
)


@pytestmark_linux
@pytest.mark.parametrize("mode", ["serial", "distributed"])
def test_a_subprocess_given_the_slot_files_writes_to_the_worker_logs(
    tmp_path: Path, mode: str
) -> None:
    logs, marks = _run(tmp_path, mode)
    out = "".join(p.read_text() for p in sorted(logs.rglob("*.out")))
    err = "".join(p.read_text() for p in sorted(logs.rglob("*.err")))
    for sid in range(3):
        assert f"child out {sid}\n" in out, out
        assert f"child err {sid}\n" in err, err
        assert f"child err {sid}" not in out
    # close_all_log_files() flushed what the block had written so far
    assert sorted(p.name for p in marks.iterdir()) == [f"flushed-{sid}" for sid in range(3)]


@pytest.mark.parametrize("mode", ["serial-console", "distributed-console"])
def test_no_slot_files_in_console_mode(tmp_path: Path, mode: str) -> None:
    logs, marks = _run(tmp_path, mode)
    assert sorted(p.name for p in marks.iterdir()) == [f"none-{sid}" for sid in range(3)]
    assert not list(logs.rglob("*.out"))
