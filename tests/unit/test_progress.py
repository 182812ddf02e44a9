"""Progress observers, their factory, the throttle and safe_notify (SPEC §1.13)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from bellis._run._progress import (
    DEFAULT_PROGRESS_INTERVAL,
    PROGRESS_INTERVAL_ENV,
    JsonProgressObserver,
    PlainProgressObserver,
    ProgressObserver,
    ProgressThrottle,
    TqdmObserver,
    make_observer,
    progress_interval,
    safe_notify,
)
from bellis._state import TaskState
from bellis.errors import ConfigurationError

JSON_KEYS = [
    "t",
    "event",
    "task",
    "total",
    "ready",
    "processing",
    "completed",
    "skipped",
    "failed",
    "orphaned",
    "restarts",
    "failures",
]


def state(task_id: str, total: int = 10, **fields: Any) -> TaskState:
    return TaskState(task_id=task_id, started=True, total_block_count=total, **fields)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TtyStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


class RecordingObserver:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, TaskState]]] = []

    def on_start(self, states: dict[str, TaskState]) -> None:
        self.events.append(("start", states))

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self.events.append(("progress", states))

    def on_finish(self, states: dict[str, TaskState]) -> None:
        self.events.append(("finish", states))


class BrokenObserver(RecordingObserver):
    def on_progress(self, states: dict[str, TaskState]) -> None:
        raise RuntimeError("bar exploded")


# ------------------------------------------------------------------------------- JSON


def test_json_observer_writes_one_line_per_task_per_event() -> None:
    stream = io.StringIO()
    observer = JsonProgressObserver(stream=stream, clock=lambda: 12.5)
    start = {"a": state("a"), "b": state("b", total=4)}
    observer.on_start(start)
    observer.on_progress(
        {
            "a": state(
                "a",
                ready_count=1,
                processing_count=2,
                completed_count=3,
                skipped_count=1,
                failed_count=1,
                orphaned_count=0,
                worker_restart_count=2,
                worker_failure_count=3,
            ),
            "b": state("b", total=4, completed_count=4),
        }
    )
    observer.on_finish({"a": state("a", completed_count=10), "b": state("b", total=4)})
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["event"], r["task"]) for r in records] == [
        ("start", "a"),
        ("start", "b"),
        ("progress", "a"),
        ("progress", "b"),
        ("finish", "a"),
        ("finish", "b"),
    ]
    assert all(list(r) == JSON_KEYS for r in records)
    assert records[2] == {
        "t": 12.5,
        "event": "progress",
        "task": "a",
        "total": 10,
        "ready": 1,
        "processing": 2,
        "completed": 3,
        "skipped": 1,
        "failed": 1,
        "orphaned": 0,
        "restarts": 2,
        "failures": 3,
    }
    assert not stream.closed


def test_json_observer_path_is_written_and_closed_on_finish(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    observer = JsonProgressObserver(path=path)
    observer.on_start({"a": state("a")})
    # line-buffered: the line is on disk before the run ends
    assert json.loads(path.read_text())["event"] == "start"
    observer.on_finish({"a": state("a", completed_count=10)})
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events == ["start", "finish"]
    # a second run through the same observer appends
    observer.on_start({"a": state("a")})
    observer.on_finish({"a": state("a")})
    assert len(path.read_text().splitlines()) == 4


def test_json_observer_rejects_path_and_stream(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^specify path OR stream, not both$"):
        JsonProgressObserver(path=tmp_path / "p", stream=io.StringIO())


def test_json_observer_defaults_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    observer = JsonProgressObserver()
    observer.on_start({"a": state("a")})
    assert json.loads(capsys.readouterr().out)["task"] == "a"


# ------------------------------------------------------------------------------- tqdm


def test_tqdm_observer_descriptions_and_postfix() -> None:
    out = io.StringIO()
    observer = TqdmObserver(["b", "a"], file=out)
    observer.on_start({"a": state("a", total=6), "b": state("b", total=6)})
    first = out.getvalue()
    # bars are created in task order
    assert first.index("b ▶ ♻=0") < first.index("a ▶ ♻=0")
    observer.on_progress(
        {
            "a": state(
                "a",
                total=6,
                processing_count=1,
                completed_count=2,
                worker_restart_count=1,
            ),
            "b": state("b", total=6, completed_count=6),
        }
    )
    text = out.getvalue()
    assert "a ▶ ♻=1" in text
    assert "⧗=3, ▶=1, ✔=2, ✗=0, ∅=0" in text
    assert "2/6" in text
    observer.on_finish(
        {
            "a": state("a", total=6, completed_count=5, failed_count=1, worker_restart_count=1),
            "b": state("b", total=6, completed_count=6, skipped_count=6),
        }
    )
    final = out.getvalue()
    assert "a ✗ ♻=1" in final
    assert "b ✔ ♻=0" in final
    assert "5/6" in final
    assert "6/6" in final


def test_tqdm_observer_final_symbols_for_orphans_and_unfinished() -> None:
    out = io.StringIO()
    observer = TqdmObserver(["a", "b"], file=out)
    states = {
        "a": state("a", total=4, completed_count=3, orphaned_count=1),
        "b": state("b", total=4, completed_count=2, ready_count=2),
    }
    observer.on_start(states)
    observer.on_finish(states)
    assert "a ∅ ♻=0" in out.getvalue()
    assert "b … ♻=0" in out.getvalue()


def test_tqdm_observer_writes_to_the_sys_stderr_in_force_at_each_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second, stdout = io.StringIO(), io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stderr", first)
    observer = TqdmObserver(["a"])
    observer.on_start({"a": state("a", total=4)})
    assert "a ▶ ♻=0" in first.getvalue()
    monkeypatch.setattr("sys.stderr", second)  # a redirect_stderr entered mid-run
    observer.on_finish({"a": state("a", total=4, completed_count=4)})
    assert "a ✔ ♻=0" in second.getvalue() and "a ✔" not in first.getvalue()
    assert stdout.getvalue() == ""


# ------------------------------------------------------------------------------- plain


def test_plain_observer_writes_to_the_sys_stderr_in_force_at_each_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second, stdout = io.StringIO(), io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stderr", first)
    clock = FakeClock(100.0)
    observer = PlainProgressObserver(["a"], min_interval_seconds=1.0, clock=clock)
    observer.on_start({"a": state("a", total=4)})
    clock.now = 102.0
    observer.on_progress({"a": state("a", total=4, completed_count=2)})
    assert first.getvalue().startswith("[bellis] a: 2/4 done")
    monkeypatch.setattr("sys.stderr", second)
    observer.on_finish({"a": state("a", total=4, completed_count=4)})
    assert second.getvalue().startswith("[bellis] a: finished ✔ 4/4 done")
    assert "finished" not in first.getvalue() and stdout.getvalue() == ""


def test_plain_observer_without_a_stderr_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = io.StringIO()
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stderr", None)  # pythonw, or code that silenced stderr
    observer = PlainProgressObserver(["a"], min_interval_seconds=0.0)
    observer.on_start({"a": state("a", total=4)})
    observer.on_finish({"a": state("a", total=4, completed_count=4)})
    assert stdout.getvalue() == ""  # progress never moves to stdout


def test_plain_observer_is_rate_limited_per_task() -> None:
    out = io.StringIO()
    clock = FakeClock(100.0)
    observer = PlainProgressObserver(["seg"], stream=out, min_interval_seconds=10.0, clock=clock)
    observer.on_start({"seg": state("seg", total=5000)})
    assert out.getvalue() == ""

    clock.now = 105.0
    observer.on_progress({"seg": state("seg", total=5000, completed_count=100)})
    assert out.getvalue() == ""  # within the first interval

    clock.now = 110.0
    observer.on_progress(
        {"seg": state("seg", total=5000, completed_count=1200, processing_count=2)}
    )
    assert out.getvalue() == (
        "[bellis] seg: 1200/5000 done (24.0%), 2 processing, 0 failed, 0 orphaned, 120.0 blocks/s\n"
    )

    clock.now = 115.0
    observer.on_progress({"seg": state("seg", total=5000, completed_count=1500)})
    assert len(out.getvalue().splitlines()) == 1  # too soon

    clock.now = 125.0
    unchanged = {"seg": state("seg", total=5000, completed_count=1200, processing_count=2)}
    observer.on_progress(unchanged)
    assert len(out.getvalue().splitlines()) == 1  # nothing changed since the last line

    observer.on_progress({"seg": state("seg", total=5000, completed_count=1500)})
    assert out.getvalue().splitlines()[-1] == (
        "[bellis] seg: 1500/5000 done (30.0%), 0 processing, 0 failed, 0 orphaned, 20.0 blocks/s"
    )

    clock.now = 150.0
    observer.on_finish({"seg": state("seg", total=5000, completed_count=5000)})
    assert out.getvalue().splitlines()[-1] == (
        "[bellis] seg: finished ✔ 5000/5000 done (100.0%), 0 processing, 0 failed, "
        "0 orphaned, 100.0 blocks/s on average"
    )


def test_plain_observer_tasks_are_independent_and_skips_do_not_count_as_rate() -> None:
    out = io.StringIO()
    clock = FakeClock(0.0)
    observer = PlainProgressObserver(["a", "b"], stream=out, min_interval_seconds=10.0, clock=clock)
    observer.on_start({"a": state("a"), "b": state("b")})
    clock.now = 10.0
    observer.on_progress(
        {
            "a": state("a", completed_count=6, skipped_count=4),
            "b": state("b"),
        }
    )
    assert out.getvalue() == (
        "[bellis] a: 6/10 done (60.0%, 4 skipped), 0 processing, 0 failed, 0 orphaned, "
        "0.2 blocks/s\n"
    )
    clock.now = 12.0
    observer.on_finish(
        {
            "a": state("a", completed_count=9, skipped_count=4, failed_count=1),
            "b": state("b", total=0),
        }
    )
    assert out.getvalue().splitlines()[1:] == [
        "[bellis] a: finished ✗ 9/10 done (90.0%, 4 skipped), 0 processing, 1 failed, "
        "0 orphaned, 0.5 blocks/s on average",
        "[bellis] b: finished ✔ 0/0 done (100.0%), 0 processing, 0 failed, 0 orphaned, "
        "0.0 blocks/s on average",
    ]


def test_plain_observer_without_on_start_starts_lazily() -> None:
    out = io.StringIO()
    clock = FakeClock(0.0)
    observer = PlainProgressObserver(["a"], stream=out, min_interval_seconds=0.0, clock=clock)
    observer.on_progress({"a": state("a", completed_count=1)})
    clock.now = 1.0
    observer.on_progress({"a": state("a", completed_count=2)})
    assert out.getvalue() == (
        "[bellis] a: 2/10 done (20.0%), 0 processing, 0 failed, 0 orphaned, 1.0 blocks/s\n"
    )


def test_plain_observer_rejects_a_negative_interval() -> None:
    with pytest.raises(ValueError, match="min_interval_seconds"):
        PlainProgressObserver([], min_interval_seconds=-1)


# ------------------------------------------------------------------------------- factory


def test_make_observer_true_picks_by_tty() -> None:
    assert isinstance(make_observer(True, ["a"], stream=TtyStringIO()), TqdmObserver)
    assert isinstance(make_observer(True, ["a"], stream=io.StringIO()), PlainProgressObserver)


def test_make_observer_true_looks_at_sys_stderr_where_progress_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdout", TtyStringIO())
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert isinstance(make_observer(True, ["a"]), PlainProgressObserver)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setattr("sys.stderr", TtyStringIO())
    assert isinstance(make_observer(True, ["a"]), TqdmObserver)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, 30.0), ("", 30.0), ("5", 5.0), (" 0.5 ", 0.5), ("0", 0.0), ("inf", float("inf"))],
)
def test_progress_interval_comes_from_the_environment(value: str | None, seconds: float) -> None:
    environ = {} if value is None else {PROGRESS_INTERVAL_ENV: value}
    assert DEFAULT_PROGRESS_INTERVAL == 30.0
    assert progress_interval(environ) == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "10s"])
def test_a_bad_progress_interval_is_named_with_its_fix(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        progress_interval({PROGRESS_INTERVAL_ENV: value})
    message = str(info.value)
    assert f"BELLIS_PROGRESS_INTERVAL={value!r}" in message
    assert "BELLIS_PROGRESS_INTERVAL=60" in message and "unset it" in message


def test_plain_lines_are_spaced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_INTERVAL_ENV, raising=False)
    plain = make_observer(True, ["a"], stream=io.StringIO())
    assert isinstance(plain, PlainProgressObserver)
    assert plain.min_interval_seconds == 30.0
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "5")
    plain = make_observer(True, ["a"], stream=io.StringIO())
    assert isinstance(plain, PlainProgressObserver) and plain.min_interval_seconds == 5.0
    # a terminal keeps its live bars, whatever the variable says
    assert isinstance(make_observer(True, ["a"], stream=TtyStringIO()), TqdmObserver)
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "soon")
    for stream in (io.StringIO(), TtyStringIO()):  # a typo is never ignored
        with pytest.raises(ConfigurationError, match="BELLIS_PROGRESS_INTERVAL"):
            make_observer(True, ["a"], stream=stream)


def test_make_observer_off_and_custom() -> None:
    assert make_observer(False, ["a"]) is None
    assert make_observer(None, ["a"]) is None
    custom = RecordingObserver()
    assert make_observer(custom, ["a"]) is custom
    assert isinstance(custom, ProgressObserver)


@pytest.mark.parametrize("bad", [1, "yes", object()])
def test_make_observer_rejects_other_values(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^progress must be True, False, None or an observer"):
        make_observer(bad, ["a"])


# ------------------------------------------------------------------------------- safe_notify


def test_safe_notify_calls_the_method() -> None:
    observer = RecordingObserver()
    states = {"a": state("a")}
    assert safe_notify(observer, "on_start", states) is True
    assert observer.events == [("start", states)]


def test_safe_notify_swallows_and_warns_once_per_observer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = BrokenObserver()
    other = BrokenObserver()
    states = {"a": state("a")}
    with caplog.at_level(logging.WARNING, logger="bellis"):
        assert safe_notify(broken, "on_progress", states) is False
        assert safe_notify(broken, "on_progress", states) is False
        assert safe_notify(other, "on_progress", states) is False
    warnings = [r for r in caplog.records if r.name == "bellis"]
    assert len(warnings) == 2
    assert warnings[0].levelno == logging.WARNING
    assert "RuntimeError: bar exploded" in warnings[0].getMessage()
    assert "on_progress" in warnings[0].getMessage()
    # the other methods of a broken observer still run
    assert safe_notify(broken, "on_finish", states) is True


def test_safe_notify_handles_unhashable_observers(caplog: pytest.LogCaptureFixture) -> None:
    class Unhashable(BrokenObserver):
        __hash__ = None  # type: ignore[assignment]

    broken = Unhashable()
    with caplog.at_level(logging.WARNING, logger="bellis"):
        safe_notify(broken, "on_progress", {})
        safe_notify(broken, "on_progress", {})
    assert len([r for r in caplog.records if r.name == "bellis"]) == 1


def test_safe_notify_survives_a_missing_method(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bellis"):
        assert safe_notify(object(), "on_start", {}) is False
    assert "AttributeError" in caplog.text


# ------------------------------------------------------------------------------- throttle


def test_throttle_fires_at_most_once_per_interval_and_only_when_dirty() -> None:
    throttle = ProgressThrottle(interval=0.5)
    assert throttle.should_fire(10.0, dirty=False) is False
    assert throttle.should_fire(10.0, dirty=True) is True
    assert throttle.should_fire(10.2, dirty=True) is False
    assert throttle.should_fire(10.49, dirty=True) is False
    assert throttle.should_fire(10.5, dirty=False) is False
    assert throttle.should_fire(10.5, dirty=True) is True
    assert throttle.should_fire(11.5, dirty=True) is True


def test_throttle_rejects_a_negative_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        ProgressThrottle(-0.1)
