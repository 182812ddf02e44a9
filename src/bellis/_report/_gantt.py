"""The report's worker timeline: a Gantt chart of the runs, built from :class:`StoreData`.

One row per (task, worker); one WebGL bar per block from ``sent_at`` to ``returned_at``
up to :data:`TIMELINE_BLOCKS` blocks, and beyond, each row binned into :data:`TIME_BINS`
time bins coloured by the fraction of the bin the worker was busy. A cell that is not
done keeps the stamps of its last failed attempt (``record_failure``): those attempts
are drawn as bars of their own in :data:`ATTEMPT_COLOUR`, red (up to ``TIMELINE_BLOCKS`` of
them, else one marker per row and time bin that counts them). The menu zooms to one run
of ``runs.jsonl``, each labelled with its start, blocks run and wall time.
"""

from __future__ import annotations

import datetime
import html
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from .._block import NO_WORKER
from .._sizes import format_iec
from ._data import StoreData
from ._figures import (
    FAILED_COLOUR,
    RETRIED_COLOUR,
    TIME_BINS,
    TIMELINE_BLOCKS,
    VOLUME_METRICS,
    base_layout,
    colour,
    line_window,
    opening_range,
    origin_label,
    run_lines,
    run_number,
    time_origin,
    typed,
    vline,
    work_window,
)
from ._panel import format_duration

__all__ = ["ATTEMPT_COLOUR", "run_menu", "timeline_figure"]

#: a failed attempt of a block that is not done: red, the volume map's "failed"
ATTEMPT_COLOUR: Final = FAILED_COLOUR


def _worker(w: int) -> str:
    return "worker " + ("none (serial / unmanaged)" if w == NO_WORKER else str(w))


def _block_text(s: StoreData, k: int, t0: float) -> str:
    f = {n: a.reshape(-1) for n, a in s.stats.items()}
    parts = [f"<b>{html.escape(s.task_id)}</b> block {s.coord(k)}", f"ROI {s.roi(k)}"]
    parts.append(_worker(int(f["worker_id"][k]) if "worker_id" in f else NO_WORKER))
    if "sent_at" in f:
        sent, ret = float(f["sent_at"][k]), float(f["returned_at"][k])
        parts.append(f"sent +{sent - t0:.3f} s, returned +{ret - t0:.3f} s")
    for name, label, unit in VOLUME_METRICS[2:]:
        if name in f:
            v = float(f[name][k])
            parts.append(f"{label} {format_iec(v) if unit == 'B' else format_duration(v)}")
    fails = int(s.failures.reshape(-1)[k])
    if fails:
        parts.append(f"<b>{fails} failed attempt(s) before it succeeded</b> (click: their errors)")
    return "<br>".join(parts)


def _attempt_text(s: StoreData, k: int, t0: float) -> str:
    f = {n: s.stats[n].reshape(-1) for n in ("worker_id", "sent_at", "returned_at")}
    sent, ret = float(f["sent_at"][k]), float(f["returned_at"][k])
    fails = int(s.failures.reshape(-1)[k])
    return "<br>".join(
        [
            f"<b>{html.escape(s.task_id)}</b> block {s.coord(k)}: <b>failed attempt</b>",
            f"ROI {s.roi(k)}",
            _worker(int(f["worker_id"][k])),
            f"sent +{sent - t0:.3f} s, returned +{ret - t0:.3f} s ({ret - sent:.3f} s)",
            f"failures {fails} (the last attempt is drawn), not done (click: its errors)",
        ]
    )


Rows = dict[tuple[int, int, int], int]


def _runs_of(s: StoreData, cells: NDArray[np.intp], numbers: dict[Any, int]) -> NDArray[np.int64]:
    """The run (its number, :func:`run_number`) each cell's stamps belong to: the run of
    the task's own ``runs.jsonl`` whose window holds the cell's ``sent_at``; 0 for none
    (a run in flight has no run line yet)."""
    out = np.zeros(len(cells), dtype=np.int64)
    own = sorted({w for r in s.runs if (w := line_window(r)) is not None})
    if not own or not len(cells):
        return out
    sent = s.stats["sent_at"].reshape(-1)[cells].astype(np.float64)
    starts = np.array([a for a, _ in own])
    ends = np.array([b for _, b in own])
    nums = np.array([numbers.get(w, 0) for w in own], dtype=np.int64)
    i = np.searchsorted(starts, sent, side="right") - 1
    ok = (i >= 0) & (sent <= ends[np.maximum(i, 0)] + 1e-6)
    out[ok] = nums[i[ok]]
    return out


def _rows(stores: list[StoreData]) -> tuple[list[str], Rows]:
    """The timeline's rows, one per (task, run, worker): worker ids restart every run, so
    the workers of two runs never share a row. Every worker with a stored block or failed
    attempt, and every worker of the task's last run (one that ran nothing has a row and no
    bar). With more than one run the label names the run (``run 2``, as the menu numbers
    them); it names a worker's failed attempts in the last run and how it exited."""
    labels: list[str] = []
    index: Rows = {}
    numbers = run_number(stores)
    many = len(numbers) > 1
    for ti, s in enumerate(stores):
        if "worker_id" not in s.stats:
            continue
        rep = s.last_report
        last = 0
        if rep is not None and s.runs:
            w = line_window(s.runs[-1])
            last = 0 if w is None else numbers.get(w, 0)
        failed = {} if rep is None else {w.worker_id: w for w in rep.workers.records}
        k = np.concatenate((s.measured(), s.failed_stamped()))
        wid = s.stats["worker_id"].reshape(-1)[k].astype(np.int64)
        pairs = set(zip(_runs_of(s, k, numbers).tolist(), wid.tolist(), strict=True))
        pairs |= {(last, w) for w in failed}
        for n, w in sorted(pairs):
            index[(ti, n, w)] = len(labels)
            name = "no worker" if w == NO_WORKER else f"worker {w}"
            rec = failed.get(w) if n == last else None
            if rec is not None and rec.blocks_failed:
                name += f" ({rec.blocks_failed} failed, exit {rec.exit or 'open'})"
            if many:
                name = (f"run {n}" if n else "run in flight") + " · " + name
            labels.append(f"{s.task_id} · {name}")
    return labels, index


def _row_ids(
    stores: list[StoreData], ti: int, cells: NDArray[np.intp], rows: Rows
) -> NDArray[np.intp]:
    """The timeline row of each of ``cells`` of store ``ti``."""
    s = stores[ti]
    runs = _runs_of(s, cells, run_number(stores)).tolist()
    wid = s.stats["worker_id"].reshape(-1)[cells].astype(np.int64).tolist()
    return np.array([rows[(ti, n, w)] for n, w in zip(runs, wid, strict=True)], dtype=np.intp)


def _busy_bins(
    sent: NDArray[np.float64], ret: NDArray[np.float64], edges: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Busy seconds in each bin of ``edges`` for the intervals ``[sent, ret)``."""
    s = np.sort(sent)
    r = np.sort(ret)
    cs, cr = np.concatenate(([0.0], np.cumsum(s))), np.concatenate(([0.0], np.cumsum(r)))
    i = np.searchsorted(s, edges, side="right")
    j = np.searchsorted(r, edges, side="right")
    f = (i * edges - cs[i]) - (j * edges - cr[j])  # integral of busy count up to each edge
    return np.diff(f)


def _bars(
    s: StoreData,
    row_of: NDArray[np.intp],
    cells: NDArray[np.intp],
    t0: float,
    style: tuple[str, str, int],
    text: list[str],
    names: list[str] | None,
    store: int | None = None,
) -> list[dict[str, Any]]:
    """One bar per cell (a WebGL line segment) and a hover marker at its middle, invisible
    for a block, a cross for a failed attempt (so that a short one shows at any zoom);
    ``y`` is the row's index, or its label (``names``) on the binned chart's category axis.
    With ``store`` (the store's index in the page), each marker's ``customdata`` is
    ``[store, "y,x", failures]``: what a click shows the block's failed attempts by."""
    name, col, width = style
    attempt = col == ATTEMPT_COLOUR
    y: list[Any] = row_of.tolist()
    if names is not None:
        y = [names[r] for r in y]
    x0 = (s.stats["sent_at"].reshape(-1)[cells] - t0).tolist()
    x1 = (s.stats["returned_at"].reshape(-1)[cells] - t0).tolist()
    xs: list[float | None] = []
    ys: list[Any] = []
    for a, b, r in zip(x0, x1, y, strict=True):
        xs += [a, b, None]
        ys += [r, r, None]
    line: dict[str, Any] = {"type": "scattergl", "mode": "lines", "x": xs, "y": ys}
    line.update(name=name, legendgroup=name, hoverinfo="skip")
    line["line"] = {"width": width, "color": col}
    marker = {
        "type": "scattergl",
        "mode": "markers",
        "x": [(a + b) / 2 for a, b in zip(x0, x1, strict=True)],
        "y": y,
        "marker": (
            {"size": 7, "color": col, "symbol": "x"}
            if attempt
            else {"size": 4, "color": col, "opacity": 0.01}
        ),
        "text": text,
        "hovertemplate": "%{text}<extra></extra>",
        "name": name,
        "legendgroup": name,
        "showlegend": False,
    }
    if store is not None:
        fails = s.failures.reshape(-1)[cells].tolist()
        marker["customdata"] = [
            [store, ",".join(map(str, s.coord(int(c)))), int(n)]
            for c, n in zip(cells.tolist(), fails, strict=True)
        ]
    return [line, marker]


def _binned_attempts(
    stores: list[StoreData],
    labels: list[str],
    rows: Rows,
    edges: NDArray[np.float64],
    t0: float,
) -> dict[str, Any] | None:
    """Too many failed attempts for a bar each: one marker per (row, time bin) holding
    any, placed at the bin's middle, its hover giving their count and time."""
    count = np.zeros((len(labels), TIME_BINS))
    secs = np.zeros((len(labels), TIME_BINS))
    for ti, s in enumerate(stores):
        f = s.failed_stamped()
        if not len(f) or "worker_id" not in s.stats or "sent_at" not in s.stats:
            continue
        sent = s.stats["sent_at"].reshape(-1)[f].astype(np.float64)
        ret = s.stats["returned_at"].reshape(-1)[f].astype(np.float64)
        row = _row_ids(stores, ti, f, rows)
        b = np.clip(np.searchsorted(edges, (sent + ret) / 2, side="right") - 1, 0, TIME_BINS - 1)
        np.add.at(count, (row, b), 1)
        np.add.at(secs, (row, b), ret - sent)
    r, b = np.nonzero(count)
    if not len(r):
        return None
    mid = (edges[:-1] + edges[1:]) / 2 - t0
    text = [
        f"{labels[i]}<br>+{mid[j]:.1f} s: <b>{int(count[i, j])} failed attempt(s)</b>, "
        f"{secs[i, j]:.2f} s in all"
        for i, j in zip(r.tolist(), b.tolist(), strict=True)
    ]
    return {
        "type": "scattergl",
        "mode": "markers",
        "x": typed(mid[b]),
        "y": [labels[i] for i in r.tolist()],
        "marker": {"size": 7, "color": ATTEMPT_COLOUR, "symbol": "x"},
        "text": text,
        "hovertemplate": "%{text}<extra></extra>",
        "name": "failed attempts (count per time bin)",
        "showlegend": True,
    }


def run_menu(
    stores: list[StoreData], t0: float
) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """The run selector's buttons and the run windows: all runs, then one button per run
    window of ``runs.jsonl`` (the tasks of one pipeline run share one), labelled with its
    start (UTC), blocks run and wall time; choosing one zooms the timeline to it."""
    found = run_lines(stores)
    buttons = [{"label": "all runs", "method": "relayout", "args": [{"xaxis.autorange": True}]}]
    for n, (a, b) in enumerate(sorted(found), start=1):
        lines = found[(a, b)]
        blocks = sum(int((r.get("blocks") or {}).get("count", 0)) for _, r in lines)
        skipped = sum(int((r.get("blocks") or {}).get("skipped", 0)) for _, r in lines)
        when = datetime.datetime.fromtimestamp(a, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        label = f"run {n}: {when} UTC, {blocks} blocks"
        label += f" ({skipped} skipped)" if skipped else ""
        label += f", wall {format_duration(b - a)}"
        if len(stores) > 1:
            label += " · " + ", ".join(tid for tid, _ in lines)
        pad = 0.02 * max(b - a, 1e-3)
        args = [{"xaxis.range": [a - t0 - pad, b - t0 + pad]}]
        buttons.append({"label": label, "method": "relayout", "args": args})
    return buttons, sorted(found)


def timeline_figure(stores: list[StoreData]) -> dict[str, Any] | None:
    """The Gantt chart: one row per (task, worker), one bar per block (or busy bins), and
    the failed attempts the stores keep stamps of."""
    t0 = time_origin(stores)
    labels, rows = _rows(stores)
    if t0 is None or not labels:
        return None
    stamped = [s for s in stores if "sent_at" in s.stats and "worker_id" in s.stats]
    total = sum(len(s.measured()) for s in stamped)
    attempts = sum(len(s.failed_stamped()) for s in stamped)
    data: list[dict[str, Any]] = []
    binned = total > TIMELINE_BLOCKS
    end = t0
    for s in stamped:
        k = np.concatenate((s.measured(), s.failed_stamped()))
        if len(k):
            end = max(end, float(s.stats["returned_at"].reshape(-1)[k].max()))
    for s in stores:
        for r in s.runs:
            b = r.get("run_finished_at")
            end = max(end, float(b)) if isinstance(b, int | float) else end
    edges = np.linspace(t0, end, TIME_BINS + 1)
    if binned:
        z = np.zeros((len(labels), TIME_BINS))
        for s in stamped:
            ti = stores.index(s)
            k = s.measured()
            if not len(k):
                continue
            row = _row_ids(stores, ti, k, rows)
            sent = s.stats["sent_at"].reshape(-1)[k].astype(np.float64)
            ret = s.stats["returned_at"].reshape(-1)[k].astype(np.float64)
            order = np.argsort(row, kind="stable")
            row, sent, ret = row[order], sent[order], ret[order]
            bounds = np.flatnonzero(np.diff(row)) + 1
            for a, b in zip(
                np.concatenate(([0], bounds)), np.concatenate((bounds, [len(row)])), strict=True
            ):
                z[int(row[a])] = _busy_bins(sent[a:b], ret[a:b], edges)
        width = (end - t0) / TIME_BINS or 1.0
        z_spec = typed(np.clip(z / width, 0.0, 1.0).reshape(-1))
        data.append(
            {
                "type": "heatmap",
                "x": typed((edges[:-1] + edges[1:]) / 2 - t0),
                "y": labels,
                "z": {**z_spec, "shape": f"{len(labels)},{TIME_BINS}"},
                "zmin": 0,
                "zmax": 1,
                "colorscale": [[0.0, "#ffffff"], [1.0, "#08306b"]],
                "colorbar": {"title": {"text": "busy"}, "tickformat": ".0%"},
                "hovertemplate": "%{y}<br>+%{x:.1f} s<br>busy %{z:.0%}<extra></extra>",
                "name": "busy fraction",
            }
        )
    else:
        for s in stamped:
            ti = stores.index(s)
            k = s.measured()
            retried = s.failures.reshape(-1)[k] > 0
            for sel, name, col in (
                (~retried, s.task_id, colour(ti)),
                (retried, f"{s.task_id}: done after failed attempts", RETRIED_COLOUR),
            ):
                if sel.any():
                    text = [_block_text(s, int(c), t0) for c in k[sel].tolist()]
                    row = _row_ids(stores, ti, k[sel], rows)
                    store = ti if col == RETRIED_COLOUR else None  # a click shows its attempts
                    data += _bars(s, row, k[sel], t0, (name, col, 10), text, None, store)
    if attempts and (not binned or attempts <= TIMELINE_BLOCKS):
        for s in stamped:
            f = s.failed_stamped()
            if len(f):
                text = [_attempt_text(s, int(c), t0) for c in f.tolist()]
                style = (f"{s.task_id}: failed attempt", ATTEMPT_COLOUR, 6)
                names = labels if binned else None
                ti = stores.index(s)
                row = _row_ids(stores, ti, f, rows)
                data += _bars(s, row, f, t0, style, text, names, ti)
    elif attempts:
        trace = _binned_attempts(stores, labels, rows, edges, t0)
        if trace is not None:
            data.append(trace)
    buttons, windows = run_menu(stores, t0)
    xaxis: dict[str, Any] = {"title": {"text": origin_label(t0)}, "zeroline": False}
    menu: dict[str, Any] = {"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.0}
    shown = opening_range(stores, t0)
    work = work_window(stores)
    if shown is not None and work in windows:
        # open on the last run that did work (a rerun that skipped everything is a sliver
        # at the end of "all runs"); the menu shows that run as chosen
        xaxis["range"] = shown
        menu["active"] = 1 + windows.index(work)
    shapes = []
    for a, b in windows:
        shapes.append(vline(a - t0, "#444", "dot"))
        shapes.append(vline(b - t0, "#444", "dash"))
    mode = f"busy fraction per worker in {TIME_BINS} time bins" if binned else "one bar per block"
    title = f"Worker timeline ({total} blocks, {mode}"
    title += f"; {attempts} failed attempts)" if attempts else ")"
    below = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0}
    return {
        "data": data,
        "layout": base_layout(
            title,
            height=max(260, 60 + 22 * len(labels)),
            xaxis=xaxis,
            yaxis={
                "tickmode": "array",
                "tickvals": list(range(len(labels))),
                "ticktext": labels,
                "autorange": "reversed",
                "automargin": True,
                "zeroline": False,
            },
            shapes=shapes,
            margin={"l": 70, "r": 20, "t": 80, "b": 80 if binned else 50},
            **({"legend": below} if binned else {}),
            updatemenus=[{**menu, "yanchor": "bottom"}],
        ),
    }
