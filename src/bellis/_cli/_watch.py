"""``bellis status PATH --watch [SECONDS]``: the status of a run, redrawn while it runs.

Every ``SECONDS`` the store is read again (read-only, as ``bellis status`` reads it) and
the status, the map and a progress line are drawn. On a terminal the frame is redrawn in
place (cursor home, each line cleared to its end, the rest of the screen cleared); when
stdout is not a terminal each read prints one plain progress line, and the full status
once at the end.

The rate comes from the store's ``returned_at`` stamps (blocks returned in the last
window, resource tracking only); without stamps, from the done count's change between
reads. The ETA is the blocks not done yet at that rate: the store's layout record says how
many blocks there are; a store without one (daisy 2.0.0's) is counted in cells, and its
ETA is an upper bound.

The watch ends when the run ends: a run holds ``bellis.lock`` from opening the store to
closing it, and the lock is tested without being taken (:func:`is_run_in_progress`).
Where that cannot be told (no lock file, no ``fcntl`` locks) it ends when every block is
done or ``runs.jsonl`` gains a line. It exits 0 then, and 130 on Ctrl-C (SIGINT), also
when it was started with SIGINT ignored (a background job of a script): from its first
output on, SIGINT ends it.
"""

from __future__ import annotations

import datetime
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

import numpy as np

from .._donemarks import StoreLocation, store_location
from .._report._panel import format_duration
from .._tracking import (
    StatusSnapshot,
    is_run_in_progress,
    is_store,
    read_lock_holder,
    read_status,
    render_status,
)

__all__ = ["watch_status"]

_HOME = "\x1b[H"
_CLEAR_LINE = "\x1b[K"
_CLEAR_BELOW = "\x1b[J"


def _run_started_at(root: StoreLocation) -> float | None:
    info = read_lock_holder(root)
    started = None if info is None else info.get("started")
    if not isinstance(started, str):
        return None
    try:
        return datetime.datetime.fromisoformat(started).timestamp()
    except ValueError:
        return None


class _Rate:
    """Blocks per second: from ``returned_at`` stamps, else from done-count changes."""

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self.seen: deque[tuple[float, int]] = deque()

    def update(self, snap: StatusSnapshot, now: float, run_start: float | None) -> float | None:
        done = snap.done_count
        self.seen.append((now, done))
        while len(self.seen) > 2 and self.seen[1][0] <= now - self.window:
            self.seen.popleft()
        stamps = snap.returned_at
        if stamps is not None and snap.stamped:
            since = now - self.window
            span = self.window
            if run_start is not None and run_start > since:
                since, span = run_start, now - run_start
            recent = int(np.count_nonzero(stamps > since))
            if span > 0:
                return recent / span
        t0, d0 = self.seen[0]
        if now > t0 and len(self.seen) > 1:
            return max(0, done - d0) / (now - t0)
        return None


def _progress_line(snap: StatusSnapshot, rate: float | None, running: bool | None) -> str:
    done, blocks = snap.done_count, snap.blocks
    total = snap.cells if blocks is None else blocks
    pct = 100.0 * done / total if total else 100.0
    if blocks is None:
        # a store without a layout record: a cell not done may be no block at all
        parts = [f"{done} of {total} cells done ({pct:.1f}%, blocks unknown)"]
    else:
        parts = [f"{done} of {total} blocks done ({pct:.1f}%)"]
    parts.append(f"{snap.failed_count} failed")
    if rate is None:
        parts.append("rate -")
    else:
        parts.append(f"{rate:.2f} blocks/s")
        left = max(0, total - done)
        if left and rate > 0:
            bound = "at most " if blocks is None else ""
            parts.append(f"ETA {bound}{format_duration(left / rate)}")
        elif left:
            parts.append("ETA -")
    if running is True:
        parts.append("run in progress")
    elif running is False:
        parts.append("no run in progress")
    return ", ".join(parts)


def _wait_for_store(
    root: StoreLocation,
    interval_seconds: float,
    *,
    err: TextIO | None,
    sleep: Callable[[float], None],
) -> None:
    """Return once ``root`` holds a store (its group and ``done`` array written), saying
    once on ``err`` that the watch waits for a run to create it."""
    said = False
    while not is_store(root):
        if not said and err is not None:
            err.write(
                f"bellis status: no tracking store at {root} yet; waiting for a run to create "
                f"it (checking every {interval_seconds:g} s, Ctrl-C to stop)\n"
            )
            err.flush()
            said = True
        sleep(interval_seconds)


def watch_status(
    path: str | os.PathLike[str],
    interval_seconds: float,
    *,
    out: TextIO,
    err: TextIO | None = None,
    max_width: int = 80,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Redraw the status of the store at ``path`` every ``interval_seconds`` until the
    run ends; returns the exit code (0). A store that does not exist yet is waited for
    (saying so on ``err``). Raises TrackingError for a store that cannot be read, and lets
    KeyboardInterrupt through (the caller exits 130)."""
    root = store_location(path)
    _wait_for_store(root, interval_seconds, err=err, sleep=sleep)
    tty = out.isatty()
    rate = _Rate(max(10.0, 4 * interval_seconds))
    snap = read_status(path, stamps_after=clock() - rate.window - 1.0)
    first_runs = snap.runs
    running = is_run_in_progress(root)
    run_start = _run_started_at(root) if running else None
    watched = False  # whether a run was seen in progress
    while True:
        now = clock()
        progress = _progress_line(snap, rate.update(snap, now, run_start), running)
        watched = watched or running is True
        if running is False:
            ended = True
        else:
            total = snap.cells if snap.blocks is None else snap.blocks
            ended = snap.runs > first_runs or (total > 0 and snap.done_count >= total)
        end_note = "run ended" if watched or running is None else "no run holds the store"
        if tty:
            frame = render_status(snap, max_width=max_width).rstrip("\n").split("\n")
            frame.append(f"  progress    {progress}")
            frame.append(
                f"  watch       {end_note}"
                if ended
                else f"  watch       every {interval_seconds:g} s (Ctrl-C to stop)"
            )
            out.write(_HOME + "".join(line + _CLEAR_LINE + "\n" for line in frame) + _CLEAR_BELOW)
        else:
            stamp = datetime.datetime.fromtimestamp(now).strftime("%H:%M:%S")
            out.write(f"{stamp}  {snap.display}: {progress}\n")
            if ended:
                out.write(render_status(snap, max_width=max_width))
                out.write(end_note + "\n")
        out.flush()
        if ended:
            return 0
        sleep(interval_seconds)
        snap = read_status(path, stamps_after=clock() - rate.window - 1.0)
        was_running = running
        running = is_run_in_progress(root)
        if running and not was_running:
            run_start = _run_started_at(root)
