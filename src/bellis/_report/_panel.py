"""The "Resource Utilization" panel, rendered from TaskReports (SPEC §5.9)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from .._sizes import format_bytes
from .._stats._aggregates import Stat
from .._stats._runlog import EXIT_KINDS

if TYPE_CHECKING:
    from .._stats._reports import TaskReport, WorkerRecord

__all__ = [
    "WORKER_HEADER",
    "chunk_locality_row",
    "format_duration",
    "has_panel",
    "panel_rows",
    "panel_title",
    "render_panel",
    "worker_rows",
]


# ----------------------------------------------------------------------------- panel

_DURATION_UNITS: Final = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def _duration_unit(seconds: float) -> tuple[float, str]:
    a = abs(seconds)
    for scale, unit in _DURATION_UNITS:
        if a >= scale:
            return scale, unit
    return 1e-6, "µs"


def format_duration(seconds: float | None) -> str:
    """``292.1 ms``: µs / ms / s with one decimal; ``-`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    scale, unit = _duration_unit(seconds)
    return f"{seconds / scale:.1f} {unit}"


def _duration_pm(s: Stat) -> str:
    """``mean ± std`` in one unit, that of the larger (``50.5 ms ± 0.1 ms``)."""
    scale, unit = _duration_unit(max(abs(s.mean), s.std))
    return f"{s.mean / scale:.1f} {unit} ± {s.std / scale:.1f} {unit}"


def _bytes_pm(s: Stat) -> str:
    return f"{format_bytes(s.mean)} ± {format_bytes(s.std)}"


def _exit_order(exits: Mapping[str, int]) -> list[str]:
    """Exit kinds with a non-zero count: the known ones in order, then any newer ones."""
    return [k for k in (*EXIT_KINDS, *sorted(set(exits) - set(EXIT_KINDS))) if exits.get(k)]


def _has_anything(r: TaskReport) -> bool:
    if r.workers.count > 0:
        return True
    if r.blocks.count == 0:
        return False
    return r.mode == "distributed" or r.resource_tracking


def _labelled(rows: list[tuple[str, str]], indent: str) -> list[str]:
    if not rows:
        return []
    width = max(len(label) for label, _ in rows) + 2
    return [f"{indent}{label:<{width}}{value}" for label, value in rows]


WORKER_HEADER: Final = (
    "id",
    "slot",
    "startup",
    "blocks",
    "idle",
    "idle / block",
    "compute",
    "compute / block",
    "teardown",
    "exit",
)


def _slot_cell(r: WorkerRecord) -> str:
    """The slot, and the GPU(s) a local worker was given: ``0 (GPU 2)``."""
    slot = "-" if r.slot is None else str(r.slot)
    return slot if r.gpus is None else f"{slot} (GPU {','.join(r.gpus)})"


def worker_rows(records: Sequence[WorkerRecord]) -> list[tuple[str, ...]]:
    """The cells of the worker table (one tuple per record, :data:`WORKER_HEADER` order)."""
    return [
        (
            # a worker shared between tasks (issue 37): its part in this task
            str(r.worker_id) if r.moved_from is None else f"{r.worker_id} (from {r.moved_from})",
            _slot_cell(r),
            format_duration(r.startup),
            str(r.blocks),
            format_duration(r.idle.total) if r.idle.n else format_duration(0.0),
            _duration_pm(r.idle) if r.idle.n else "-",
            format_duration(r.compute.total) if r.compute.n else format_duration(0.0),
            _duration_pm(r.compute) if r.compute.n else "-",
            format_duration(r.teardown),
            f"moved to {r.moved_to}" if r.moved_to is not None else r.exit or "-",
        )
        for r in records
    ]


def _worker_table(records: Sequence[WorkerRecord], max_rows: int, indent: str) -> list[str]:
    rows: list[tuple[str, ...]] = [WORKER_HEADER, *worker_rows(records[:max_rows])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(WORKER_HEADER))]
    out = [
        indent + "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    hidden = len(records) - max_rows
    if hidden > 0:
        out.append(
            f"{indent}(+ {hidden} more workers — see task.report().workers.records "
            "for the full table)"
        )
    return out


def _log_line(records: Sequence[WorkerRecord]) -> str | None:
    """Where the workers' output is: ``<dir>/worker_<slot>.out and .err`` (None: no files)."""
    dirs = sorted({os.path.dirname(r.log_files[0]) for r in records if r.log_files is not None})
    if not dirs:
        return None
    where = ", ".join(os.path.join(d, "worker_<slot>") for d in dirs)
    return f"{where}.out and .err"


def _backups_row(c: Mapping[str, float]) -> str | None:
    """``1 started, 1 won, 0 lost; losers 60.0 s`` (straggler backups; None: none)."""
    started = int(c.get("backups_started", 0))
    if started <= 0:
        return None
    won, lost = int(c.get("backups_won", 0)), int(c.get("backups_lost", 0))
    loser = format_duration(float(c.get("backup_loser_seconds", 0.0)))
    return f"{started} started, {won} won, {lost} lost; losers {loser}"


def locality_row(c: Mapping[str, float]) -> str | None:
    """``94.1% of blocks next to their worker's previous one; mean step 1.1 blocks``: how
    coherent the workers' streams of blocks were (None: no worker had two blocks)."""
    blocks = int(c.get("locality_blocks", 0))
    if blocks <= 0:
        return None
    share = 100.0 * int(c.get("locality_local", 0)) / blocks
    step = int(c.get("locality_steps", 0)) / blocks
    return (
        f"{share:.1f}% of blocks next to their worker's previous one; mean step {step:.1f} blocks"
    )


def chunk_locality_row(c: Mapping[str, float]) -> str | None:
    """``87.5% of input chunks read by their worker for an earlier block (7 of 8)``: the
    same at the level of declared inputs' chunks (None: no such chunk was read)."""
    reads = int(c.get("chunk_reads", 0))
    if reads <= 0:
        return None
    hits = int(c.get("chunk_hits", 0))
    return (
        f"{100.0 * hits / reads:.1f}% of input chunks read by their worker for an earlier "
        f"block ({hits} of {reads})"
    )


def panel_rows(r: TaskReport) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The labelled rows of a task's panel: (blocks, workers); either may be empty."""
    b = r.blocks
    w = r.workers
    rows: list[tuple[str, str]] = []
    if r.mode == "distributed" and b.round_trip is not None:
        rows.append(("round trip", _duration_pm(b.round_trip)))
    if r.resource_tracking and b.wall is not None:
        rows.append(("wall", _duration_pm(b.wall)))
        if b.cpu is not None:
            rows.append(("cpu", _duration_pm(b.cpu)))
        if b.cpu_children is not None and b.cpu_children.max > 0.0:
            # only when some block started a child process (else it is 0 throughout)
            rows.append(("cpu children", _duration_pm(b.cpu_children)))
        if b.peak_rss is not None:
            rows.append(("peak RSS", _bytes_pm(b.peak_rss)))
        if b.gpu_util is not None:  # only when some block's process measured a GPU
            rows.append(("gpu util", f"{b.gpu_util.mean:.1f} % ± {b.gpu_util.std:.1f} %"))
        if b.gpu_mem is not None:
            rows.append(("gpu mem", _bytes_pm(b.gpu_mem)))
        read = b.io_read.total if b.io_read is not None else 0.0
        write = b.io_write.total if b.io_write is not None else 0.0
        rows.append(("io", f"read {format_bytes(read)}  write {format_bytes(write)}"))
        if b.overhead is not None:
            rows.append(("overhead", _duration_pm(b.overhead)))
        # SPEC §5.9 fixes this format: the angle glyph, signed, four decimals
        rows.append(("trend", f"∠ {(b.trend or 0.0):+.4f} ms/block"))
    cache = _input_cache_cell(r.input_cache, b.count)
    if cache is not None:
        rows.append(("input cache", cache))
    chunks = chunk_locality_row(r.counters)
    if chunks is not None:
        rows.append(("chunk locality", chunks))
    wrows: list[tuple[str, str]] = []
    if w.count > 0:
        phases = (
            ("startup", w.startup),
            ("task setup", w.task_setup),  # Task(setup=...); None without one
            ("idle", w.idle),
            ("teardown", w.teardown),
        )
        for label, s in phases:
            if s is not None:
                wrows.append((label, _duration_pm(s)))
        exits = ", ".join(f"{w.exits[k]} {k}" for k in _exit_order(w.exits))
        wrows.append(("exits", exits or "-"))
        backups = _backups_row(r.counters)
        if backups is not None:
            wrows.append(("backups", backups))
        locality = locality_row(r.counters)
        if locality is not None:
            wrows.append(("locality", locality))
        if r.memory:
            wrows.append(("oom retries", _memory_cell(r.memory)))
        logs = _log_line(w.records)
        if logs is not None:
            wrows.append(("logs", logs))
    return rows, wrows


def _input_cache_cell(c: Mapping[str, int], blocks: int) -> str | None:
    """``90% hit: 412 hits, 44 decodes (0.17 per block), 11.0 MiB decoded``: what the
    workers' decoded-chunk caches did for the declared inputs (None: no inputs)."""
    if not c:
        return None
    hits, misses = int(c.get("hits", 0)), int(c.get("misses", 0))
    share = f"{100 * hits / (hits + misses):.0f}% hit: " if hits + misses else ""
    per = f" ({misses / blocks:.2f} per block)" if blocks else ""
    text = (
        f"{share}{hits} hits, {misses} decodes{per}, "
        f"{format_bytes(float(c.get('miss_bytes', 0)))} decoded"
    )
    if c.get("bypassed"):
        text += f"; {c['bypassed']} reads uncached (the run writes them)"
    return text


def _memory_cell(m: dict[str, object]) -> str:
    """``600M 1, 1.2G 1 (succeeded: 600M 1)``: out-of-memory retries per grant."""

    def per_grant(d: object) -> str:
        items = d.items() if isinstance(d, dict) else ()
        return ", ".join(f"{g} {n}" for g, n in items) or "-"

    text = f"{per_grant(m.get('retries'))} (succeeded: {per_grant(m.get('succeeded'))}"
    failed = m.get("failed")
    if failed:
        text += f"; {failed} failed at the largest grant"
    return text + ")"


def panel_title(r: TaskReport) -> str:
    """``extract  40 blocks, 2 workers, 1.2 s wall``: the first line of a task's panel.

    The wall is the task's own, from its first block sent to its last block returned
    (in a pipeline each task has its own); the whole run's where that is unknown (a run
    line written before bellis kept it, or a task that ran no block)."""
    own = r.task_wall_seconds
    wall = r.wall_seconds if own is None or r.blocks.count == 0 else own
    return (
        f"{r.task_id}  {r.blocks.count} blocks, {r.workers.count} workers, "
        f"{format_duration(wall)} wall"
    )


def has_panel(r: TaskReport) -> bool:
    """Whether the panel shows this task (see :func:`render_panel`)."""
    return _has_anything(r)


def _task_lines(r: TaskReport, max_worker_rows: int) -> list[str]:
    w = r.workers
    lines = [f"  {panel_title(r)}"]
    rows, wrows = panel_rows(r)
    width = max((len(label) for label, _ in rows + wrows), default=0)
    if rows:
        lines.append("    blocks")
        lines.extend(_labelled([(label.ljust(width), v) for label, v in rows], "      "))
    if wrows:
        lines.append("    workers")
        lines.extend(_labelled([(label.ljust(width), v) for label, v in wrows], "      "))
        lines.extend(_worker_table(w.records, max_worker_rows, "      "))
    return lines


def render_panel(reports: Sequence[TaskReport], *, max_worker_rows: int = 10) -> str:
    """The "Resource Utilization" panel for these tasks; "" when there is nothing to show.

    Distributed tasks always show the round trip and the worker timeline; tasks with
    resource tracking add wall, cpu, cpu children, peak RSS, io, overhead and trend. A
    task with nothing to show (serial without resource tracking, or no executed block
    and no worker) is left out, and so is the whole panel if every task is.
    """
    shown = [r for r in reports if _has_anything(r)]
    if not shown:
        return ""
    out = ["Resource Utilization", "-" * len("Resource Utilization")]
    for r in shown:
        out.append("")
        out.extend(_task_lines(r, max_worker_rows))
    return "\n".join(out)
