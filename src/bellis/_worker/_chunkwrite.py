"""Chunk-aligned writes of declared outputs, encoded and written in the calling thread.

Why this hand-written path exists (the project's rule: only where a measurement says so):
zarr-python 3's synchronous ``arr[sel] = value`` runs its async write on zarr's event-loop
thread and waits for it (``zarr.core.sync``), and the loop hands the encode and the file
write to a thread pool in turn: three thread hops per call. On the W2 benchmark (4,096
blocks of 32³, one 32³ output chunk each, ``benchmarks/bench_real.py``) 84-88% of a
block's time in a bellis worker was that ``sync()`` (waiting on the loop thread, 0.3-0.5 ms
a call in asyncio's self-pipe wake-up alone), while the encode and the write take tenths of
a millisecond. ``benchmarks/real/profile_write.py`` measures it (benchmarks/RESULTS.md,
"#38: the write path"): a 32³ uint8 zstd chunk costs 1.9 ms through zarr on an idle
machine (2.8 ms at load 7), of which the zstd encode and the file write are 0.36 ms;
written here it costs 0.75 ms at load 7 (0.26× zarr's), byte for byte the same file. In
W2 at 512³ the blocks' write time fell from 19-30 s (main) to 6-8 s.

What qualifies (else zarr writes, unchanged; :func:`write_chunks` returns False):

- a zarr v3 array on a ``LocalStore`` (the local file system), writable, with a regular
  chunk grid, no sharding, no storage transformers, zarr's default codec pipeline;
- codecs exactly ``bytes`` (either endian) and at most one of ``zstd``, ``gzip`` or
  ``blosc`` (numcodecs does the encoding, with the parameters zarr's codec objects carry);
- a data type of kind bool, int, uint or float (at most 8 bytes);
- a selection of integers and step-1 slices whose box is chunk-aligned: it starts on chunk
  borders and ends on chunk borders or at the array's end (an integer only on an axis of
  chunk length 1), so that zarr too would write whole chunks without reading any;
- a value that is a scalar, or a ``numpy.ndarray`` of the box's shape (with or without the
  axes an integer drops), cast to the array's dtype as zarr casts it.

What it does, as zarr does: an edge chunk is padded with the fill value; a chunk equal to
the fill value is deleted instead of written unless ``write_empty_chunks`` is set; bytes
are the C-order values in the codec's byte order, then compressed. Each chunk file is
written to a temporary file in its folder and moved into place (``os.replace``), so a
reader never sees half a chunk.

Imports neither numpy nor zarr at module level: they are loaded already when a write
comes here (the value is an array, the target a zarr array).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

__all__ = ["counts", "write_chunks"]

_lock = threading.Lock()
#: chunk-aligned writes done here, writes left to zarr, chunk files written, chunks deleted
_counts = [0, 0, 0, 0]
_serial = itertools.count()
#: numcodecs codec objects by configuration (they are stateless)
_codecs: dict[tuple[Any, ...], Any] = {}
_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def counts() -> dict[str, int]:
    """What this process's writes did so far: ``direct`` (``[]=`` calls written here),
    ``zarr`` (calls of declared outputs left to zarr), ``chunks`` (chunk files written
    here) and ``deleted`` (chunks equal to the fill value, removed)."""
    with _lock:
        return dict(zip(("direct", "zarr", "chunks", "deleted"), _counts, strict=True))


class _Plan(NamedTuple):
    folder: str  # the array's folder in the store
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: Any  # the array's (native) numpy dtype
    disk: Any  # the dtype of the stored bytes (the bytes codec's endianness)
    fill: Any
    compressor: Any  # a numcodecs codec, or None
    write_empty: bool
    encode_key: Any  # chunk coordinates -> the chunk's key (the array's own encoding)


def _compressor(codec: Any) -> tuple[bool, Any]:
    """(supported, numcodecs codec) for zarr's bytes-to-bytes ``codec``."""
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    kind = type(codec)
    config: tuple[Any, ...]
    if kind is ZstdCodec:
        config = ("zstd", int(codec.level), bool(codec.checksum))
    elif kind is GzipCodec:
        config = ("gzip", int(codec.level))
    elif kind is BloscCodec:
        config = (
            "blosc",
            codec.cname.name,
            int(codec.clevel),
            _SHUFFLE[codec.shuffle.value],
            int(codec.blocksize),
            int(codec.typesize),
        )
    else:
        return False, None
    made = _codecs.get(config)
    if made is None:
        made = _codecs[config] = _make(config)
    return made is not False, made


def _make(config: tuple[Any, ...]) -> Any:
    """The numcodecs codec zarr builds for ``config``, or False when this numcodecs
    cannot build it as zarr does."""
    if config[0] == "zstd":
        from numcodecs.zstd import Zstd

        return Zstd(level=config[1], checksum=config[2])
    if config[0] == "gzip":
        from numcodecs.gzip import GZip

        return GZip(config[1])
    import numcodecs
    from numcodecs.blosc import Blosc

    _, cname, clevel, shuffle, blocksize, typesize = config
    major, minor = (int(p) for p in numcodecs.__version__.split(".")[:2])
    if (major, minor) < (0, 16):
        return False  # zarr passes typesize only from numcodecs 0.16 on: leave it to zarr
    return Blosc(
        cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize, typesize=typesize
    )


def _plan(arr: Any) -> _Plan | None:
    """How to write ``arr``'s chunks here, or None when zarr must."""
    try:
        from zarr.codecs import BytesCodec
        from zarr.core.chunk_grids import RegularChunkGrid
        from zarr.core.codec_pipeline import BatchedCodecPipeline
        from zarr.storage import LocalStore
    except ImportError:  # a zarr whose layout this path was not checked against: zarr writes
        return None

    meta = arr.metadata
    store = arr.store
    if (
        meta.zarr_format != 3
        or type(store) is not LocalStore
        or store.read_only
        or meta.storage_transformers
        or type(meta.chunk_grid) is not RegularChunkGrid
        or type(arr.async_array.codec_pipeline) is not BatchedCodecPipeline
    ):
        return None
    codecs = meta.codecs
    if not 1 <= len(codecs) <= 2 or type(codecs[0]) is not BytesCodec:
        return None
    compressor = None
    if len(codecs) == 2:
        ok, compressor = _compressor(codecs[1])
        if not ok:
            return None
    dtype = arr.dtype
    if dtype.kind not in "biuf" or dtype.itemsize > 8 or not dtype.isnative:
        return None
    disk = dtype
    endian = codecs[0].endian
    if dtype.itemsize > 1 and endian is not None:
        disk = dtype.newbyteorder("<" if endian.value == "little" else ">")
    return _Plan(
        folder=os.path.join(os.fspath(store.root), str(arr.path)),
        shape=tuple(int(s) for s in arr.shape),
        chunks=tuple(int(c) for c in meta.chunk_grid.chunk_shape),
        dtype=dtype,
        disk=disk,
        fill=meta.fill_value,
        compressor=compressor,
        write_empty=bool(arr.config.write_empty_chunks),
        encode_key=meta.encode_chunk_key,
    )


def selection_box(
    selection: Any, shape: Sequence[int]
) -> tuple[list[int], list[int], list[bool]] | None:
    """``selection`` of an array of ``shape`` as a box (starts, stops, which axes an
    integer drops), or None when it is not integers and step-1 slices within bounds."""
    sel = selection if isinstance(selection, tuple) else (selection,)
    ndim = len(shape)
    ellipses = [i for i, s in enumerate(sel) if s is Ellipsis]
    if len(ellipses) > 1:
        return None
    if ellipses:
        i = ellipses[0]
        sel = sel[:i] + (slice(None),) * (ndim - len(sel) + 1) + sel[i + 1 :]
    if len(sel) > ndim:
        return None
    sel = sel + (slice(None),) * (ndim - len(sel))
    starts, stops, drop = [], [], []
    for s, n in zip(sel, shape, strict=True):
        if isinstance(s, slice):
            if s.step not in (None, 1):
                return None
            a, b, _ = s.indices(n)
            starts.append(a)
            stops.append(max(a, b))
            drop.append(False)
        elif hasattr(s, "__index__") and not isinstance(s, bool):
            i = s.__index__()
            if i < 0:
                i += n
            if not 0 <= i < n:
                return None  # zarr says what is wrong
            starts.append(i)
            stops.append(i + 1)
            drop.append(True)
        else:
            return None
    if all(drop) or any(b <= a for a, b in zip(starts, stops, strict=True)):
        return None
    return starts, stops, drop


def chunks_of_box(
    starts: Sequence[int], stops: Sequence[int], chunks: Sequence[int]
) -> Iterator[tuple[int, ...]]:
    """The grid index of every chunk that the box ``[starts, stops)`` touches."""
    return itertools.product(
        *(range(a // c, (b - 1) // c + 1) for a, b, c in zip(starts, stops, chunks, strict=True))
    )


def _aligned_box(
    selection: Any, shape: tuple[int, ...], chunks: tuple[int, ...]
) -> tuple[list[int], list[int], list[bool]] | None:
    """``selection`` as a chunk-aligned box (starts, stops, which axes an integer drops),
    or None when it is not integers and step-1 slices that zarr would write as whole
    chunks without reading any."""
    box = selection_box(selection, shape)
    if box is None:
        return None
    for a, b, dropped, n, c in zip(*box, shape, chunks, strict=True):
        if (dropped and c != 1) or a % c or (b % c and b != n):
            return None
    return box


def _all_fill(chunk: Any, fill: Any) -> bool:
    """Whether ``chunk`` equals the fill value everywhere, as zarr decides it before it
    skips an empty chunk (``NDBuffer.all_equal``): NaN equals NaN, and a float fill of 0
    compares bit patterns (a chunk of -0.0 is not empty). The first element rejects most
    chunks without a pass over the others."""
    import numpy as np

    if fill is None:
        return False
    if chunk.dtype.kind == "f":
        if fill == 0.0:
            width = np.dtype(f"u{chunk.dtype.itemsize}")
            bits = chunk.view(width)
            zero = np.asarray(fill, chunk.dtype).view(width)
            return bool(bits.flat[0] == zero) and bool((bits == zero).all())
        if fill != fill:  # NaN
            return bool(np.isnan(chunk.flat[0])) and bool(np.isnan(chunk).all())
    return bool(chunk.flat[0] == fill) and bool((chunk == fill).all())


def _put(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}-{next(_serial)}.partial"
    try:
        f = open(tmp, "wb")
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(tmp, "wb")
    try:
        with f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_chunks(arr: Any, selection: Any, value: Any) -> bool:
    """Write ``arr[selection] = value`` here when it qualifies (see the module's
    docstring) and return True; else return False, having written nothing, for zarr to
    write it."""
    plan = _plan(arr)
    box = None if plan is None else _aligned_box(selection, plan.shape, plan.chunks)
    values = None if plan is None or box is None else _values(value, plan.dtype, box)
    if plan is None or box is None or values is None:
        with _lock:
            _counts[1] += 1
        return False
    import numpy as np

    starts, stops, _drop = box
    scalar = values.ndim == 0
    chunks = plan.chunks
    written = deleted = 0
    for idx in chunks_of_box(starts, stops, chunks):
        lo = [i * c for i, c in zip(idx, chunks, strict=True)]
        hi = [min(o + c, n) for o, c, n in zip(lo, chunks, plan.shape, strict=True)]
        inner = tuple(slice(0, h - o) for o, h in zip(lo, hi, strict=True))
        if scalar:
            part = values
        else:
            part = values[
                tuple(slice(o - a, h - a) for o, h, a in zip(lo, hi, starts, strict=True))
            ]
        if not scalar and part.shape == chunks:
            chunk = part
        else:  # an edge chunk (or a scalar): the fill value around the values, as zarr pads
            chunk = np.full(chunks, plan.fill, dtype=plan.dtype)
            chunk[inner] = part
        path = os.path.join(plan.folder, plan.encode_key(idx))
        if not plan.write_empty and _all_fill(chunk, plan.fill):
            _remove(path)
            deleted += 1
            continue
        raw = np.ascontiguousarray(chunk, dtype=plan.disk).reshape(-1).view(np.uint8)
        _put(path, raw if plan.compressor is None else plan.compressor.encode(raw))
        written += 1
    with _lock:
        _counts[0] += 1
        _counts[2] += written
        _counts[3] += deleted
    return True


def _values(value: Any, dtype: Any, box: tuple[list[int], list[int], list[bool]]) -> Any:
    """``value`` as an array of the box's shape (or 0-d, a scalar) in ``dtype``, cast as
    zarr casts it; None when it is not a scalar or a numpy array of that shape, or the cast
    fails (zarr then writes it, or says what is wrong)."""
    import numpy as np

    starts, stops, drop = box
    shape = tuple(b - a for a, b in zip(starts, stops, strict=True))
    try:
        if np.isscalar(value):
            return np.asarray(value, dtype=dtype)
        if type(value) is not np.ndarray:
            return None
        kept = tuple(n for n, d in zip(shape, drop, strict=True) if not d)
        if value.shape != shape:
            if value.shape != kept:
                return None
            value = value.reshape(shape)
        if value.dtype.name != dtype.name:
            value = value.astype(dtype=dtype, order="A")
        return value
    except (TypeError, ValueError, OverflowError):
        return None
