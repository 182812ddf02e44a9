"""A forecast scored against the run that followed it (docs/plan.md, "Scored afterwards").

``bellis.plan(tasks, sample=N)`` leaves each task's forecast in its tracking store as
:data:`FORECAST_NAME`, with the ids of the tasks it forecast. The next real run of the
task takes it (the file is removed, so a forecast is scored once). When that run is the
forecast's run (the same tasks, every block completed, not interrupted) its run line in
``runs.jsonl`` gets a ``forecast`` key: what was predicted and what happened, with the
error in percent, for the run's wall, the task's core-hours and its per-block p99 peak
RSS. The report's "Forecast vs actual" section reads those lines. Any other real run
(other tasks, a failed or interrupted one, one with other blocks left than forecast)
drops the forecast unscored, with a warning:
once it ran some of the blocks, no later run is the run forecast. A plan's own sample run
(:func:`sample_run`) is no real run: it leaves a waiting forecast alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from .._donemarks import BlockStore

__all__ = ["FORECAST_NAME", "read_forecast", "sample_run", "score_forecast", "write_forecast"]

FORECAST_NAME = "forecast.json"

logger = logging.getLogger("bellis")

#: True while a plan runs its sample (:func:`sample_run`)
_SAMPLING: ContextVar[bool] = ContextVar("bellis_forecast_sampling", default=False)


@contextlib.contextmanager
def sample_run() -> Iterator[None]:
    """Within: the runs are a plan's sample runs, which score no forecast and leave any
    waiting one in place."""
    token = _SAMPLING.set(True)
    try:
        yield
    finally:
        _SAMPLING.reset(token)


def write_forecast(store: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Leave ``record`` (a task's forecast) in the store for its next run to score."""
    path = Path(store) / FORECAST_NAME
    tmp = path.with_name(f".{FORECAST_NAME}.{os.getpid()}")
    tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_forecast(store: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The forecast waiting in the store, or None (none, or unreadable: logged)."""
    path = Path(store) / FORECAST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("the forecast at %s cannot be read (%s); it is not scored", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _error_pct(predicted: Any, actual: Any) -> float | None:
    ok = all(isinstance(x, int | float) and math.isfinite(x) for x in (predicted, actual))
    if not ok or actual == 0:
        return None
    return 100.0 * (float(predicted) - float(actual)) / float(actual)


def _run_p99_rss(store: BlockStore | None, started_at: float) -> float | None:
    """p99 of the per-block peak RSS of the blocks this run returned (resource tracking)."""
    stats = store.stats if store is not None else {}
    rss, returned = stats.get("peak_rss_bytes"), stats.get("returned_at")
    if rss is None or returned is None:
        return None
    rss_flat = np.asarray(rss).reshape(-1)
    mine = (np.asarray(returned).reshape(-1) >= started_at) & (rss_flat > 0)
    if not mine.any():
        return None
    return float(np.percentile(rss_flat[mine], 99))


def _total(stat: Any) -> float | None:
    if isinstance(stat, dict) and isinstance(stat.get("total"), int | float):
        return float(stat["total"])
    return None


def _not_scored(record: dict[str, Any], tasks: list[str], complete: bool, left: int) -> str | None:
    """Why the run just done is not the run ``record`` forecast; None when it is."""
    forecast_tasks = record.get("tasks")
    if isinstance(forecast_tasks, list) and sorted(map(str, forecast_tasks)) != sorted(tasks):
        return (
            f"it forecast a run of tasks {sorted(map(str, forecast_tasks))}, and this run ran "
            f"tasks {sorted(tasks)}"
        )
    if not complete:
        return "this run did not complete every block (interrupted, abandoned or failed blocks)"
    expected = record.get("blocks_left")
    if isinstance(expected, int) and expected != left:
        return (
            f"it forecast {expected} blocks left, and this run had {left} to run (another "
            "run, an interrupted one say, ran some in between)"
        )
    return None


def score_forecast(
    store: BlockStore, run_line: dict[str, Any], *, tasks: list[str], complete: bool, left: int
) -> dict[str, Any] | None:
    """The ``forecast`` entry of ``run_line`` (the run just done of the task whose open
    tracking ``store`` this is; ``tasks``: the run's task ids; ``complete``: it completed
    every block of every task and was not interrupted; ``left``: the task's blocks it had
    to run, not done nor masked at its start): the waiting forecast with the
    actual figures and errors. Removes the forecast from the store, also when the run is
    not the forecast's run (then logged, and None). None when no forecast waits, and in a
    plan's sample run (:func:`sample_run`), which leaves it waiting."""
    if _SAMPLING.get() or isinstance(store.path, str):  # no forecast file on S3
        return None
    path = Path(store.path)
    record = read_forecast(path)
    if record is None:
        return None
    try:
        (path / FORECAST_NAME).unlink()
    except OSError as exc:
        logger.warning("the forecast at %s cannot be removed: %s", path, exc)
    why = _not_scored(record, tasks, complete, left)
    if why is not None:
        logger.warning(
            "the forecast left in %s by bellis.plan(sample=...) is dropped, not scored: %s; "
            "plan again (sample=...) before the run to be scored",
            path,
            why,
        )
        return None
    blocks = run_line.get("blocks") if isinstance(run_line.get("blocks"), dict) else {}
    assert isinstance(blocks, dict)
    cpu = _total(blocks.get("cpu"))
    children = _total(blocks.get("cpu_children")) or 0.0
    started = run_line.get("run_started_at")
    actual = {
        "wall": run_line.get("wall_seconds"),
        "core_hours": None if cpu is None else (cpu + children) / 3600.0,
        "peak_rss_p99": _run_p99_rss(store, float(started)) if started else None,
        "blocks": blocks.get("count"),
    }
    predicted = {
        "wall": (record.get("wall") or {}).get("estimate"),
        "core_hours": (record.get("core_hours") or {}).get("estimate"),
        "peak_rss_p99": record.get("peak_rss_p99"),
    }
    return {
        **record,
        "actual": actual,
        "error_pct": {k: _error_pct(predicted[k], actual[k]) for k in predicted},
    }
