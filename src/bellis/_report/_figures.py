"""The report's plotly figures, built as plain figure dictionaries from :class:`StoreData`.

Figures are dictionaries (``{"data": [...], "layout": {...}}``) that ``Plotly.newPlot``
takes as they are; large numeric columns travel as plotly.js typed-array specs
(``{"dtype": "f4", "bdata": base64}``), so a 10^6-block store stays a few megabytes.
Every figure's size is bounded whatever the block count: the timeline (in
``_report_timeline``) draws one WebGL segment per block up to :data:`TIMELINE_BLOCKS`
blocks and bins busy time per worker beyond; histograms and throughput are binned here;
the volume is downsampled past :data:`VOLUME_CELLS` cells per metric.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from .._sizes import BYTE_UNITS
from .._stats._reports import TaskReport
from .._tracking import SlabReader
from ._data import StoreData

__all__ = [
    "FAILED_COLOUR",
    "PLANE_CELLS",
    "RETRIED_COLOUR",
    "TIMELINE_BLOCKS",
    "TIME_BINS",
    "VOLUME_CELLS",
    "VOLUME_METRICS",
    "RunLines",
    "base_layout",
    "colour",
    "did_work",
    "histogram_figure",
    "last_worker_runs",
    "line_window",
    "opening_range",
    "origin_label",
    "run_history_figure",
    "run_labels",
    "run_lines",
    "run_number",
    "run_windows",
    "task_wall",
    "throughput_figure",
    "time_origin",
    "typed",
    "vline",
    "volume_factor",
    "volume_payload",
    "work_window",
    "workers_figure",
]

TIMELINE_BLOCKS: Final = 20_000
VOLUME_CELLS: Final = 1 << 18
PLANE_CELLS: Final = 1 << 16
TIME_BINS: Final = 600
PALETTE: Final = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#e377c2",
)
#: one meaning per colour on the whole page: red is failed (a block not done, its failed
#: attempts, a worker's error exit), orange is done after failed attempts (the volume map's
#: state, the timeline's bars), and neither is used for anything else
FAILED_COLOUR: Final = "#d62728"
RETRIED_COLOUR: Final = "#ff7f0e"
#: The report's byte units: binary, named as IEC names them (the page's scripts use the
#: same), as the terminal panel's are (``_sizes.format_bytes``).
VOLUME_METRICS: Final = (
    ("state", "state (done, failed ...)", ""),
    ("failures", "failed attempts", ""),
    ("verified", "verified (bellis verify)", ""),
    ("code_version", "code version (0: unknown)", ""),
    ("wall_seconds", "wall time", "s"),
    ("cpu_seconds", "CPU time", "s"),
    ("cpu_children_seconds", "CPU of child processes", "s"),
    ("peak_rss_bytes", "peak RSS", "B"),
    ("io_read_bytes", "IO read", "B"),
    ("io_write_bytes", "IO written", "B"),
    ("gpu_util_pct", "GPU utilisation", "%"),
    ("gpu_mem_bytes", "GPU memory", "B"),
)


def typed(a: NDArray[Any], dtype: str = "f4") -> dict[str, str]:
    """A plotly.js typed-array spec of ``a`` (little-endian ``f4``, ``f8`` or ``u1`` ...)."""
    np_dtype = {"f4": "<f4", "f8": "<f8", "u1": "u1", "i4": "<i4", "u4": "<u4"}[dtype]
    raw = np.ascontiguousarray(a, dtype=np_dtype).tobytes()
    return {"dtype": dtype, "bdata": base64.b64encode(raw).decode("ascii")}


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def base_layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
        "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
        "hovermode": "closest",
        "template": {"layout": {"paper_bgcolor": "white", "plot_bgcolor": "#fafafa"}},
    }
    layout.update(extra)
    return layout


def run_windows(stores: list[StoreData]) -> list[tuple[str, float, float]]:
    """(label, start, end) of every run, oldest first; the tasks of one pipeline run (the
    same start and end) share one window."""
    found: dict[tuple[float, float], list[str]] = {}
    for s in stores:
        for i, r in enumerate(s.runs):
            a, b = r.get("run_started_at"), r.get("run_finished_at")
            if isinstance(a, int | float) and isinstance(b, int | float):
                found.setdefault((float(a), float(b)), []).append(f"{s.task_id} run {i + 1}")
    return [(", ".join(found[w]), w[0], w[1]) for w in sorted(found)]


RunLines = dict[tuple[float, float], list[tuple[str, dict[str, Any]]]]


def line_window(line: dict[str, Any]) -> tuple[float, float] | None:
    """A run line's (start, end), UNIX seconds; None when it lacks them."""
    a, b = line.get("run_started_at"), line.get("run_finished_at")
    if isinstance(a, int | float) and isinstance(b, int | float):
        return (float(a), float(b))
    return None


def run_lines(stores: list[StoreData]) -> RunLines:
    """Every run window, oldest first, with the (task id, run line) pairs that share it."""
    found: RunLines = {}
    for s in stores:
        for r in s.runs:
            w = line_window(r)
            if w is not None:
                found.setdefault(w, []).append((s.task_id, r))
    return {w: found[w] for w in sorted(found)}


def run_number(stores: list[StoreData]) -> dict[tuple[float, float], int]:
    """Each run window's number, 1 for the oldest: the page names runs so everywhere
    (the timeline's menu and rows, the run labels, the Workers section)."""
    return {w: n for n, w in enumerate(run_lines(stores), start=1)}


def task_wall(line: dict[str, Any]) -> float:
    """A run line's wall time for its task: the task's own (first block sent to last
    block returned) where the line has it and the task ran a block, else the run's."""
    own = TaskReport(line).task_wall_seconds
    if own is not None and did_work(line):
        return own
    return float(line.get("wall_seconds") or 0.0)


def did_work(line: dict[str, Any]) -> bool:
    """Whether a run line's run ran a block (a block done or a failed attempt)."""
    b = line.get("blocks") or {}
    return int(b.get("count", 0) or 0) + int(b.get("failed_attempts", 0) or 0) > 0


def work_window(stores: list[StoreData]) -> tuple[float, float] | None:
    """The window of the last run that ran a block; None when no run did."""
    found = [w for w, lines in run_lines(stores).items() if any(did_work(r) for _, r in lines)]
    return found[-1] if found else None


def opening_range(stores: list[StoreData], t0: float) -> list[float] | None:
    """The x range a time chart opens on: the last run that did work, padded by 2 %
    (None: every run, when that is the only run or no run did work)."""
    w = work_window(stores)
    if w is None or len(run_lines(stores)) < 2:
        return None
    a, b = w
    pad = 0.02 * max(b - a, 1e-3)
    return [a - t0 - pad, b - t0 + pad]


def run_labels(stores: list[StoreData], t0: float) -> list[dict[str, Any]]:
    """One ``run N`` label per run window, at its start, its tasks and times in the
    hover. Runs closer than a label's width (measured on the whole time axis) get their
    labels on the next of three rows; a fourth label that would collide is left out
    (the run's dotted line stays)."""
    lines = run_lines(stores)
    if not lines:
        return []
    first = min(a for a, _ in lines)
    span = max(max(b for _, b in lines) - first, 1e-9)
    room = 0.08 * span  # about one short label on a chart some 900 pixels wide
    row_end: list[float] = []
    notes = []
    for n, ((a, b), pairs) in enumerate(lines.items(), start=1):
        row = next((i for i, end in enumerate(row_end) if a >= end), len(row_end))
        if row >= 3:
            continue
        if row == len(row_end):
            row_end.append(a + room)
        else:
            row_end[row] = a + room
        tasks = ", ".join(dict.fromkeys(tid for tid, _ in pairs))
        notes.append(
            {
                "x": a - t0,
                "y": 1.01 + 0.07 * row,
                "xref": "x",
                "yref": "paper",
                "yanchor": "bottom",
                "text": f"run {n}",
                "hovertext": f"run {n} ({tasks}): +{a - t0:.2f} s to +{b - t0:.2f} s",
                "showarrow": False,
                "xanchor": "left",
                "font": {"size": 10},
            }
        )
    return notes


def time_origin(stores: list[StoreData]) -> float | None:
    starts = [w[1] for w in run_windows(stores)]
    for s in stores:
        if "sent_at" in s.stats:
            k = np.concatenate((s.measured(), s.failed_stamped()))
            if len(k):
                starts.append(float(s.stats["sent_at"].reshape(-1)[k].min()))
    return min(starts) if starts else None


def origin_label(t0: float) -> str:
    import datetime

    when = datetime.datetime.fromtimestamp(t0, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"seconds since {when} (dotted: a run starts, dashed: it ends)"


def vline(x: float, col: str, dash: str) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": col, "dash": dash, "width": 1},
    }


def percentiles(values: NDArray[Any]) -> dict[str, float]:
    p50, p95, p99 = np.percentile(values, [50, 95, 99]).tolist()
    return {"p50": p50, "p95": p95, "p99": p99, "max": float(values.max())}


def histogram_figure(stores: list[StoreData], name: str, label: str) -> dict[str, Any] | None:
    """A binned histogram of one per-block figure, one trace per task, with percentiles."""
    series = [(s, s.stats[name].reshape(-1)[s.measured()]) for s in stores if name in s.stats]
    series = [(s, v.astype(np.float64)) for s, v in series if len(v)]
    if not series:
        return None
    allv = np.concatenate([v for _, v in series])
    is_bytes = name.endswith("_bytes")
    scale, unit = _unit(float(allv.max()), is_bytes)
    edges = np.histogram_bin_edges(allv / scale, bins=60)
    data = []
    for s, v in series:
        counts, _ = np.histogram(v / scale, bins=edges)
        data.append(
            {
                "type": "bar",
                "x": ((edges[:-1] + edges[1:]) / 2).tolist(),
                "y": counts.tolist(),
                "width": float(edges[1] - edges[0]),
                "name": s.task_id,
                "marker": {"color": colour(stores.index(s))},
                "opacity": 0.75,
                "hovertemplate": f"{s.task_id}<br>%{{x:.3g}} {unit}: %{{y}} blocks<extra></extra>",
            }
        )
    p = percentiles(allv)
    shapes, notes = [], []
    for j, (key, q) in enumerate(p.items()):
        shapes.append(vline(q / scale, "#333", ("dot", "dash", "longdash", "solid")[j]))
        notes.append(
            {
                "x": q / scale,
                "y": 1.0 - 0.07 * j,
                "xref": "x",
                "yref": "paper",
                "text": f"{key} {q / scale:.3g} {unit}",
                "showarrow": False,
                "xanchor": "left",
                "font": {"size": 11},
                "bgcolor": "rgba(255,255,255,0.8)",
            }
        )
    return {
        "data": data,
        "layout": base_layout(
            f"{label} per block ({len(allv)} blocks)",
            barmode="overlay",
            height=320,
            xaxis={"title": {"text": f"{label} ({unit})"}},
            yaxis={"title": {"text": "blocks"}},
            shapes=shapes,
            annotations=notes,
        ),
    }


def _unit(vmax: float, is_bytes: bool) -> tuple[float, str]:
    if is_bytes:
        for scale, unit in BYTE_UNITS:
            if vmax >= scale:
                return float(scale), unit
        return 1.0, "B"
    return 1.0, "s"


def _segments(
    stamps: list[NDArray[np.float64]], windows: list[tuple[float, float]]
) -> list[tuple[float, float, int]]:
    """The stretches of time the throughput is binned over: each run window (overlapping
    windows merged) that holds a stamp, widened to its stamps, and one stretch for the
    stamps of no window (a run in flight has no run line yet); ``(start, end, stamps)``."""
    merged: list[list[float]] = []
    for a, b in sorted(windows):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    allv = np.sort(np.concatenate(stamps)) if stamps else np.zeros(0)
    out: list[tuple[float, float, int]] = []
    outside = np.ones(len(allv), dtype=bool)
    for a, b in merged:
        lo, hi = np.searchsorted(allv, a, "left"), np.searchsorted(allv, b, "right")
        if hi > lo:
            out.append((a, b, int(hi - lo)))
            outside[lo:hi] = False
    rest = allv[outside]
    if len(rest):
        out.append((float(rest.min()), float(rest.max()), len(rest)))
    return sorted(out)


def throughput_figure(stores: list[StoreData]) -> dict[str, Any] | None:
    """Blocks returned per second over time, per task, as a step line over bin edges:
    each run is binned on its own (a rerun long after does not stretch the bins), every
    step is drawn from its bin's start to its end, and a run's steps drop to zero at its
    end. Runs are marked (dotted: start, dashed: end) and labelled ``run N`` as the
    timeline's menu numbers them; the chart opens on the last run that did work."""
    t0 = time_origin(stores)
    series = []
    for i, s in enumerate(stores):
        if "returned_at" in s.stats:
            r = s.stats["returned_at"].reshape(-1)[s.measured()].astype(np.float64)
            if len(r):
                series.append((i, s, r))
    if t0 is None or not series:
        return None
    windows = run_windows(stores)
    segments = _segments([r for _, _, r in series], [(a, b) for _, a, b in windows])
    data = []
    for i, s, r in series:
        xs: list[float] = []
        ys: list[float] = []
        text: list[str] = []
        for a, b, n in segments:
            nbins = int(min(TIME_BINS, max(10, math.sqrt(n) * 2)))
            edges = np.linspace(a, b if b > a else a + 1e-3, nbins + 1)
            counts, _ = np.histogram(r, bins=edges)
            if not counts.any():
                continue
            width = float(edges[1] - edges[0])
            rates = counts / width
            rel = edges - t0
            xs += rel.tolist()
            ys += [*rates.tolist(), 0.0]
            text += [
                f"+{lo:.2f} to +{hi:.2f} s: {c} blocks, {v:.3g} blocks/s"
                for lo, hi, c, v in zip(rel[:-1], rel[1:], counts.tolist(), rates, strict=True)
            ] + [f"+{rel[-1]:.2f} s: end of the run's bins"]
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": xs,
                "y": ys,
                "text": text,
                "line": {"shape": "hv", "color": colour(i)},
                "fill": "tozeroy",
                "name": s.task_id,
                "hovertemplate": f"{s.task_id}<br>%{{text}}<extra></extra>",
            }
        )
    shapes = []
    for _, a, b in windows:
        shapes.append(vline(a - t0, "#2ca02c", "dot"))
        shapes.append(vline(b - t0, "#555555", "dash"))
    xaxis: dict[str, Any] = {"title": {"text": origin_label(t0)}}
    shown = opening_range(stores, t0)
    if shown is not None:
        xaxis["range"] = shown
    return {
        "data": data,
        "layout": base_layout(
            "Throughput (blocks returned per second)",
            height=340,
            margin={"l": 70, "r": 20, "t": 70, "b": 50},
            xaxis=xaxis,
            yaxis={"title": {"text": "blocks / s"}},
            shapes=shapes,
            annotations=run_labels(stores, t0),
        ),
    }


_PHASES: Final = (
    ("launch", "#c7c7c7"),
    ("setup", "#aec7e8"),
    ("task_setup", "#1f77b4"),
    ("idle", "#ffbb78"),
    ("compute", "#2ca02c"),
    ("final_wait", "#f7b6d2"),
    ("teardown", "#9edae5"),
)


def last_worker_runs(stores: list[StoreData]) -> dict[str, tuple[TaskReport, int]]:
    """Per task, the report of its last run that started managed workers and that run's
    number (:func:`run_number`); a task whose runs started none is left out. A rerun that
    skipped every block starts no worker: its task keeps the workers of the run before."""
    numbers = run_number(stores)
    out: dict[str, tuple[TaskReport, int]] = {}
    for s in stores:
        for line in reversed(s.runs):
            rep = TaskReport(line, s.path)
            if rep.workers.records:
                key = line_window(line)
                out[s.task_id] = (rep, 0 if key is None else numbers.get(key, 0))
                break
    return out


def workers_figure(stores: list[StoreData]) -> dict[str, Any] | None:
    """Per worker of each task's last run that started workers (see
    :func:`last_worker_runs`): stacked phase seconds, and exit kinds."""
    labels: list[str] = []
    values: dict[str, list[float]] = {p: [] for p, _ in _PHASES}
    hover: list[str] = []
    exits: dict[tuple[str, str], int] = {}
    shown = last_worker_runs(stores)
    for s in stores:
        if s.task_id not in shown:
            continue
        rep = shown[s.task_id][0]
        for kind, n in rep.workers.exits.items():
            exits[(s.task_id, kind)] = n
        for w in rep.workers.records:
            gpu = "" if w.gpus is None else f" · GPU {','.join(w.gpus)}"
            labels.append(f"{s.task_id} · worker {w.worker_id}{gpu}")
            vals = {
                "launch": w.launch if w.launch is not None else (w.startup or 0.0),
                "setup": w.setup or 0.0,
                "task_setup": w.task_setup or 0.0,
                "idle": w.idle.total,
                "compute": w.compute.total,
                "final_wait": w.final_wait or 0.0,
                "teardown": w.teardown or 0.0,
            }
            for p, _ in _PHASES:
                values[p].append(float(vals[p]))
            hover.append(
                f"{w.blocks} blocks, {w.blocks_failed} failed attempts, exit {w.exit or 'open'}"
            )
    if not labels:
        return None
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "orientation": "h",
            "y": labels,
            "x": values[p],
            "name": p.replace("_", " "),
            "marker": {"color": c},
            "customdata": hover,
            "hovertemplate": f"%{{y}}<br>{p}: %{{x:.3f}} s<br>%{{customdata}}<extra></extra>",
            "xaxis": "x",
            "yaxis": "y",
        }
        for p, c in _PHASES
    ]
    kinds = sorted({k for _, k in exits})
    tasks = [s.task_id for s in stores if s.task_id in shown]
    exit_colours = {
        "clean": "#4c78a8",
        "walltime": "#72b7b2",
        "timeout": "#8c6d31",
        "stalled": "#9467bd",
        "error": FAILED_COLOUR,
    }
    for kind in kinds:
        data.append(
            {
                "type": "bar",
                "x": tasks,
                "y": [exits.get((t, kind), 0) for t in tasks],
                "name": f"exit: {kind}",
                "marker": {"color": exit_colours.get(kind, "#7f7f7f")},
                "hovertemplate": f"%{{x}}: %{{y}} workers exited {kind}<extra></extra>",
                "xaxis": "x2",
                "yaxis": "y2",
            }
        )
    return {
        "data": data,
        "layout": base_layout(
            f"Workers of {_which_runs(shown)}: where their time went, and how they exited",
            barmode="stack",
            height=max(300, 80 + 24 * len(labels)),
            xaxis={"domain": [0, 0.68], "title": {"text": "seconds"}},
            yaxis={"autorange": "reversed", "automargin": True},
            xaxis2={"domain": [0.78, 1.0], "anchor": "y2"},
            yaxis2={"anchor": "x2", "title": {"text": "workers"}},
        ),
    }


def _which_runs(shown: dict[str, tuple[TaskReport, int]]) -> str:
    """``run 1`` (every task's workers from one run), else ``smooth: run 1, label: run 2``."""
    numbers = {n for _, n in shown.values()}
    if len(numbers) == 1:
        (n,) = numbers
        return f"run {n}" if n else "the last run with workers"
    return ", ".join(f"{tid}: run {n}" for tid, (_, n) in shown.items())


def run_history_figure(stores: list[StoreData]) -> dict[str, Any] | None:
    """Blocks run per run line and throughput, per task."""
    data = []
    for i, s in enumerate(stores):
        if not s.runs:
            continue
        xs = list(range(1, len(s.runs) + 1))
        counts = [int((r.get("blocks") or {}).get("count", 0)) for r in s.runs]
        walls = [task_wall(r) for r in s.runs]
        data.append(
            {
                "type": "bar",
                "x": xs,
                "y": counts,
                "name": f"{s.task_id} blocks run",
                "marker": {"color": colour(i)},
                "customdata": walls,
                "hovertemplate": f"{s.task_id} run %{{x}}: %{{y}} blocks in "
                "%{customdata:.2f} s<extra></extra>",
            }
        )
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": xs,
                "y": [c / w if w > 0 else 0.0 for c, w in zip(counts, walls, strict=True)],
                "name": f"{s.task_id} blocks/s",
                "yaxis": "y2",
                "line": {"color": colour(i), "dash": "dot"},
                "hovertemplate": f"{s.task_id} run %{{x}}: %{{y:.3g}} blocks/s<extra></extra>",
            }
        )
    if not data:
        return None
    return {
        "data": data,
        "layout": base_layout(
            "Run history (one entry per line of runs.jsonl)",
            height=340,
            margin={"l": 70, "r": 70, "t": 50, "b": 50},
            barmode="group",
            xaxis={"title": {"text": "run"}, "dtick": 1},
            yaxis={"title": {"text": "blocks run"}},
            yaxis2={
                "overlaying": "y",
                "side": "right",
                "rangemode": "tozero",
                "title": {"text": "blocks / s"},
            },
            legend={"orientation": "h", "y": -0.3},
        ),
    }


def _downsample(a: NDArray[Any], k: int, fill: float) -> NDArray[Any]:
    """Max over ``k``-cubes of ``a`` (padded with ``fill``)."""
    if k == 1:
        return a
    pad = [(0, (-n) % k) for n in a.shape]
    b = np.pad(a, pad, constant_values=fill)
    shape: list[int] = []
    for n in b.shape:
        shape += [n // k, k]
    out: NDArray[Any] = b.reshape(shape).max(axis=tuple(range(1, 2 * b.ndim, 2)))
    return out


def volume_factor(grid: tuple[int, ...]) -> int:
    """The per-axis downsampling factor of a grid: at most VOLUME_CELLS cells in all and
    PLANE_CELLS in the largest plane a slice can show (each drawn cell has hover text)."""
    cells = int(np.prod(grid))
    a, b = sorted((1, *grid))[-2:]
    k_all = math.ceil(float((cells / VOLUME_CELLS) ** (1 / len(grid))))
    k_plane = math.ceil(math.sqrt(a * b / PLANE_CELLS))
    return max(1, k_all, k_plane)


NO_BLOCK: Final = -1.0
"""The state code of a cell no block maps to (read context, past a ``valid`` grid's end)."""


def _state_codes(
    done: NDArray[Any], failures: NDArray[Any], block: NDArray[np.bool_] | None = None
) -> NDArray[np.float32]:
    """0 untouched, 1 done, 2 done after a failed attempt, 3 failed and not done;
    :data:`NO_BLOCK` where ``block`` (broadcast) says the cell holds no block."""
    failed = failures > 0
    out = done.astype(np.float32)
    out += failed
    out[failed & ~done] = 3.0
    if block is not None:
        out[~np.broadcast_to(block, out.shape)] = NO_BLOCK
    return out


def _block_masks(s: StoreData, grid: tuple[int, ...]) -> list[NDArray[np.bool_]] | None:
    """Per axis of ``grid`` (the payload's, a 1-D grid as one row), which cells hold a
    block; None when the store does not say."""
    if s.layout is None:
        return None
    masks = s.layout.block_axis_masks()
    if len(masks) < len(grid):
        masks = [np.ones(1, dtype=bool), *masks]
    return masks


def _mesh(masks: list[NDArray[np.bool_]]) -> NDArray[np.bool_]:
    """The block mask of a box from its per-axis masks (broadcastable, not expanded)."""
    n = len(masks)
    out: NDArray[np.bool_] = np.ones((1,) * n, dtype=bool)
    for axis, m in enumerate(masks):
        out = out & m.reshape((1,) * axis + (-1,) + (1,) * (n - axis - 1))
    return out


def _state_slabs(
    s: StoreData, grid: tuple[int, ...], k: int
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """The downsampled state and failures of a large store, read ``k`` planes at a time
    (never a whole-grid copy; a never-written ``failures`` chunk is not read at all).

    Each slab is reduced over its ``k`` planes first (a contiguous max), then the one
    plane left is downsampled: the same max over ``k``-cubes as :func:`_downsample`.
    """
    assert s.maps is not None
    rest = grid[1:]
    plane = int(np.prod(rest))
    out_rest = tuple(-(-n // k) for n in rest)
    masks = _block_masks(s, grid)
    readers = [SlabReader(s.maps["done"]), SlabReader(s.maps["failures"])]
    states, fails = [], []
    try:
        for z in range(0, grid[0], k):
            a, b = z * plane, min(grid[0], z + k) * plane
            rows = (b - a) // plane
            raw_done = readers[0].read(a, b)
            raw_failures = readers[1].read(a, b)
            block = None if masks is None else _mesh([masks[0][z : z + rows], *masks[1:]])
            if raw_failures is None:
                if raw_done is None:
                    slab = np.zeros((rows, *rest), dtype=np.int8)
                else:
                    slab = np.not_equal(raw_done, 0).reshape(rows, *rest).view(np.int8)
                if block is not None:
                    slab = np.where(block, slab, np.int8(NO_BLOCK))
                state = slab.max(axis=0).astype(np.float32)
                states.append(_downsample(state, k, NO_BLOCK).reshape(out_rest))
                fails.append(np.zeros(out_rest, dtype=np.float32))
                continue
            done = np.zeros(b - a, dtype=bool) if raw_done is None else np.not_equal(raw_done, 0)
            codes = _state_codes(
                done.reshape(rows, *rest), raw_failures.reshape(rows, *rest), block
            ).max(axis=0)
            top = raw_failures.reshape(rows, *rest).max(axis=0).astype(np.float32)
            states.append(_downsample(codes, k, NO_BLOCK).reshape(out_rest))
            fails.append(_downsample(top, k, 0.0).reshape(out_rest))
    finally:
        for reader in readers:
            reader.close()
    return np.stack(states), np.stack(fails)


def volume_payload(s: StoreData) -> dict[str, Any] | None:
    """The volume heatmaps' data for one store: metric arrays over the (downsampled) grid."""
    ndim = len(s.grid)
    if s.path is None or ndim == 0 or ndim > 3 or s.done.size == 0:
        return None
    grid = s.grid if ndim > 1 else (1, *s.grid)
    k = volume_factor(grid)
    metrics: dict[str, Any] = {}
    masks = _block_masks(s, grid)
    if s.maps is not None:
        state_ds, failures_ds = _state_slabs(s, grid, k)
    else:
        done = s.done.reshape(grid)
        failures = s.failures.reshape(grid).astype(np.float32)
        block = None if masks is None else _mesh(masks)
        state_ds = _downsample(_state_codes(done, failures, block), k, NO_BLOCK)
        failures_ds = _downsample(failures, k, 0.0)
    metrics["state"] = typed(state_ds.reshape(-1))
    metrics["failures"] = typed(failures_ds.reshape(-1))
    if s.verify_codes is not None:  # -1 not done: no colour; 0 .. 2 (the worst shown)
        codes = s.verify_codes.reshape(grid).astype(np.float32)
        codes[codes < 0] = np.nan
        metrics["verified"] = typed(_downsample(codes, k, np.nan).reshape(-1))
    if s.code_version is not None and s.code_versions:
        # the newest version over a k-cube of done blocks (NaN: none done)
        v = np.nan_to_num(s.code_version.reshape(grid), nan=-1.0)
        v = _downsample(v, k, -1.0)
        metrics["code_version"] = typed(np.where(v < 0, np.nan, v).astype(np.float32).reshape(-1))
    names = [name for name, _, _ in VOLUME_METRICS[4:] if name in s.stats and _shown(s, name)]
    if names:
        measured = np.zeros(int(np.prod(grid)), dtype=bool)
        measured[s.measured()] = True
        measured = measured.reshape(grid)
    for name in names:
        v = np.where(measured, s.stats[name].reshape(grid).astype(np.float64), np.nan)
        metrics[name] = typed(_downsample(v, k, np.nan).astype(np.float32).reshape(-1))
    shape = [-(-n // k) for n in grid]
    extra: dict[str, Any] = {}
    if k == 1 and s.stats and "worker_id" in s.stats:
        extra["worker"] = typed(s.stats["worker_id"].reshape(-1).astype(np.int64) % (1 << 32), "u4")
    return {
        "task": s.task_id,
        "ndim": ndim,
        "shape": shape,
        "factor": k,
        "grid_offset": list(s.grid_offset) if s.grid_offset else None,
        "stride": list(s.write_stride) if s.write_stride else None,
        # per axis of the store's grid, each cell index's [begin, end) of its blocks' write
        # ROI, or null for an index no block maps to: the hovers' ROIs, computed by the
        # same StoreLayout.write_interval as the table and the trace
        "rois": (
            [[list(iv) if iv else None for iv in s.layout.write_intervals(a)] for a in range(ndim)]
            if s.layout is not None and k == 1
            else None
        ),
        "blocks": s.blocks,
        # a 3-D grid opens on the middle slice of its blocks (not of its tracking cells)
        "start": (
            (s.layout.block_cells[0][0] + s.layout.block_cells[0][1] // 2) // k
            if s.layout is not None and ndim == 3 and s.layout.block_count
            else None
        ),
        "metrics": metrics,
        "labels": {n: [label, unit] for n, label, unit in VOLUME_METRICS if n in metrics},
        **extra,
    }


def _shown(s: StoreData, name: str) -> bool:
    """Whether a figure has anything to show: the GPU figures only where some block's
    process measured them (elsewhere they are the seed's NaN and 0 throughout)."""
    if name == "gpu_util_pct":
        return bool(np.isfinite(s.stats[name].reshape(-1)[s.measured()]).any())
    if name == "gpu_mem_bytes":
        return bool((s.stats[name].reshape(-1)[s.measured()] > 0).any())
    return True
