"""Worker exit kinds are one ``ExitKind`` enum whose members equal the strings the stored
formats spell: what runs.jsonl, the summary and the report read stays byte-identical."""

from __future__ import annotations

import json
import logging

import msgpack

from bellis._protocol import ExitKind, WorkerExit, is_oom_exit
from bellis._stats._runlog import EXIT_KINDS
from bellis._stats._timeline import TimelineSet


def test_the_stored_exit_kinds_are_the_enum_in_order() -> None:
    assert EXIT_KINDS == tuple(ExitKind)
    assert [str(k) for k in ExitKind] == list(EXIT_KINDS)


def test_a_kind_is_written_as_its_string() -> None:
    ts = TimelineSet()
    for i, kind in enumerate(ExitKind):
        ts.spawned(i, 0.0).exited(1.0, kind)
    j = ts.to_json()
    plain = {k: 1 for k in EXIT_KINDS}
    assert json.dumps(j["exits"]) == json.dumps(plain)
    assert json.dumps([r["exit"] for r in j["records"]]) == json.dumps(list(EXIT_KINDS))
    assert msgpack.packb(j["exits"]) == msgpack.packb(plain)
    assert f"{ExitKind.TIMEOUT} {ExitKind.STALLED:>8}" == "timeout  stalled"
    record = logging.makeLogRecord({"msg": "exit %s", "args": (ExitKind.PREEMPTED,)})
    assert record.getMessage() == "exit preempted"  # as the log writes it


def test_an_oom_exit_is_an_error_kind() -> None:
    assert is_oom_exit(WorkerExit(ExitKind.ERROR, -9, "out of memory: killed"))
    assert not is_oom_exit(WorkerExit(ExitKind.TIMEOUT, 87, "out of memory?"))
    assert not is_oom_exit(None)
