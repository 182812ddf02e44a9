"""``bellis verify`` and ``Task.verify()``: is every done block's data still there?

Theory of operation
-------------------
A verify needs nothing but tracking stores. Each store's ``outputs.json`` says where the
task's outputs live and how world units map to their voxels; its ``bellis_layout`` record
gives every block's write ROI; ``output_checksum`` holds what the block's worker read back
(``_readback``). For every done block with a checksum the outputs are read again, in
parallel processes (each opens the arrays once and takes a share of the blocks), and
compared:

* **missing**: the checksum differs, and the block's data is not there: an output's part
  reads as the fill value everywhere, or a chunk (shard) file it covers is absent;
* **changed**: the checksum differs otherwise (one byte is enough), or the data cannot be
  decoded any more (the detail says so);
* **unverifiable**: done, but no checksum recorded (blocks done before ``verify_outputs``,
  or by daisy).

An output that cannot be *read* says nothing about its data: an array that cannot be
opened (deleted, an unmounted file system, a relative path in an old ``outputs.json``) or
a read the operating system refuses (permission denied, an I/O error: an ``OSError`` with
an errno) ends the verify with a :class:`~bellis.errors.TrackingError` (``bellis verify``
exits 2), and nothing is reset: every store's outputs are opened before any block is
read, and every store is read before any marker is cleared.

``reset`` clears the done markers of the missing and changed blocks, then of every block
of a downstream task whose read ROI meets the write ROI of a cleared block, transitively
(:func:`transitive_readers`; the tasks below come from ``outputs.json``, recorded by the
run). Unverifiable blocks are listed, not reset: nothing says their data is wrong. The
result of each verify goes to the store's ``verify.json`` (``_tracking._reset``). Several
stores are all read first, then reset upstream first; a store's result leaves out the
blocks an upstream store's reset cleared (:func:`_less_upstream_resets`), as if it had
been read after it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._bulk import downstream_readers
from .._donemarks import StoreLocation, join_location, location_name, store_location
from .._graph import TaskGeometry
from ..errors import ConfigurationError, TrackingError
from ._readback import HASH_NAME, ReadBack, Target

__all__ = [
    "Mismatch",
    "VerifyResult",
    "check_blocks",
    "open_targets",
    "transitive_readers",
    "verify_stores",
    "verify_task",
]

logger = logging.getLogger("bellis")

MISSING, CHANGED, UNVERIFIABLE = "missing", "changed", "unverifiable"


@dataclass(frozen=True)
class Mismatch:
    """One done block whose outputs do not verify."""

    kind: str  #: ``missing``, ``changed`` or ``unverifiable``
    cell: int  #: the block's flat tracking cell
    block: tuple[int, ...]  #: its block grid coordinates
    write_roi: tuple[tuple[int, ...], tuple[int, ...]]  #: (offset, shape), world units
    detail: str = ""


@dataclass(frozen=True)
class VerifyResult:
    """What ``bellis verify`` found in one task's store."""

    task: str  #: the store's name (the task's tracking directory)
    path: str
    done: int  #: done blocks
    verified: int  #: done blocks whose outputs match their checksum
    mismatches: tuple[Mismatch, ...]
    #: blocks whose done marker ``reset`` cleared, per store path (the downstream ones too)
    reset: dict[str, int] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Mismatch]:
        return [m for m in self.mismatches if m.kind == kind]

    @property
    def missing(self) -> list[Mismatch]:
        return self.of_kind(MISSING)

    @property
    def changed(self) -> list[Mismatch]:
        return self.of_kind(CHANGED)

    @property
    def unverifiable(self) -> list[Mismatch]:
        return self.of_kind(UNVERIFIABLE)

    @property
    def ok(self) -> bool:
        """Whether every done block verified."""
        return not self.mismatches


# -- geometry ------------------------------------------------------------------------------


def _geometry(task_id: str, layout: Any) -> TaskGeometry:
    """The block grid a store's layout describes (read ROI at 0, as the record has it)."""
    from funlib.geometry import Roi

    return TaskGeometry(
        task_id,
        Roi(layout.total_offset, layout.total_shape),
        Roi(layout.read_offset, layout.read_shape),
        Roi(layout.write_offset, layout.write_shape),
        fit=layout.fit,
        read_write_conflict=False,
    )


def _cell_to_block(layout: Any, geom: TaskGeometry, cell: int) -> int:
    """Block index of tracking ``cell``, or -1 when no block maps to it."""
    coords = []
    rem = cell
    for n in reversed(layout.grid_shape):
        rem, c = divmod(rem, n)
        coords.append(c)
    coords.reverse()
    out = []
    for c, (first, count) in zip(coords, layout.block_cells, strict=True):
        g = c - first
        if not 0 <= g < count:
            return -1
        out.append(g)
    return geom.index_of(out)


def _block_to_cell(layout: Any, geom: TaskGeometry, k: int) -> int:
    cell = 0
    for g, (first, _count), n in zip(
        geom.coords_of(k), layout.block_cells, layout.grid_shape, strict=True
    ):
        c = g + first
        if c >= n:
            return -1
        cell = cell * n + c
    return cell


def transitive_readers(
    geoms: dict[str, TaskGeometry],
    edges: Iterable[tuple[str, str]],
    bad: dict[str, set[int]],
) -> dict[str, set[int]]:
    """The blocks that read ``bad`` blocks, transitively, per task (``bad`` excluded).

    ``geoms``: the tasks' block grids; ``edges``: ``(upstream, downstream)`` task ids;
    ``bad``: block indices per task. One step down an edge is
    :func:`bellis._bulk.downstream_readers` (a block reads an upstream block when its read
    ROI meets that block's write ROI, the same rule run start uses for stale blocks); a
    block that reads a reader is a reader too. Pure: no store is touched.
    """
    import numpy as np

    edge_list = [(a, b) for a, b in edges if a in geoms and b in geoms]
    bad_masks: dict[str, Any] = {}
    for tid, ks in bad.items():
        if tid in geoms:
            mask = np.zeros(geoms[tid].grid, dtype=bool)
            mask.reshape(-1)[sorted(ks)] = True
            bad_masks[tid] = mask
    found: dict[str, Any] = {}
    frontier = {t: m for t, m in bad_masks.items() if m.any()}
    while frontier:
        nxt: dict[str, Any] = {}
        for up, mask in frontier.items():
            for a, b in edge_list:
                if a != up:
                    continue
                readers = downstream_readers(geoms[a], geoms[b], mask)
                if b in bad_masks:
                    readers &= ~bad_masks[b]
                if b in found:
                    readers &= ~found[b]
                    found[b] |= readers
                else:
                    found[b] = readers
                if readers.any():
                    nxt[b] = nxt[b] | readers if b in nxt else readers
        frontier = nxt
    return {t: {int(k) for k in np.flatnonzero(m)} for t, m in found.items() if m.any()}


# -- the parallel check ----------------------------------------------------------------------

_STATE: dict[str, Any] = {}


#: keys one listing request returns (S3's ``ListObjectsV2`` page)
LIST_PAGE = 1000


class _Presence:
    """Which unit (chunk or shard) objects of an output on S3 exist, asked only for the
    blocks whose checksum did not match (a matching block's units were just read).

    A unit is asked for by key (one HEAD; two for an absent one, where s3fs also looks
    for a "directory" of that name) until the requests spent, plus those the block in
    hand needs, would exceed one listing of the array's units (one request per
    :data:`LIST_PAGE` of them); then the array's prefix is listed once, and this verify
    process answers every later block from that listing, without a request. So a verify
    that finds a few damaged blocks costs a few HEADs, and one that finds many costs one
    listing of the output, never one request per unit of every block."""

    def __init__(self, arr: Any) -> None:
        self.arr = arr
        unit = arr.shards if arr.shards is not None else arr.chunks
        n = 1
        for size, u in zip(arr.shape, unit, strict=True):
            n *= max(1, -(-size // u))
        self.list_cost = max(1, -(-n // LIST_PAGE))
        self.spent = 0
        self.listed: set[str] | None = None

    def absent(self, keys: list[str]) -> list[str]:
        from zarr.core.sync import sync

        if self.listed is None and self.spent + 2 * len(keys) > self.list_cost:
            self.listed = sync(self._list())
        if self.listed is not None:
            return [k for k in keys if k not in self.listed]
        out = []
        for key in keys:
            self.spent += 1
            if not sync((self.arr.store_path / key).exists()):
                self.spent += 1
                out.append(key)
        return out

    async def _list(self) -> set[str]:
        """The unit keys below the array's prefix (relative to the array)."""
        base = self.arr.path.strip("/")
        cut = len(base) + 1 if base else 0
        found: set[str] = set()
        async for key in self.arr.store.list_prefix(f"{base}/" if base else ""):
            found.add(key[cut:])
        return found


_PRESENCE: dict[tuple[str, int], _Presence] = {}


def _absent_units(rb: ReadBack, i: int, intervals: Sequence[tuple[int, int]]) -> list[str]:
    """The unit (chunk or shard) keys of output ``i`` that the block covers and its store
    lacks (on S3: :class:`_Presence`)."""
    from zarr.core.sync import sync

    arr = rb.arrays()[i]
    keys = rb.unit_keys(i, intervals)
    if rb.targets[i].store.startswith("s3://"):
        presence = _PRESENCE.get((repr(rb.targets), i))
        if presence is None:
            presence = _PRESENCE[(repr(rb.targets), i)] = _Presence(arr)
        return presence.absent(keys)
    return [key for key in keys if not sync((arr.store_path / key).exists())]


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the operating system refusing a read (permission denied, an I/O
    error, a vanished mount: an ``OSError`` with an errno), not data that fails to decode
    (a codec's error; gzip's ``BadGzipFile`` is an ``OSError`` without an errno)."""
    return isinstance(exc, OSError) and exc.errno is not None


def _cannot_read(what: str, exc: BaseException) -> TrackingError:
    return TrackingError(
        f"cannot read {what} ({type(exc).__name__}: {exc}), so its blocks cannot be "
        "verified; nothing was reset. Make the output readable at that path (the file "
        "system mounted, read permission) and verify again"
    )


def open_targets(targets: Sequence[Any]) -> ReadBack:
    """A :class:`ReadBack` of ``targets`` with every array open; TrackingError naming the
    output that cannot be opened."""
    rb = ReadBack(targets, allow_empty=True)
    try:
        rb.arrays()
    except Exception:
        for t in rb.targets:  # which one (only when one fails)
            try:
                ReadBack([t]).arrays()
            except Exception as exc:
                raise TrackingError(
                    f"cannot open output {t.name} ({type(exc).__name__}: {exc}): its "
                    "blocks cannot be verified, and nothing was reset. If the array moved, "
                    'write its new place into the "store" (and "path") of outputs.json; if '
                    "its file system is not mounted or not readable here, verify where it is"
                ) from exc
        raise
    return rb


def check_blocks(
    targets: Sequence[Any], jobs: Sequence[tuple[int, list[tuple[int, int]], int]]
) -> tuple[int, list[tuple[int, str, str]]]:
    """Re-read the blocks ``jobs`` (cell, write intervals, recorded checksum) of one store's
    ``targets``: how many matched, and (cell, kind, detail) of each that did not. Runs in a
    verify process; the arrays stay open there between calls. An output that cannot be
    opened or read (see the module docstring) raises TrackingError."""
    key = repr(targets)
    rb = _STATE.get(key)
    if rb is None:
        rb = _STATE[key] = open_targets(targets)
    matched = 0
    bad: list[tuple[int, str, str]] = []
    for cell, intervals, expected in jobs:
        try:
            parts = rb.crcs(intervals)
        except Exception as exc:
            if _refused(exc):
                names = ", ".join(t.name for t in rb.targets)
                raise _cannot_read(f"{names} at {_roi_text(intervals)}", exc) from exc
            bad.append((cell, CHANGED, f"unreadable: {type(exc).__name__}: {exc}"))
            continue
        if rb.combine([crc for crc, _e in parts]) == expected:
            matched += 1
            continue
        why = []
        for i, (t, (_crc, empty)) in enumerate(zip(rb.targets, parts, strict=True)):
            absent = _absent_units(rb, i, intervals)
            if absent:
                why.append(f"{t.name}: {len(absent)} chunk file(s) absent ({absent[0]}...)")
            elif empty:
                why.append(f"{t.name}: reads as the fill value everywhere")
        if why:
            bad.append((cell, MISSING, "; ".join(why)))
        else:
            bad.append((cell, CHANGED, "the checksum differs from the one recorded"))
    return matched, bad


def _roi_text(intervals: Sequence[tuple[int, int]]) -> str:
    begin = ", ".join(str(b) for b, _e in intervals)
    shape = ", ".join(str(e - b) for b, e in intervals)
    return f"write ROI [{begin}]+({shape})"


# -- stores ------------------------------------------------------------------------------------


class _Store:
    """One store as verify reads it."""

    def __init__(self, path: StoreLocation) -> None:
        from .._tracking import read_outputs_record

        self.path = path  #: a local folder, or the URL of a store on S3 (a str)
        self.name = location_name(path)
        self.load()
        self.record = read_outputs_record(path)
        task_id = (self.record or {}).get("task_id")
        if isinstance(task_id, str):
            self.name = task_id
        self.geom = _geometry(self.name, self.layout)

    def load(self) -> None:
        """(Re)read the layout, the done markers and the checksums."""
        from .._tracking import StoreLayout, open_readonly

        path = self.path
        store = open_readonly(path)
        try:
            layout = StoreLayout.from_record(store.record)
            if layout is None or layout.grid_shape != store.grid_shape:
                raise TrackingError(
                    f"block tracking at {path} has no bellis_layout record (a daisy store): "
                    "its blocks' write ROIs are not known, so it cannot be verified",
                    path=str(path),
                )
            self.layout = layout
            self.grid = store.grid_shape
            self.done = store.done.reshape(-1).copy()
            sums = store.checksums()
            self.checksums = None if sums is None else sums.reshape(-1).copy()
        finally:
            store.close()

    def key(self) -> str:
        return _real(self.path)

    def below(self) -> list[str]:
        """The (real) paths of the tracking stores of the tasks downstream of this one."""
        out = []
        for entry in (self.record or {}).get("downstream") or []:
            path = entry.get("tracking") if isinstance(entry, dict) else None
            if isinstance(path, str):
                out.append(_real(path))
        return out

    def file(self, name: str) -> str:
        """The store's file (on S3: object) ``name``, as a message names it."""
        return str(join_location(self.path, name))

    def targets(self) -> list[Target]:
        record = self.record
        if record is None or not record.get("outputs"):
            raise ConfigurationError(
                f"block tracking at {self.path} records no declared outputs (outputs.json): "
                "run the task with Task(outputs=[...], verify_outputs=True) to verify it",
                parameter="verify_outputs",
            )
        if record.get("checksum", HASH_NAME) != HASH_NAME:
            raise TrackingError(
                f"{self.path}: checksums are {record.get('checksum')!r}; this bellis "
                f"knows {HASH_NAME!r}",
                path=str(self.path),
            )
        out = []
        for i, o in enumerate(record["outputs"]):
            where = str(o.get("store"))
            if "://" not in where and not os.path.isabs(where):
                # relative to the directory the task ran in, which nothing records: read
                # from here, it could be another array, or none, and a reset would clear
                # blocks whose data is fine
                raise TrackingError(
                    f"{self.file('outputs.json')}: outputs[{i}] is at the relative path "
                    f"{where!r}, and the directory it is relative to is not recorded, so "
                    "its blocks cannot be verified; nothing was reset. Write the array's "
                    'absolute path into its "store" field (a run of this bellis records '
                    "absolute paths) and verify again",
                    path=str(self.path),
                )
            out.append(
                Target(
                    where,
                    o["path"],
                    tuple(o["voxel_size"]),
                    tuple(o["offset"]),
                    o.get("readback") == "stored",
                )
            )
        return out

    def intervals(self, cell: int) -> list[tuple[int, int]] | None:
        coord = []
        rem = cell
        for n in reversed(self.grid):
            rem, c = divmod(rem, n)
            coord.append(c)
        roi = self.layout.write_roi_of_cell(tuple(reversed(coord)))
        if roi is None:
            return None
        return list(zip(roi[0], roi[1], strict=True))

    def mismatch(self, kind: str, cell: int, detail: str) -> Mismatch:
        k = _cell_to_block(self.layout, self.geom, cell)
        iv = self.intervals(cell) or []
        return Mismatch(
            kind,
            cell,
            tuple(self.geom.coords_of(k)) if k >= 0 else (),
            (tuple(b for b, _ in iv), tuple(e - b for b, e in iv)),
            detail,
        )


def _real(path: str | os.PathLike[str]) -> str:
    """A store's identity: a local folder's real path, a URL as its canonical self."""
    where = store_location(path)
    return where if isinstance(where, str) else os.path.realpath(where)


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _in_processes(
    targets: list[Target], jobs: list[tuple[int, list[tuple[int, int]], int]], n: int
) -> tuple[int, list[tuple[int, str, str]]]:
    """:func:`check_blocks` of ``jobs`` in ``n`` fresh interpreters (``python -m`` this
    module), each given an interleaved share on its stdin. Fresh interpreters, not a
    ``multiprocessing`` pool: a spawned pool re-runs the caller's script in every process
    (a script without a main guard would verify again, and again), and a forked one would
    copy whatever threads the caller runs."""
    shares = [jobs[i::n] for i in range(n) if jobs[i::n]]
    procs = []
    try:
        for _share in shares:
            p = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            procs.append(p)
        for p, share in zip(procs, shares, strict=True):
            assert p.stdin is not None
            p.stdin.write(json.dumps({"targets": targets, "jobs": share}).encode())
            p.stdin.close()
            p.stdin = None  # sent: communicate() below only reads
        matched = 0
        bad: list[tuple[int, str, str]] = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-5:]
                raise TrackingError(
                    f"a bellis verify process failed (exit code {p.returncode}): "
                    + " / ".join(tail)
                )
            answer = json.loads(out)
            if isinstance(answer, dict):  # an output it could not read: the whole verify ends
                raise TrackingError(str(answer.get("error")))
            m, b = answer
            matched += m
            bad += [(int(c), str(k), str(d)) for c, k, d in b]
        return matched, bad
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _verify_one(store: _Store, workers: int) -> VerifyResult:
    import numpy as np

    targets = store.targets()
    done_cells = np.flatnonzero(store.done)
    sums = store.checksums
    if sums is None:
        with_sum = np.zeros(0, dtype=np.intp)
        without = done_cells
    else:
        has = sums[done_cells] != 0
        with_sum, without = done_cells[has], done_cells[~has]
    jobs = []
    for cell in with_sum.tolist():
        iv = store.intervals(cell)
        if iv is not None:
            jobs.append((cell, iv, int(sums[cell])))  # type: ignore[index]
    if workers > 1 and len(jobs) > 1:
        matched, bad = _in_processes(targets, jobs, min(workers, len(jobs)))
    else:
        matched, bad = check_blocks(targets, jobs)
    mismatches = [store.mismatch(kind, cell, detail) for cell, kind, detail in sorted(bad)]
    mismatches += [
        store.mismatch(UNVERIFIABLE, cell, "no checksum recorded") for cell in without.tolist()
    ]
    return VerifyResult(
        store.name, str(store.path), len(done_cells), matched, tuple(mismatches), {}
    )


def _reset(stores: dict[StoreLocation, _Store], result: VerifyResult) -> dict[str, int]:
    """Clear the mismatched blocks of ``result`` and their downstream readers; returns the
    cleared count per store path. On S3 each clear takes the store's lock object as a run
    does, and is refused while a run's lease on it is alive."""
    from .._tracking import backend_for, store_exists

    def clear_done(path: StoreLocation, grid: tuple[int, ...], cells: list[int]) -> int:
        return backend_for(path).clear_done(path, grid, cells)

    store = stores[store_location(result.path)]
    cells = [m.cell for m in result.mismatches if m.kind in (MISSING, CHANGED)]
    if not cells:
        return {}
    cleared = {result.path: clear_done(store.path, store.grid, cells)}
    record = store.record or {}
    root = record.get("task_id") or store.name
    geoms = {root: store.geom}
    below: dict[str, _Store] = {}
    edges: list[tuple[str, str]] = []
    for entry in record.get("downstream") or []:
        tid, path = entry.get("task_id"), entry.get("tracking")
        if not isinstance(tid, str):
            continue
        if isinstance(path, str) and store_exists(path):
            down = stores.get(store_location(path)) or _Store(store_location(path))
            below[tid] = down
            geoms[tid] = down.geom
        edges += [(up, tid) for up in entry.get("upstream") or [] if isinstance(up, str)]
    bad = {root: {_cell_to_block(store.layout, store.geom, c) for c in cells} - {-1}}
    for tid, ks in transitive_readers(geoms, edges, bad).items():
        down = below[tid]
        down_cells = [_block_to_cell(down.layout, down.geom, k) for k in sorted(ks)]
        n = clear_done(down.path, down.grid, [c for c in down_cells if c >= 0])
        cleared[str(down.path)] = cleared.get(str(down.path), 0) + n
    return cleared


def verify_stores(
    paths: Sequence[str | os.PathLike[str]], *, workers: int | None = None, reset: bool = False
) -> list[VerifyResult]:
    """Verify the tracking stores at ``paths`` (each one task's), in ``workers`` processes
    (default: the cores this process may use; 1: in this process). With ``reset``, clear
    the done markers of the missing and changed blocks and of their downstream readers.
    Each store's ``verify.json`` records the outcome."""
    from .._tracking._reset import write_verify_record

    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ConfigurationError(
            f"workers={workers!r} is not a number of processes; pass 1 or more",
            parameter="workers",
        )
    n = workers or _default_workers()
    stores = {store_location(p): _Store(store_location(p)) for p in paths}
    order = _upstream_first(stores)
    # every store is read before any marker is cleared: an output that cannot be opened
    # or read (deleted, not mounted, permission denied) says nothing about the blocks'
    # data, and ends the verify with nothing reset. Every output opens before any block
    # is read
    for store in stores.values():
        open_targets(store.targets())
    results = {path: _verify_one(stores[path], n) for path in order}
    if reset:
        touched = False
        for path in order:  # upstream first: a reset clears blocks downstream only
            store, result = stores[path], results[path]
            if touched:
                result = _less_upstream_resets(store, result)
            cleared = _reset(stores, result)
            touched = touched or bool(cleared)
            results[path] = replace(result, reset=cleared)
    for path in order:
        store, result = stores[path], results[path]
        write_verify_record(
            store.path,
            checked=result.done,
            verified=result.verified,
            missing=[m.cell for m in result.missing],
            changed=[m.cell for m in result.changed],
            unverifiable=len(result.unverifiable),
            reset=reset,
            grid=store.grid,
        )
    return [results[p] for p in stores]


def _less_upstream_resets(store: _Store, result: VerifyResult) -> VerifyResult:
    """``result`` without the blocks that the resets of stores upstream cleared since it
    was read (they are redone by the next run, as if they had not been done): not
    counted as done or verified, not listed, not reset again."""
    import numpy as np

    before, sums = store.done, store.checksums
    store.load()
    gone = (before != 0) & (store.done == 0)
    if not gone.any():
        return result
    cells = set(np.flatnonzero(gone).tolist())
    # the cleared blocks that had verified: those with a checksum, less the mismatched
    bad = {m.cell for m in result.mismatches if m.kind != UNVERIFIABLE} & cells
    matched = 0 if sums is None else int(np.count_nonzero(sums[gone])) - len(bad)
    return replace(
        result,
        done=result.done - len(cells),
        verified=result.verified - matched,
        mismatches=tuple(m for m in result.mismatches if m.cell not in cells),
    )


def _upstream_first(stores: dict[StoreLocation, _Store]) -> list[StoreLocation]:
    """The stores in an order where each comes after every store upstream of it (by the
    ``downstream`` lists of their ``outputs.json``), else in the order given."""
    by_key = {s.key(): p for p, s in stores.items()}
    uppers: dict[StoreLocation, set[StoreLocation]] = {p: set() for p in stores}
    for p, s in stores.items():
        for below in s.below():
            q = by_key.get(below)
            if q is not None and q != p:
                uppers[q].add(p)
    order: list[StoreLocation] = []
    placed: set[StoreLocation] = set()
    while len(order) < len(stores):
        ready = [p for p in stores if p not in placed and uppers[p] <= placed]
        if not ready:  # a cycle (records of different pipelines): the order given
            ready = [p for p in stores if p not in placed][:1]
        order.append(ready[0])
        placed.add(ready[0])
    return order


def verify_task(task: Any, *, workers: int | None = None, reset: bool = False) -> VerifyResult:
    """``Task.verify()``: :func:`verify_stores` of the task's store (re-read the outputs of
    every done block with a recorded checksum, in ``workers`` processes; ``reset`` clears
    the mismatched blocks and the downstream blocks that read them)."""
    path = task.resolved_tracking_path()
    if path is None:
        raise ConfigurationError(
            f'task "{task.task_id}" has no tracking store to verify; pass '
            "Task(tracking_path=...) or call bellis.set_tracking_basedir(...)",
            parameter="tracking_path",
        )
    return verify_stores([path], workers=workers, reset=reset)[0]


def _main() -> None:
    """A verify process: ``{"targets", "jobs"}`` on stdin, ``[matched, bad]`` on stdout
    (``{"error": text}`` when an output cannot be read)."""
    doc = json.loads(sys.stdin.buffer.read())
    jobs = [(int(c), [(int(b), int(e)) for b, e in iv], int(x)) for c, iv, x in doc["jobs"]]
    try:
        answer: Any = list(check_blocks([tuple(t) for t in doc["targets"]], jobs))
    except TrackingError as exc:
        answer = {"error": str(exc)}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    _main()
