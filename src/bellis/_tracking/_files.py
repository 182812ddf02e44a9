"""File primitives of the tracking store: zarr.json documents, atomic and durable writes,
and the memory-mapped single-chunk arrays (created at full length, blocks reserved).

See ``_store.py`` for the layout on disk; nothing here knows about tasks or runs."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._donemarks import is_store_url, store_location
from ..errors import TrackingError
from ._disk import disk_full_error, is_no_space, reserve, unreserved_bytes
from ._layout import ARRAY_DTYPES, array_metadata, dump_metadata, invalid_metadata

__all__ = [
    "TMP_PREFIX",
    "cell_count",
    "child_arrays",
    "chunk_files",
    "chunk_parts",
    "create_array",
    "ensure_chunk",
    "fsync_dir",
    "make_dir",
    "map_array",
    "map_readonly",
    "map_writable",
    "open_error",
    "read_json",
    "rmtree",
    "write_atomic",
]

#: the prefix of every temporary file the store writes (a crash may leave one behind)
TMP_PREFIX = ".bellis-tmp-"


def read_json(file: Path) -> dict[str, Any] | None:
    """A zarr.json document, or None when the file does not exist."""
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise invalid_metadata(str(file), str(exc)) from exc
    if not isinstance(document, dict):
        raise invalid_metadata(str(file), "zarr.json does not hold a JSON object")
    return document


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(file: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``file`` through a temporary file in the same directory and ``os.replace``.

    ``durable`` also fsyncs the file and its directory, so the replacement survives a
    power loss; the migration needs that for its commit point, creation does not.
    """
    tmp = file.with_name(f"{TMP_PREFIX}{os.getpid()}-{file.name}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(file.parent)


#: the task's declared outputs (``Task(outputs=...)``): where each lives, its voxel mapping
OUTPUTS_NAME = "outputs.json"


def write_outputs_record(root: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Write ``outputs.json`` into the group (a zarr reader ignores the file; on S3 the
    object ``<prefix>/outputs.json``). Rewritten by each run of a task with declared
    outputs, so it names the last run's outputs."""
    data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    if is_store_url(root):
        from ._s3objects import write_object

        write_object(root, OUTPUTS_NAME, data)
        return
    file = Path(root) / OUTPUTS_NAME
    try:
        if file.read_bytes() == data:
            return  # unchanged: no rewrite, no fsync
    except OSError:
        pass  # missing or unreadable: the write below replaces it (or raises)
    write_atomic(file, data, durable=True)


def read_outputs_record(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``outputs.json`` of a group (of a store on S3: its object), or None when the task
    declared no outputs."""
    if is_store_url(root):
        from ._s3objects import read_object

        where = f"{store_location(root)}/{OUTPUTS_NAME}"
        raw = read_object(root, OUTPUTS_NAME)
        if raw is None:
            return None
    else:
        where = str(Path(root) / OUTPUTS_NAME)
        try:
            raw = (Path(root) / OUTPUTS_NAME).read_bytes()
        except FileNotFoundError:
            return None
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise invalid_metadata(where, str(exc)) from exc
    if not isinstance(document, dict):
        raise invalid_metadata(where, "not a JSON object")
    return document


def chunk_parts(ndim: int) -> tuple[str, ...]:
    return ("0",) * max(1, ndim)


def cell_count(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ensure_chunk(file: Path, nbytes: int, *, reserved: bool = True) -> None:
    """Create the chunk file with ``nbytes`` or resize it to that length, and (``reserved``)
    allocate all of its blocks, so that no store into its mapping can meet a full disk."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != nbytes:
            os.ftruncate(fd, nbytes)
        if reserved:
            reserve(fd, nbytes)
    finally:
        os.close(fd)


def chunk_files(
    root: Path, grid: tuple[int, ...], names: tuple[str, ...]
) -> list[tuple[Path, int]]:
    """The chunk file and byte size of each of the arrays ``names`` on ``grid``."""
    cells = cell_count(grid)
    parts = chunk_parts(len(grid))
    return [
        (root.joinpath(name, "c", *parts), cells * np.dtype(ARRAY_DTYPES[name]).itemsize)
        for name in names
    ]


def open_error(display: str, exc: OSError, files: list[tuple[Path, int]]) -> TrackingError:
    """The TrackingError of an OSError while opening: a full disk and a read-only
    filesystem say what to do."""
    if is_no_space(exc):
        return disk_full_error(display, max(1, unreserved_bytes(files)), Path(display))
    if exc.errno == errno.EROFS:
        return TrackingError(
            f"block tracking at {display} is on a read-only filesystem ({exc}); a run "
            f"writes its store. Read it with `bellis status {display}`, or pass "
            "tracking_path= on a writable filesystem",
            path=display,
        )
    return TrackingError(f"io error opening block tracking at {display}: {exc}", path=display)


def map_writable(file: Path, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.memmap[Any, Any]:
    ensure_chunk(file, cell_count(shape) * dtype.itemsize)
    return np.memmap(os.fspath(file), dtype=dtype, mode="r+", shape=shape, order="C")


def create_array(root: Path, name: str, grid: tuple[int, ...]) -> np.memmap[Any, Any]:
    """Write array ``name``'s metadata and map its (sparse) chunk file."""
    directory = root / name
    directory.mkdir(exist_ok=True)
    write_atomic(directory / "zarr.json", dump_metadata(array_metadata(ARRAY_DTYPES[name], grid)))
    return map_array(root, name, grid)


def map_array(root: Path, name: str, grid: tuple[int, ...]) -> np.memmap[Any, Any]:
    dtype = np.dtype(ARRAY_DTYPES[name]).newbyteorder("<")
    return map_writable(root.joinpath(name, "c", *chunk_parts(len(grid))), dtype, grid)


def map_readonly(
    file: Path, dtype: np.dtype[Any], shape: tuple[int, ...], display: str
) -> np.memmap[Any, Any]:
    """Map a chunk read-only. A missing chunk reads as the fill value (zarr semantics)."""
    nbytes = cell_count(shape) * dtype.itemsize
    if nbytes == 0 or not file.exists():
        return np.zeros(shape, dtype=dtype).view(np.memmap)
    size = file.stat().st_size
    if size != nbytes:
        raise invalid_metadata(display, f"chunk file {file} is {size} bytes, expected {nbytes}")
    return np.memmap(os.fspath(file), dtype=dtype, mode="r", shape=shape, order="C")


def child_arrays(root: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Every child directory of the group that holds a zarr array, sorted by name."""
    found = []
    for child in sorted(root.iterdir()):
        if child.is_symlink() or not child.is_dir():
            continue
        meta = read_json(child / "zarr.json")
        if meta is not None and meta.get("node_type") == "array":
            found.append((child.name, child / "zarr.json", meta))
    return found


def clear_cells(done: NDArray[Any], cells: Sequence[int] | NDArray[np.intp]) -> int:
    """Set the flat ``done`` markers of ``cells`` to 0; returns how many were set (cells
    outside the array are ignored). The one place a done marker is cleared."""
    picked = np.asarray(cells, dtype=np.intp).reshape(-1)
    picked = picked[(picked >= 0) & (picked < done.size)]
    if picked.size == 0:
        return 0
    picked = np.unique(picked)
    was = int(np.count_nonzero(done[picked]))
    done[picked] = 0
    return was


def make_dir(root: Path) -> Path:
    """Create the store directory (and its parents); returns it."""
    root.mkdir(parents=True, exist_ok=True)
    return root


def rmtree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)
