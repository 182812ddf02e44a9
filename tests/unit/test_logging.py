"""The ``bellis.logging`` module (SPEC §1.14, §6.4)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

import bellis.logging as blog
from bellis.errors import WorkerStartError

SEPARATOR = re.compile(r"^=== bellis run \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d pid \d+ ===$")


@pytest.fixture(autouse=True)
def restore_settings() -> Iterator[None]:
    saved = dict(vars(blog._settings))
    level = logging.getLogger("bellis").level
    yield
    vars(blog._settings).update(saved)
    logging.getLogger("bellis").setLevel(level)


def raise_and_capture(
    exc: BaseException,
) -> tuple[type[BaseException], BaseException, TracebackType]:
    try:
        raise exc
    except BaseException as caught:
        info = sys.exc_info()
        assert info[0] is not None and info[2] is not None
        return info[0], caught, info[2]


# ------------------------------------------------------------------------------- settings


def test_defaults_match_daisy(monkeypatch: pytest.MonkeyPatch) -> None:
    # the autouse fixture points the log dir at tmp_path; check a fresh settings object
    monkeypatch.setattr(blog, "_settings", blog._Settings())
    assert blog.get_log_basedir() == Path("./daisy_logs")
    assert blog.get_log_mode() == "file"
    assert blog.get_traceback_style() == "plain"
    assert blog.get_worker_log_basename(3, "a") == Path("daisy_logs/a/worker_3")
    assert blog.get_worker_log_basename(3) == Path("daisy_logs/worker_3")


def test_none_basedir_is_console_mode(tmp_path: Path) -> None:
    blog.set_log_basedir(None)
    assert blog.get_log_basedir() is None
    assert blog.get_log_mode() == "console"
    assert blog.get_worker_log_basename(0, "a") is None
    assert blog.clear_logs() is None
    assert blog.open_worker_log("a", 0) is None
    # the mode set earlier comes back with a basedir
    blog.set_log_basedir(tmp_path)
    assert blog.get_log_mode() == "file"


def test_set_log_mode_validates_with_the_daisy_message() -> None:
    for mode in ("console", "file", "both"):
        blog.set_log_mode(mode)
        assert blog.get_log_mode() == mode
    with pytest.raises(ValueError) as info:
        blog.set_log_mode("x")
    assert str(info.value) == "mode must be one of ('console', 'file', 'both'), got 'x'"


def test_console_mode_writes_no_files(tmp_path: Path) -> None:
    blog.set_log_basedir(tmp_path / "logs")
    blog.set_log_mode("console")
    assert blog.get_worker_log_basename(1, "a") is None
    assert blog.open_worker_log("a", 1) is None
    assert not (tmp_path / "logs").exists()


def test_log_level_is_the_bellis_loggers() -> None:
    blog.set_log_level("INFO")
    assert blog.get_log_level() == logging.INFO
    assert logging.getLogger("bellis").level == logging.INFO
    blog.set_log_level(logging.DEBUG)
    assert blog.get_log_level() == logging.DEBUG


def test_no_handlers_are_installed() -> None:
    assert logging.getLogger("bellis").handlers == []


# ------------------------------------------------------------------------------- directory names


@pytest.mark.parametrize(
    ("task_id", "dirname"),
    [
        ("seg", "seg"),
        ("my task: ünïcode", "my task: ünïcode"),
        ("a/b", "a%2Fb"),
        ("a\\b", "a%5Cb"),
        ("a\0b", "a%00b"),
        (".hidden", "%2Ehidden"),
        ("..", "%2E."),
        ("a.b.", "a.b."),
        ("50%", "50%25"),
        ("", "%"),
    ],
)
def test_task_log_dirname_is_readable(task_id: str, dirname: str) -> None:
    assert blog.task_log_dirname(task_id) == dirname


def test_task_log_dirname_is_injective_on_tricky_ids() -> None:
    ids = ["a/b", "a%2Fb", "a%252Fb", ".a", "%2Ea", "", "%", "%25", "a\\b", "a%5Cb"]
    names = [blog.task_log_dirname(task_id) for task_id in ids]
    assert len(set(names)) == len(ids)
    assert all("/" not in name and "\\" not in name and "\0" not in name for name in names)


def test_task_log_dirname_shortens_long_ids_distinctly() -> None:
    first = blog.task_log_dirname("x" * 300 + "1")
    second = blog.task_log_dirname("x" * 300 + "2")
    assert first != second
    assert len(first.encode()) <= 200
    assert first.startswith("x" * 150)
    assert "%~" in first
    wide = blog.task_log_dirname("ü" * 300)
    assert len(wide.encode()) <= 200


def test_task_log_dirname_is_used_for_log_paths() -> None:
    blog.set_log_basedir("daisy_logs")
    assert blog.get_worker_log_basename(2, "a/b") == Path("daisy_logs/a%2Fb/worker_2")


# ------------------------------------------------------------------------------- files


def test_open_worker_log_creates_files_and_separates_runs(tmp_path: Path) -> None:
    blog.set_log_basedir(tmp_path)
    paths = blog.open_worker_log("seg", 0, pid=4242)
    assert paths == (tmp_path / "seg" / "worker_0.out", tmp_path / "seg" / "worker_0.err")
    out, err = paths
    assert out.read_text() == "" and err.read_text() == ""  # empty files get no separator

    out.write_text("first run output")  # no trailing newline
    err.write_text("first run error\n")
    blog.open_worker_log("seg", 0, pid=4242)
    out_lines = out.read_text().splitlines()
    err_lines = err.read_text().splitlines()
    assert out_lines[0] == "first run output"
    assert SEPARATOR.match(out_lines[1])
    assert out_lines[1].endswith("pid 4242 ===")
    assert err_lines[0] == "first run error"
    assert SEPARATOR.match(err_lines[1])
    assert len(err_lines) == 2


def test_open_worker_log_defaults_to_this_pid(tmp_path: Path) -> None:
    blog.set_log_basedir(tmp_path)
    out, _ = blog.open_worker_log("t", 1) or (None, None)
    assert out is not None
    out.write_text("x\n")
    blog.open_worker_log("t", 1)
    assert out.read_text().splitlines()[1].endswith(f"pid {os.getpid()} ===")


def test_open_worker_log_reports_an_unwritable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    blog.set_log_basedir(blocker)
    with pytest.raises(WorkerStartError, match="cannot create the worker log files") as info:
        blog.open_worker_log("a", 0)
    assert info.value.task_id == "a"
    assert isinstance(info.value.__cause__, OSError)


def test_clear_logs_one_task_or_all(tmp_path: Path) -> None:
    blog.set_log_basedir(tmp_path / "logs")
    blog.open_worker_log("a", 0)
    blog.open_worker_log("b/c", 0)
    assert blog.clear_logs("b/c") == tmp_path / "logs" / "b%2Fc"
    assert not (tmp_path / "logs" / "b%2Fc").exists()
    assert (tmp_path / "logs" / "a" / "worker_0.out").exists()
    assert blog.clear_logs("never-ran") == tmp_path / "logs" / "never-ran"
    assert blog.clear_logs() == tmp_path / "logs"
    assert not (tmp_path / "logs").exists()


def test_emit_failure_writes_to_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    blog.emit_failure("block ('a', 3) failed: boom\n")
    assert err.getvalue() == "block ('a', 3) failed: boom\n"
    err.close()
    blog.emit_failure("nowhere to go")  # a closed stream does not raise


# ------------------------------------------------------------------------------- tracebacks


def user_function() -> None:
    raise ValueError("boom")


def test_format_traceback_plain() -> None:
    exc_type, exc, tb = raise_and_capture(KeyError("k"))
    text = blog.format_traceback(exc_type, exc, tb)
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("KeyError: 'k'\n")
    assert "raise_and_capture" in text


def test_format_traceback_strips_leading_bellis_frames() -> None:
    exc_type, exc, tb = _traceback_with_bellis_prefix(user_function)
    text = blog.format_traceback(exc_type, exc, tb)
    assert "_runner_stand_in.py" not in text
    assert "user_function" in text
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("ValueError: boom\n")


def test_format_traceback_keeps_bellis_frames_when_nothing_else_is_left() -> None:
    def fail_inside() -> None:
        raise AssertionError("never called")

    exc_type, exc, tb = _traceback_with_bellis_prefix(fail_inside, include_user_frame=False)
    text = blog.format_traceback(exc_type, exc, tb)
    assert "_runner_stand_in.py" in text
    assert text.endswith("ZeroDivisionError: division by zero\n")


def _traceback_with_bellis_prefix(
    function: Callable[[], None], *, include_user_frame: bool = True
) -> tuple[type[BaseException], BaseException, TracebackType]:
    """An exception whose traceback starts with a frame in a file inside the bellis package.

    Code compiled under a bellis file name stands in for bellis's own wrapper around the
    user function. Without ``include_user_frame`` the traceback holds only that frame.
    """
    package_dir = Path(blog.__file__).parent
    source = "def wrapper(f):\n    f()\n" if include_user_frame else "def wrapper(f):\n    1 / 0\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, str(package_dir / "_runner_stand_in.py"), "exec"), namespace)
    try:
        namespace["wrapper"](function)
    except Exception as caught:
        tb = caught.__traceback__
        assert tb is not None and tb.tb_next is not None
        # drop this helper's own frame so the stand-in frame is the first one
        return type(caught), caught, tb.tb_next
    raise AssertionError("the wrapper did not raise")


def test_format_traceback_rewrites_ipython_cells() -> None:
    source = "def cell_function():\n    raise RuntimeError('in a cell')\n"
    namespace: dict[str, object] = {}
    exec(compile(source, "<ipython-input-7-0a1b2c3d4e5f>", "exec"), namespace)
    try:
        namespace["cell_function"]()  # type: ignore[operator]
    except RuntimeError:
        info = sys.exc_info()
    text = blog.format_traceback(*info)
    assert "File [notebook cell 7], line 2, in cell_function" in text
    assert "ipython-input" not in text


def test_format_traceback_never_raises() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    exc_type, exc, tb = raise_and_capture(Unprintable())
    text = blog.format_traceback(exc_type, exc, tb)
    assert "Unprintable" in text
    assert blog.format_traceback(None, None, None).strip() == "NoneType: None"
    weird = blog.format_traceback(object, "not an exception", None)  # type: ignore[arg-type]
    assert isinstance(weird, str) and weird


def test_format_traceback_show_locals() -> None:
    blog.set_traceback_style("plain", show_locals=True)

    def with_local() -> None:
        secret_value = 41 + 1
        raise ValueError(secret_value)

    try:
        with_local()
    except ValueError:
        info = sys.exc_info()
    assert "secret_value = 42" in blog.format_traceback(*info)


def test_set_traceback_style_validates() -> None:
    with pytest.raises(ValueError, match="style must be 'plain' or 'rich', got 'fancy'"):
        blog.set_traceback_style("fancy")
    with pytest.raises(ValueError, match="width"):
        blog.set_traceback_style("plain", width=5)
    with pytest.raises(ValueError, match="extra_lines"):
        blog.set_traceback_style("plain", extra_lines=-1)


def test_rich_style_needs_rich() -> None:
    try:
        import rich  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install rich"):
            blog.set_traceback_style("rich")
        assert blog.get_traceback_style() == "plain"
    else:
        blog.set_traceback_style("rich", width=80)
        assert blog.get_traceback_style() == "rich"
        exc_type, exc, tb = raise_and_capture(ValueError("rich boom"))
        assert "rich boom" in blog.format_traceback(exc_type, exc, tb)


def test_cap_traceback_keeps_short_text() -> None:
    text = "Traceback\n  line\nValueError: x\n"
    assert blog.cap_traceback(text) == text


def test_cap_traceback_keeps_the_last_50_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(120))
    capped = blog.cap_traceback(text)
    lines = capped.splitlines()
    assert lines[0] == "... (traceback truncated) ..."
    assert lines[1:] == [f"line {i}" for i in range(70, 120)]


def test_cap_traceback_keeps_the_last_8192_bytes_in_whole_lines() -> None:
    text = "\n".join("é" * 300 for _ in range(40)) + "\nValueError: last"
    capped = blog.cap_traceback(text)
    body = capped.split("\n", 1)[1]
    assert capped.startswith("... (traceback truncated) ...\n")
    assert len(body.encode()) <= 8192
    assert body.endswith("ValueError: last")
    assert all(line == "é" * 300 for line in body.splitlines()[:-1])


def test_cap_traceback_cuts_one_huge_line_on_a_character_boundary() -> None:
    text = "ValueError: " + "ü" * 10_000
    body = blog.cap_traceback(text).split("\n", 1)[1]
    assert body == "ü" * 4096


# ------------------------------------------------------------------------------- export / apply


def test_export_and_apply_round_trip(tmp_path: Path) -> None:
    blog.set_log_basedir(tmp_path / "logs")
    blog.set_log_mode("both")
    blog.set_log_level(logging.INFO)
    blog.set_traceback_style("plain", show_locals=True, width=120, extra_lines=4)
    exported = blog.export_settings()
    assert json.loads(json.dumps(exported)) == exported
    assert exported == {
        "log_basedir": str(tmp_path / "logs"),
        "log_mode": "both",
        "log_level": logging.INFO,
        "traceback_style": "plain",
        "traceback_show_locals": True,
        "traceback_width": 120,
        "traceback_extra_lines": 4,
    }

    blog.set_log_basedir(None)
    blog.set_log_mode("file")
    blog.set_log_level(logging.ERROR)
    blog.set_traceback_style("plain")
    blog.apply_settings(exported)
    assert blog.export_settings() == exported
    assert blog.get_log_basedir() == tmp_path / "logs"


def test_export_makes_a_relative_basedir_absolute() -> None:
    blog.set_log_basedir("daisy_logs")
    exported = blog.export_settings()
    assert exported["log_basedir"] == os.path.abspath("daisy_logs")


def test_apply_settings_console_and_partial() -> None:
    blog.apply_settings({"log_basedir": None})
    assert blog.get_log_mode() == "console"
    blog.apply_settings({})
    assert blog.get_log_basedir() is None


def test_apply_settings_rejects_unknown_and_invalid_keys() -> None:
    with pytest.raises(ValueError, match="unknown log settings: 'colour'"):
        blog.apply_settings({"colour": True})
    with pytest.raises(ValueError, match="mode must be one of"):
        blog.apply_settings({"log_mode": "loud"})


def test_apply_settings_falls_back_to_plain_without_rich() -> None:
    blog.apply_settings({"traceback_style": "rich", "traceback_width": 90})
    try:
        import rich  # noqa: F401
    except ImportError:
        assert blog.get_traceback_style() == "plain"
    else:
        assert blog.get_traceback_style() == "rich"
    assert blog.export_settings()["traceback_width"] == 90
