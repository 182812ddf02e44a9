"""What the HTML report reads: every tracking store under the given paths, as one snapshot.

A PATH is a task's tracking store (a directory whose ``zarr.json`` is a group with a
``done`` array) or a folder that holds several (a pipeline's tracking basedir). Each
store is opened read-only (``_tracking.open_readonly``), so this works while a
run writes it and on stores written by daisy 2.0.0. A store of up to ``COPY_CELLS`` cells
has its arrays copied once; a larger one keeps its read-only maps (nothing is copied
whole), its counts come from one pass in slabs (:func:`read_status`) and its volume
figure is downsampled slab by slab (``_report_figures.volume_payload``).

A run is **in flight** when another process holds the store's lock file: the report
is then partial (the blocks recorded so far), and its last run line belongs to an
earlier run. The lock is tested with ``F_OFD_GETLK``, which takes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._donemarks import BlockStore, StoreLocation, location_name, store_location
from .._stats._errorlog import read_errors
from .._stats._reports import TaskReport
from .._stats._runlog import read_runs
from .._tracking import (
    STAT_ARRAYS,
    StoreLayout,
    find_stores as _find_stores,
    format_roi,
    is_store,
    lease_holder,
    open_readonly,
    read_status,
)
from .._tracking._codever import MAX_CODE_INDEX, code_counts, version_counts
from .._tracking._reset import read_verify_record, verify_codes, verify_counts
from ..errors import TrackingError

__all__ = ["StoreData", "find_stores", "load_stores"]

_LOCK_NAME = "bellis.lock"
_STAMPS = "the worker timeline, the throughput and the workers of each block"
_LOST = {
    "cpu_children_seconds": "the CPU time of the processes blocks start",
    "worker_id": _STAMPS,
    "sent_at": _STAMPS,
    "returned_at": _STAMPS,
}
_MAX_DEPTH = 4
#: stores with more cells than this are read through their maps, not copied
COPY_CELLS = 1 << 24


def find_stores(paths: Sequence[str | os.PathLike[str]]) -> list[StoreLocation]:
    """The tracking stores at or under each path, in path order then name order: a
    ``Path`` each, or the ``str`` of an ``s3://`` URL (``store_location``).

    Raises TrackingError naming a path that does not exist or holds no store.
    """
    found: list[StoreLocation] = []
    for raw in paths:
        p = store_location(raw)
        if isinstance(p, Path) and not p.exists():
            raise TrackingError(f"report path {os.fspath(raw)!r} does not exist", path=str(p))
        inside = _find_stores(p, _MAX_DEPTH)
        if not inside:
            raise TrackingError(
                f"no tracking store at or under {os.fspath(raw)!r}: give a task's tracking "
                "directory (it holds zarr.json and done/) or the tracking basedir of a pipeline",
                path=str(p),
            )
        found.extend(inside)
    unique: list[StoreLocation] = []
    seen: set[str] = set()
    for s in found:
        key = s if isinstance(s, str) else str(s.resolve())
        if key not in seen:
            seen.add(key)
            unique.append(s)
    return unique


def lock_holder(store: StoreLocation) -> str | None:
    """Who holds the store's lock (a run in flight), or None when nobody does."""
    if isinstance(store, str):  # a URL: the lease object, read without taking it
        return lease_holder(store)
    file = store / _LOCK_NAME
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    # an OFD query sees every lock of another open file description (this process's
    # too); plain F_GETLK (no OFD locks here) sees other processes' locks
    getlk = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    try:
        request = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(64, b"\0")
        try:
            answer = fcntl.fcntl(fd, getlk, request)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return None
            raise
        if struct.unpack("h", answer[:2])[0] == fcntl.F_UNLCK:
            return None
        try:
            info = json.loads(os.pread(fd, 4096, 0))
        except ValueError:
            info = None
    finally:
        os.close(fd)
    if isinstance(info, dict):
        return (
            f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, "
            f"started {info.get('started', '?')}"
        )
    return "a run holds the store's lock"


@dataclass
class StoreData:
    """One task's tracking store, copied: arrays, layout, run lines, in-flight state."""

    task_id: str
    path: StoreLocation | None
    grid: tuple[int, ...]
    done: NDArray[np.bool_]
    failures: NDArray[np.uint32]
    stats: dict[str, NDArray[Any]]
    runs: list[dict[str, Any]]
    in_flight: str | None = None
    grid_offset: tuple[int, ...] | None = None
    write_stride: tuple[int, ...] | None = None
    total_shape: tuple[int, ...] | None = None
    notes: list[str] = field(default_factory=list)
    #: a large store's (done, failed and not done, failed attempts), counted at load
    precounted: tuple[int, int, int] | None = None
    #: a large store's read-only maps of ``done`` and ``failures`` (``done`` and
    #: ``failures`` above are then views of them, not copies); None when copied
    maps: dict[str, Any] | None = None
    #: the block geometry from the ``bellis_layout`` record: which cells are blocks, and
    #: their write ROIs; None without a record (a daisy 2.0.0 store has only the hash)
    layout: StoreLayout | None = None
    #: done blocks by what ``bellis verify`` knows (verified, mismatched, unverifiable);
    #: None for a task that records no checksums and was never verified
    verify: Any = None
    #: per cell, ``_tracking._reset.verify_codes`` (-1 not done, 0 no checksum, 1
    #: verified, 2 mismatched), for the volume map's "verified" figure; None for a large
    #: store (see ``COPY_CELLS``) or one without ``verify``
    verify_codes: NDArray[np.int8] | None = None
    #: done blocks per code version, as ``bellis status`` counts them (``version_counts``)
    code_versions: list[dict[str, Any]] = field(default_factory=list)
    #: per cell, the code version (1, 2, ... as in ``code_versions``) of a done block, 0
    #: for a done block of unknown code, NaN for a cell not done; None for a large store
    #: (past COPY_CELLS, the volume figure shows no code version)
    code_version: NDArray[np.float32] | None = None
    #: a store at a URL: its runs' ``errors.jsonl`` lines, read when it was loaded (it
    #: has no folder to read them from later); None for a local store
    error_lines: list[dict[str, Any]] | None = None

    @property
    def blocks(self) -> int | None:
        """How many blocks the task has; None when the store does not say."""
        return None if self.layout is None else self.layout.block_count

    @property
    def untouched(self) -> int:
        """Blocks neither done nor failed; without a layout, cells (an upper bound)."""
        done, failed, _ = self.counts
        total = int(self.done.size) if self.layout is None else self.layout.block_count
        return max(0, total - done - failed)

    @property
    def counts(self) -> tuple[int, int, int]:
        """(done, failed and not done, failed attempts)."""
        if self.precounted is not None:
            return self.precounted
        return (
            int(np.count_nonzero(self.done)),
            int(np.count_nonzero((self.failures > 0) & ~self.done)),
            int(self.failures.sum(dtype=np.uint64)),
        )

    @property
    def tracked(self) -> bool:
        return "returned_at" in self.stats or "wall_seconds" in self.stats

    @property
    def missing(self) -> list[str]:
        """Resource arrays absent from a store that has some (e.g. daisy 2.0.0's)."""
        if not self.stats:
            return []
        return [n for n in STAT_ARRAYS if n not in self.stats and not n.startswith("gpu_")]

    @property
    def last_report(self) -> TaskReport | None:
        return None if not self.runs else TaskReport(self.runs[-1], self.path)

    def measured(self) -> NDArray[np.intp]:
        """Flat cells that are done and carry figures, in C order."""
        if "returned_at" in self.stats:
            m = self.done & (self.stats["returned_at"] > 0.0)
        elif "wall_seconds" in self.stats:
            m = self.done & (self.stats["wall_seconds"] > 0.0)
        else:
            return np.zeros(0, dtype=np.intp)
        return np.flatnonzero(m.reshape(-1))

    def failed_stamped(self) -> NDArray[np.intp]:
        """Flat cells that are not done and carry the stamps of their last failed attempt
        (a store with resource tracking records them, see ``record_failure``)."""
        if "returned_at" not in self.stats or "sent_at" not in self.stats:
            return np.zeros(0, dtype=np.intp)
        m = ~self.done & (self.stats["returned_at"] > 0.0) & (self.failures > 0)
        return np.flatnonzero(m.reshape(-1))

    def coord(self, k: int) -> tuple[int, ...]:
        return tuple(int(x) for x in np.unravel_index(k, self.grid))

    def roi(self, k: int) -> str:
        """The world ROI of the write region of the block in cell ``k``, as ``[begin, end)``
        per axis (:meth:`StoreLayout.write_interval`, as the volume hovers and the trace)."""
        if self.layout is None:
            return "ROI unknown (no bellis_layout)"
        roi = self.layout.write_roi_of_cell(self.coord(k))
        return "no block" if roi is None else format_roi(*roi)


def _tuple(v: Any, n: int) -> tuple[int, ...] | None:
    if isinstance(v, list) and len(v) == n and all(isinstance(x, int) for x in v):
        return tuple(v)
    return None


def load_store(path: StoreLocation) -> StoreData:
    """Snapshot the store at ``path`` (read-only)."""
    holder = lock_holder(path)
    with open_readonly(path) as store:
        grid = tuple(store.grid_shape)
        maps: dict[str, Any] | None = None
        counts: tuple[int, int, int] | None = None
        if int(store.done.size) <= COPY_CELLS:
            done = np.array(store.done) != 0
            failures = np.array(store.failures, dtype=np.uint32)
            stats = {name: np.array(a) for name, a in store.stats.items()}
        else:
            maps = {"done": store.done, "failures": store.failures}
            done = store.done.view(bool)
            failures = store.failures
            stats = dict(store.stats.items())
            snap = read_status(path)
            counts = (snap.done_count, snap.failed_count, snap.attempts)
        n_done = counts[0] if counts is not None else int(np.count_nonzero(done))
        versions, per_cell = _code_versions(store, done, maps is None, n_done)
        record = store.record
        runs_file = store.runs_jsonl
        # a store at a URL has its runs' errors merged beside runs_jsonl while it is open
        error_lines = read_errors(runs_file.parent) if isinstance(path, str) else None
        checks = store.checksums()
        last_verify = read_verify_record(path)
        verify = codes = None
        if checks is not None or last_verify is not None:
            flat_done = store.done.reshape(-1)
            flat = None if checks is None else checks.reshape(-1)
            verify = verify_counts(flat_done, flat, last_verify)
            if maps is None:
                codes = verify_codes(flat_done, flat, last_verify)
    runs = read_runs(runs_file)
    task_id = str(runs[-1].get("task_id")) if runs else location_name(path)
    data = StoreData(task_id, path, grid, done, failures, stats, runs, holder)
    data.precounted = counts
    data.error_lines = error_lines
    data.maps = maps
    data.verify, data.verify_codes = verify, codes
    data.code_versions = versions
    data.code_version = per_cell
    if record is not None:
        n = len(grid)
        data.grid_offset = _tuple(record.get("grid_offset"), n)
        data.write_stride = _tuple(record.get("write_stride"), n)
        data.total_shape = _tuple(record.get("total_shape"), n)
        layout = StoreLayout.from_record(record)
        data.layout = layout if layout is not None and layout.grid_shape == grid else None
    if data.layout is None:
        data.notes.append(
            "no bellis_layout record (a daisy 2.0.0 store has only the layout hash): which "
            "cells are blocks, how many blocks there are and their ROIs are not known, so "
            "counts are of tracking cells"
        )
    if holder is not None:
        data.notes.append(
            f"a run is in flight ({holder}): this report is partial, it shows the blocks "
            "recorded so far, and the worker and history sections end at the previous run"
        )
    if not stats:
        data.notes.append(
            "written without resource tracking: only done, failures and code versions are "
            "shown (run with resource_tracking=True for times, memory and the timeline)"
        )
    elif data.missing:
        lost = [_LOST.get(n, n) for n in data.missing]
        data.notes.append(
            f"the store has no {', '.join(data.missing)} array(s), so the report cannot show "
            f"{'; '.join(dict.fromkeys(lost))} (daisy 2.0.0 writes no cpu_children_seconds, "
            "and no worker stamps either)"
        )
    if not runs:
        data.notes.append("runs.jsonl holds no run line: no worker or run history")
    return data


def _code_versions(
    store: BlockStore, done: NDArray[np.bool_], small: bool, n_done: int
) -> tuple[list[dict[str, Any]], NDArray[np.float32] | None]:
    """The done blocks per code version, and (a small store) each cell's version number."""
    codes = store.code_versions()
    if codes is None:
        unknown = [{"version": None, "hash": None, "blocks": n_done}] if n_done else []
        return unknown, (
            np.where(done, np.float32(0.0), np.float32(np.nan)).astype(np.float32)
            if small
            else None
        )
    rows = version_counts(store.code_table(), code_counts(store.done, codes))
    if not small:
        return rows, None
    lut = np.zeros(MAX_CODE_INDEX + 1, dtype=np.float32)
    for row in rows:
        if row["version"] is not None:
            lut[row["indices"]] = row["version"]
    per_cell = np.where(done, lut[np.asarray(codes)], np.float32(np.nan)).astype(np.float32)
    return rows, per_cell


def _started(s: StoreData) -> tuple[float, float]:
    """(last run's start, first block sent): the order tasks of a pipeline ran in."""
    t = s.runs[-1].get("run_started_at") if s.runs else None
    k = s.measured()
    first = 0.0
    if "sent_at" in s.stats and len(k):
        first = float(s.stats["sent_at"].reshape(-1)[k].min())
    return (float(t) if isinstance(t, int | float) else float("inf"), first)


def load_stores(paths: list[str | os.PathLike[str]]) -> list[StoreData]:
    """Every store at or under ``paths``, in the order their last runs started."""
    stores = [load_store(p) for p in find_stores(paths)]
    return sorted(stores, key=_started)


def from_task_report(report: TaskReport) -> StoreData:
    """A report's store, or (no store) its run line alone."""
    if report.store_path is not None and is_store(report.store_path):
        return load_store(report.store_path)
    empty_b: NDArray[np.bool_] = np.zeros(0, dtype=bool)
    empty_u: NDArray[np.uint32] = np.zeros(0, dtype=np.uint32)
    data = StoreData(report.task_id, None, (0,), empty_b, empty_u, {}, [report.to_json()])

    data.notes.append("no tracking store: only the run line's figures are shown")
    return data
