"""Reading a tracking store: ``failed_cells`` and ``bellis status PATH``.

Reads the store read-only through :meth:`TrackingStore.open_readonly`, so it works while
a run is writing it and on stores written by daisy 2.0.0 (which carry only the hash).
The arrays are read in one pass, a slab at a time (never a whole-array copy).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._sizes import format_bytes
from ..errors import TrackingError
from ._codever import MAX_CODE_INDEX, version_counts
from ._disk import data_ranges
from ._layout import (
    CACHE_ARRAYS,
    STAT_ARRAYS,
    StoreLayout,
    invalid_metadata,
    layout_hash,
    layout_mismatch,
    plan_growth,
)
from ._reset import VerifyCounts, read_verify_record, verify_counts
from ._s3 import S3Store, is_s3_url
from ._store import TrackingStore

__all__ = [
    "SlabReader",
    "StatusSnapshot",
    "failed_cells",
    "format_status",
    "read_status",
    "render_status",
]

_INDENT = "    "


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _render_map(
    done: NDArray[np.bool_],
    failed: NDArray[np.bool_],
    max_width: int,
    max_height: int,
    block: NDArray[np.bool_] | None = None,
) -> tuple[list[str], int]:
    """One character per cell of a 2-D grid, or per ``k x k`` square of cells.

    Returns the lines and ``k``. ``block`` says which cells hold a block (None: unknown,
    every cell counts). Over the block cells of a square: ``x`` if any failed, ``#`` if
    all are done, ``+`` if some are, ``.`` if none are; ``-`` for a square without a
    block (cells of the read context, or past the last block of a ``valid`` fit).
    """
    rows, cols = done.shape
    k = max(
        1,
        _ceil_div(cols, max(1, max_width - len(_INDENT))),
        _ceil_div(rows, max(1, max_height)),
    )
    out_rows, out_cols = _ceil_div(rows, k), _ceil_div(cols, k)
    padded = np.zeros((3, out_rows * k, out_cols * k), dtype=np.int64)
    padded[0, :rows, :cols] = 1 if block is None else block
    padded[1, :rows, :cols] = done
    padded[2, :rows, :cols] = failed
    counts = padded.reshape(3, out_rows, k, out_cols, k).sum(axis=(2, 4))
    present, n_done, n_failed = counts[0], counts[1], counts[2]
    chars = np.full((out_rows, out_cols), ".", dtype="<U1")
    chars[present == 0] = "-"
    chars[(n_done > 0) & (n_done < present)] = "+"
    chars[(n_done >= present) & (present > 0)] = "#"
    chars[n_failed > 0] = "x"
    return [_INDENT + "".join(row) for row in chars.tolist()], k


def _count_runs(path: os.PathLike[str] | str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except FileNotFoundError:
        return 0


#: cells read per pass of :func:`read_status` (a few MiB of copies at a time)
_SLAB = 1 << 22


@dataclass(frozen=True)
class StatusSnapshot:
    """One read of a tracking store: what ``bellis status`` shows.

    Counts, and the two boolean planes the map is drawn from; never a copy of a whole
    array, so a 10^9-cell store is read in one pass of a few MiB at a time.
    """

    display: str
    grid: tuple[int, ...]
    task_hash: str | None
    record: dict[str, Any] | None
    cells: int
    done_count: int
    failed_count: int
    """cells with ``failures > 0`` and not done"""
    attempts: int
    """failed attempts recorded, over every cell"""
    retried: int
    """done cells that failed before they succeeded"""
    plane_done: NDArray[np.bool_]
    plane_failed: NDArray[np.bool_]
    """the map's 2-D plane: the grid (1-D: one row, 2-D: itself, 3-D: the middle slice
    along axis 0); empty for an empty grid or more than three dimensions"""
    present: list[str]
    runs: int
    returned_at: NDArray[np.float64] | None
    """``returned_at`` stamps later than ``read_status``'s ``stamps_after``, flat; None in
    a store without them."""
    stamped: bool = False
    """whether any cell has a ``returned_at`` stamp"""
    layout: StoreLayout | None = None
    """the block geometry from the store's ``bellis_layout`` record; None for a store
    without one (daisy 2.0.0's carry only the layout hash): then which cells are blocks,
    and how many blocks there are, is not known"""
    plane_block: NDArray[np.bool_] | None = None
    """which cells of the map's plane hold a block (None: unknown)"""
    middle: int = 0
    """a 3-D map's slice along axis 0: the middle one of the blocks' cells"""
    verify: VerifyCounts | None = None
    """done blocks by what ``bellis verify`` knows of them; None for a store whose blocks
    record no checksum and that was never verified"""
    code_versions: tuple[dict[str, Any], ...] = ()
    """done cells per code version (``_codever.version_counts``), the unknown ones last;
    a store without a ``code_version`` array has all its done cells unknown"""
    input_cache: dict[str, int] | None = None
    """over the done blocks, what the workers' chunk caches did for them (``hits``,
    ``misses``, ``miss_bytes``, ``bypassed``, ``blocks``: the done blocks with counts); None
    for a store that recorded none (a task without declared inputs)"""

    @property
    def blocks(self) -> int | None:
        """How many blocks the task has (None: unknown, see ``layout``)."""
        return None if self.layout is None else self.layout.block_count

    @property
    def untouched(self) -> int:
        """Blocks neither done nor failed; without a layout, cells (an upper bound)."""
        total = self.cells if self.layout is None else self.layout.block_count
        return max(0, total - self.done_count - self.failed_count)


class SlabReader:
    """Copies of slabs of one mapped chunk, read with ``pread`` (no mapped pages stay
    resident) and skipping the file's holes: a slab wholly in a hole reads as None (all
    zeros), so a never-written ``failures`` chunk of 4 GB costs a few ``lseek`` calls."""

    def __init__(self, arr: NDArray[Any]) -> None:
        self.flat = arr.reshape(-1)
        self.dtype = arr.dtype
        self.size = int(arr.size)
        self.fd = -1
        self.ranges: list[tuple[int, int]] | None = None
        self.base = 0
        filename = getattr(arr, "filename", None)
        if filename is not None and self.size:
            self.fd = os.open(filename, os.O_RDONLY)
            self.base = int(getattr(arr, "offset", 0))
            itemsize = self.dtype.itemsize
            ranges = data_ranges(self.fd, self.base + self.size * itemsize)
            if ranges is not None:
                self.ranges = [
                    ((a - self.base) // itemsize, -(-(b - self.base) // itemsize))
                    for a, b in ranges
                    if b > self.base
                ]

    def read(self, a: int, b: int) -> NDArray[Any] | None:
        """Cells ``[a, b)``, or None when they are all zero (a hole)."""
        if self.ranges is not None and not any(lo < b and hi > a for lo, hi in self.ranges):
            return None
        if self.fd < 0:
            return np.array(self.flat[a:b])
        out = np.empty(b - a, dtype=self.dtype)
        raw: Any = out.data
        view = memoryview(raw).cast("B")
        offset = self.base + a * self.dtype.itemsize
        got = 0
        while got < len(view):
            n = os.preadv(self.fd, [view[got:]], offset + got)
            if n <= 0:
                raise TrackingError(f"short read of a tracking chunk at byte {offset + got}")
            got += n
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _plane_index(grid: tuple[int, ...], middle: int) -> tuple[int, int] | None:
    """The flat cell range of the map's plane (slice ``middle`` of a 3-D grid), or None
    when there is no map."""
    n = int(np.prod(grid)) if grid else 0
    if n == 0 or len(grid) > 3:
        return None
    if len(grid) <= 2:
        return 0, n
    plane = grid[1] * grid[2]
    return middle * plane, (middle + 1) * plane


def _layout_of(record: dict[str, Any] | None, grid: tuple[int, ...]) -> StoreLayout | None:
    layout = StoreLayout.from_record(record)
    return layout if layout is not None and layout.grid_shape == grid else None


def _middle(grid: tuple[int, ...], layout: StoreLayout | None) -> int:
    """The middle slice along axis 0 of the blocks' cells (of the grid without a layout)."""
    if len(grid) != 3:
        return 0
    if layout is not None:
        first, count = layout.block_cells[0]
        if count > 0:
            return first + count // 2
    return grid[0] // 2


def _plane_blocks(
    layout: StoreLayout | None, grid: tuple[int, ...], middle: int
) -> NDArray[np.bool_] | None:
    """Which cells of the map's plane hold a block."""
    if layout is None or not grid or len(grid) > 3:
        return None
    masks = layout.block_axis_masks()
    if len(grid) == 1:
        return masks[0].reshape(1, -1)
    plane = np.outer(masks[-2], masks[-1])
    if len(grid) == 3:
        plane &= bool(masks[0][middle])
    return plane


def read_status(path: str | os.PathLike[str], *, stamps_after: float = 0.0) -> StatusSnapshot:
    """Read the store at ``path`` once, read-only (see :func:`format_status`).

    One pass over the arrays, a slab of cells at a time; each slab is copied once, so
    the counts of one slab agree with each other while a run writes the store.
    """
    display = os.fspath(path)
    on_s3 = is_s3_url(path)  # read by key, no lock; runs merged from per-run objects
    opened: TrackingStore | S3Store = (
        S3Store.open_readonly(path) if on_s3 else TrackingStore.open_readonly(path)
    )
    if isinstance(opened, S3Store):
        display = opened.url
    with opened as store:
        grid = tuple(store.grid_shape)
        stats = store.stats
        present = [name for name in STAT_ARRAYS if name in stats]
        cells = int(store.done.size)
        layout = _layout_of(store.record, grid)
        middle = _middle(grid, layout)
        window = _plane_index(grid, middle)
        plane_shape = (1, cells) if len(grid) == 1 else (grid[-2], grid[-1]) if window else (0, 0)
        plane_done = np.zeros(plane_shape, dtype=bool)
        plane_failed = np.zeros(plane_shape, dtype=bool)
        pd, pf = plane_done.reshape(-1), plane_failed.reshape(-1)
        n_done = n_failed = attempts = retried = 0
        stamped = False
        recent: list[NDArray[np.float64]] = []
        readers = [
            SlabReader(store.done),
            SlabReader(store.failures),
            *([SlabReader(stats["returned_at"])] if "returned_at" in stats else []),
        ]
        codes = store.code_versions()
        code_reader = None if codes is None else SlabReader(codes)
        per_code = np.zeros(MAX_CODE_INDEX + 1, dtype=np.int64)
        try:
            for a in range(0, cells, _SLAB):
                b = min(cells, a + _SLAB)
                raw_done = readers[0].read(a, b)
                raw_failures = readers[1].read(a, b)
                if raw_failures is not None and not np.count_nonzero(raw_failures):
                    raw_failures = None
                in_plane = window is not None and a < window[1] and b > window[0]
                done: NDArray[np.bool_] | None = None
                if raw_done is not None:
                    n_done += int(np.count_nonzero(raw_done))
                    if raw_failures is not None or in_plane:
                        done = raw_done != 0
                    if code_reader is not None:
                        raw_codes = code_reader.read(a, b)
                        if raw_codes is not None:
                            per_code += np.bincount(
                                raw_codes[raw_done != 0], minlength=MAX_CODE_INDEX + 1
                            )
                failed: NDArray[np.bool_] | None = None
                if raw_failures is not None:
                    if done is None:
                        done = np.zeros(b - a, dtype=bool)
                    failed_any = raw_failures > 0
                    attempts += int(raw_failures.sum(dtype=np.uint64))
                    retried += int(np.count_nonzero(failed_any & done))
                    failed = np.greater(failed_any, done)  # failed and not done
                    n_failed += int(np.count_nonzero(failed))
                if in_plane:
                    assert window is not None
                    lo, hi = max(a, window[0]), min(b, window[1])
                    if done is not None:
                        pd[lo - window[0] : hi - window[0]] = done[lo - a : hi - a]
                    if failed is not None:
                        pf[lo - window[0] : hi - window[0]] = failed[lo - a : hi - a]
                if len(readers) > 2:
                    stamps = readers[2].read(a, b)
                    if stamps is not None:
                        stamped = stamped or bool(stamps.any())
                        recent.append(stamps[stamps > stamps_after])
        finally:
            for reader in readers:
                reader.close()
            if code_reader is not None:
                code_reader.close()
        returned = None
        if "returned_at" in stats:
            returned = np.concatenate(recent) if recent else np.zeros(0, dtype=np.float64)
        task_hash = store.task_hash
        record: dict[str, Any] | None = store.record
        runs_file = store.runs_jsonl
        try:  # in the store's lifetime: an S3 store's merged file goes with it
            runs = _count_runs(runs_file)
        except OSError as exc:
            raise TrackingError(f"io error reading {runs_file}: {exc}", path=display) from exc
        checks = store.checksums()
        last_verify = None if on_s3 else read_verify_record(path)
        verify = None
        if checks is not None or last_verify is not None:
            flat = None if checks is None else checks.reshape(-1)
            verify = verify_counts(store.done.reshape(-1), flat, last_verify)
        counts = {int(i): int(per_code[i]) for i in np.flatnonzero(per_code)}
        counts[0] = counts.get(0, 0) + n_done - int(per_code.sum())  # no array, or a hole
        if not counts[0]:
            del counts[0]
        table = store.code_table() if codes is not None else []
        input_cache = _cache_sums(store.done.reshape(-1), store.cache_counts())
    return StatusSnapshot(
        display,
        grid,
        task_hash,
        record,
        cells,
        n_done,
        n_failed,
        attempts,
        retried,
        plane_done,
        plane_failed,
        present,
        runs,
        returned,
        stamped,
        layout,
        _plane_blocks(layout, grid, middle) if window else None,
        middle,
        verify,
        tuple(version_counts(table, counts)),
        input_cache,
    )


def _cache_sums(done: NDArray[Any], arrays: Any) -> dict[str, int] | None:
    """The per-block cache counts (``CACHE_ARRAYS``) summed over the done cells, a slab at
    a time, and how many done cells have any; None without the arrays."""
    if arrays is None:
        return None
    flats = [arrays[name].reshape(-1) for name in CACHE_ARRAYS]
    sums = [0] * len(flats)
    blocks = 0
    for a in range(0, int(done.size), _SLAB):
        b = min(int(done.size), a + _SLAB)
        mask = np.asarray(done[a:b]) != 0
        if not mask.any():
            continue
        any_count = np.zeros(b - a, dtype=bool)
        for i, flat in enumerate(flats):
            part = np.asarray(flat[a:b])
            sums[i] += int(part[mask].sum(dtype=np.uint64))
            any_count |= part != 0
        blocks += int(np.count_nonzero(any_count & mask))
    out = {n.removeprefix("cache_"): total for n, total in zip(CACHE_ARRAYS, sums, strict=True)}
    out["blocks"] = blocks
    return out


def _cache_line(c: dict[str, int]) -> str:
    """``bellis status``'s line of per-block cache counts: hit rate, decodes per block."""
    reads = c["hits"] + c["misses"]
    rate = f"{100.0 * c['hits'] / reads:.0f}% hit" if reads else "no cached reads"
    per = c["misses"] / c["blocks"] if c["blocks"] else 0.0
    return (
        f"  input cache {rate}: {c['hits']} hits, {c['misses']} decodes ({per:.2f} per "
        f"block, over {c['blocks']} done blocks), {format_bytes(c['miss_bytes'])} decoded, "
        f"{c['bypassed']} reads bypassed"
    )


def _chunk_share(c: dict[str, int] | None) -> float | None:
    """Cache hits over chunk reads of the done blocks (None: none read, or no counts)."""
    if c is None or not c["hits"] + c["misses"]:
        return None
    return c["hits"] / (c["hits"] + c["misses"])


def _chunk_locality_line(c: dict[str, int]) -> str:
    """``bellis status``'s chunk-level locality: the share of the done blocks' chunk reads
    that their worker had read for an earlier block (cache hits)."""
    reads = c["hits"] + c["misses"]
    if not reads:
        return "  chunk locality  no chunk of a declared input read"
    return (
        f"  chunk locality  {100.0 * c['hits'] / reads:.1f}% of input chunks read by their "
        f"worker for an earlier block ({c['hits']} of {reads})"
    )


def _code_lines(snap: StatusSnapshot) -> list[str]:
    """``bellis status``'s done blocks per code version (``docs/tracking.md``)."""
    rows = snap.code_versions
    if not rows:
        return ["  code        no done blocks"]
    out: list[str] = []
    for row in rows:
        if row["version"] is None:
            text = (
                f"unknown version: {row['blocks']} blocks (made before code versions were "
                "recorded, or output a check_function found)"
            )
        else:
            seen = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(row["first_seen"] or 0))
            covered = ", ".join(row["functions"]) or "none"
            text = (
                f"version {row['version']}: {row['blocks']} blocks ({row['hash'][:12]}, "
                f"first seen {seen}, functions {covered})"
            )
        out.append(("  code        " if not out else "              ") + text)
    return out


def format_status(
    path: str | os.PathLike[str], *, max_width: int = 80, max_height: int = 40
) -> str:
    """Summarise the tracking store at ``path`` as text.

    Counts blocks (from the store's layout record), done, failed (``failures > 0`` and
    not done) and untouched blocks, the total
    of failed attempts, the resource arrays present and the runs recorded, and draws a
    map of 1-D, 2-D and 3-D grids (the middle slice along axis 0 for 3-D). A map wider
    than ``max_width`` or taller than ``max_height`` is downsampled by a square factor.
    Raises :class:`~bellis.errors.TrackingError` when there is no store or it cannot
    be read.
    """
    return render_status(read_status(path), max_width=max_width, max_height=max_height)


def render_status(snap: StatusSnapshot, *, max_width: int = 80, max_height: int = 40) -> str:
    """The text of :func:`format_status` for one snapshot."""
    display, present = snap.display, snap.present
    grid, task_hash, record, runs = snap.grid, snap.task_hash, snap.record, snap.runs
    cells, n_done, n_failed = snap.cells, snap.done_count, snap.failed_count
    attempts, retried = snap.attempts, snap.retried

    lines = [f"block tracking at {display}"]
    if task_hash is None:
        lines.append("  layout      no daisy_task_hash (a caller-provided store)")
    else:
        lines.append(f"  layout      hash {task_hash}")
    if record is not None:
        lines.append(
            f"              grid offset {record.get('grid_offset')}, "
            f"stride {record.get('write_stride')}, fit {record.get('fit')}"
        )
    lines.append(f"  grid        {' x '.join(str(g) for g in grid)} = {cells} cells")
    layout = snap.layout
    if layout is not None:
        blocks = layout.block_count
        spare = cells - blocks
        lines.append(
            f"  blocks      {' x '.join(str(g) for g in layout.block_grid)} = {blocks}"
            + (
                f" (the other {spare} cells hold no block)"
                if spare > 1
                else " (the other cell holds no block)"
                if spare
                else ""
            )
        )
    else:
        lines.append(
            "  blocks      unknown: no bellis_layout record (a daisy 2.0.0 store has only the\n"
            "              layout hash), so which cells are blocks is not known"
        )
    lines.append(f"  done        {n_done}")
    lines.append(f"  failed      {n_failed} (failures > 0 and not done)")
    if layout is not None:
        lines.append(f"  untouched   {snap.untouched}")
    else:
        lines.append(
            f"  untouched   at most {snap.untouched} (cells not done: blocks, or cells of no block)"
        )
    lines.append(
        f"  attempts    {attempts} failed attempts recorded; "
        f"{retried} of the done cells failed before they succeeded"
    )
    if not present:
        lines.append("  resources   none (opened without resource_tracking)")
    elif len(present) == len(STAT_ARRAYS):
        lines.append(f"  resources   all {len(STAT_ARRAYS)} arrays")
    else:
        missing = ", ".join(n for n in STAT_ARRAYS if n not in present)
        lines.append(
            f"  resources   {len(present)} of {len(STAT_ARRAYS)} arrays (missing {missing})"
        )
    lines.append(f"  runs        {runs} recorded in runs.jsonl")
    if snap.verify is not None:
        v = snap.verify
        when = (
            "never verified (bellis verify PATH)"
            if v.last_verify is None
            else "last bellis verify "
            + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.last_verify))
        )
        lines.append(
            f"  verified    {v.verified} verified, {v.mismatched} mismatched, "
            f"{v.unverifiable} unverifiable (done, no checksum); {when}"
        )
    if snap.input_cache is not None:
        lines.append(_cache_line(snap.input_cache))
        lines.append(_chunk_locality_line(snap.input_cache))
    lines.extend(_code_lines(snap))

    ndim = len(grid)
    if cells == 0:
        lines.append("  map         (empty grid)")
        return "\n".join(lines) + "\n"
    if ndim > 3:
        lines.append(f"  map         (no map for a {ndim}-D grid)")
        return "\n".join(lines) + "\n"
    plane_done, plane_failed = snap.plane_done, snap.plane_failed
    if ndim == 1:
        axes = "one row, axis 0 left to right"
    elif ndim == 2:
        axes = "rows = axis 0, columns = axis 1"
    else:
        axes = (
            f"middle slice along axis 0 (index {snap.middle} of 0..{grid[0] - 1}), "
            "rows = axis 1, columns = axis 2"
        )
    block = snap.plane_block if layout is not None else None
    rendered, k = _render_map(plane_done, plane_failed, max_width, max_height, block)
    lines.append(f"  map         {axes}")
    untouched = ". untouched, - no block" if layout is not None else ". not done (or no block)"
    if k == 1:
        lines.append(f"              # done, x failed, {untouched}")
    else:
        lines.append(
            f"              downsampled: each character covers {k} x {k} cells; "
            "# all done, + some done, x any failed, . none done"
            + (", - no block" if layout is not None else "")
        )
    lines.extend(rendered)
    return "\n".join(lines) + "\n"


def failed_cells(path: str | os.PathLike[str], *, layout: StoreLayout | None = None) -> list[int]:
    """Flat cells with ``failures > 0`` and ``done == 0``, ascending.

    Empty when there is no store or no ``zarr.json``. With ``layout``, the cells are
    those of that layout's grid: a store for another layout is refused unless it is a
    grown-volume ancestor, whose cells are then remapped the way opening would migrate
    them (without writing anything). A store that cannot be opened raises
    ``TrackingError("cannot open block tracking at <p>: <e>")``.
    """
    display = os.fspath(path)
    root = Path(path)
    if not (root / "zarr.json").is_file():
        return []
    try:
        with TrackingStore.open_readonly(root) as store:
            if layout is None or (
                store.task_hash is not None and store.task_hash == layout_hash(layout)
            ):
                return _failed_in_slabs(store)
            done = np.array(store.done, dtype=bool)
            failures = np.array(store.failures) > 0
            done, failures = _as_layout(store, display, layout, done, failures)
    except TrackingError as exc:
        raise TrackingError(
            f"cannot open block tracking at {display}: {exc}", path=display
        ) from exc
    return [int(c) for c in np.flatnonzero(failures & ~done)]


def _failed_in_slabs(store: TrackingStore) -> list[int]:
    """The failed, not done cells of ``store``, read a slab at a time (holes skipped)."""
    out: list[int] = []
    readers = [SlabReader(store.done), SlabReader(store.failures)]
    try:
        cells = int(store.done.size)
        for a in range(0, cells, _SLAB):
            b = min(cells, a + _SLAB)
            failures = readers[1].read(a, b)
            if failures is None or not np.count_nonzero(failures):
                continue
            done = readers[0].read(a, b)
            failed = failures > 0 if done is None else (failures > 0) & (done == 0)
            out.extend((np.flatnonzero(failed) + a).tolist())
    finally:
        for reader in readers:
            reader.close()
    return out


def _as_layout(
    store: TrackingStore,
    display: str,
    layout: StoreLayout,
    done: NDArray[np.bool_],
    failures: NDArray[np.bool_],
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    expected = layout_hash(layout)
    grid = layout.grid_shape
    if store.task_hash is None:
        if store.grid_shape != grid:
            raise invalid_metadata(
                display,
                "done shape inconsistent with task layout "
                f"(stored = {list(store.grid_shape)}, expected = {list(grid)})",
            )
        return done, failures
    if store.task_hash == expected:
        return done, failures
    plan = plan_growth(store.record, layout)
    if isinstance(plan, str):
        raise layout_mismatch(display, store.task_hash, expected)
    target = tuple(slice(k, k + n) for k, n in zip(plan.shift, plan.old_grid, strict=True))
    new_done = np.zeros(grid, dtype=bool)
    new_failures = np.zeros(grid, dtype=bool)
    new_done[target] = done
    new_failures[target] = failures
    for axis, index in plan.clear_done:
        new_done[(slice(None),) * axis + (index,)] = False
    return new_done, new_failures


def status_record(snap: StatusSnapshot) -> dict[str, Any]:
    """``bellis status PATH --json``: what :func:`render_status` shows, as plain data.

    ``blocks`` and ``block_grid`` are None for a store without a layout record (daisy
    2.0.0's); ``untouched`` then counts cells, an upper bound (``untouched_is_bound``).
    ``failed`` counts blocks that failed and are not done, ``failed_attempts`` every failed
    attempt recorded, ``retried`` the done blocks that failed first.
    """
    layout = snap.layout
    verify = snap.verify
    return {
        "path": snap.display,
        "layout_hash": snap.task_hash,
        "layout": snap.record,
        "grid": list(snap.grid),
        "cells": snap.cells,
        "block_grid": None if layout is None else list(layout.block_grid),
        "blocks": snap.blocks,
        "done": snap.done_count,
        "failed": snap.failed_count,
        "untouched": snap.untouched,
        "untouched_is_bound": layout is None,
        "failed_attempts": snap.attempts,
        "retried": snap.retried,
        "resources": list(snap.present),
        "runs": snap.runs,
        "verify": None if verify is None else verify._asdict(),
        "code_versions": [dict(row) for row in snap.code_versions],
        "input_cache": snap.input_cache,
        # the share of the done blocks' input chunks their worker had read before
        "chunk_locality": _chunk_share(snap.input_cache),
    }
