"""The driver's window of recent blocks, written into each local tracking store.

A store without per-block stamps (no ``resource_tracking``) does not say which worker ran
a block nor when, so ``bellis serve`` could draw no lanes for it: :class:`LanesWriter`
writes the driver's window (``TaskRun.recent``: worker, send and return time, block,
failed or not; the races of stragglers and their copies, ended and going) into the store
as ``live_lanes.json`` (``_report._live_lanes``), from a daemon thread: at most every
:data:`WRITE_SECONDS`, only when a block came back since the last write (or a race is
going), and once more when the run ends. The run's hot path pays one append to a
bounded deque per block (``Scheduler.release_index``), kept for every task with a local
store: a page may be opened on the store at any time, during the run or after it (see
``docs/live.md``, "What it costs the run"). A store at a URL gets no file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._donemarks import BlockStore, is_store_url
from .._report._live_lanes import WRITE_SECONDS, lanes_document, snapshot, write_lanes
from .._report._live_recent import MAX_RECENT_BLOCKS
from ._dashboard import MAX_RACES, _Counted, racing_now

__all__ = ["LanesWriter", "start_lanes"]

logger = logging.getLogger("bellis")


class _Lane:
    __slots__ = ("failed", "going", "last", "root", "run")

    def __init__(self, root: Path, run: _Counted) -> None:
        self.root = root
        self.run = run
        #: the newest entries of ``run.recent`` and ``run.races`` at the last write
        #: (compared by identity), and whether a race was going then
        self.last: tuple[object, object] = (None, None)
        self.going = False
        self.failed = False


class LanesWriter:
    """Writes the lanes file of each run with a local store; :meth:`close` writes the
    last one and stops."""

    def __init__(self, runs: Sequence[_Counted], stores: Mapping[str, BlockStore]) -> None:
        self.lanes: list[_Lane] = []
        for r in runs:
            store = stores.get(r.task_id)
            if store is None or isinstance(store.path, str) or is_store_url(store.path):
                continue
            r.recent = deque(maxlen=MAX_RECENT_BLOCKS)
            r.races = deque(maxlen=MAX_RACES)
            self.lanes.append(_Lane(store.path, r))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="bellis-lanes", daemon=True)

    def start(self) -> LanesWriter:
        if self.lanes:
            self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stop.wait(WRITE_SECONDS):
            if not self._write_or_say():
                return

    def _write_or_say(self) -> bool:
        """:meth:`write`; an error it did not expect is logged (the run goes on without
        the file) and answers False."""
        try:
            self.write()
        except Exception:
            logger.exception("the live page's lanes file is not written any more")
            return False
        return True

    def write(self) -> None:
        """Write the file of each run whose window changed since its last write."""
        for lane in self.lanes:
            r = lane.run
            recent, races = r.recent, r.races
            if recent is None or races is None or lane.failed:
                continue
            # what the last write saw: the newest block and race (by identity), and
            # whether a race was going (a race going is rewritten: it runs on to now)
            token = (recent[-1] if recent else None, races[-1] if races else None)
            going = racing_now(r.racing)
            if (
                not going
                and not lane.going
                and all(a is b for a, b in zip(token, lane.last, strict=True))
            ):
                continue
            ended = snapshot(races)  # before the blocks: see _dashboard's copies
            blocks = snapshot(recent)
            cell_of = None if r.cell_identity else r.cell_of
            data = lanes_document(blocks, ended, going, cell_of, time.time())
            try:
                write_lanes(lane.root, data)
            except OSError as exc:  # the run goes on; the page of this store has no lanes
                lane.failed = True
                logger.warning(
                    "cannot write the live page's lanes to %s: %s; `bellis serve` draws no "
                    "lanes for this store",
                    lane.root,
                    exc,
                )
                continue
            lane.last, lane.going = token, bool(going)

    def close(self) -> None:
        """The run ends: the last write, then the thread stops."""
        self.stop.set()
        if self.thread.ident is not None:
            self.thread.join(timeout=30)
        self._write_or_say()


def start_lanes(runs: Sequence[_Counted], stores: Mapping[str, BlockStore]) -> LanesWriter:
    """Keep the lanes of ``runs`` and write them into their local stores from now on."""
    return LanesWriter(runs, stores).start()
