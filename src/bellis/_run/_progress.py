"""What a run reports while it goes: the progress observers (SPEC §1.13).

An observer has ``on_start``, ``on_progress`` and ``on_finish``, each given the tasks'
:class:`~bellis._state.TaskState` snapshots. :func:`make_observer` turns
``run_blockwise``'s ``progress`` argument into one; the run loop calls it through
:func:`safe_notify` (an observer never breaks a run), throttled by
:class:`ProgressThrottle`. Progress goes to ``sys.stderr``, as tqdm's and daisy's does:
users pipe stdout. The bars and lines show the status symbols of :mod:`bellis._run._summary`,
which prints what a run leaves behind.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from bellis._run._summary import ordered_task_ids, status_symbol
from bellis._state import TaskState
from bellis._streams import StreamInForce
from bellis.errors import ConfigurationError

__all__ = [
    "DEFAULT_PROGRESS_INTERVAL",
    "PROGRESS_INTERVAL_ENV",
    "JsonProgressObserver",
    "PlainProgressObserver",
    "ProgressObserver",
    "ProgressThrottle",
    "TqdmObserver",
    "make_observer",
    "safe_notify",
]

logger = logging.getLogger("bellis")

#: the environment variable that spaces the plain progress lines (seconds), read at each run
PROGRESS_INTERVAL_ENV = "BELLIS_PROGRESS_INTERVAL"
#: its default: a task's line every 30 s, 120 lines an hour in a batch job's log (daisy#57)
DEFAULT_PROGRESS_INTERVAL = 30.0


def progress_interval(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between a task's plain progress lines: ``BELLIS_PROGRESS_INTERVAL`` from
    ``environ`` (default ``os.environ``), else :data:`DEFAULT_PROGRESS_INTERVAL`.

    ``0`` writes a line at every update (at most every 0.5 s), ``inf`` only the last
    lines. Anything else that is not a number of seconds >= 0 is a
    :class:`~bellis.errors.ConfigurationError` naming the variable and its value.
    """
    env = os.environ if environ is None else environ
    raw = env.get(PROGRESS_INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:
        raise ConfigurationError(
            f"{PROGRESS_INTERVAL_ENV}={raw!r} is not a number of seconds >= 0: set it to "
            f"the seconds between progress lines (e.g. {PROGRESS_INTERVAL_ENV}=60; 0 for a "
            f"line at every update, inf for the last lines only), or unset it for the "
            f"default of {DEFAULT_PROGRESS_INTERVAL:g} s"
        )
    return value


@runtime_checkable
class ProgressObserver(Protocol):
    """Anything with these three methods can watch a run (SPEC §1.13)."""

    def on_start(self, states: dict[str, TaskState]) -> None: ...

    def on_progress(self, states: dict[str, TaskState]) -> None: ...

    def on_finish(self, states: dict[str, TaskState]) -> None: ...


_OBSERVER_METHODS = ("on_start", "on_progress", "on_finish")
_warned_observers: weakref.WeakSet[Any] = weakref.WeakSet()
_warned_observer_ids: set[int] = set()


def _first_failure_of(observer: object) -> bool:
    """True the first time ``observer`` fails; afterwards False."""
    try:
        if observer in _warned_observers:
            return False
        _warned_observers.add(observer)
        return True
    except TypeError:
        # not weak-referenceable or not hashable: fall back to its id
        key = id(observer)
        if key in _warned_observer_ids:
            return False
        _warned_observer_ids.add(key)
        return True


def safe_notify(observer: object, method_name: str, states: dict[str, TaskState]) -> bool:
    """Call ``observer.<method_name>(states)``; return True when it did not raise.

    An observer must never break a run: any ``Exception`` is caught and reported once per
    observer as a WARNING on the ``bellis`` logger; later failures of the same observer are
    counted out silently because a broken bar would otherwise warn twice a second.
    """
    try:
        getattr(observer, method_name)(states)
    except Exception as exc:
        if _first_failure_of(observer):
            logger.warning(
                "progress observer %r failed in %s: %s: %s (further errors from this "
                "observer are not reported)",
                observer,
                method_name,
                type(exc).__name__,
                exc,
            )
        return False
    return True


class TqdmObserver:
    """One ``tqdm.auto`` bar per task, created in ``task_order`` (daisy's ``_TqdmObserver``).

    The description is ``"{task_id} {symbol} ♻={restarts}"`` with ``▶`` while running; the
    postfix shows ``⧗`` pending, ``▶`` processing, ``✔`` completed, ``✗`` failed and ``∅``
    orphaned. At finish each bar jumps to its completed count (so an all-skipped run shows
    100 %), takes the task's final symbol and is closed. ``file`` defaults to ``sys.stderr``
    as it is at each write.
    """

    def __init__(self, task_order: Sequence[str], file: IO[str] | None = None) -> None:
        self._task_order = list(task_order)
        self._file = file
        self._bars: dict[str, Any] = {}

    def _bar(self, task_id: str, state: TaskState) -> Any:
        bar = self._bars.get(task_id)
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=state.total_block_count,
                desc=self._describe(task_id, "▶", state),
                unit="block",
                leave=True,
                file=self._file if self._file is not None else StreamInForce("stderr"),
            )
            self._bars[task_id] = bar
        elif bar.total != state.total_block_count:
            bar.total = state.total_block_count
        return bar

    @staticmethod
    def _describe(task_id: str, symbol: str, state: TaskState) -> str:
        return f"{task_id} {symbol} ♻={state.worker_restart_count}"

    @staticmethod
    def _postfix(state: TaskState) -> dict[str, int]:
        return {
            "⧗": state.pending_count,
            "▶": state.processing_count,
            "✔": state.completed_count,
            "✗": state.failed_count,
            "∅": state.orphaned_count,
        }

    def _update(self, states: Mapping[str, TaskState], *, final: bool) -> None:
        for task_id in ordered_task_ids(states, self._task_order):
            state = states[task_id]
            bar = self._bar(task_id, state)
            bar.n = state.completed_count
            symbol = status_symbol(state) if final else "▶"
            bar.set_description(self._describe(task_id, symbol, state), refresh=False)
            bar.set_postfix(self._postfix(state), refresh=False)
            bar.refresh()

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._update(states, final=False)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self._update(states, final=False)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        try:
            self._update(states, final=True)
        finally:
            bars, self._bars = self._bars, {}
            for bar in bars.values():
                bar.close()


@dataclass
class _PlainTaskRecord:
    emitted_at: float
    processed: int
    counters: tuple[int, ...] | None = None


class PlainProgressObserver:
    """Plain, rate-limited progress lines for logs that are not a terminal.

    ``[bellis] seg: 1200/5000 done (24.0%), 2 processing, 0 failed, 0 orphaned,
    310.5 blocks/s``. A task gets at most one line per ``min_interval_seconds`` (a run's
    observer: :func:`progress_interval`) and none when its counters did not change since its
    last line, never one per block; the first line comes one interval after the start. At
    finish every task gets a last line with its status symbol and its average rate: its
    processed blocks over its own wall time, from its first block sent to its last block
    returned (``TaskState.task_wall_seconds``; the time since the start where that is
    unknown). The rate counts processed blocks only (skipped blocks cost nothing). Lines go
    to ``stream``, or to ``sys.stderr`` as it is at each line.
    """

    def __init__(
        self,
        task_order: Sequence[str],
        stream: IO[str] | None = None,
        min_interval_seconds: float = DEFAULT_PROGRESS_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_interval_seconds < 0:
            raise ValueError(
                f"min_interval_seconds must not be negative, got {min_interval_seconds}"
            )
        self._task_order = list(task_order)
        self._stream = stream
        self._interval = min_interval_seconds
        self._clock = clock
        self._started_at: float | None = None
        self._records: dict[str, _PlainTaskRecord] = {}

    @property
    def min_interval_seconds(self) -> float:
        """The seconds between two lines of one task."""
        return self._interval

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        if stream is None:
            return
        stream.write(line + "\n")
        stream.flush()

    @staticmethod
    def _counters(state: TaskState) -> tuple[int, ...]:
        return (
            state.total_block_count,
            state.ready_count,
            state.processing_count,
            state.completed_count,
            state.skipped_count,
            state.failed_count,
            state.orphaned_count,
            state.worker_restart_count,
        )

    @staticmethod
    def _processed(state: TaskState) -> int:
        return state.completed_count - state.skipped_count + state.failed_count

    def _start_if_needed(self, states: Mapping[str, TaskState], now: float) -> None:
        if self._started_at is None:
            self._started_at = now
        for task_id, state in states.items():
            if task_id not in self._records:
                self._records[task_id] = _PlainTaskRecord(
                    emitted_at=now, processed=self._processed(state), counters=self._counters(state)
                )

    @staticmethod
    def _line(task_id: str, state: TaskState, rate: float, prefix: str = "") -> str:
        total = state.total_block_count
        percent = 100.0 * state.completed_count / total if total else 100.0
        done = f"{state.completed_count}/{total} done ({percent:.1f}%"
        if state.skipped_count:
            done += f", {state.skipped_count} skipped"
        return (
            f"[bellis] {task_id}: {prefix}{done}), {state.processing_count} processing, "
            f"{state.failed_count} failed, {state.orphaned_count} orphaned, "
            f"{rate:.1f} blocks/s"
        )

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._started_at = None
        self._records = {}
        self._start_if_needed(states, self._clock())

    def on_progress(self, states: dict[str, TaskState]) -> None:
        now = self._clock()
        self._start_if_needed(states, now)
        for task_id in ordered_task_ids(states, self._task_order):
            state = states[task_id]
            record = self._records[task_id]
            counters = self._counters(state)
            if counters == record.counters or now - record.emitted_at < self._interval:
                continue
            elapsed = now - record.emitted_at
            processed = self._processed(state)
            rate = (processed - record.processed) / elapsed if elapsed > 0 else 0.0
            self._write(self._line(task_id, state, max(rate, 0.0)))
            record.emitted_at = now
            record.processed = processed
            record.counters = counters

    def on_finish(self, states: dict[str, TaskState]) -> None:
        now = self._clock()
        self._start_if_needed(states, now)
        started = self._started_at if self._started_at is not None else now
        elapsed = now - started
        for task_id in ordered_task_ids(states, self._task_order):
            state = states[task_id]
            own = state.task_wall_seconds
            took = own if own else elapsed
            rate = self._processed(state) / took if took > 0 else 0.0
            prefix = f"finished {status_symbol(state)} "
            self._write(self._line(task_id, state, rate, prefix) + " on average")


class JsonProgressObserver:
    """One JSON line per task per event (SPEC §1.13), for dashboards and log scrapers.

    Each line holds ``t`` (``time.time()``), ``event`` (``start``, ``progress`` or
    ``finish``), ``task``, ``total``, ``ready``, ``processing``, ``completed``, ``skipped``,
    ``failed``, ``orphaned``, ``restarts`` and ``failures``. A ``path`` is opened for writing
    (line-buffered) at construction and closed on finish; without one the lines go to
    ``stream``, or to ``sys.stdout`` when neither is given.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        stream: IO[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if path is not None and stream is not None:
            raise ValueError("specify path OR stream, not both")
        self._path = Path(path) if path is not None else None
        self._clock = clock
        self._stream = stream
        self._owned: IO[str] | None = None
        if self._path is not None:
            self._owned = open(self._path, "w", buffering=1, encoding="utf-8")

    def _target(self) -> IO[str]:
        if self._path is not None:
            if self._owned is None or self._owned.closed:
                # a second run through the same observer appends to the first one's lines
                self._owned = open(self._path, "a", buffering=1, encoding="utf-8")
            return self._owned
        return self._stream if self._stream is not None else sys.stdout

    def _emit(self, event: str, states: Mapping[str, TaskState]) -> None:
        target = self._target()
        now = self._clock()
        for task_id, state in states.items():
            record = {
                "t": now,
                "event": event,
                "task": task_id,
                "total": state.total_block_count,
                "ready": state.ready_count,
                "processing": state.processing_count,
                "completed": state.completed_count,
                "skipped": state.skipped_count,
                "failed": state.failed_count,
                "orphaned": state.orphaned_count,
                "restarts": state.worker_restart_count,
                "failures": state.worker_failure_count,
            }
            target.write(json.dumps(record, ensure_ascii=False) + "\n")
        target.flush()

    def on_start(self, states: dict[str, TaskState]) -> None:
        self._emit("start", states)

    def on_progress(self, states: dict[str, TaskState]) -> None:
        self._emit("progress", states)

    def on_finish(self, states: dict[str, TaskState]) -> None:
        try:
            self._emit("finish", states)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file opened for ``path``; a no-op for streams."""
        if self._owned is not None and not self._owned.closed:
            self._owned.close()


def _is_observer(obj: object) -> bool:
    return all(callable(getattr(obj, name, None)) for name in _OBSERVER_METHODS)


def make_observer(
    progress: object, task_order: Sequence[str], stream: IO[str] | None = None
) -> ProgressObserver | None:
    """Turn ``run_blockwise``'s ``progress`` argument into an observer, or None.

    ``True`` gives progress bars when ``stream`` (default ``sys.stderr``, where progress
    goes) is a terminal and plain lines otherwise, spaced by :func:`progress_interval`;
    ``False`` and ``None`` give no observer; an object with ``on_start``, ``on_progress``
    and ``on_finish`` is used as it is.
    """
    if progress is None or progress is False:
        return None
    if progress is True:
        target = stream if stream is not None else sys.stderr
        try:
            is_tty = bool(target.isatty())
        except (AttributeError, ValueError, OSError):
            is_tty = False
        interval = progress_interval()  # checked on a terminal too: a typo is never ignored
        if is_tty:
            return TqdmObserver(task_order, file=stream)
        return PlainProgressObserver(task_order, stream=stream, min_interval_seconds=interval)
    if _is_observer(progress):
        return progress  # type: ignore[return-value]
    raise TypeError(
        "progress must be True, False, None or an observer with on_start(states), "
        f"on_progress(states) and on_finish(states) methods; got {type(progress).__name__}"
    )


class ProgressThrottle:
    """Decides when the run loop calls ``on_progress``: at most once per ``interval``
    seconds, and only when something changed.

    The loop calls :meth:`should_fire` every iteration with its clock and whether the
    counters changed since the last notification; when the run ends it is the caller's job
    to send one final ``on_progress`` if the state is still dirty.
    """

    def __init__(self, interval: float = 0.5) -> None:
        if interval < 0:
            raise ValueError(f"interval must not be negative, got {interval}")
        self.interval = interval
        self._last_fired: float | None = None

    def should_fire(self, now: float, dirty: bool) -> bool:
        """True when a notification is due; the call then counts as one."""
        if not dirty:
            return False
        if self._last_fired is not None and now - self._last_fired < self.interval:
            return False
        self._last_fired = now
        return True
