"""A run as a Chrome trace: ``bellis report PATH --trace trace.json``.

The file is in the Trace Event Format that Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` open. It is built from tracking stores alone:

- one *process* per run. A run is a line of ``runs.jsonl``; the lines of the tasks of
  one pipeline run overlap in time and make one process. Blocks whose stamps fall in no
  recorded run (a run still in flight, or one stopped before it wrote its line) go to a
  process of their own;
- one *thread* per worker of a task (ids restart at 0 every run), plus one thread per
  task for blocks run by no managed worker (serial mode, unmanaged clients), and one
  ``run`` thread per task with the run's whole span;
- one complete event (``"ph": "X"``, ``ts`` and ``dur`` in microseconds from the
  earliest stamp, which ``otherData.origin_unix_seconds`` gives) per block, from its
  ``sent_at`` to its ``returned_at``, with its figures as ``args``: grid coordinate,
  write ROI (where the store records its layout), worker, wall, cpu, peak RSS, IO and
  the failed attempts before it. A cell that is not done but carries stamps holds its
  last failed attempt (category ``failed_attempt``); earlier failed attempts of a cell
  leave only their count.

Stamps exist only in stores with resource tracking; a store without them (or one
written by daisy 2.0.0) contributes its runs' spans and is listed with what it lacks
under ``otherData.stores``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._block import NO_WORKER
from .._donemarks import StoreLocation, is_store_url, location_name, store_location
from .._stats._runlog import read_runs
from .._tracking import (
    StoreLayout,
    find_stores as _find_stores,
    is_store,
    open_readonly,
)
from ..errors import TrackingError

__all__ = ["build_trace", "find_stores", "write_trace"]

_FIGURES = (
    "wall_seconds",
    "cpu_seconds",
    "cpu_children_seconds",
    "peak_rss_bytes",
    "io_read_bytes",
    "io_write_bytes",
)
_STAMPS = ("worker_id", "sent_at", "returned_at")
_UNRECORDED = "blocks of no recorded run (in flight, or stopped before writing runs.jsonl)"


def find_stores(path: str | os.PathLike[str]) -> list[StoreLocation]:
    """``path`` itself when it is a tracking store, else every store below it, sorted.

    A store is a directory (or an ``s3://`` prefix: its URL, a ``str``) whose
    ``zarr.json`` is a group with a ``done`` array. Raises :class:`TrackingError` when
    there is none.
    """
    if is_store_url(path):  # the figures of the stats/ objects (docs/cloud.md)
        url = store_location(path)
        stores = _find_stores(url)
        if not stores:
            raise TrackingError(
                f"no tracking store at {url}: neither it nor a prefix below it holds a "
                "store. Give the task's tracking_path or the tracking basedir"
            )
        return stores
    root = Path(path)
    if is_store(root):
        return [root]
    if not root.is_dir():
        raise TrackingError(f"no tracking store at {os.fspath(path)} (no such directory)")
    found = _find_stores(root)
    if not found:
        raise TrackingError(
            f"no tracking store at {os.fspath(path)}: neither it nor a folder below it holds "
            "a store (a zarr group with a 'done' array). Give the task's tracking_path or "
            "the tracking basedir"
        )
    return found


@dataclass
class _Store:
    path: StoreLocation
    task_id: str
    grid: tuple[int, ...]
    record: dict[str, Any] | None
    done: NDArray[np.bool_]
    failures: NDArray[np.uint64]
    arrays: dict[str, NDArray[Any]]
    runs: list[dict[str, Any]]

    @property
    def missing(self) -> list[str]:
        return [n for n in (*_STAMPS, *_FIGURES) if n not in self.arrays]


def _load(path: StoreLocation, root: StoreLocation) -> _Store:
    with open_readonly(path) as store:
        done = np.array(store.done).reshape(-1) != 0
        failures = np.array(store.failures, dtype=np.uint64).reshape(-1)
        arrays = {
            n: np.array(a).reshape(-1) for n, a in store.stats.items() if n in (*_STAMPS, *_FIGURES)
        }
        grid = tuple(store.grid_shape)
        record = store.record
        runs = read_runs(store.runs_jsonl)
    ids = {str(r.get("task_id")) for r in runs if r.get("task_id") is not None}
    if len(ids) == 1:
        task_id = ids.pop()
    elif path == root:
        task_id = location_name(path)
    elif isinstance(path, str):  # a store below an s3:// prefix
        task_id = path[len(str(root)) :].strip("/")
    else:
        task_id = path.relative_to(root).as_posix()
    return _Store(path, task_id, grid, record, done, failures, arrays, runs)


@dataclass
class _Run:
    start: float
    end: float
    lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _group_runs(stores: Sequence[_Store]) -> list[_Run]:
    """Run lines of all stores, merged where their spans overlap (one pipeline run)."""
    spans = []
    for s in stores:
        for line in s.runs:
            a, b = line.get("run_started_at"), line.get("run_finished_at")
            if isinstance(a, int | float) and isinstance(b, int | float):
                spans.append((float(a), max(float(a), float(b)), s.task_id, line))
    spans.sort(key=lambda t: t[0])
    runs: list[_Run] = []
    for a, b, tid, line in spans:
        if runs and a <= runs[-1].end:
            runs[-1].end = max(runs[-1].end, b)
        else:
            runs.append(_Run(a, b))
        runs[-1].lines.append((tid, line))
    return runs


def _num(v: Any) -> float | int | None:
    x = v.item() if hasattr(v, "item") else v
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return int(x)


def _write_roi(layout: StoreLayout | None, coord: tuple[int, ...]) -> dict[str, Any] | None:
    """The write ROI of the block in cell ``coord`` from the store's layout record (None
    without one, or for a cell no block maps to): :meth:`StoreLayout.write_interval`, as
    the report's table and hovers."""
    if layout is None or layout.ndim != len(coord):
        return None
    roi = layout.write_roi_of_cell(coord)
    if roi is None:
        return None
    begin, end = roi
    return {"offset": list(begin), "shape": [e - b for b, e in zip(begin, end, strict=True)]}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def build_trace(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """The Chrome trace (a JSON object) of the stores at or below ``paths``."""
    stores: list[_Store] = []
    for p in paths:
        root = store_location(p)
        stores.extend(_load(s, root) for s in find_stores(root))
    runs = _group_runs(stores)
    origin_candidates = [r.start for r in runs]
    for s in stores:
        if "sent_at" in s.arrays and "returned_at" in s.arrays:
            stamped = s.arrays["returned_at"] > 0
            if stamped.any():
                origin_candidates.append(float(s.arrays["sent_at"][stamped].min()))
    origin = min(origin_candidates, default=0.0)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: list[dict[str, Any]] = []
    starts = np.array([r.start for r in runs], dtype=np.float64)
    ends = np.array([r.end for r in runs], dtype=np.float64)
    unrecorded_pid = len(runs) + 1
    threads: dict[tuple[int, str, int], int] = {}

    def tid_of(pid: int, task: str, worker: int) -> int:
        key = (pid, task, worker)
        if key not in threads:
            threads[key] = len([k for k in threads if k[0] == pid]) + 1
        return threads[key]

    # one "run" span per task line, on the first thread of its task
    for i, run in enumerate(runs):
        for task, line in run.lines:
            a = float(line["run_started_at"])
            b = max(a, float(line["run_finished_at"]))
            events.append(
                {
                    "name": f"{task} run",
                    "cat": "run",
                    "ph": "X",
                    "pid": i + 1,
                    "tid": tid_of(i + 1, task, -2),
                    "ts": us(a),
                    "dur": round((b - a) * 1e6, 3),
                    "args": {
                        "task": task,
                        "outcome": line.get("outcome"),
                        "mode": line.get("mode"),
                        "counters": line.get("counters"),
                        "run_started_at": a,
                        "run_finished_at": b,
                    },
                }
            )

    blocks = failed = 0
    store_info: list[dict[str, Any]] = []
    for s in stores:
        info: dict[str, Any] = {"path": os.fspath(s.path), "task_id": s.task_id}
        info["missing_arrays"] = s.missing
        n_events = 0
        if all(n in s.arrays for n in _STAMPS):
            sent, ret, wid = s.arrays["sent_at"], s.arrays["returned_at"], s.arrays["worker_id"]
            cells = np.flatnonzero(ret > 0)
            layout = StoreLayout.from_record(s.record)
            where = np.searchsorted(starts, sent[cells], side="right") - 1
            for cell, r in zip(cells.tolist(), where.tolist(), strict=True):
                t0, t1 = float(sent[cell]), float(ret[cell])
                pid = r + 1 if r >= 0 and t0 <= ends[r] else unrecorded_pid
                w = int(wid[cell])
                is_done = bool(s.done[cell])
                coord = tuple(int(x) for x in np.unravel_index(cell, s.grid))
                args: dict[str, Any] = {
                    "task": s.task_id,
                    "grid_coordinate": list(coord),
                    "cell": cell,
                    "worker_id": None if w == NO_WORKER else w,
                    "sent_at": t0,
                    "returned_at": t1,
                    "failed_attempts": int(s.failures[cell]),
                }
                roi = _write_roi(layout, coord)
                if roi is not None:
                    args["write_roi"] = roi
                if is_done:
                    for n in _FIGURES:
                        if n in s.arrays:
                            args[n] = _num(s.arrays[n][cell])
                    blocks += 1
                else:
                    failed += 1
                events.append(
                    {
                        "name": s.task_id if is_done else f"{s.task_id} failed",
                        "cat": "block" if is_done else "failed_attempt",
                        "ph": "X",
                        "pid": pid,
                        "tid": tid_of(pid, s.task_id, w),
                        "ts": us(t0),
                        "dur": round((t1 - t0) * 1e6, 3),
                        "args": args,
                        **({} if is_done else {"cname": "terrible"}),
                    }
                )
                n_events += 1
        info["block_events"] = n_events
        store_info.append(info)

    meta: list[dict[str, Any]] = []
    pids = sorted({k[0] for k in threads})
    for pid in pids:
        if pid == unrecorded_pid:
            name = _UNRECORDED
        else:
            run = runs[pid - 1]
            tasks = ", ".join(dict.fromkeys(t for t, _ in run.lines))
            outcomes = ", ".join(sorted({str(line.get("outcome")) for _, line in run.lines}))
            name = f"run {pid}: {_iso(run.start)} ({tasks}; {outcomes})"
        meta.append(_meta("process_name", pid, 0, {"name": name}))
        meta.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    for (pid, task, worker), tid in threads.items():
        if worker == -2:
            name = f"{task} run"
        elif worker == NO_WORKER:
            name = f"{task} no managed worker"
        else:
            name = f"{task} worker {worker}"
        meta.append(_meta("thread_name", pid, tid, {"name": name}))
        meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "bellis report --trace",
            "origin_unix_seconds": origin,
            "runs": len(runs),
            "block_events": blocks,
            "failed_attempt_events": failed,
            "stores": store_info,
        },
    }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def write_trace(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    out: str | os.PathLike[str],
) -> dict[str, Any]:
    """Write the Chrome trace of the stores at or below ``paths`` to ``out`` (atomically).

    Returns the trace's ``otherData`` summary: runs, block and failed-attempt events,
    and per store what it lacks. Raises :class:`TrackingError` for a path with no store.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    trace = build_trace(paths)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    # created as any file the user writes: 0666 less their umask (mkstemp would make it 0600)
    tmp = str(target.with_name(f".{target.name}.tmp-{os.getpid()}"))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(trace, fh, separators=(",", ":"), allow_nan=False)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    summary: dict[str, Any] = trace["otherData"]
    return summary
