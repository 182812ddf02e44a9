"""``run_blockwise(..., dashboard=True | PORT)``: the live page served by the driver.

The same page and JSON as ``bellis serve`` (``_report._live``), for the stores this run
opened, served on 127.0.0.1 from a daemon thread for as long as the run goes on. Nothing
happens per block: the state is read from the stores (read-only, as ``bellis serve``
reads them) only when a page asks, at most once a second.

What the stores do not know (blocks running now, skipped as already done, orphaned) the
page takes from the driver's own counters (:class:`DriverCounters`): a snapshot of a few
integers of each task's ``TaskRun``, taken when a page asks (at most once a second, with
the rest of the state), never per block. Each read is one attribute of an int, which the
serving thread can read while the run loop changes it; the numbers of one snapshot may be
a block apart, never torn. See ``docs/live.md``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .._donemarks import BlockStore
from .._report._live import LiveState
from .._report._live_lanes import snapshot
from .._report._live_recent import MAX_RECENT_BLOCKS, driver_recent, race_marks, running_marks
from .._report._live_server import LiveServer
from ._checks import _config_error

__all__ = [
    "MAX_RACES",
    "Dashboard",
    "DriverCounters",
    "check_dashboard",
    "racing_now",
    "start_dashboard",
]


def check_dashboard(value: Any) -> int | None:
    """The port ``dashboard`` asks for (0: any free one), None for no page; raises
    ConfigurationError for anything but a bool or a port number."""
    if value is False or value is None:
        return None
    if value is True:
        return 0
    if isinstance(value, int) and 0 <= value <= 65535:
        return value
    raise _config_error(
        f"dashboard={value!r}: pass True (any free port), a port number 0..65535, or False",
        "dashboard",
    )


class _Counted(Protocol):
    """What :class:`DriverCounters` reads of a task's run (``_scheduling.TaskRun``)."""

    task_id: str
    processing: int
    skipped_done: int
    orphaned: int
    completed: int
    total: int
    recent: deque[tuple[int, float, float, int, bool]] | None
    races: deque[tuple[int, int, float, int, float, float, bool]] | None
    racing: dict[int, tuple[Any, Any]] | None
    cell_identity: bool

    def cell_of(self, k: int) -> int: ...


class DriverCounters:
    """The driver's counters of the tasks that have a store, keyed by the store's path as
    the live state names it: ``{path: {"running_blocks", "skipped", "orphaned",
    "completed", "total", "recent", "marks"}}``, read from the runs when called.

    ``recent`` is the lanes of the blocks the driver released lately (each run's
    ``recent``, a bounded deque the scheduler appends a block's worker and times to; this
    class turns it on where the store's lanes file (``_lanes``) has not), ``marks`` the
    races of stragglers and their backup copies (the run's ``races``), and those still
    going (``racing``), drawn running up to now."""

    def __init__(self, runs: Sequence[_Counted], stores: Mapping[str, BlockStore]) -> None:
        self.runs = [(os.fspath(stores[r.task_id].path), r) for r in runs if r.task_id in stores]
        #: the runs whose deques this page turned on (and turns off at the end)
        self.owned: list[_Counted] = []
        for _, r in self.runs:
            if r.recent is None or r.races is None:
                r.recent = deque(maxlen=MAX_RECENT_BLOCKS)
                r.races = deque(maxlen=MAX_RACES)
                self.owned.append(r)

    def __call__(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for path, r in self.runs:
            # the races before the blocks: a race is posted after its winner's release
            # (``_backups``), so every race copied here has its winner's block below
            races = _copy(r.races)
            racing = racing_now(r.racing)
            out[path] = {
                "running_blocks": int(r.processing),
                "skipped": int(r.skipped_done),
                "orphaned": int(r.orphaned),
                "completed": int(r.completed),
                "total": int(r.total),
                "recent": driver_recent(_copy(r.recent), r.cell_of),
                "marks": race_marks(races, r.cell_of)
                + running_marks(racing, r.cell_of, time.time()),
            }
        return out

    def detach(self) -> None:
        """The run ends: the runs whose lanes this page turned on stop keeping them."""
        for r in self.owned:
            r.recent = r.races = None


def racing_now(
    racing: dict[int, tuple[Any, Any]] | None,
) -> list[tuple[int, int, float, int, float]]:
    """The races still going, ``(k, the original's worker, its start, the copy's worker,
    its start)`` in UNIX seconds, read from the straggler backups' pairs (``TaskRun.racing``:
    the connections, read from this thread while the run's changes them; a copy not sent
    yet is left out)."""
    if not racing:
        return []
    out = []
    for k, (orig, copy) in snapshot(racing.items()):
        start_orig, start_copy = float(orig.sent_wall), float(copy.sent_wall)
        if start_copy >= start_orig > 0.0:
            out.append((k, int(orig.worker_id), start_orig, int(copy.worker_id), start_copy))
    return out


#: the most races of a block's two copies the lanes mark (the latest)
MAX_RACES = 200


_T = TypeVar("_T")


def _copy(items: deque[_T] | None) -> list[_T]:
    """A copy of ``items``, which the run's thread appends to while this (the server's)
    thread reads: a copy that met an append is taken again."""
    for _ in range(100):
        try:
            return [] if items is None else list(items)
        except RuntimeError:  # "deque mutated during iteration"
            continue
    return []


class Dashboard:
    """The run's live page: its server and its state, which the run feeds with its
    counters (:meth:`attach`) once its scheduler exists."""

    def __init__(self, server: LiveServer, state: LiveState, stores: Mapping[str, BlockStore]):
        self.server = server
        self.state = state
        self.stores = stores
        self.counters: DriverCounters | None = None

    def attach(self, runs: Sequence[_Counted]) -> None:
        """From now on the page shows the driver's counters of ``runs``."""
        self.counters = DriverCounters(runs, self.stores)
        self.state.driver = self.counters

    def close(self) -> None:
        self.state.driver = None
        self.server.close()
        if self.counters is not None:
            self.counters.detach()


def start_dashboard(port: int | None, stores: Mapping[str, BlockStore]) -> Dashboard | None:
    """Serve the live page of ``stores`` on 127.0.0.1:``port``; None when ``port`` is
    None. Raises ConfigurationError when no task has a store (the page is drawn from the
    stores) or the port cannot be bound."""
    if port is None:
        return None
    if not stores:
        raise _config_error(
            "dashboard=True draws its page from the tracking stores, and no task of this "
            "run has one: pass Task(tracking_path=...) or call bellis.set_tracking_basedir("
            "...), and keep block_tracking=True",
            "dashboard",
        )
    state = LiveState([s.path for s in stores.values()])
    try:
        server = LiveServer(state.json_bytes, port=port, documents=state.documents())
    except OSError as exc:
        raise _config_error(
            f"dashboard={port}: cannot listen on 127.0.0.1:{port}: {exc}; pass another port "
            "or True (any free one)",
            "dashboard",
        ) from exc
    return Dashboard(server.start(), state, stores)
