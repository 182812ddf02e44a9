"""``runs.jsonl``: append one run line, read the last one back, validate the schema.

The line format (schema 2; schema 1 lines, without the GPU figures, are still read) is
documented in ``docs/statistics.md``. Appends are one ``write`` of one line followed by
``fsync``; readers skip a torn last line.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeGuard

__all__ = [
    "BLOCK_STAT_KEYS",
    "COUNTER_KEYS",
    "EXIT_KINDS",
    "MODES",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "WORKER_STAT_KEYS",
    "append_run_line",
    "read_last_run",
    "read_runs",
    "validate_run_line",
]

SCHEMA_VERSION: Final = 2
#: the schemas this version reads: 1 lacks the blocks' gpu_util and gpu_mem
READABLE_SCHEMAS: Final = (1, 2)
OUTCOMES: Final = ("completed", "failed", "interrupted", "abandoned")
MODES: Final = ("distributed", "serial")
EXIT_KINDS: Final = (
    "clean",
    "walltime",
    "timeout",
    "stalled",
    "error",
    "interrupted",
    "preempted",
)
COUNTER_KEYS: Final = (
    "total",
    "completed",
    "skipped",
    "failed",
    "orphaned",
    "worker_failures",
    "worker_restarts",
    "worker_starts",
    "timeout_reclaims",
    "stall_reclaims",
    "backups_started",
    "backups_won",
    "backups_lost",
    "backup_loser_seconds",
    "oom_retries",
    "locality_blocks",
    "locality_local",
    "locality_steps",
    "chunk_reads",
    "chunk_hits",
)
#: counters added after schema 1's first lines: absent from older lines
_NEWER_COUNTERS: Final = (
    "stall_reclaims",
    "backups_started",
    "backups_won",
    "backups_lost",
    "oom_retries",
    "locality_blocks",
    "locality_local",
    "locality_steps",
    "chunk_reads",
    "chunk_hits",
)
BLOCK_STAT_KEYS: Final = (
    "round_trip",
    "wall",
    "cpu",
    "cpu_children",
    "peak_rss",
    "io_read",
    "io_write",
    "overhead",
    "gpu_util",
    "gpu_mem",
)
WORKER_STAT_KEYS: Final = ("startup", "launch", "setup", "idle", "teardown", "task_setup")


# ----------------------------------------------------------------------- runs.jsonl


def append_run_line(path: str | os.PathLike[str], report_json: Mapping[str, Any]) -> None:
    """Append one run line to ``path`` (creating parent directories), then fsync.

    The line is written with one ``write`` on an ``O_APPEND`` descriptor. A torn last
    line left by a crash is terminated first so that it cannot swallow the new one.
    Raises ValueError for a non-finite number (the line must stay valid JSON).
    """
    line = json.dumps(report_json, allow_nan=False, separators=(",", ":")) + "\n"
    data = line.encode("utf-8")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        size = os.fstat(fd).st_size
        if size > 0:
            with open(p, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    data = b"\n" + data
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) else None


def read_last_run(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last valid run line of ``path``; None if the file is missing or has none.

    Invalid trailing lines (a line torn by a crash) are skipped. The file is read
    backwards in chunks, so a long history costs nothing.
    """
    try:
        f = open(path, "rb")  # closed by the with below; read backwards in chunks
    except FileNotFoundError:
        return None
    with f:
        end = f.seek(0, os.SEEK_END)
        chunk = 1 << 16
        tail = b""
        pos = end
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            lines = tail.split(b"\n")
            # lines[0] may be cut unless we reached the start of the file
            complete = lines if pos == 0 else lines[1:]
            for raw in reversed(complete):
                d = _parse_line(raw)
                if d is not None:
                    return d
            tail = lines[0] if pos > 0 else b""
    return None


def read_runs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every valid run line of ``path``, oldest first (invalid lines left out)."""
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except FileNotFoundError:
        return []
    return [d for d in map(_parse_line, raw_lines) if d is not None]


# ----------------------------------------------------------------------- validation


def _is_num(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check(d: Mapping[str, Any], where: str, spec: Mapping[str, str], out: list[str]) -> None:
    """Check the keys of ``d`` against ``spec``: key -> count | num | num? | stat | stat?."""
    for key, kind in spec.items():
        v, at = d.get(key), f"{where}{key}"
        if kind.endswith("?") and v is None:
            continue
        if kind.startswith("count") and not _is_count(v):
            out.append(f"{at}: must be an integer >= 0, got {v!r}")
        elif kind.startswith("num") and not (_is_num(v) and v >= 0):
            out.append(f"{at}: must be a number >= 0, got {v!r}")
        elif kind == "snum?" and not _is_num(v):
            out.append(f"{at}: must be a finite number or null, got {v!r}")
        elif kind.startswith("stat"):
            if not isinstance(v, dict):
                out.append(f"{at}: must be a stat object, got {v!r}")
                continue
            bad = [k for k in ("mean", "std", "min", "max", "total") if not _is_num(v.get(k))]
            if not _is_count(v.get("n")) or bad:
                out.append(f"{at}: n must be an integer >= 0 and {bad} finite numbers")
            elif v["std"] < 0 or (v["n"] > 0 and v["min"] > v["max"]):
                out.append(f"{at}: std < 0 or min > max")


_RECORD_SPEC: Final = {
    "worker_id": "count",
    "blocks": "count",
    "blocks_failed": "count",
    "slot": "count?",
    "idle": "stat",
    "compute": "stat",
    **{k: "num?" for k in ("startup", "launch", "setup", "final_wait", "teardown", "task_setup")},
}


def validate_run_line(d: Any) -> list[str]:
    """Problems of one run line against its schema, 1 or 2 (empty: valid). Unknown keys are
    allowed."""
    if not isinstance(d, dict):
        return [f"a run line must be a JSON object, got {type(d).__name__}"]
    out: list[str] = []
    if d.get("schema") not in READABLE_SCHEMAS:
        out.append(f"schema: must be one of {READABLE_SCHEMAS}, got {d.get('schema')!r}")
    if not isinstance(d.get("task_id"), str):
        out.append("task_id: must be a string")
    if d.get("outcome") not in OUTCOMES:
        out.append(f"outcome: must be one of {OUTCOMES}, got {d.get('outcome')!r}")
    if d.get("mode") not in MODES:
        out.append(f"mode: must be one of {MODES}, got {d.get('mode')!r}")
    if not isinstance(d.get("resource_tracking"), bool):
        out.append("resource_tracking: must be a boolean")
    spec = {"run_started_at": "num?", "run_finished_at": "num?", "wall_seconds": "num"}
    spec |= {"first_sent_at": "num?", "last_returned_at": "num?"}  # newer: the task's own span
    _check(d, "", spec, out)
    code = d.get("code")
    if code is not None and (
        not isinstance(code, dict)
        or not isinstance(code.get("hash"), str)
        or not (code.get("index") is None or _is_count(code.get("index")))
    ):
        out.append("code: must be an object with a string hash and a count or null index")
    cache = d.get("input_cache")  # newer: a task with declared inputs
    if cache is not None:
        if isinstance(cache, dict):
            _check(cache, "input_cache.", dict.fromkeys(cache, "count"), out)
        else:
            out.append("input_cache: must be an object")
    sections = {k: d.get(k) for k in ("counters", "blocks", "workers")}
    for key, v in sections.items():
        if not isinstance(v, dict):
            out.append(f"{key}: must be an object")
    counters, blocks, workers = (v if isinstance(v, dict) else None for v in sections.values())
    if counters is not None:
        spec = dict.fromkeys(COUNTER_KEYS, "count") | dict.fromkeys(_NEWER_COUNTERS, "count?")
        spec["backup_loser_seconds"] = "num?"  # seconds, not a count
        _check(counters, "counters.", spec, out)
    if blocks is not None:
        spec = {"count": "count", "skipped": "count", "failed_attempts": "count"}
        spec |= dict.fromkeys(BLOCK_STAT_KEYS, "stat?")
        spec |= {"io_read_bytes": "count?", "io_write_bytes": "count?"}
        _check(blocks, "blocks.", spec | {"trend_ms_per_block": "snum?"}, out)
        rt, count = blocks.get("round_trip"), blocks.get("count")
        if isinstance(rt, dict) and _is_count(rt.get("n")) and _is_count(count):
            if rt["n"] > count:
                out.append("blocks.round_trip.n: more samples than blocks.count")
    if workers is None:
        return out
    spec = {"count": "count", "unmanaged_clients": "count"}
    _check(workers, "workers.", spec | dict.fromkeys(WORKER_STAT_KEYS, "stat?"), out)
    exits = workers.get("exits")
    if not isinstance(exits, dict):
        out.append("workers.exits: must be an object")
    else:
        out.extend(f"workers.exits: unknown exit kind {k!r}" for k in exits if k not in EXIT_KINDS)
        _check(exits, "workers.exits.", dict.fromkeys(exits, "count"), out)
    records = workers.get("records")
    if not isinstance(records, list):
        out.append("workers.records: must be a list")
        return out
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            out.append(f"workers.records[{i}]: must be an object")
            continue
        _check(r, f"workers.records[{i}].", _RECORD_SPEC, out)
        ex = r.get("exit")
        if ex is not None and ex not in EXIT_KINDS:
            out.append(f"workers.records[{i}].exit: must be one of {EXIT_KINDS} or null")
        if r.get("teardown") is not None and ex != "clean":
            out.append(f"workers.records[{i}].teardown: only clean exits have a teardown")
    if _is_count(workers.get("count")) and len(records) != workers["count"]:
        out.append(f"workers.records: {len(records)} records for count {workers['count']}")
    return out
