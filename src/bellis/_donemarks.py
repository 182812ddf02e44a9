"""The done markers as the rest of the package sees them: one typed interface to a task's
tracking store, whatever keeps it.

``_tracking`` owns the markers: it is the only package that knows where and how they are
kept (SPEC §4.2: a zarr v3 group on local disk today) and the only one that opens their
arrays. Everything else holds a :class:`BlockStore`, an open store of one task, and asks
it: the scheduler (``_scheduling``, which may not import ``_tracking``) records blocks
through it, the run's start (``_run/_provenance``) clears stale markers through it, and
the readers (``_stats``, ``_report``, ``_plan``, ``_cli``) read the mask it hands out.
:class:`StoreBackend` is what a kind of store offers before one is open: find stores,
tell a store from other folders, open one read-only, clear markers of a store no run
holds. ``_tracking/_backends.py`` picks the backend of a path.

Cells are C-order flat indices into :attr:`BlockStore.grid_shape`, the tracking grid;
the scheduler translates blocks into cells (``TaskRun.cell_of``) before it asks.

The hot path
------------
A block that comes back unmeasured is marked done by one element store, not a method
call: :meth:`BlockStore.hot_writer` hands out a :class:`HotWriter`, whose ``done`` (and
``code``) take ``writer.done[cell] = 1`` directly (a typed ``memoryview`` of the mapped
chunk on local disk). The writer belongs to the store: it stops taking writes when the
store closes, and a store that cannot give one (read-only; a backend without a mapping)
returns None, so the scheduler falls back to :meth:`BlockStore.record_success`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:  # annotations only: a worker reaches this module and imports no numpy
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "BlockStore",
    "CellWriter",
    "HotWriter",
    "StoreBackend",
    "StoreLocation",
    "is_store_url",
    "join_location",
    "location_name",
    "store_location",
]

#: where a tracking store lives: a local directory as a ``Path``, a URL as its ``str``
#: (``s3://bucket/prefix``). A URL is never a ``Path``: ``Path("s3://b/k")`` folds the
#: ``//`` to ``s3:/b/k``, and a folded URL printed, joined or resolved is another place.
StoreLocation: TypeAlias = Path | str

_S3 = "s3://"


def is_store_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a store at a URL (``s3://...``, or a ``Path``'s folded
    ``s3:/...`` of one), not a local directory."""
    return os.fspath(path).startswith("s3:/")


def store_location(path: str | os.PathLike[str]) -> StoreLocation:
    """The one way a tracking path becomes a location: a URL stays a string, canonical
    (``s3://bucket/prefix``, no trailing ``/``; a folded ``s3:/...`` is unfolded), and
    anything else is a local ``Path``."""
    text = os.fspath(path)
    if is_store_url(text):
        return _S3 + text[len("s3:") :].strip("/")
    return Path(text)


def location_name(location: StoreLocation) -> str:
    """A location's last part: a folder's name, a URL's last key part."""
    if isinstance(location, str):
        return location.rstrip("/").rsplit("/", 1)[-1]
    return location.name


def join_location(base: StoreLocation, name: str) -> StoreLocation:
    """``base / name`` for a location: a URL joined with ``/`` as a string."""
    if isinstance(base, str):
        return f"{base.rstrip('/')}/{name}"
    return base / name


class CellWriter(Protocol):
    """One element per cell, written by index (a typed ``memoryview``, a numpy array)."""

    def __setitem__(self, cell: int, value: int, /) -> None: ...


@dataclass(frozen=True, slots=True)
class HotWriter:
    """The scheduler's fast path into a store's done markers, handed out by
    :meth:`BlockStore.hot_writer`: ``code[cell] = code_index`` first (so a done block
    always names the code that made it), then ``done[cell] = 1``."""

    #: one byte per cell, 1 = done
    done: CellWriter
    #: where a done block's code index goes; None: the store records no code versions yet
    code: CellWriter | None
    #: the code index blocks marked done now are recorded with (0: unknown)
    code_index: int


class BlockStore(Protocol):
    """One task's open tracking store: its done markers, failure counts and block figures."""

    @property
    def path(self) -> StoreLocation:
        """Where the store lives: a local store's folder (``Path``), an S3 store's
        ``s3://bucket/prefix`` URL (``str``: a ``Path`` would fold its ``//``)."""
        ...

    @property
    def grid_shape(self) -> tuple[int, ...]: ...

    @property
    def created(self) -> bool:
        """True when this open created the done markers: no block is done, none to read."""
        ...

    @property
    def is_writable(self) -> bool: ...

    @property
    def runs_jsonl(self) -> Path: ...

    @property
    def task_hash(self) -> str | None:
        """The layout hash the store was made for (daisy's ``daisy_task_hash``)."""
        ...

    @property
    def record(self) -> dict[str, Any] | None:
        """The layout record the store keeps beside the hash (None: daisy's store)."""
        ...

    # -- reading -------------------------------------------------------------------------
    @property
    def done(self) -> NDArray[Any]:
        """The done mask, ``uint8`` per cell shaped as the grid (1 = done). Read it; the
        writers are the ``record_*`` methods, :meth:`hot_writer` and :meth:`clear_done`."""
        ...

    @property
    def failures(self) -> NDArray[Any]: ...

    @property
    def stats(self) -> Mapping[str, NDArray[Any]]:
        """The resource arrays by name (those the store has)."""
        ...

    def is_done(self, cell: int) -> bool: ...

    def code_versions(self) -> NDArray[Any] | None: ...

    def checksums(self) -> NDArray[Any] | None: ...

    def grants(self) -> NDArray[Any] | None: ...

    def cache_counts(self) -> Mapping[str, NDArray[Any]] | None:
        """The ``cache_*`` arrays by name (per-block chunk-cache counts of a task with
        declared inputs), or None for a store that never recorded one."""
        ...

    # -- writing -------------------------------------------------------------------------
    def hot_writer(self) -> HotWriter | None:
        """The fast path (see the module docstring); None for a store that cannot give it."""
        ...

    def record_success(
        self,
        cell: int,
        stats: tuple[Any, ...] | None,
        worker_id: int,
        sent_at: float,
        returned_at: float,
    ) -> None: ...

    def record_skip(self, cell: int) -> None: ...

    def record_failure(
        self, cell: int, worker_id: int = -1, sent_at: float = 0.0, returned_at: float = 0.0
    ) -> None: ...

    def record_measured(
        self,
        cells: NDArray[np.intp],
        table: NDArray[Any],
        worker_id: int,
        sent_at: NDArray[np.float64],
        returned_at: NDArray[np.float64],
    ) -> None: ...

    def record_grant(self, cell: int, megabytes: int) -> None: ...

    def record_checksum(self, cell: int, checksum: int) -> None: ...

    def record_cache(self, cell: int, counts: Sequence[int]) -> None:
        """Record what the worker's chunk cache did for ``cell`` (``_protocol.CACHE_COUNTS``
        order; the ``cache_*`` arrays, created by the first record)."""
        ...

    def clear_done(self, cells: Sequence[int] | NDArray[np.intp]) -> int:
        """Clear the done markers of ``cells``; returns how many were done."""
        ...

    def code_table(self) -> list[dict[str, Any]]:
        """The code versions of the runs that made blocks (``_tracking/_codever``)."""
        ...

    def use_code(self, record: dict[str, Any], started: float, floor: int = 0) -> int:
        """Register this run's code (fingerprint ``record``, run started at ``started``)
        and record every block marked done from now on with its index; returns it."""
        ...

    def scratch(self) -> BlockStore:
        """This read-only store with its done markers as a private, writable copy (a dry
        run's: :meth:`clear_done` takes them, nothing is written)."""
        ...

    # -- lifetime ------------------------------------------------------------------------
    def open_stats(self) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> BlockStore: ...

    def __exit__(self, *exc_info: object) -> None: ...


class StoreBackend(Protocol):
    """What a kind of tracking store offers before a store is open."""

    def exists(self, path: StoreLocation) -> bool:
        """Whether something at ``path`` claims to be a store (opening it tells whether
        it is a valid one)."""
        ...

    def is_store(self, path: StoreLocation) -> bool:
        """Whether ``path`` holds a tracking store (a group with done markers)."""
        ...

    def find_stores(
        self, root: StoreLocation, max_depth: int | None = None
    ) -> Iterator[StoreLocation]:
        """``root`` when it is a store, else the stores below it (down to ``max_depth``
        folders, None: all), each once, in path order; a store's folders are not searched."""
        ...

    def open_readonly(self, path: StoreLocation) -> BlockStore:
        """Open the store at ``path`` for reading; safe while a run writes it."""
        ...

    def clear_done(self, path: StoreLocation, grid: tuple[int, ...], cells: Sequence[int]) -> int:
        """Clear the done markers of flat ``cells`` of the store at ``path`` (tracking grid
        ``grid``), which no run may hold (``bellis verify --reset``); returns how many
        were done."""
        ...
