"""Observers attached to a server: what a run is told to notify (bellis._run._observers)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bellis._run._observers import ObserverFanOut, ObserverRegistry, run_observed
from bellis._state import TaskState


class Recorder:
    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def on_start(self, states: dict[str, TaskState]) -> None:
        self.log.append(f"{self.name}.start")

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self.log.append(f"{self.name}.progress")

    def on_finish(self, states: dict[str, TaskState]) -> None:
        self.log.append(f"{self.name}.finish")


class Broken(Recorder):
    def on_start(self, states: dict[str, TaskState]) -> None:
        raise RuntimeError("bar exploded")


def test_nothing_attached_leaves_progress_as_given() -> None:
    registry = ObserverRegistry()
    marker: Any = object()
    assert registry.progress_for(True) is True
    assert registry.progress_for(False) is False
    assert registry.progress_for(marker) is marker


def test_attached_observers_replace_the_default_and_join_an_explicit_one() -> None:
    log: list[str] = []
    registry = ObserverRegistry()
    first, second = Recorder(log, "a"), Recorder(log, "b")
    registry.register(first)
    registry.register(second)
    registry.register(first)  # once only
    assert registry.observers == [first, second]

    for progress in (True, False, None):
        fan = registry.progress_for(progress)
        assert isinstance(fan, ObserverFanOut) and fan.observers == [first, second]
    explicit = Recorder(log, "x")
    fan = registry.progress_for(explicit)
    fan.on_start({})
    fan.on_finish({})
    assert log == ["x.start", "a.start", "b.start", "x.finish", "a.finish", "b.finish"]

    registry.unregister(first)
    registry.unregister(first)  # detaching twice is a no-op
    assert registry.observers == [second]


def test_a_failing_observer_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    fan = ObserverFanOut([Broken(log, "broken"), Recorder(log, "ok")])
    with caplog.at_level(logging.WARNING, logger="bellis"):
        fan.on_start({})
    assert log == ["ok.start"]
    assert "bar exploded" in caplog.text


def test_only_observer_objects_can_be_attached() -> None:
    registry = ObserverRegistry()
    with pytest.raises(TypeError, match=r"on_start.*got bool"):
        registry.register(True)
    registry.register(Recorder([], "a"))
    with pytest.raises(TypeError, match="progress must be True"):
        registry.progress_for(42)


def test_run_observed_tells_the_observer_even_when_the_run_raises() -> None:
    log: list[str] = []
    blocks: list[str] = []

    def run(on_block: Any) -> None:
        assert on_block is not None
        on_block()  # the first block: a progress notification is due
        on_block()  # within the interval: none
        blocks.append("ran")
        raise KeyError("block failed")

    with pytest.raises(KeyError, match="block failed"):
        run_observed(Recorder(log, "m"), dict, run, interval_seconds=60.0)
    assert blocks == ["ran"]
    assert log == ["m.start", "m.progress", "m.progress", "m.finish"]


def test_run_observed_without_an_observer_passes_no_callback() -> None:
    seen: list[Any] = []
    run_observed(None, dict, seen.append)
    assert seen == [None]
