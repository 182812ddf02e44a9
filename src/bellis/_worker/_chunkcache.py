"""The per-worker decoded-chunk cache of declared inputs (``Task(inputs=[...])``).

Where the time of a read goes: a 64³ block with an 8-voxel margin from 64³ zstd chunks
touches 27 chunks, and zarr reads and decodes every one of them on every read (the
block's own chunk and its 26 neighbours' margins); 32³ blocks in 64³ chunks decode each
chunk 8 times. Measured (zarr-python 3.1.6, uint8, zstd): of the 1.8 ms one 64³ chunk
costs through zarr, the file read is 0.03 ms and the zstd decode 0.03 ms; the rest is
zarr's per-chunk machinery (event loop, codec pipeline, copies). A store-level cache
(zarr's ``CacheStore``) keeps encoded bytes, so every hit still pays all of that. This
cache keeps *decoded* chunks, as numpy arrays, in one LRU per worker process bounded in
bytes, and serves a read by copying from them (an 80³ read from 27 held chunks: 0.5 ms).

How it is transparent: while a task with declared inputs runs, ``zarr.Array.__getitem__``
is wrapped in this process (:func:`install`; :meth:`Installed.remove` puts it back). A
read of an array whose store and path are a declared input's, with a selection of
integers and step-1 slices, is served here; every other read (other arrays, fancy or
strided selections, ``get_*_selection``, ``oindex``/``vindex``) goes to zarr unchanged.
So ``raw[block.read_roi]`` on a funlib ``Array`` (which reads its zarr array through
``[]``, directly or through dask), ``raw.to_ndarray(roi)`` and ``raw[slices]`` on a zarr
array all hit the cache, whether the user's function opened the array at module level,
in a closure, or in the block itself. Reads that bypass ``[]`` (``get_basic_selection``,
``oindex``, ``vindex``, zarr's async API, tensorstore) are not cached: write them as
``raw[...]`` with slices to use the cache.

Chunks are the array's own (the inner chunks of a sharded array: one read of a
chunk-aligned box decodes only that chunk of the shard). A miss reads the bounding box of
the missing chunks in one zarr call when they fill it, else chunk by chunk.

Staleness: an input that a task of the run declares as an output is cacheable only where
``_outputs._inputs.plan_inputs`` proves every chunk a block reads final when the block
runs (its writers are direct upstream tasks whose write ROIs are chunk-aligned for it: the
argument is in that module's docstring); otherwise its reads go to zarr (counted as
``bypassed``). A write through ``[]=`` in this process to a cached input drops that
array's chunks. An array that the run writes without declaring it as an output is the
user's risk: declare it, or leave it out of ``inputs``.

Write-through: a task that is the one writer of an array cacheable downstream gets it with
``WRITE_THROUGH``. Its ``[]=`` writes of that array note each chunk the selection covers
whole (a copy of the written values, in the array's dtype and shape) in
``ChunkCache.pending``, and drop from the cache any chunk it covers in part; the worker
loop commits the pending chunks when the block function returns without error
(:meth:`ChunkCache.commit`) and discards them when it fails (:meth:`ChunkCache.discard`),
so a failed attempt's writes are never served. Committed chunks count against the same
byte bound, and neither as hits nor misses (``written`` counts them). A downstream block
on that worker then reads them without a decode.

Writes: the same installation serves a task's declared *outputs* (``Task(outputs=...)``,
with or without inputs): a chunk-aligned ``[]=`` to one is encoded and written in the
calling thread by :mod:`._chunkwrite` when it is simple enough; the rest go to zarr.

numpy and zarr are imported only when a task declares inputs or outputs
(:func:`install`); the :class:`ChunkCache` itself needs neither.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from .._outputs._inputs import CACHE_READS, WRITE_THROUGH, array_location
from ._chunkwrite import chunks_of_box, selection_box as _box, write_chunks

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "ChunkCache",
    "Installed",
    "active",
    "cache_bound",
    "install",
    "install_for_task",
    "take_counts",
]

#: the bound when the worker has no memory limit
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
#: the share of a worker's memory limit the cache may hold by default
LIMIT_SHARE = 4


def cache_bound(requested: int | None, memory_limit: int | None) -> int:
    """The cache's bound in bytes: ``requested`` (``Task(input_cache_bytes=...)``) when
    given, else a quarter of the worker's ``memory_limit``, else 256 MiB."""
    if requested is not None:
        return max(0, int(requested))
    if memory_limit:
        return int(memory_limit) // LIMIT_SHARE
    return DEFAULT_CACHE_BYTES


class ChunkCache:
    """A least-recently-used map of decoded chunks whose ``nbytes`` never sum above
    ``bound_bytes``. Thread-safe (dask reads a funlib array from several threads)."""

    def __init__(self, bound_bytes: int) -> None:
        self.bound_bytes = int(bound_bytes)
        self._chunks: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        #: bytes held now, and the most ever held
        self.bytes = 0
        self.peak_bytes = 0
        #: chunks served from memory, chunks read (decoded) from the store, chunks dropped
        #: to stay within the bound, and reads that went to zarr uncached
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.bypassed = 0
        #: bytes decoded from the store on misses
        self.miss_bytes = 0
        #: chunks kept from this worker's own writes (write-through, at block success)
        self.written = 0
        #: the whole chunks the running block wrote of a write-through array, not yet
        #: kept: :meth:`commit` keeps them when the block succeeds, :meth:`discard` drops
        #: them when it fails
        self.pending: dict[Any, Any] = {}
        self._reported = [0, 0, 0, 0]

    def __len__(self) -> int:
        return len(self._chunks)

    def get(self, key: Any) -> Any:
        """The chunk stored under ``key`` (counted as a hit), or None."""
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                self._chunks.move_to_end(key)
                self.hits += 1
            return chunk

    def put(self, key: Any, chunk: Any) -> None:
        """Keep ``chunk`` (counted as a miss), dropping the least recently used chunks to
        stay within the bound; a chunk larger than the bound is not kept."""
        with self._lock:
            self.misses += 1
            self.miss_bytes += int(chunk.nbytes)
            self._keep(key, chunk)

    def commit(self) -> None:
        """The running block succeeded: keep the chunks it wrote whole (:attr:`pending`),
        within the bound, counted as ``written``."""
        if not self.pending:
            return
        with self._lock:
            pending, self.pending = self.pending, {}
            for key, chunk in pending.items():
                self.written += 1
                self._keep(key, chunk)

    def discard(self) -> None:
        """The running block failed: its writes are never served."""
        if self.pending:
            with self._lock:
                self.pending = {}

    def forget(self, key: Any) -> None:
        """A write covered chunk ``key`` in part: drop it (held or pending)."""
        with self._lock:
            self.pending.pop(key, None)
            old = self._chunks.pop(key, None)
            if old is not None:
                self.bytes -= int(old.nbytes)

    def _keep(self, key: Any, chunk: Any) -> None:
        """Hold ``chunk`` under ``key`` (the lock held), least recently used ones going."""
        size = int(chunk.nbytes)
        if size > self.bound_bytes:
            old = self._chunks.pop(key, None)
            if old is not None:
                self.bytes -= int(old.nbytes)
            return
        old = self._chunks.pop(key, None)
        if old is not None:
            self.bytes -= int(old.nbytes)
        while self._chunks and self.bytes + size > self.bound_bytes:
            _key, dropped = self._chunks.popitem(last=False)
            self.bytes -= int(dropped.nbytes)
            self.evictions += 1
        self._chunks[key] = chunk
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def shrink_to(self, bound_bytes: int) -> None:
        """Set the bound to ``bound_bytes``, dropping the least recently used chunks
        until they fit."""
        with self._lock:
            self.bound_bytes = int(bound_bytes)
            while self._chunks and self.bytes > self.bound_bytes:
                _key, dropped = self._chunks.popitem(last=False)
                self.bytes -= int(dropped.nbytes)
                self.evictions += 1

    def drop_array(self, array_key: Any) -> None:
        """Forget every chunk of one array (keys are ``(array_key, chunk index)``)."""
        with self._lock:
            for key in [k for k in self._chunks if k[0] == array_key]:
                self.bytes -= int(self._chunks.pop(key).nbytes)
            for key in [k for k in self.pending if k[0] == array_key]:
                del self.pending[key]

    def take_counts(self) -> list[int] | None:
        """hits, misses, miss_bytes and bypassed reads since the last call (what a
        worker's next message reports: ``_protocol.CACHE_COUNTS``), or None when the cache
        did nothing since."""
        with self._lock:
            now = [self.hits, self.misses, self.miss_bytes, self.bypassed]
            delta = [a - b for a, b in zip(now, self._reported, strict=True)]
            self._reported = now
        return delta if any(delta) else None

    def counters(self) -> dict[str, int]:
        """hits, misses, miss_bytes, evictions, bypassed, written, bytes, peak_bytes: a
        snapshot."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "miss_bytes": self.miss_bytes,
                "evictions": self.evictions,
                "bypassed": self.bypassed,
                "written": self.written,
                "bytes": self.bytes,
                "peak_bytes": self.peak_bytes,
            }


def array_key(arr: Any) -> str:
    """Where a zarr array lives (:func:`~bellis._outputs._inputs.array_location`): the
    same string for a declared input however the block function opened it."""
    store = arr.store
    root = getattr(store, "root", None)
    return array_location(os.fspath(root) if root is not None else str(store), str(arr.path))


class Installed:
    """The cache serving one process's reads of declared inputs (see :func:`install`)."""

    def __init__(
        self,
        inputs: Iterable[Sequence[Any]],
        bound_bytes: int,
        outputs: Iterable[Sequence[Any]] = (),
    ) -> None:
        import numpy as np
        import zarr

        self._np = np
        self._zarr = zarr
        self.cache = ChunkCache(bound_bytes)
        #: where each input lives -> cacheable; where the write-through arrays live
        self.inputs: dict[str, bool] = {}
        self.writes: set[str] = set()
        self._target(inputs)
        #: where each declared output lives (written by ``_chunkwrite`` when it can)
        self.outputs = _locations(outputs)
        cls: Any = zarr.Array
        self._cls = cls
        self._getitem: Any = cls.__getitem__
        self._setitem: Any = cls.__setitem__
        original_get, original_set = self._getitem, self._setitem
        me = self

        def __getitem__(arr: Any, selection: Any) -> Any:
            if me.inputs:
                key = array_key(arr)
                cacheable = me.inputs.get(key)
                if cacheable:
                    out = me.serve(arr, key, selection)
                    if out is not None:
                        return out
                elif cacheable is not None:
                    with me.cache._lock:
                        me.cache.bypassed += 1
            return original_get(arr, selection)

        def __setitem__(arr: Any, selection: Any, value: Any) -> None:
            key = array_key(arr)
            if me.inputs and me.inputs.get(key) and key not in me.writes:
                me.cache.drop_array(key)
            # a declared output's chunk-aligned write goes to _chunkwrite (no hop to
            # zarr's loop thread); what it does not take goes to zarr
            if not (me.outputs and key in me.outputs and write_chunks(arr, selection, value)):
                original_set(arr, selection, value)
            if me.writes:  # write-through: kept at the block's success (pending)
                me.note_write(arr, selection, value)

        __getitem__.__wrapped__ = original_get  # type: ignore[attr-defined]
        setattr(cls, "__getitem__", __getitem__)  # noqa: B010
        setattr(cls, "__setitem__", __setitem__)  # noqa: B010

    def retarget(
        self,
        inputs: Iterable[Sequence[Any]],
        bound_bytes: int,
        outputs: Iterable[Sequence[Any]] = (),
    ) -> None:
        """Serve another task's declared ``inputs`` from now on, within ``bound_bytes``
        (a shared worker that moved: ``_worker._shared``). The cache stays the process's
        one: chunks of an input both tasks declare cacheable are still served (every
        chunk it holds is final: read where ``plan_inputs`` proved it so, or written
        through by the block that alone writes it, which succeeded), including the
        chunks the old task wrote through for the new one; the others stay until the
        bound pushes them out, and what the cache does from here on is counted for the
        new task. Pending writes of a block not committed are dropped."""
        self._target(inputs)
        self.outputs = _locations(outputs)
        self.cache.shrink_to(bound_bytes)

    def _target(self, inputs: Iterable[Sequence[Any]]) -> None:
        """Serve ``inputs`` (``(store, path, flags)``, ``_outputs._inputs.plan_inputs``):
        reads of those with ``CACHE_READS`` from the cache, writes of those with
        ``WRITE_THROUGH`` kept. An entry with ``WRITE_THROUGH`` alone is an output of the
        task, not an input: its reads are not counted as bypassed."""
        self.inputs = {}
        self.writes = set()
        for s, p, flags in inputs:
            where = array_location(str(s), str(p))
            f = int(flags)
            if f & WRITE_THROUGH:
                self.writes.add(where)
            if f != WRITE_THROUGH:
                self.inputs[where] = bool(f & CACHE_READS)
        self.cache.discard()

    def note_write(self, arr: Any, selection: Any, value: Any) -> None:
        """``arr[selection] = value`` was written: for a write-through array, each chunk
        the selection covers whole goes to the cache's pending chunks (a read-only copy of
        its values), each chunk it covers in part is dropped. Only a value that is an
        array of ``arr``'s dtype and of the selection's shape is kept; any other write
        drops the chunks it touches (every chunk of the array when the selection is not a
        box)."""
        key = array_key(arr)
        if key not in self.writes:
            return
        cache = self.cache
        shape = tuple(int(s) for s in arr.shape)
        box = _box(selection, shape)
        if box is None:
            cache.drop_array(key)
            return
        starts, stops, drop = box
        np = self._np
        chunks = tuple(int(c) for c in arr.chunks)
        keep = (
            isinstance(value, np.ndarray)
            and not any(drop)
            and value.dtype == arr.dtype
            and value.shape == tuple(b - a for a, b in zip(starts, stops, strict=True))
        )
        for idx in chunks_of_box(starts, stops, chunks):
            lo = [i * c for i, c in zip(idx, chunks, strict=True)]
            hi = [min((i + 1) * c, n) for i, c, n in zip(idx, chunks, shape, strict=True)]
            whole = all(a <= x and y <= b for a, b, x, y in zip(starts, stops, lo, hi, strict=True))
            if keep and whole:
                at = tuple(slice(x - a, y - a) for a, x, y in zip(starts, lo, hi, strict=True))
                part = np.array(value[at], copy=True)
                part.flags.writeable = False
                with cache._lock:
                    cache.pending[(key, idx)] = part
            else:
                cache.forget((key, idx))

    def remove(self) -> None:
        """Put zarr's own ``[]`` back."""
        setattr(self._cls, "__getitem__", self._getitem)  # noqa: B010
        setattr(self._cls, "__setitem__", self._setitem)  # noqa: B010
        global _active
        if _active is self:
            _active = None

    def serve(self, arr: Any, key: str, selection: Any) -> Any:
        """``arr[selection]`` from decoded chunks, or None when the selection is not a
        box (the caller then asks zarr)."""
        shape = tuple(int(s) for s in arr.shape)
        box = _box(selection, shape)
        if box is None:
            return None
        starts, stops, drop = box
        np = self._np
        chunks = tuple(int(c) for c in arr.chunks)
        found: dict[tuple[int, ...], Any] = {}
        missing = []
        cache = self.cache
        for idx in chunks_of_box(starts, stops, chunks):
            chunk = cache.get((key, idx))
            if chunk is None:
                missing.append(idx)
            else:
                found[idx] = chunk
        if missing:
            found.update(self._fetch(arr, key, shape, chunks, missing))
        out = np.empty([b - a for a, b in zip(starts, stops, strict=True)], dtype=arr.dtype)
        for idx, chunk in found.items():
            dst = []
            src = []
            for a, b, c, i in zip(starts, stops, chunks, idx, strict=True):
                lo, hi = max(a, i * c), min(b, (i + 1) * c)
                dst.append(slice(lo - a, hi - a))
                src.append(slice(lo - i * c, hi - i * c))
            out[tuple(dst)] = chunk[tuple(src)]
        if any(drop):
            out = out[tuple(0 if d else slice(None) for d in drop)]
        return out

    def _fetch(
        self,
        arr: Any,
        key: str,
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        missing: list[tuple[int, ...]],
    ) -> dict[tuple[int, ...], Any]:
        """Read the ``missing`` chunks from the store (one call for their bounding box
        when they fill it) and keep them."""
        lo = [min(m[d] for m in missing) for d in range(len(shape))]
        hi = [max(m[d] for m in missing) + 1 for d in range(len(shape))]
        count = 1
        for a, b in zip(lo, hi, strict=True):
            count *= b - a
        get = self._getitem
        got: dict[tuple[int, ...], Any] = {}
        if count == len(missing):
            origin = [a * c for a, c in zip(lo, chunks, strict=True)]
            region = get(
                arr,
                tuple(
                    slice(o, min(b * c, n))
                    for o, b, c, n in zip(origin, hi, chunks, shape, strict=True)
                ),
            )
            for idx in missing:
                part = region[
                    tuple(
                        slice(i * c - o, min((i + 1) * c, n) - o)
                        for i, c, o, n in zip(idx, chunks, origin, shape, strict=True)
                    )
                ]
                got[idx] = self._np.array(part, copy=True) if len(missing) > 1 else part
        else:
            for idx in missing:
                got[idx] = get(
                    arr,
                    tuple(
                        slice(i * c, min((i + 1) * c, n))
                        for i, c, n in zip(idx, chunks, shape, strict=True)
                    ),
                )
        for idx, chunk in got.items():
            chunk.flags.writeable = False
            self.cache.put((key, idx), chunk)
        return got


_active: Installed | None = None


def _locations(outputs: Iterable[Sequence[Any]]) -> frozenset[str]:
    return frozenset(array_location(str(o[0]), str(o[1])) for o in outputs)


def install(
    inputs: Iterable[Sequence[Any]], bound_bytes: int, outputs: Iterable[Sequence[Any]] = ()
) -> Installed | None:
    """Serve this process's reads of ``inputs`` (``(store, path, cacheable)`` each, as
    ``wire_inputs`` makes them) from a cache of ``bound_bytes``; None (nothing done) when
    there are no inputs or the bound is 0 and none is installed. One installation per
    process: a second call (a shared worker that moved to another task) retargets it
    (:meth:`Installed.retarget`): the new task's inputs, bound and counts, the same
    chunks; with no inputs or a bound of 0 it then serves nothing and holds nothing.
    ``outputs``: the declared outputs (``(store, path)`` each) whose writes
    :mod:`._chunkwrite` takes when it can (installed for them alone too)."""
    global _active
    inputs = [tuple(i) for i in inputs]
    outputs = [tuple(o) for o in outputs]
    if not inputs or bound_bytes <= 0:
        inputs, bound_bytes = [], 0
    if _active is not None:
        _active.retarget(inputs, bound_bytes, outputs)
        return _active
    if not inputs and not outputs:
        return None
    _active = Installed(inputs, bound_bytes, outputs)
    return _active


def install_for_task(
    inputs: Iterable[Sequence[Any]],
    input_cache_bytes: int | None,
    outputs: Iterable[Sequence[Any]] = (),
) -> None:
    """Serve a worker's task's declared ``inputs`` (:func:`install`), bounded by
    ``input_cache_bytes`` (``Task(input_cache_bytes=...)``) or else by the worker's memory
    limit (:func:`cache_bound`), and write its declared ``outputs`` directly where it can.
    A shared worker calls it again on each move (``_worker._shared``): the cache then
    serves the new task's inputs."""
    from .._protocol import MEMORY_LIMIT_ENV

    limit = os.environ.get(MEMORY_LIMIT_ENV)
    install(inputs, cache_bound(input_cache_bytes, int(limit) if limit else None), outputs)


def active() -> Installed | None:
    """The installation serving this process, if any."""
    return _active


def take_counts() -> list[int] | None:
    """What this process's cache did since the last call (:meth:`ChunkCache.take_counts`);
    None without a cache, or when it did nothing."""
    inst = _active
    return None if inst is None else inst.cache.take_counts()
