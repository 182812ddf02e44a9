"""errors.jsonl: whole lines, a torn last line skipped, bounded by distinct error."""

from __future__ import annotations

from pathlib import Path

from bellis._stats._errorlog import ErrorLog, group_errors, read_errors, records_of_run


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
    groups = {g.key[1]: g for g in group_errors(lines)}
    assert groups["boom"].count == 100_000 and groups["other"].count == 1
    assert groups["boom"].first is not None and groups["boom"].first.block_id == 0


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
