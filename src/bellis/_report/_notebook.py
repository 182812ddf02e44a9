"""Jupyter display: ``TaskReport._repr_html_`` and ``RunReport._repr_html_``.

Plain HTML and one inline SVG per task, no JavaScript and nothing beyond the default
install: the panel as a table, the worker table, and a small timeline of the run (one
row per worker, busy time in blue, failed attempts in red). Every text that comes from
a run (task ids, paths, exit kinds) is escaped with :func:`html.escape`.

The timeline bins the blocks into the pixel columns of each row, so a run of 10^6
blocks draws at most one rectangle per busy stretch of a row, not one per block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Final

import numpy as np
from numpy.typing import NDArray

from .._block import NO_WORKER, STAMP_ARRAYS
from ._panel import WORKER_HEADER, format_duration, panel_rows, panel_title, worker_rows

if TYPE_CHECKING:
    from .._stats._reports import TaskReport

__all__ = ["Spans", "task_html", "task_report_html", "timeline_svg"]

_WIDTH: Final = 640
_LABEL: Final = 90
_ROW: Final = 14
_GAP: Final = 3
_MAX_ROWS: Final = 32
_MAX_WORKER_TABLE: Final = 50
_BUSY: Final = "#4878d0"
_FAILED: Final = "#d65f5f"
_STYLE: Final = (
    "<style>.bellis-report table{border-collapse:collapse;margin:4px 0}"
    ".bellis-report td,.bellis-report th{padding:1px 8px;text-align:left;"
    "font-family:monospace}.bellis-report th.section{font-weight:bold;"
    "border-bottom:1px solid #999}</style>"
)


@dataclass(frozen=True)
class Spans:
    """The round trips of one run's blocks: UNIX seconds, worker ids, failed or not."""

    sent: NDArray[np.float64]
    returned: NDArray[np.float64]
    worker: NDArray[np.int64]
    failed: NDArray[np.bool_]


def _table(rows: Sequence[tuple[str, str]], section: str) -> str:
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<tr><th class="section" colspan="2">{escape(section)}</th></tr>{body}'


def _runs_of(mask: NDArray[np.bool_]) -> list[tuple[int, int]]:
    """(start, stop) of every stretch of True in ``mask``."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]


def _coverage(x0: NDArray[np.int64], x1: NDArray[np.int64], width: int) -> NDArray[np.bool_]:
    """Which of ``width`` pixel columns the spans ``[x0, x1]`` touch."""
    diff = np.zeros(width + 1, dtype=np.int64)
    np.add.at(diff, x0, 1)
    np.add.at(diff, x1 + 1, -1)
    covered: NDArray[np.bool_] = np.cumsum(diff[:width]) > 0
    return covered


def round_ticks(duration: float, most: int = 6) -> list[float]:
    """Tick positions from 0 to ``duration`` at a round step (1, 2, 2.5 or 5 times a power
    of ten), at most ``most`` of them: 0, 5, 10, 15 s, never 0, 4.33, 8.66, 12.99 s."""
    if not duration > 0:
        return [0.0]
    raw = duration / max(1, most - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    count = int(duration / step + 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def timeline_svg(spans: Spans, start: float, end: float) -> str:
    """An inline SVG of the spans between ``start`` and ``end`` (UNIX seconds)."""
    plot = _WIDTH - _LABEL - 10
    duration = max(end - start, 1e-9)
    workers = sorted({int(w) for w in spans.worker.tolist()})
    shown = workers[:_MAX_ROWS]
    height = (len(shown) + 1) * (_ROW + _GAP) + 14
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="10" role="img">'
        f"<title>worker timeline: {len(spans.sent)} blocks, "
        f"{escape(format_duration(end - start))}</title>"
    ]
    scale = plot / duration
    for row, w in enumerate(shown):
        y = row * (_ROW + _GAP)
        sel = spans.worker == w
        label = "no worker" if w == NO_WORKER else f"worker {w}"
        n_failed = int(spans.failed[sel].sum())
        parts.append(
            f'<text x="0" y="{y + _ROW - 3}">{escape(label)}<title>{escape(label)}: '
            f"{int(sel.sum())} blocks, {n_failed} failed</title></text>"
        )
        for failed, colour in ((False, _BUSY), (True, _FAILED)):
            pick = sel & (spans.failed == failed)
            if not pick.any():
                continue
            x0 = np.clip(((spans.sent[pick] - start) * scale).astype(np.int64), 0, plot - 1)
            x1 = np.clip(((spans.returned[pick] - start) * scale).astype(np.int64), 0, plot - 1)
            for a, b in _runs_of(_coverage(x0, np.maximum(x0, x1), plot)):
                t0, t1 = a / scale, b / scale
                kind = "failed attempt" if failed else "busy"
                parts.append(
                    f'<rect x="{_LABEL + a}" y="{y}" width="{b - a}" height="{_ROW}" '
                    f'fill="{colour}"><title>{escape(label)} {kind} '
                    f"{t0:.2f} s to {t1:.2f} s</title></rect>"
                )
    y = len(shown) * (_ROW + _GAP)
    if len(workers) > len(shown):
        parts.append(
            f'<text x="0" y="{y + _ROW - 3}">(+ {len(workers) - len(shown)} more workers)</text>'
        )
        y += _ROW + _GAP
    for t in round_ticks(duration):
        x = _LABEL + plot * t / duration
        anchor = "end" if x > _LABEL + plot - 20 else "middle"
        parts.append(
            f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#666"/>'
            f'<text x="{x:.1f}" y="{y + 14}" text-anchor="{anchor}">'
            f"{escape(format_duration(t) if t else '0 s')}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def task_html(report: TaskReport, spans: Spans | None, note: str | None = None) -> str:
    """One task's report as HTML: the panel, the worker table and the timeline."""
    rows, wrows = panel_rows(report)
    head = [
        ("outcome", report.outcome),
        ("mode", report.mode),
        (
            "blocks",
            f"{report.blocks.count} run, {report.blocks.skipped} skipped, "
            f"{report.blocks.failed_attempts} failed attempts",
        ),
    ]
    parts = [
        f'<div class="bellis-report">{_STYLE}',
        f"<table><caption>{escape(panel_title(report))}</caption>",
        _table(head, "run"),
    ]
    if rows:
        parts.append(_table(rows, "blocks"))
    if wrows:
        parts.append(_table(wrows, "workers"))
    parts.append("</table>")
    records = report.workers.records
    if records:
        cells = worker_rows(records[:_MAX_WORKER_TABLE])
        parts.append("<table><tr>")
        parts.extend(f"<th>{escape(h)}</th>" for h in WORKER_HEADER)
        parts.append("</tr>")
        for row in cells:
            parts.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
        if len(records) > _MAX_WORKER_TABLE:
            parts.append(f"<p>(+ {len(records) - _MAX_WORKER_TABLE} more workers)</p>")
    start, end = report.run_started_at, report.run_finished_at
    if spans is not None and len(spans.sent) and start is not None and end is not None:
        parts.append(timeline_svg(spans, float(start), float(end)))
    elif note:
        parts.append(f"<p><i>{escape(note)}</i></p>")
    parts.append("</div>")
    return "".join(parts)


def task_report_html(report: TaskReport) -> str:
    """``TaskReport._repr_html_``: the panel as a table and a timeline of this run
    (inline SVG), read from the task's store."""
    start, end = report.run_started_at, report.run_finished_at
    store = report._store() if report.store_path is not None else None
    if store is None or store.done is None:
        return task_html(report, None, "no timeline: this task has no tracking store")
    f = store.flat
    if not all(n in f for n in STAMP_ARRAYS):
        return task_html(
            report, None, "no timeline: the store has no per-block times (resource_tracking off)"
        )
    sent, ret = f["sent_at"], f["returned_at"]
    pick = ret > 0
    if start is not None and end is not None:
        # the blocks of this run (skipped ones keep the stamps of the run that ran them)
        pick &= (sent >= float(start) - 1.0) & (sent <= float(end) + 1.0)
    cells = np.flatnonzero(pick)
    spans = Spans(
        sent=np.asarray(sent[cells], dtype=np.float64),
        returned=np.asarray(ret[cells], dtype=np.float64),
        worker=np.asarray(f["worker_id"][cells], dtype=np.int64),
        failed=np.asarray(store.done[cells] != 1),
    )
    return task_html(report, spans, "no timeline: no block of this run has times")
