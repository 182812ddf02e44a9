"""``bellis status PATH --failed`` and ``--block 3,7,2``: the error records of a task
(``errors.jsonl``, :mod:`bellis._stats._errorlog`) grouped by distinct error, or one
block's history with the log lines of each attempt."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from .._stats._errorlog import (
    ERRORS_FILE,
    ErrorRecord,
    LogReader,
    format_messages,
    group_errors,
    read_errors,
    records_of_run,
)
from ..errors import TrackingError

__all__ = ["error_folders", "format_block", "format_failed", "parse_coord"]

#: tracebacks shown per group, in lines (the JSON has them whole)
_SHOWN_TRACEBACK_LINES = 40
_OUT_LINES = 10


def parse_coord(text: str) -> tuple[int, ...]:
    """``"3,7,2"`` (or ``"3 7 2"``, ``"(3, 7, 2)"``) as a coordinate."""
    parts = text.strip().strip("()[]").replace(",", " ").split()
    try:
        coord = tuple(int(p) for p in parts)
    except ValueError:
        coord = ()
    if not coord:
        raise TrackingError(f"--block takes a grid coordinate such as 3,7,2, not {text!r}")
    return coord


def error_folders(path: str | Path) -> list[Path]:
    """The folders under ``path`` that hold error records: a task's store or log folder,
    or the stores and folders directly under a basedir."""
    p = Path(path)
    if not p.exists():
        raise TrackingError(f"no such file or folder: {p}", path=str(p))
    if p.is_file():
        return [p.parent]
    if (p / ERRORS_FILE).exists() or (p / "zarr.json").exists():
        return [p]
    found = sorted(c for c in p.iterdir() if c.is_dir() and (c / ERRORS_FILE).exists())
    if not found:
        found = sorted(c for c in p.iterdir() if c.is_dir() and (c / "zarr.json").exists())
    if not found:
        raise TrackingError(f"no error records ({ERRORS_FILE}) under {p}", path=str(p))
    return found


def _when(t: float | None) -> str:
    if not t:
        return "?"
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _log_place(log: str | None, offset: int | None, line: int | None) -> str | None:
    if log is None:
        return None
    if offset is None:
        return log
    return f"{log}, line {line}" if line is not None else f"{log}, byte {offset}"


def _coord_text(c: tuple[int, ...] | list[int]) -> str:
    return "(" + ", ".join(str(x) for x in c) + ")"


def _failed_json(folder: Path) -> dict[str, Any]:
    lines = records_of_run(read_errors(folder))
    groups = group_errors(lines)
    reader = LogReader(g.first for g in groups if g.first is not None)
    out = []
    for g in groups:
        d = g.to_json()
        first = g.first
        d["blocks_failed"] = len({r.coord for r in g.records})
        d["title"] = g.title
        d["block_ids"] = [[list(r.coord), r.block_id] for r in g.records if r.block_id >= 0]
        d["log_line"] = (
            None
            if first is None or first.log is None or first.log_offset is None
            else reader.line(first.log, first.log_offset)
        )
        out.append(d)
    run = next((d.get("run") for d in lines if d.get("run") is not None), None)
    return {"path": str(folder), "run": run, "errors": out}


def _block_ids(g: dict[str, Any]) -> list[tuple[list[int], int | None]]:
    """A group's blocks (their coordinates) with their block ids where a record names
    them: the summary names blocks by id, ``--block`` takes either."""
    ids: dict[tuple[int, ...], int] = {}
    for r in g.get("block_ids", ()):
        ids.setdefault(tuple(r[0]), r[1])
    return [(b, ids.get(tuple(b))) for b in g["blocks"]]


def format_failed(path: str | Path, *, as_json: bool = False) -> str:
    """The last run's failed attempts under ``path``, grouped by distinct error."""
    data = [_failed_json(folder) for folder in error_folders(path)]
    if as_json:
        return json.dumps(data if len(data) > 1 else data[0], indent=1)
    out: list[str] = []
    for d in data:
        groups = d["errors"]
        attempts = sum(g["count"] for g in groups)
        head = f"errors in {d['path']}"
        if not groups:
            out.append(f"{head}: none recorded")
            continue
        out.append(
            f"{head} (run of {_when(d['run'])}): {len(groups)} distinct error"
            f"{'s' if len(groups) != 1 else ''}, {attempts} failed attempt"
            f"{'s' if attempts != 1 else ''}"
        )
        for g in groups:
            out.append("")
            title = g["title"]
            out.append(f"  [{g['kind']}] {title}")
            blocks = ", ".join(
                (f"{_coord_text(b[0])} id {b[1]}" if b[1] is not None else _coord_text(b[0]))
                for b in _block_ids(g)
            )
            out.append(f"    {g['count']} attempt{'s' if g['count'] != 1 else ''}; blocks {blocks}")
            if g["where"]:
                out.append(f"    at {g['where']}")
            if len(g["messages"]) > 1:
                pairs = [(m["message"], m["count"]) for m in g["messages"]]
                out.append(f"    messages: {format_messages(pairs)}")
            if g["log"]:
                line = f", line {g['log_line']}" if g["log_line"] is not None else ""
                out.append(f"    log {g['log']}{line}")
            tb = (g["traceback"] or "").rstrip("\n").splitlines()
            if tb and tb != [title]:
                if len(tb) > _SHOWN_TRACEBACK_LINES:
                    tb = ["...", *tb[-_SHOWN_TRACEBACK_LINES:]]
                out += ["      " + line for line in tb]
    return "\n".join(out)


def _attempt_json(r: ErrorRecord, reader: LogReader) -> dict[str, Any]:
    return {**r.raw, **reader.logs(r, out_lines=_OUT_LINES)}


def format_block(path: str | Path, coord: tuple[int, ...], *, as_json: bool = False) -> str:
    """Every recorded attempt of the block at ``coord`` (every run), with its log lines."""
    data: list[dict[str, Any]] = []
    for folder in error_folders(path):
        lines = read_errors(folder)
        records = [
            ErrorRecord.from_json(d)
            for d in lines
            if "count" not in d and tuple(d.get("coord") or ()) == coord
        ]
        counted = sum(1 for d in lines if "count" in d and list(coord) in (d.get("blocks") or []))
        reader = LogReader(records)  # each log file read once for all the attempts
        data.append(
            {
                "path": str(folder),
                "block": list(coord),
                "attempts": [_attempt_json(r, reader) for r in records],
                "counted_errors": counted,
            }
        )
    if as_json:
        return json.dumps(data if len(data) > 1 else data[0], indent=1)
    out: list[str] = []
    for d in data:
        attempts = d["attempts"]
        out.append(
            f"block {_coord_text(coord)} in {d['path']}: {len(attempts)} failed attempt"
            f"{'s' if len(attempts) != 1 else ''} recorded"
        )
        if d["counted_errors"]:
            out.append(
                "  (its error also went past the records kept per distinct error: "
                "further attempts were only counted)"
            )
        for a in attempts:
            out.append("")
            who = [f"worker {a['worker']}" if a.get("worker") is not None else "no worker"]
            for key, label in (("host", "host"), ("pid", "pid"), ("job", "job")):
                if a.get(key) is not None:
                    who.append(f"{label} {a[key]}")
            out.append(
                f"  attempt {a.get('attempt')} at {_when(a.get('time'))} [{a.get('kind')}] "
                f"block id {a.get('block')}, " + ", ".join(who)
            )
            tb = str(a.get("traceback") or "").rstrip("\n").splitlines()
            out += ["      " + line for line in tb[-_SHOWN_TRACEBACK_LINES:]]
            place = _log_place(a.get("log"), a.get("log_offset"), a.get("log_line"))
            if place is not None:
                out.append(f"    log {place}:")
                out += ["      | " + line for line in a["log_lines"]]
            if a["out_lines"]:
                out.append(f"    last lines of {a.get('out_log')} before it:")
                out += ["      | " + line for line in a["out_lines"]]
    return "\n".join(out)
