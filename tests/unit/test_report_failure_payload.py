"""The report's Failures section and block details, from written ``errors.jsonl`` files:
the page's bounds (attempts, bytes, one of each distinct error in turn), escaping, and the
lines of a store without records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bellis._report._data import StoreData
from bellis._report._failures import (
    failure_payload,
    failures_of,
    failures_section,
    payload_json,
)


def _store(path: Path, failures: int = 0) -> StoreData:
    f = np.zeros(40, dtype=np.uint32)
    f[:failures] = 1
    return StoreData("seg", path, (4, 10), np.zeros(40, dtype=bool), f, {}, [])


def _record(i: int, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "run": 100.0,
        "task": "seg",
        "block": i,
        "coord": [i // 10, i % 10],
        "attempt": 1,
        "time": 101.0,
        "kind": "raised",
        "type": "ValueError",
        "message": message,
        "where": f"user.py:{len(message)} in process",  # a line per message: a group each
        "traceback": f"Traceback (most recent call last):\nValueError: {message}\n",
        **extra,
    }


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "errors.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))


def test_the_page_bound_leaves_every_error_some_attempts(tmp_path: Path) -> None:
    lines = [_record(i, "common") for i in range(30)] + [_record(35, "rare")]
    _write(tmp_path, lines)
    found = failures_of([_store(tmp_path, 31)])
    assert [g.count for g in found[0].groups] == [30, 1]
    payload = failure_payload(found, max_attempts=4)
    assert payload["embedded"] == 4 and payload["omitted"] == 27
    blocks = payload["stores"]["0"]["blocks"]
    assert "3,5" in blocks  # the rare error got its turn
    assert sum(len(a) for a in blocks.values()) == 4
    section = failures_section(found, payload)
    assert "27 recorded attempt(s) are not embedded" in section
    assert section.count('class="error-row"') == 2


def test_the_byte_bound(tmp_path: Path) -> None:
    _write(tmp_path, [_record(i, "x" * 1000) for i in range(20)])
    payload = failure_payload(failures_of([_store(tmp_path, 20)]), max_bytes=5000)
    assert 1 <= payload["embedded"] < 5
    assert payload["embedded"] + payload["omitted"] == 20


def test_run_text_is_escaped(tmp_path: Path) -> None:
    evil = "</script><script>alert(1)</script><!-- & <b>"
    _write(tmp_path, [_record(0, evil, where=f"x.py:1 in <module> {evil}")])
    found = failures_of([_store(tmp_path, 1)])
    payload = failure_payload(found)
    section = failures_section(found, payload)
    assert evil not in section and "<script>" not in section
    assert "&lt;/script&gt;" in section
    text = payload_json(payload)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["stores"]["0"]["blocks"]["0,0"][0]["message"] == evil


def test_a_store_without_records_says_why(tmp_path: Path) -> None:
    counted = failures_of([_store(tmp_path / "a", 3)])
    section = failures_section(counted, failure_payload(counted))
    assert "3 failed attempt(s) counted, but none recorded" in section
    assert "no traceback is known" in section
    clean = failures_of([_store(tmp_path / "b")])
    section = failures_section(clean, failure_payload(clean))
    assert "seg: no failed attempt was recorded (no errors.jsonl)." in section
    assert 'id="failures-detail"' not in section


def test_an_attempt_carries_its_log_lines(tmp_path: Path) -> None:
    err = tmp_path / "worker_0.err"
    err.write_text("earlier\nblock failed: boom\nTraceback ...\n")
    out = tmp_path / "worker_0.out"
    out.write_text("start block 7\n")
    rec = _record(7, "boom", log=str(err), log_offset=len("earlier\n"), out_log=str(out))
    rec["out_offset"] = out.stat().st_size
    _write(tmp_path / "store", [rec])
    payload = failure_payload(failures_of([_store(tmp_path / "store", 1)]))
    (a,) = payload["stores"]["0"]["blocks"]["0,7"]
    assert a["log_line"] == 2
    assert a["log_lines"] == ["block failed: boom", "Traceback ..."]
    assert a["out_lines"] == ["start block 7"]
