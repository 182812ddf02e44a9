"""``bellis report``: one self-contained HTML page of a run, from its tracking stores alone.

The page embeds plotly.js once, inline (no CDN: it opens offline), then one JSON
document (``<script id="bellis-data" type="application/json">``) that holds every
figure and the volume arrays; a small script draws them. plotly is imported here and
nowhere else, and only when a report is written: workers and ``run_blockwise`` never
load it.

Sections: summary and notes, advice, failures, worker timeline, volume, distributions,
throughput, workers, run history (``docs/report.md`` explains each). The failure data
(``_failures``) travels in a second JSON document, ``<script id="bellis-failures">``.
"""

from __future__ import annotations

import datetime
import html
import json
import os
from pathlib import Path
from typing import Any

from .._sizes import format_iec
from .._stats._reports import RunReport, TaskReport
from ._advice import advice
from ._data import StoreData, from_task_report, load_stores
from ._failures import failure_payload, failures_of, failures_section, payload_json
from ._figures import (
    did_work,
    histogram_figure,
    last_worker_runs,
    line_window,
    run_history_figure,
    run_number,
    task_wall,
    throughput_figure,
    volume_payload,
    workers_figure,
)
from ._gantt import timeline_figure
from ._page_script import PAGE_JS
from ._panel import format_duration

__all__ = ["render_html", "report_html_for", "write_report"]

TOP: int = 20
_NO_STAMPS = (
    "No block has time stamps: the store was written without resource tracking or "
    "without the sent_at / returned_at arrays (see the notes above)."
)
_CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px;color:#222}
h1{font-size:22px}
h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.note{background:#fff4e5;border-left:4px solid #ff9800;padding:6px 10px;margin:6px 0}
.partial{background:#fdecea;border-left-color:#d62728}
.advice li{margin:4px 0} .empty{color:#777;font-style:italic}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:right} th{background:#f3f3f3}
td.l,th.l{text-align:left} .controls{margin:6px 0;font-size:13px}
.controls label{margin-right:14px} .plot{min-height:200px}
table.failures td{vertical-align:top} table.failures pre{max-width:560px}
pre{white-space:pre-wrap;overflow-wrap:anywhere;max-height:320px;overflow:auto;
background:#f7f7f7;padding:6px;font-size:12px;margin:4px 0}
.detail{border-left:4px solid #d62728;background:#fff;margin:8px 0;padding:4px 10px}
.detail:empty{display:none} .detail .attempt{border-top:1px solid #eee;padding:4px 0}
.detail .meta{font-size:12px;color:#555} a.blk{cursor:pointer}
"""


def _esc(v: Any) -> str:
    return html.escape(str(v))


def _when(t: Any) -> str:
    if not isinstance(t, int | float):
        return "?"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(head: list[str], rows: list[list[Any]], left: int = 1) -> str:
    def cells(tag: str, vals: list[Any]) -> str:
        return "".join(
            f"<{tag}{' class=l' if i < left else ''}>{_esc(v)}</{tag}>" for i, v in enumerate(vals)
        )

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', head)}</tr>{body}</table>"


def _top_table(s: StoreData, name: str) -> str:
    if name not in s.stats:
        return ""
    k = s.measured()
    if not len(k):
        return ""
    v = s.stats[name].reshape(-1)[k]
    order = k[(-v.astype("float64")).argsort(kind="stable")[:TOP]]
    f = {n: a.reshape(-1) for n, a in s.stats.items()}
    rows = []
    for c in order.tolist():
        w = int(f["worker_id"][c]) if "worker_id" in f else None
        rows.append(
            [
                str(s.coord(c)),
                s.roi(c),
                "-" if w is None or w == 2**32 - 1 else w,
                format_duration(float(f["wall_seconds"][c])) if "wall_seconds" in f else "-",
                format_duration(float(f["cpu_seconds"][c])) if "cpu_seconds" in f else "-",
                format_iec(float(f["peak_rss_bytes"][c])) if "peak_rss_bytes" in f else "-",
                int(s.failures.reshape(-1)[c]),
            ]
        )
    head = ["grid coordinate", "world ROI", "worker", "wall", "CPU", "peak RSS", "failures"]
    return _table(head, rows, left=2)


def _backups_cell(c: dict[str, Any]) -> str:
    """Straggler backups of a run: ``2 (1 won, 1 lost)``; ``-`` for none."""
    started = int(c.get("backups_started", 0))
    if started <= 0:
        return "-"
    return f"{started} ({int(c.get('backups_won', 0))} won, {int(c.get('backups_lost', 0))} lost)"


def _chunk_locality_cell(c: dict[str, Any]) -> str:
    """The share of declared-input chunks read by their worker for an earlier block:
    ``87.5% (7 of 8)``; ``-`` where no such chunk was read."""
    reads = int(c.get("chunk_reads", 0))
    if reads <= 0:
        return "-"
    hits = int(c.get("chunk_hits", 0))
    return f"{100.0 * hits / reads:.1f}% ({hits} of {reads})"


def _oom_cell(r: dict[str, Any]) -> str:
    """Out-of-memory retries of a run, per grant they ran with: ``1 (600M 1)``, with the
    blocks that ran out at the largest grant; ``-`` for none."""
    mem = r.get("memory") or {}
    retries = mem.get("retries") or {}
    failed = int(mem.get("failed", 0))
    n = sum(int(v) for v in retries.values())
    if n <= 0 and failed <= 0:
        return "-"
    text = f"{n} (" + ", ".join(f"{g} {int(v)}" for g, v in retries.items()) + ")" if n else "0"
    return text + (f", {failed} failed at the cap" if failed else "")


def _code_versions_line(s: StoreData) -> str:
    """Under a volume's title: its done blocks per code version (the "code version"
    figure's numbers), as ``bellis status`` prints them."""
    if not s.code_versions:
        return ""
    parts = []
    for row in s.code_versions:
        if row["version"] is None:
            parts.append(f"unknown version: {row['blocks']}")
        else:
            parts.append(f"version {row['version']} ({row['hash'][:12]}): {row['blocks']}")
    return f'<p class="code-versions">done blocks per code version: {_esc("; ".join(parts))}</p>'


def _code_cell(r: dict[str, Any]) -> str:
    """A run's code fingerprint (its first 12 hex digits) and its code-version entry."""
    code = r.get("code")
    if not isinstance(code, dict) or not isinstance(code.get("hash"), str):
        return "-"
    index = code.get("index")
    return str(code["hash"])[:12] + (f" (#{index})" if isinstance(index, int) else " (no block)")


def _history_rows(stores: list[StoreData]) -> str:
    rows = []
    for s in stores:
        for i, r in enumerate(s.runs):
            b, c = r.get("blocks") or {}, r.get("counters") or {}
            wall = task_wall(r)
            n = int(b.get("count", 0))
            exits = (r.get("workers") or {}).get("exits") or {}
            rows.append(
                [
                    s.task_id,
                    i + 1,
                    _when(r.get("run_started_at")),
                    r.get("outcome", "?"),
                    r.get("mode", "?"),
                    n,
                    int(b.get("skipped", 0)),
                    int(c.get("failed", 0)),
                    format_duration(wall),
                    f"{n / wall:.3g}" if wall > 0 else "-",
                    ", ".join(f"{k} {v}" for k, v in sorted(exits.items())) or "-",
                    _backups_cell(c),
                    _chunk_locality_cell(c),
                    _oom_cell(r),
                    _code_cell(r),
                ]
            )
    head = ["task", "run", "started (UTC)", "outcome", "mode", "blocks run", "skipped"]
    head += ["failed", "wall", "blocks/s", "exits", "backups", "chunk locality", "oom retries"]
    head += ["code"]
    return _table(head, rows, left=5) if rows else ""


def _forecast_rows(stores: list[StoreData]) -> str:
    """One row per run line that scored a forecast (``bellis.plan(tasks, sample=N)``)."""

    def pct(v: Any) -> str:
        return f"{v:+.1f}%" if isinstance(v, int | float) else "-"

    def num(v: Any, fmt: Any) -> str:
        return fmt(float(v)) if isinstance(v, int | float) else "-"

    def interval(d: Any, fmt: Any) -> str:
        if not isinstance(d, dict):
            return "-"
        return (
            f"{num(d.get('estimate'), fmt)} ({num(d.get('low'), fmt)} to {num(d.get('high'), fmt)})"
        )

    def hours(x: float) -> str:
        return f"{x:.3g}"

    rows = []
    for s in stores:
        for i, r in enumerate(s.runs):
            f = r.get("forecast")
            if not isinstance(f, dict):
                continue
            act = f.get("actual") if isinstance(f.get("actual"), dict) else {}
            err = f.get("error_pct") if isinstance(f.get("error_pct"), dict) else {}
            assert isinstance(act, dict) and isinstance(err, dict)
            rows.append(
                [
                    s.task_id,
                    i + 1,
                    _when(r.get("run_started_at")),
                    interval(f.get("wall"), format_duration),
                    num(act.get("wall"), format_duration),
                    pct(err.get("wall")),
                    interval(f.get("core_hours"), hours),
                    num(act.get("core_hours"), hours),
                    pct(err.get("core_hours")),
                    num(f.get("peak_rss_p99"), format_iec),
                    num(act.get("peak_rss_p99"), format_iec),
                    pct(err.get("peak_rss_p99")),
                ]
            )
    head = ["task", "run", "started (UTC)", "wall forecast", "wall actual", "error"]
    head += ["core-hours forecast", "core-hours actual", "error"]
    head += ["p99 peak RSS forecast", "actual", "error"]
    return _table(head, rows, left=3) if rows else ""


def _summary(stores: list[StoreData]) -> str:
    rows = []
    verifies = any(s.verify is not None for s in stores)
    for s in stores:
        done, failed, attempts = s.counts
        last = s.runs[-1] if s.runs else {}
        # blocks, not tracking cells: a task with read context has cells no block maps to
        grid, blocks, untouched = "unknown", f"unknown ({int(s.done.size)} cells)", "?"
        if s.layout is not None:
            grid = " x ".join(map(str, s.layout.block_grid))
            blocks, untouched = str(s.blocks), str(s.untouched)
        else:
            untouched = f"at most {s.untouched}"
        rows.append(
            [
                s.task_id,
                grid,
                blocks,
                done,
                failed,
                untouched,
                attempts,
                *(_verify_cells(s) if verifies else []),
                "in flight" if s.in_flight else last.get("outcome", "-"),
                str(s.path) if s.path else "-",
            ]
        )
    head = ["task", "block grid", "blocks", "done", "failed", "untouched", "failed attempts"]
    if verifies:
        head += ["verified", "mismatched", "unverifiable"]
    return _table([*head, "last run", "store"], rows)


def _verify_cells(s: StoreData) -> list[Any]:
    """verified / mismatched / unverifiable (``bellis verify``), or dashes."""
    v = s.verify
    if v is None:
        return ["-", "-", "-"]
    return [
        v.verified if v.last_verify is not None else f"{v.verified} (not yet verified)",
        v.mismatched,
        v.unverifiable,
    ]


def _why_no_workers(line: dict[str, Any]) -> str:
    """Why a run started no managed worker, from its run line."""
    if line.get("mode") == "serial":
        return "it ran in serial mode (blocks ran in the driver)"
    b = line.get("blocks") or {}
    if not did_work(line) and int(b.get("skipped", 0) or 0) > 0:
        return "every block was skipped (done by an earlier run), so no worker was started"
    if int((line.get("workers") or {}).get("unmanaged_clients", 0) or 0) > 0:
        return "its blocks ran on unmanaged clients (workers bellis did not start)"
    return "it started no managed worker"


def _workers_notes(stores: list[StoreData]) -> str:
    """What the Workers section says about each task whose last run started no worker:
    why, and which run's workers are shown instead (or that none are)."""
    shown = last_worker_runs(stores)
    numbers = run_number(stores)
    notes: dict[str, list[str]] = {}  # the tasks of one pipeline share a note
    for s in stores:
        if not s.runs or TaskReport(s.runs[-1], s.path).workers.records:
            continue
        w = line_window(s.runs[-1])
        n = numbers.get(w) if w is not None else None
        which = f"the last run (run {n})" if n else "the last run"
        text = f"{which} started no worker: {_why_no_workers(s.runs[-1])}."
        if s.task_id in shown:
            text += f" Shown: the workers of run {shown[s.task_id][1]}, the last that had some."
        notes.setdefault(text, []).append(s.task_id)
    return "".join(f"<p>{_esc(', '.join(t))}: {_esc(x)}</p>" for x, t in notes.items())


def _section(sid: str, title: str, intro: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{_esc(title)}</h2><p>{intro}</p>{body}</section>'


def _plot(pid: str, section: str) -> str:
    return f'<div class="plot" id="plot-{pid}" data-section="{section}"></div>'


def _empty(why: str) -> str:
    return f'<p class="empty">{_esc(why)}</p>'


def render_html(stores: list[StoreData], title: str = "bellis run report") -> str:
    """The whole page for these stores."""
    from plotly.offline import get_plotlyjs

    figures: dict[str, Any] = {}
    volumes: list[dict[str, Any]] = []
    parts: list[str] = []
    partial = [s for s in stores if s.in_flight]
    notes = "".join(
        f'<div class="note{" partial" if s.in_flight else ""}"><b>{_esc(s.task_id)}</b>: '
        f"{_esc(n)}</div>"
        for s in stores
        for n in s.notes
    )
    head = "Partial report: a run is still in flight. " if partial else ""
    parts.append(
        f"<h1>{_esc(title)}</h1><p>{_esc(head)}Built {_when(datetime.datetime.now().timestamp())}"
        f" UTC from {len(stores)} tracking store(s).</p>{notes}{_summary(stores)}"
    )
    lines = advice(stores)
    body = (
        "<ul class=advice>" + "".join(f"<li>{_esc(x)}</li>" for x in lines) + "</ul>"
        if lines
        else _empty("No advice: the figures show nothing to act on (or too few blocks).")
    )
    parts.append(_section("advice", "Advice", "Read from the figures below only.", body))

    found = failures_of(stores)
    failures = failure_payload(found)
    parts.append(
        _section(
            "failures",
            "Failures",
            "The distinct errors of the failed attempts recorded in each store's errors.jsonl "
            "(every run), with their blocks. Click a block here, a cell of the failure map or "
            "a red or orange bar of the timeline for that block's attempts, traceback and "
            "log lines.",
            failures_section(found, failures),
        )
    )

    fig = timeline_figure(stores)
    if fig is not None:
        figures["timeline"] = fig
    parts.append(
        _section(
            "timeline",
            "Worker timeline",
            "One row per worker, one bar per block from sent to returned, coloured by task; "
            "orange bars needed failed attempts first (done after a retry, orange in the "
            "volume map too); red bars are the last failed attempt of a block that is not "
            "done (failed, red in the volume map too). Gaps are idle time. With several runs "
            "it opens on the last run that did work, and each row is one worker of one run "
            "(worker ids restart every run); pick a run above the chart (start, blocks, wall) "
            "to zoom to it.",
            _plot("timeline", "timeline") + '<div class="detail" id="timeline-detail"></div>'
            if fig
            else _empty(_NO_STAMPS),
        )
    )

    vol_html = []
    for i, s in enumerate(stores):
        p = volume_payload(s)
        if p is None:
            continue
        p["div"] = f"volume-{i}"
        p["store"] = i
        volumes.append(p)
        vol_html.append(
            f'<h3>{_esc(s.task_id)}</h3><div class="controls" id="volume-{i}-controls"></div>'
            + _code_versions_line(s)
            + _plot(f"volume-{i}", "volume")
            + f'<div class="detail" id="volume-{i}-detail"></div>'
        )
    parts.append(
        _section(
            "volume",
            "The volume",
            'The block grid: choose a figure ("code version": which code made each done '
            "block, 0 where unknown); a 3-D grid shows one slice, chosen with the "
            "slider along the chosen axis. Hover a cell for its coordinate, ROI and figures; "
            "click one for its failed attempts.",
            "".join(vol_html) or _empty("No store with a 1-, 2- or 3-D grid."),
        )
    )

    dist = []
    for name, label in (("wall_seconds", "Wall time"), ("peak_rss_bytes", "Peak RSS")):
        fig = histogram_figure(stores, name, label)
        if fig is not None:
            figures[f"hist-{name}"] = fig
            dist.append(_plot(f"hist-{name}", "distributions"))
    for s in stores:
        for name, what in (("wall_seconds", "slowest"), ("peak_rss_bytes", "most memory-hungry")):
            t = _top_table(s, name)
            if t:
                dist.append(f"<h3>{_esc(s.task_id)}: the {TOP} {what} blocks</h3>{t}")
    parts.append(
        _section(
            "distributions",
            "Distributions",
            "Histograms of per-block wall time and peak RSS with p50, p95, p99 and max.",
            "".join(dist) or _empty("No measured blocks (resource tracking was off)."),
        )
    )

    for sid, title_, intro, fn in (
        (
            "throughput",
            "Throughput over time",
            "Blocks returned per second, binned run by run. With several runs the chart opens "
            "on the last run that did work; double-click it to see every run.",
            throughput_figure,
        ),
        (
            "workers",
            "Workers",
            "Launch, setup, idle, compute, final wait and teardown per worker of each "
            "task's last run that started workers, and how the workers exited.",
            workers_figure,
        ),
        (
            "history",
            "Run history",
            "One row per line of runs.jsonl.",
            run_history_figure,
        ),
    ):
        fig = fn(stores)
        if fig is not None:
            figures[sid] = fig
        why = "No run line in runs.jsonl (see the notes)."
        if sid == "throughput":
            why = _NO_STAMPS
        elif sid == "workers" and any(s.runs for s in stores):
            why = "No run started a managed worker."
        body = _plot(sid, sid) if fig else _empty(why)
        if sid == "workers":
            body = _workers_notes(stores) + body
        if sid == "history":
            body += _history_rows(stores)
        parts.append(_section(sid, title_, intro, body))

    scored = _forecast_rows(stores)
    parts.append(
        _section(
            "forecast",
            "Forecast vs actual",
            "What bellis.plan(tasks, sample=N) predicted before a run (its interval: the "
            "10th to 90th percentile), against what that run measured. The wall is the "
            "run's; core-hours and p99 peak RSS are the task's (measured with resource "
            "tracking only).",
            scored
            or _empty(
                "No run was forecast: bellis.plan(tasks, sample=N) leaves a forecast in "
                "each task's store, and the next run scores it here."
            ),
        )
    )

    payload = json.dumps({"figures": figures, "volumes": volumes}, separators=(",", ":"))
    payload = payload.replace("</", "<\\/").replace("<!--", "\\u003c!--")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{_esc(title)}</title><style>{_CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        + "".join(parts)
        + f'<script id="bellis-data" type="application/json">{payload}</script>'
        + f'<script id="bellis-failures" type="application/json">{payload_json(failures)}'
        + "</script>"
        + f"<script>{PAGE_JS}</script></body></html>"
    )


def write_report(
    paths: str | os.PathLike[str] | list[str | os.PathLike[str]],
    out: str | os.PathLike[str] = "report.html",
) -> Path:
    """Write the HTML report of the tracking stores at or under ``paths`` to ``out``.

    A path is a task's tracking store or a folder that holds several (a pipeline's
    tracking basedir). Returns the path written. Raises
    :class:`~bellis.errors.TrackingError` for a path with no store.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    stores = load_stores(list(paths))
    return _write(render_html(stores), out)


def _write(text: str, out: str | os.PathLike[str]) -> Path:
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target


def report_html_for(report: TaskReport | RunReport, out: str | os.PathLike[str]) -> Path:
    """``TaskReport.to_html`` / ``RunReport.to_html``: the report of its store(s)."""
    reports = [report] if isinstance(report, TaskReport) else list(report.tasks.values())
    return _write(render_html([from_task_report(r) for r in reports]), out)
