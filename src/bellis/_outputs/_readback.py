"""Reading a block's outputs back: the checksum of ``Task(verify_outputs=True)``.

Theory of operation
-------------------
After a block's process function returns, and before the block goes home, its worker reads
each declared output's part of the block's write ROI back from the store (from the page
cache: it was just written) and hashes it with CRC-32C (google-crc32c, a dependency of
zarr; chosen by ``benchmarks/bench_verify_hash.py``: 0.3 ms for an 8 MiB block against
0.7 ms for xxh3 and 8 ms for blake2b). One checksum per block covers every output: one
output's CRC as is, several outputs' CRCs hashed again in order. Bit 32 is set in what is
stored (:data:`RECORDED`), so 0 always means "none recorded".

An output whose whole part of the ROI reads as its fill value has no data there: zarr
writes no chunk that is all fill value, and reads an absent one as fill value. That is a
failed attempt ("no data written"), unless ``verify_outputs="allow_empty"`` says such
blocks are legitimate (background). It is found without a second pass over the data: the
part's CRC equals the CRC of the fill value in the part's shape (computed once per shape).

``bellis verify`` (:mod:`._verify`) reads the same parts again with :class:`ReadBack` and
compares. Everything here takes plain values (the outputs as the worker's WELCOME carries
them, see :func:`wire_outputs`); numpy and zarr are imported only when a read-back runs,
so a worker without ``verify_outputs`` never imports them for it.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "HASH_NAME",
    "RECORDED",
    "VERIFY_MODES",
    "ReadBack",
    "Target",
    "check_verify_outputs",
    "wire_outputs",
]

#: the hash ``output_checksum`` holds (``outputs.json`` records it)
HASH_NAME = "crc32c"
#: set in every stored checksum: 0 is "none recorded"
RECORDED = 1 << 32
#: ``Task(verify_outputs=...)``: off, on, or on with blocks of only fill value accepted
VERIFY_MODES = (False, True, "allow_empty")


class Target(NamedTuple):
    """One output as a read-back needs it: plain values, as they travel to a worker."""

    store: str
    path: str
    voxel_size: tuple[float, ...]
    offset: tuple[float, ...]
    #: checksum the stored bytes of the units (chunk or shard files) the block covers,
    #: not the decoded values: only for a task whose blocks own their units wholly
    #: (``_units.owns_units``)
    stored: bool = False

    @property
    def name(self) -> str:
        store = self.store.rstrip("/")
        return f"{store}/{self.path}" if self.path else store


def _is_url(store: str) -> bool:
    return "://" in store


def check_verify_outputs(verify_outputs: Any, specs: Sequence[Any], task_id: str) -> Any:
    """``Task(verify_outputs=...)`` checked against the declared outputs ``specs``."""
    from ..errors import ConfigurationError

    if not (verify_outputs is False or verify_outputs is True or verify_outputs == "allow_empty"):
        raise ConfigurationError(
            f"verify_outputs={verify_outputs!r} is not a verify mode; use False, True (read "
            "each block's outputs back and record their checksum) or 'allow_empty' (the same, "
            "accepting blocks whose outputs read as the fill value)",
            parameter="verify_outputs",
        )
    if verify_outputs and not specs:
        raise ConfigurationError(
            f'task "{task_id}": verify_outputs={verify_outputs!r} needs declared outputs to '
            "read back; pass Task(outputs=[...]) with the zarr arrays the blocks write (see "
            "docs/outputs.md)",
            parameter="verify_outputs",
        )
    if verify_outputs:
        for spec in specs:
            if spec.store.startswith("memory://") or spec.store.startswith("<"):
                raise ConfigurationError(
                    f'task "{task_id}": verify_outputs needs outputs that a worker and '
                    f"`bellis verify` can open again, and {spec.name} is in a store of "
                    "this process only; write to a directory or URL store",
                    parameter="verify_outputs",
                )
    return verify_outputs


def wire_outputs(specs: Sequence[Any], stored: Sequence[bool]) -> list[list[Any]]:
    """The outputs of a task as its workers get them (the WELCOME's last field);
    ``stored`` per output: whether its blocks own their units (see :class:`Target`)."""
    out = []
    for s, own in zip(specs, stored, strict=True):
        store = s.store if _is_url(s.store) else os.path.abspath(s.store)
        out.append([store, s.path, list(s.voxel_size), list(s.offset), bool(own)])
    return out


class ReadBack:
    """Reads blocks' write ROIs of ``targets`` back and checksums them.

    ``targets``: :class:`Target`\\s, or lists as :func:`wire_outputs` makes them. The
    arrays are opened on first use and kept open.
    """

    def __init__(self, targets: Sequence[Any], allow_empty: bool = False) -> None:
        self.targets = [
            Target(
                str(t[0]), str(t[1]), tuple(t[2]), tuple(t[3]), bool(t[4]) if len(t) > 4 else False
            )
            for t in targets
        ]
        self.allow_empty = allow_empty
        self._arrays: list[Any] | None = None
        self._fill: dict[tuple[int, tuple[int, ...]], int] = {}

    def arrays(self) -> list[Any]:
        if self._arrays is None:
            import zarr

            self._arrays = [zarr.open_array(t.store, path=t.path, mode="r") for t in self.targets]
        return self._arrays

    def selection(self, i: int, intervals: Sequence[tuple[int, int]]) -> tuple[slice, ...]:
        """The voxel slices of output ``i`` that the world ``intervals`` cover (channel axes
        whole), clipped to the array."""
        arr = self.arrays()[i]
        t = self.targets[i]
        shape = arr.shape
        lead = len(shape) - len(intervals)
        sel = [slice(None)] * lead
        for axis, (b, e) in enumerate(intervals):
            vs, off = t.voxel_size[axis], t.offset[axis]
            n = shape[lead + axis]
            lo = min(n, max(0, math.floor((b - off) / vs)))
            hi = min(n, max(lo, math.ceil((e - off) / vs)))
            sel.append(slice(lo, hi))
        return tuple(sel)

    def read(self, i: int, intervals: Sequence[tuple[int, int]]) -> Any:
        """Output ``i``'s data in the world ``intervals``, a C-contiguous numpy array."""
        import numpy as np

        data = np.ascontiguousarray(self.arrays()[i][self.selection(i, intervals)])
        data.flags.writeable = False  # google-crc32c hashes read-only buffers only
        return data

    def fill_crc(self, i: int, shape: tuple[int, ...]) -> int:
        """The CRC-32C of output ``i``'s fill value in ``shape`` (cached per shape)."""
        key = (i, shape)
        crc = self._fill.get(key)
        if crc is None:
            import google_crc32c
            import numpy as np

            arr = self.arrays()[i]
            fill = np.full(shape, arr.fill_value, dtype=arr.dtype)
            fill.flags.writeable = False
            crc = self._fill[key] = int(google_crc32c.value(fill))
        return crc

    def unit_keys(self, i: int, intervals: Sequence[tuple[int, int]]) -> list[str]:
        """The store keys (relative to the array) of the units (shards, else chunks) of
        output ``i`` that the world ``intervals`` touch, in C order; channel axes whole."""
        import itertools

        arr = self.arrays()[i]
        sel = self.selection(i, intervals)
        unit = arr.shards if arr.shards is not None else arr.chunks
        ranges = []
        for s, u, n in zip(sel, unit, arr.shape, strict=True):
            lo, hi = (0, n) if s.start is None else (s.start, s.stop)
            ranges.append(range(lo // u, -(-hi // u)) if hi > lo else range(0))
        return [arr.metadata.encode_chunk_key(c) for c in itertools.product(*ranges)]

    def read_unit(self, i: int, key: str) -> Any:
        """The stored bytes of unit ``key`` of output ``i`` (read-only), None if absent."""
        arr = self.arrays()[i]
        root = getattr(arr.store, "root", None)
        if root is not None:  # a local store: the file itself, without zarr's event loop
            try:
                with open(os.path.join(root, arr.path, key), "rb") as fh:
                    return fh.read()
            except FileNotFoundError:
                return None
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        buf = sync((arr.store_path / key).get(prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def _stored_crc(self, i: int, intervals: Sequence[tuple[int, int]]) -> tuple[int, bool]:
        import google_crc32c

        crc = 0
        empty = True
        for key in self.unit_keys(i, intervals):
            data = self.read_unit(i, key)
            crc = google_crc32c.extend(crc, key.encode() + (b"\0" if data is None else b"\1"))
            if data is not None:
                crc = google_crc32c.extend(crc, data)
                empty = False
        return int(crc), empty

    def crcs(self, intervals: Sequence[tuple[int, int]]) -> list[tuple[int, bool]]:
        """Per output: the CRC-32C of its part of ``intervals`` (of its units' stored
        bytes for a :attr:`Target.stored` output), and whether that part has no data: it
        reads as the fill value everywhere, or every unit is absent (True for an empty
        part). Raises what zarr raises for data it cannot read."""
        import google_crc32c

        out = []
        for i, t in enumerate(self.targets):
            if t.stored:
                out.append(self._stored_crc(i, intervals))
                continue
            data = self.read(i, intervals)
            crc = int(google_crc32c.value(data))
            empty = data.size == 0 or crc == self.fill_crc(i, data.shape)
            out.append((crc, empty))
        return out

    @staticmethod
    def combine(crcs: Sequence[int]) -> int:
        """The stored checksum of a block whose outputs have CRCs ``crcs``."""
        if len(crcs) == 1:
            return RECORDED | crcs[0]
        import google_crc32c

        packed = struct.pack(f"<{len(crcs)}I", *crcs)
        return RECORDED | int(google_crc32c.value(packed))

    def checksum(self, intervals: Sequence[tuple[int, int]]) -> int | str:
        """The block's checksum, or why its read-back failed (the text of a failed
        attempt): an output that cannot be read, or that has no data in the block's write
        ROI (all fill value) unless ``allow_empty``."""
        try:
            parts = self.crcs(intervals)
        except Exception as exc:
            return (
                f"verify_outputs: reading the block's write ROI {_roi(intervals)} back from "
                f"its outputs failed: {type(exc).__name__}: {exc}"
            )
        if not self.allow_empty:
            for t, (_crc, empty) in zip(self.targets, parts, strict=True):
                if empty:
                    return (
                        f"verify_outputs: output {t.name} has no data in the block's write "
                        f"ROI {_roi(intervals)}: it reads back as the fill value everywhere "
                        "(its chunks are absent, or the block wrote only the fill value). "
                        "Write the block's output there, or pass "
                        "Task(verify_outputs='allow_empty') if such blocks are expected"
                    )
        return self.combine([crc for crc, _empty in parts])


def _roi(intervals: Sequence[tuple[int, int]]) -> str:
    begin = ", ".join(str(b) for b, _e in intervals)
    shape = ", ".join(str(e - b) for b, e in intervals)
    return f"[{begin}]+({shape})"
