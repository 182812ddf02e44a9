"""errors.jsonl: whole lines, a torn last line skipped, bounded by distinct error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bellis._stats._errorlog import (
    FULL_PER_ERROR,
    ErrorLog,
    ErrorRecord,
    LogReader,
    format_messages,
    frame_of_traceback,
    group_errors,
    group_key,
    line_number,
    line_numbers,
    read_errors,
    records_of_run,
)


def _rec(i: int, message: str = "boom") -> dict[str, object]:
    return {
        "task": "t",
        "block": i,
        "coord": [i],
        "attempt": 1,
        "kind": "raised",
        "type": "ValueError",
        "message": message,
        "where": "f.py:3 in g",
        "traceback": "Traceback ...\nValueError: " + message,
        "time": 1.0,
    }


def test_identical_failures_are_counted_after_the_first_records(tmp_path: Path) -> None:
    log = ErrorLog(tmp_path / "errors.jsonl", run=5.0, full_per_error=10)
    for i in range(100_000):
        log.add(_rec(i))
    log.add(_rec(7, "other"))
    log.close("t")
    assert (tmp_path / "errors.jsonl").stat().st_size < 64 * 1024
    lines = read_errors(tmp_path)
    assert sum("count" not in d for d in lines) == 11
    # one raising line: one group, its two messages counted apart
    (group,) = group_errors(lines)
    assert group.count == 100_001 and group.messages == [("boom", 100_000), ("other", 1)]
    assert group.first is not None and group.first.block_id == 0
    assert group.title == "ValueError (2 distinct messages)"


def test_a_torn_last_line_is_skipped_and_terminated(tmp_path: Path) -> None:
    path = tmp_path / "errors.jsonl"
    log = ErrorLog(path, run=1.0)
    log.add(_rec(1))
    log.close("t")
    with open(path, "ab") as f:
        f.write(b'{"v":1,"run":1.0,"task":"t","blo')  # a crash mid-write
    assert len(read_errors(path)) == 1
    log = ErrorLog(path, run=2.0)
    log.add(_rec(2))
    log.close("t")
    lines = read_errors(path)
    assert [d["block"] for d in lines] == [1, 2]
    assert [d["block"] for d in records_of_run(lines)] == [2]


def test_a_batch_of_failures_fits_the_servers_frame() -> None:
    """64 failures with 64 KiB tracebacks, 8 KiB texts and 2,000-character messages, as a
    catching worker sends them in one request: encoded, they stay under the frame cap."""
    import msgpack

    from bellis._protocol import MAX_CLIENT_FRAME_BYTES
    from bellis._worker import _failure

    used, msg = 0, []
    for k in range(64):
        field = [
            "t" * 8192,
            {"type": "ValueError", "message": "m" * 2000, "traceback": "x" * 65536, "pid": 1},
        ]
        used += _failure.fit(field, used)
        msg += [k, 2, -1, field]
    assert used <= _failure.FRAME_BUDGET + 64 * 4096  # past it, at most ~3 KiB a failure
    assert len(msgpack.packb(msg)) < MAX_CLIENT_FRAME_BYTES // 2
    # the first failures keep their full tracebacks; the later ones fall back to the text
    assert "traceback" in msg[3][1] and "traceback" not in msg[-1][1]


# ------------------------------------------------------------ the per-attempt count path


def _attempts() -> list[tuple[int, str, dict[str, Any] | None]]:
    """(block, text, details) of failed attempts as workers send them: each error's first
    ones with details, the rest as a client sends a repeat (``_failure``): status FAILED
    as its text alone, a raised error with its key only; and server-side texts that name
    their block."""
    from bellis._worker import _failure

    out: list[tuple[int, str, dict[str, Any] | None]] = []
    raised = {"type": "ValueError", "message": "bad", "where": "u.py:3 in f"}
    for i in range(3000):
        if i % 3 == 0:
            full = {"log": "w.err", "log_offset": i, "host": "h", "pid": 1, "traceback": "tb"}
            out.append((i, _failure.STATUS_FAILED_TEXT, full if i < 60 else None))
        elif i % 3 == 1:
            details = {**raised, "traceback": "Traceback\nValueError: bad"} if i < 60 else raised
            out.append((i, "Traceback\nValueError: bad", details))
        else:
            out.append((i, f"block t/{i} lost: boom", None))
    return out


def _feed(tmp_path: Path, name: str, fast: bool) -> tuple[list[dict[str, Any]], int]:
    from bellis._scheduling._attempts import text_key
    from bellis._stats._errorgroups import ErrorCollector

    errors = ErrorCollector()
    errors.sinks = {"t": ErrorLog(tmp_path / name / "errors.jsonl", run=3.0)}
    built = 0
    for i, text, details in _attempts():
        group = errors.add("t", i, text)  # as the dispatcher does: the summary's groups
        if fast and errors.counted("t", text, details, group):
            continue
        d = details or {}
        record = {
            "task": "t",
            "block": i,
            "coord": [i],
            "attempt": 1,
            "kind": "raised" if d.get("type") else "error",
            "type": d.get("type"),
            "message": d.get("message", text.rpartition(" lost: ")[2] or text),
            "where": d.get("where"),
            "traceback": d.get("traceback", text),
            "time": 1.0,
        }
        errors.record(record, text_key("t", text, None, details) if fast else None, group)
        built += 1
    errors.close_sinks()
    return read_errors(tmp_path / name), built


def test_counting_repeats_by_lookup_writes_what_full_records_would(tmp_path: Path) -> None:
    """The dispatcher's path (``ErrorCollector.counted`` first, a record built only when
    it says so) writes the same records and counts as building every attempt's record."""
    (slow, _), (fast, built) = _feed(tmp_path, "slow", False), _feed(tmp_path, "fast", True)
    # the repeats of status FAILED and of the raised error were counted by lookup; the
    # texts that name their block (a server-side loss) are each built
    assert built < 1000 + 2 * 30
    assert [d for d in fast if "count" not in d] == [d for d in slow if "count" not in d]
    got = {g.key: (g.count, g.blocks, len(g.records)) for g in group_errors(fast)}
    assert got == {g.key: (g.count, g.blocks, len(g.records)) for g in group_errors(slow)}
    assert sorted(count for count, _, _ in got.values()) == [1000, 1000, 1000]
    assert all(full == FULL_PER_ERROR for _, _, full in got.values())


def test_a_client_sends_details_no_more_often_than_the_driver_writes_them() -> None:
    """A repeat goes without details only after the driver has all its full records:
    the client's quota per error is at least the driver's."""
    from bellis._worker import _failure

    assert _failure.FULL_PER_ERROR >= FULL_PER_ERROR
    repeats = _failure.Repeats()
    sent = [repeats.full(("ValueError", "bad", None)) for _ in range(3 * FULL_PER_ERROR)]
    assert sent == [True] * _failure.FULL_PER_ERROR + [False] * (
        3 * FULL_PER_ERROR - _failure.FULL_PER_ERROR
    )
    assert [_failure.status_failed(repeats) for _ in range(12)][-1] == "block status set to FAILED"
    assert isinstance(_failure.status_failed(repeats), str)
    assert isinstance(_failure.status_failed(_failure.Repeats()), list)


def test_lone_surrogates_are_escaped_for_the_wire_and_the_file(tmp_path: Path) -> None:
    import msgpack

    from bellis._worker import _failure

    name = os.fsdecode(b"scan_\xff.tif")  # an undecodable byte: a lone surrogate
    try:
        raise OSError(f"cannot open {name}")
    except OSError as exc:
        field = _failure.failure_field(f"OSError: cannot open {name}", {}, exc)
        key = _failure.error_key(exc)
    assert field[1]["message"] == "cannot open scan_\\udcff.tif" == key[1]
    assert field[0] == "OSError: cannot open scan_\\udcff.tif"
    msgpack.unpackb(msgpack.packb(field))  # valid UTF-8 throughout
    assert _failure.clean("plain") == "plain" and _failure.clean("é") == "é"
    # a record an older bellis wrote with the surrogate in it reads back escaped
    (tmp_path / "errors.jsonl").write_text(
        json.dumps({"v": 1, "run": 1.0, "task": "t", "message": f"cannot open {name}"}) + "\n"
    )
    (line,) = read_errors(tmp_path)
    assert line["message"] == "cannot open scan_\\udcff.tif"
    line["message"].encode("utf-8")


def test_a_log_reader_counts_lines_once_per_file(tmp_path: Path) -> None:
    log = tmp_path / "worker_0.err"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(5000)))
    offsets = [0, 7, 8, 500, 20000, len(log.read_bytes()), 10**9]
    records = [
        ErrorRecord.from_json({"task": "t", "block": i, "log": str(log), "log_offset": o})
        for i, o in enumerate(offsets)
    ]
    reader = LogReader(records)
    assert [reader.line(str(log), o) for o in offsets] == [line_number(log, o) for o in offsets]
    assert reader.line(str(log), 9) == 2  # an offset not among the records
    assert line_numbers(tmp_path / "missing.err", [3, 1]) == {1: None, 3: None}
    logs = reader.logs(records[3], err_lines=2)
    assert logs["log_line"] == line_number(log, 500) and len(logs["log_lines"]) == 2


def test_the_summary_line_is_the_last_non_empty_line() -> None:
    """``error_summary_line``'s shortcut agrees with splitting every line boundary."""
    import random

    from bellis._stats._errorgroups import error_summary_line

    def reference(text: str) -> str:
        for line in reversed(text.splitlines()):
            if line.strip():
                return line.strip()
        return "(no error text was captured)"

    rng = random.Random(5)
    parts = ["a", " ", "\n", "\r", "\t", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "b", "\r\n"]
    for _ in range(20000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert error_summary_line(text) == reference(text), repr(text)


def test_the_grouping_rule_is_type_and_raising_line() -> None:
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/w/run.py", line 40, in <module>\n'
        "    go()\n"
        '  File "/w/user.py", line 12, in process\n'
        '    raise ValueError(f"bad data at {x}")\n'
        "ValueError: bad data at 3\n"
    )
    where = frame_of_traceback(tb)
    assert where == "/w/user.py:12 in process"  # the innermost frame, as workers name it
    assert frame_of_traceback("ValueError: no traceback") is None
    assert group_key("ValueError", "bad data at 3", where) == group_key(
        "ValueError", "bad data at 7", where
    )
    assert group_key("ValueError", "x", where) != group_key("KeyError", "x", where)
    # without a frame, the message tells errors apart
    assert group_key("timeout", "a", None) != group_key("timeout", "b", None)
    messages = [(f"bad data at {i}", 2) for i in range(5)]
    assert format_messages(messages) == (
        "'bad data at 0' (2), 'bad data at 1' (2), 'bad data at 2' (2) and 2 more"
    )


def test_records_of_one_raising_line_are_one_group_with_its_messages() -> None:
    def rec(i: int, message: str, where: str) -> dict[str, object]:
        return {
            "task": "t",
            "block": i,
            "coord": [i],
            "run": 1.0,
            "kind": "raised",
            "type": "ValueError",
            "message": message,
            "where": where,
            "traceback": "",
        }

    lines = [rec(i, f"bad data at {i % 3}", "u.py:5 in f") for i in range(6)]
    lines.append(rec(9, "bad data at 0", "u.py:8 in f"))
    first, second = group_errors(lines)
    assert first.count == 6 and first.messages == [
        ("bad data at 0", 2),
        ("bad data at 1", 2),
        ("bad data at 2", 2),
    ]
    assert first.title == "ValueError (3 distinct messages)"
    assert second.count == 1 and second.title == "ValueError: bad data at 0"
    assert first.to_json()["messages"][0] == {"message": "bad data at 0", "count": 2}
