"""What a plan says: one :class:`TaskOutlook` per task, the :class:`Plan` that holds them,
its table (stdout) and its JSON. No I/O but the formatting of numbers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .._sizes import format_iec

__all__ = ["Plan", "TaskOutlook", "format_bytes", "format_seconds"]


def format_bytes(n: float | None) -> str:
    """``25.5 MiB`` (``_sizes.format_iec``), ``-`` for None."""
    return "-" if n is None else format_iec(n)


def format_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


@dataclass
class TaskOutlook:
    """One task's part of a plan (the dry run's counts, and its forecast when sampled)."""

    task_id: str
    #: blocks in the task's grid
    blocks: int
    #: blocks marked done in the tracking store
    done: int
    #: blocks the skip mask skips (and the store does not already count as done)
    masked: int
    #: blocks that failed in an earlier run and are not done (they run again)
    failed_before: int
    #: blocks this run would hand out: blocks - done - masked
    left: int
    #: read/write conflict levels (1: no conflicts)
    levels: int
    #: the most blocks left in one conflict level: the most that can run at once
    max_parallel: int
    #: blocks ready the moment the run starts
    ready_at_start: int
    upstream: list[str]
    downstream: list[str]
    #: the tracking store's path (None: no block tracking)
    store: str | None
    #: whether the store exists already
    store_exists: bool
    #: bytes the store's chunk files reserve on disk (all of them), and the part of it a
    #: run would still allocate now
    store_reserved_bytes: int
    store_to_allocate_bytes: int
    #: free bytes on the store's filesystem (None: no store)
    disk_free_bytes: int | None
    #: "local", "slurm", "dask" or "serial" (this process runs the blocks)
    launcher: str
    max_workers: int
    #: the most workers this run would start at once (0 in serial mode or with nothing left)
    workers: int
    #: a check_function would run for each block left (the dry run does not call it)
    check_function: bool = False
    notes: list[str] = field(default_factory=list)
    #: the sampled forecast (see _forecast.TaskForecast.to_json), when one was made
    forecast: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = (
    ("task", "task_id"),
    ("blocks", "blocks"),
    ("done", "done"),
    ("masked", "masked"),
    ("failed before", "failed_before"),
    ("left", "left"),
    ("levels", "levels"),
    ("at once", "max_parallel"),
    ("workers", "workers"),
    ("launcher", "launcher"),
)


@dataclass
class Plan:
    """A run's plan: per task what is left, and how the run would go about it.

    Returned by :func:`bellis.plan` and ``run_blockwise(..., dry_run=True)``; nothing of it
    ran (but a forecast's sample, recorded done). ``str(plan)`` is the table it printed;
    :meth:`to_json` is everything, as plain JSON types.
    """

    #: "distributed" or "serial"
    mode: str
    tasks: list[TaskOutlook]
    #: a pipeline-wide forecast (see _forecast), when sampled
    forecast: dict[str, Any] | None = None
    #: in a planned script (``bellis plan -- ...``): the run_blockwise call this is, from 1
    call: int | None = None
    #: in a planned script: earlier calls' tasks whose blocks a dry run did not run
    assumes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __getitem__(self, task_id: str) -> TaskOutlook:
        for t in self.tasks:
            if t.task_id == task_id:
                return t
        raise KeyError(
            f"no task {task_id!r} in this plan (tasks: {[t.task_id for t in self.tasks]})"
        )

    @property
    def left(self) -> int:
        """Blocks left to run, all tasks together."""
        return sum(t.left for t in self.tasks)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "call": self.call,
            "assumes": list(self.assumes),
            "tasks": [t.to_json() for t in self.tasks],
            "forecast": self.forecast,
            "warnings": list(self.warnings),
        }

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def table(self) -> str:
        title = f"bellis plan ({self.mode})"
        if self.call is not None:
            title += f", run_blockwise call {self.call}"
        rows = [[h for h, _ in _COLUMNS]]
        for t in self.tasks:
            rows.append([str(getattr(t, attr)) for _, attr in _COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = [title]
        for n, r in enumerate(rows):
            cells = [
                c.ljust(w) if i in (0, 9) else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("")
        for t in self.tasks:
            deps = []
            if t.upstream:
                deps.append("after " + ", ".join(t.upstream))
            if t.downstream:
                deps.append("before " + ", ".join(t.downstream))
            if t.store is None:
                store = "no block tracking"
            elif t.store.startswith("s3://"):  # object storage: no local disk reserved
                store = f"store {t.store} ({'exists' if t.store_exists else 'new'}): on S3"
            else:
                store = (
                    f"store {t.store} ({'exists' if t.store_exists else 'new'}): reserves "
                    f"{format_bytes(t.store_reserved_bytes)}, "
                    f"{format_bytes(t.store_to_allocate_bytes)} still to allocate, "
                    f"{format_bytes(t.disk_free_bytes)} free"
                )
            lines.append(f"{t.task_id}: " + "; ".join([*deps, store]))
            for note in t.notes:
                lines.append(f"  note: {note}")
            if t.forecast is not None:
                lines.extend("  " + line for line in _forecast_lines(t.forecast))
        if self.forecast is not None:
            lines.extend(_run_forecast_lines(self.forecast))
        if self.assumes:
            lines.append(
                "assumes: the blocks earlier run_blockwise calls left to run ("
                + ", ".join(self.assumes)
                + ") had run; a dry run did not write their outputs"
            )
        for w in self.warnings:
            lines.append(f"warning: {w}")
        return "\n".join(lines).rstrip()

    def __str__(self) -> str:
        return self.table()

    def __bool__(self) -> bool:
        return True


def _interval(d: dict[str, Any], fmt: Any) -> str:
    return f"{fmt(d['estimate'])} ({fmt(d['low'])} to {fmt(d['high'])})"


def _forecast_lines(f: dict[str, Any]) -> list[str]:
    ran = f"sample: {f['sampled']} blocks ran (recorded done)"
    if "left_before" in f:
        ran += f" of the {f['left_before']} left; {f['done_before']} were done before it"
    lines = [
        f"{ran}; block wall p50 {format_seconds(f['block_wall']['p50'])}, "
        f"p95 {format_seconds(f['block_wall']['p95'])}",
    ]
    rss = f.get("peak_rss")
    if rss is not None:
        lines.append(
            f"peak RSS per block: p50 {format_bytes(rss['p50'])}, p95 {format_bytes(rss['p95'])}, "
            f"p99 {format_bytes(rss['p99'])}; memory request {format_bytes(rss['request'])}, "
            "ladder " + " -> ".join(format_bytes(x) for x in rss["ladder"])
        )
    if f.get("time_limit"):
        lines.append(f"job time_limit: {f['time_limit']}")
    return lines


def _run_forecast_lines(f: dict[str, Any]) -> list[str]:
    lines = [
        "forecast (from the sample; interval p10-p90 of the simulated schedule):",
        f"  blocks left to forecast: {f['blocks_left']} (done: {f.get('blocks_done', 0)}, "
        f"{f.get('done_before', 0)} of them before the sample, {f['sampled']} by it)",
        f"  wall at max_workers as set: {_interval(f['wall'], format_seconds)}",
        f"  core-hours (CPU): {_interval(f['core_hours'], lambda x: f'{x:.3g}')}",
        f"  worker-hours (held): {_interval(f['worker_hours'], lambda x: f'{x:.3g}')}",
    ]
    for alt in f.get("alternatives", []):
        lines.append(
            f"  wall with workers x{alt['scale']:g} ({alt['workers']}): "
            f"{_interval(alt['wall'], format_seconds)}"
        )
    return lines
