"""Writers that look up ``sys.stdout`` / ``sys.stderr`` when they write (bellis._streams)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from bellis._streams import StdoutHandler, StreamInForce, write_to_stream


def test_stream_in_force_forwards_to_the_stream_of_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    stream = StreamInForce("stderr")
    assert stream.write("one") == 3
    monkeypatch.setattr(sys, "stderr", second)
    stream.write("two")
    stream.flush()
    assert (first.getvalue(), second.getvalue()) == ("one", "two")
    assert stream.isatty() is False
    assert stream.getvalue() == "two"  # anything else is the stream in force's


def test_stream_in_force_without_a_stream_drops_what_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", None)  # pythonw, or code that silenced stderr
    stream = StreamInForce("stderr")
    assert stream.write("three") == 5
    stream.flush()
    assert stream.isatty() is False
    with pytest.raises(AttributeError, match=r"sys\.stderr is None"):
        stream.fileno()


def test_write_to_stream_uses_the_stream_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    write_to_stream("stdout", "echo\n")
    assert out.getvalue() == "echo\n"
    monkeypatch.setattr(sys, "stdout", None)
    write_to_stream("stdout", "lost\n")  # nowhere to write, and no error


def test_stdout_handler_writes_to_the_sys_stdout_of_each_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", first)
    handler = StdoutHandler()
    log = logging.getLogger("bellis.test_streams")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        log.info("one")
        monkeypatch.setattr(sys, "stdout", second)  # a redirect_stdout after the handler
        log.info("two")
    finally:
        log.removeHandler(handler)
        log.propagate = True
        log.setLevel(logging.NOTSET)
    assert (first.getvalue(), second.getvalue()) == ("one\n", "two\n")
