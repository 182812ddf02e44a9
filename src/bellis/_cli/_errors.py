"""``bellis status PATH --failed`` and ``--block 3,7,2``: the error records of a task
(``errors.jsonl``, :mod:`bellis._stats._errorlog`) grouped by distinct error, or one
block's history with the log lines of each attempt."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._block import cantor_index, cantor_number
from .._donemarks import StoreLocation, store_location
from .._stats._errorlog import (
    ERRORS_FILE,
    ErrorRecord,
    LogReader,
    format_messages,
    group_errors,
    read_errors,
    records_of_run,
)
from .._tracking import StoreLayout, find_stores, is_s3_url, open_readonly, store_exists
from ..errors import TrackingError

__all__ = ["error_folders", "format_block", "format_failed", "parse_coord"]

#: tracebacks shown per group, in lines (the JSON has them whole)
_SHOWN_TRACEBACK_LINES = 40
_OUT_LINES = 10


def parse_coord(text: str) -> tuple[int, ...] | int:
    """``"3,7,2"`` (or ``"3 7 2"``, ``"(3, 7, 2)"``, ``"6,"``) as a grid coordinate; a plain
    number (``"40"``, as the end-of-run summary prints block ids) as a block id."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    parts = stripped.strip("()[]").replace(",", " ").split()
    try:
        coord = tuple(int(p) for p in parts)
    except ValueError:
        coord = ()
    if not coord:
        raise TrackingError(
            f"--block takes a grid coordinate such as 3,7,2 or a block id such as 40 (as "
            f"the summary prints them), not {text!r}"
        )
    return coord


def _cells_text(layout: StoreLayout) -> str:
    return " x ".join(
        f"{first}..{first + count - 1}" if count else "none" for first, count in layout.block_cells
    )


def _locate(folder: StoreLocation, text: str, wanted: tuple[int, ...] | int) -> dict[str, Any]:
    """The block ``wanted`` names in the store at ``folder``: its coordinate, its id,
    whether it is done and its failed attempts; a TrackingError naming the grid when
    ``wanted`` has the wrong rank, lies outside the grid or is a cell of no block."""
    with open_readonly(folder) as store:
        grid = tuple(int(g) for g in store.grid_shape)
        layout = StoreLayout.from_record(store.record)
        if layout is not None and tuple(layout.grid_shape) != grid:
            layout = None
        shape = " x ".join(str(g) for g in grid)
        about = f"{folder} has a {len(grid)}-D grid of {shape} cells"
        if isinstance(wanted, int):
            coord = cantor_index(wanted, len(grid))
            named = f"block id {wanted} (grid coordinate {_coord_text(coord)})"
        else:
            coord = wanted
            named = f"grid coordinate {_coord_text(coord)}"
            if len(coord) != len(grid):
                example = ",".join(str(min(3, g - 1) if g else 0) for g in grid)
                raise TrackingError(
                    f"--block {text}: {len(coord)} coordinate{'s' if len(coord) != 1 else ''} "
                    f"for a {len(grid)}-D store ({about}); give {len(grid)}, such as --block "
                    f"{example}, or a block id as the summary prints them (--block 40)",
                    path=str(folder),
                )
        if any(not 0 <= c < g for c, g in zip(coord, grid, strict=True)):
            raise TrackingError(
                f"--block {text}: {named} is outside the grid ({about}: each coordinate "
                "runs from 0 to its axis's size - 1)",
                path=str(folder),
            )
        if layout is not None and layout.write_roi_of_cell(coord) is None:
            raise TrackingError(
                f"--block {text}: {named} is a cell of no block ({about}; the blocks are "
                f"the cells {_cells_text(layout)})",
                path=str(folder),
            )
        flat = int(np.ravel_multi_index(coord, grid))
        done = bool(store.done.reshape(-1)[flat])
        failures = int(store.failures.reshape(-1)[flat])
    return {"block": list(coord), "id": cantor_number(coord), "done": done, "failures": failures}


def error_folders(path: str | Path) -> list[Path]:
    """The folders under ``path`` that hold error records: a task's store or log folder,
    or the stores and folders directly under a basedir."""
    p = Path(path)
    if not p.exists():
        raise TrackingError(f"no such file or folder: {p}", path=str(p))
    if p.is_file():
        return [p.parent]
    if (p / ERRORS_FILE).exists() or store_exists(p):
        return [p]
    found = sorted(c for c in p.iterdir() if c.is_dir() and (c / ERRORS_FILE).exists())
    if not found:
        found = sorted(c for c in p.iterdir() if c.is_dir() and store_exists(c))
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


def _stores_on_s3(url: str, *, with_errors: bool = False) -> list[StoreLocation]:
    """The stores at or below ``url``; ``with_errors``: of a prefix of several, those
    with error records where any has some (as :func:`error_folders` picks folders)."""
    stores = find_stores(url)
    if not stores:
        raise TrackingError(f"no block tracking at or below {url}", path=url)
    if with_errors and stores != [store_location(url)]:
        having = [s for s in stores if _error_lines(s)]
        return having or stores
    return stores


def _error_lines(folder: StoreLocation) -> list[Any]:
    """The error records of a folder, or of a store on S3 (its runs' ``errors/``
    objects, merged by the read-only store into its local staging folder)."""
    if isinstance(folder, str):
        with open_readonly(folder) as store:
            return read_errors(store.runs_jsonl.parent)
    return read_errors(folder)


def _failed_on_s3(url: str) -> list[dict[str, Any]]:
    """``--failed`` for a store on S3 or a prefix of them: each store's runs' ``errors/``
    objects, merged by the read-only store into its local staging folder."""
    out = []
    for location in _stores_on_s3(url):
        with open_readonly(location) as store:
            d = _failed_json(store.runs_jsonl.parent)
        d["path"] = str(location)
        out.append(d)
    return out


def format_failed(path: str | Path, *, as_json: bool = False) -> str:
    """The last run's failed attempts under ``path``, grouped by distinct error."""
    if is_s3_url(path):
        data = _failed_on_s3(str(path))
    else:
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
            if g["kind"] in ("setup failed", "setup timed out"):  # Task(setup=...): no block ran
                n = g["count"]
                out.append(
                    f"    {n} worker start{'s' if n != 1 else ''} failed in the setup; no block ran"
                )
            else:
                out.append(
                    f"    {g['count']} attempt{'s' if g['count'] != 1 else ''}; blocks {blocks}"
                )
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


def _plural_attempts(n: int) -> str:
    return f"{n} failed attempt{'s' if n != 1 else ''}"


def _attempt_json(r: ErrorRecord, reader: LogReader) -> dict[str, Any]:
    return {**r.raw, **reader.logs(r, out_lines=_OUT_LINES)}


def format_block(path: str | Path, text: str, *, as_json: bool = False) -> str:
    """Every recorded attempt of the block ``text`` names (a grid coordinate, or a block
    id as the summary prints it), every run, with its log lines; and, from the task's
    store, whether it is done. A TrackingError when ``text`` names no block of the grid."""
    wanted = parse_coord(text)
    data: list[dict[str, Any]] = []
    folders: list[Path] | list[StoreLocation] = (
        _stores_on_s3(str(path), with_errors=True) if is_s3_url(path) else error_folders(path)
    )
    refused: list[TrackingError] = []
    for folder in folders:
        state: dict[str, Any] | None = None
        if store_exists(folder):
            try:
                state = _locate(folder, text, wanted)
            except TrackingError as exc:
                # a basedir's tasks have grids of their own: one that lacks the block is
                # left out, and an error only when no task has it
                refused.append(exc)
                continue
            coord = tuple(state["block"])
        elif isinstance(wanted, int):
            raise TrackingError(
                f"--block {text}: a block id needs the task's tracking store to know the "
                f"grid, and {folder} holds only logs; pass the block's grid coordinate "
                "(such as --block 3,7) or the store's path",
                path=str(folder),
            )
        else:
            coord = wanted
        lines = _error_lines(folder)
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
                "id": cantor_number(coord),
                "done": None if state is None else state["done"],
                "failed_attempts_counted": None if state is None else state["failures"],
                "attempts": [_attempt_json(r, reader) for r in records],
                "counted_errors": counted,
            }
        )
    if not data:
        if len(refused) == 1:
            raise refused[0]
        raise TrackingError(
            f"--block {text}: no task under {path} has that block: "
            + "; ".join(str(e).removeprefix(f"--block {text}: ") for e in refused),
            path=str(path),
        )
    if as_json:
        return json.dumps(data if len(data) > 1 else data[0], indent=1)
    out: list[str] = []
    for d in data:
        attempts = d["attempts"]
        head = f"block {_coord_text(d['block'])} (id {d['id']}) in {d['path']}"
        noun = f"{len(attempts)} failed attempt{'s' if len(attempts) != 1 else ''} recorded"
        counted = d["failed_attempts_counted"]
        if d["done"] is None:
            out.append(f"{head}: {noun}")
        else:
            if d["done"]:
                outcome = "done" + (f" after {_plural_attempts(counted)}" if counted else "")
            elif counted:
                outcome = f"not done: failed ({_plural_attempts(counted)})"
            else:
                outcome = "not done"
            out.append(f"{head}: {outcome}")
            out.append(f"  {noun} in its error records")
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
