"""Jupyter display of reports (bellis._report._notebook): HTML structure, escaping, the timeline."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

import numpy as np

from bellis._block import NO_WORKER, BlockStats
from bellis._report._notebook import Spans, round_ticks, timeline_svg
from bellis._stats._reports import (
    COUNTER_KEYS,
    RunReport,
    TaskAggregates,
    TaskReport,
    task_report_json,
)
from bellis._stats._timeline import TimelineSet

SVG = "{http://www.w3.org/2000/svg}"


def _line(task_id: str, n_workers: int = 2, blocks: int = 3) -> dict[str, Any]:
    agg = TaskAggregates()
    ts = TimelineSet()
    for w in range(n_workers):
        tl = ts.spawned(w, 0.0)
        tl.first_acquire(0.05)
        t = 0.05
        for _ in range(blocks):
            tl.sent(t)
            t += 0.25
            tl.returned(t)
            stats = BlockStats(0.25, 0.125, 3 << 20, 100, 50, math.nan, 0, 0.0).to_tuple()
            agg.add_block(0.25, stats, failed=False)
        tl.shutdown_requested(t)
        tl.exited(t + 0.01, "clean")
    counters = dict.fromkeys(COUNTER_KEYS, 0) | {"total": n_workers * blocks}
    return task_report_json(
        task_id=task_id,
        outcome="completed",
        mode="distributed",
        run_started_at=1000.0,
        run_finished_at=1002.0,
        resource_tracking=True,
        counters=counters,
        blocks=agg,
        workers=ts.to_json(),
    )


def _cells(html: str) -> list[str]:
    """The text of every <td> of the HTML (which is well-formed XML)."""
    root = ET.fromstring(f"<root>{html}</root>")
    return ["".join(td.itertext()) for td in root.iter("td")]


def test_task_html_is_the_panel_as_a_table() -> None:
    report = TaskReport(_line("seg"))
    html = report._repr_html_()
    cells = _cells(html)
    for label, value in (("outcome", "completed"), ("wall", "250.0 ms ± 0.0 ms")):
        i = cells.index(label)
        assert cells[i + 1] == value
    assert "3.0 MiB ± 0.0 B" in cells  # peak RSS
    assert cells.count("clean") == 2  # the worker table: one row per worker
    assert "seg  6 blocks, 2 workers, 2.0 s wall" in html
    assert "no timeline: this task has no tracking store" in html
    assert "<script" not in html


def test_text_from_the_run_is_escaped() -> None:
    report = TaskReport(_line("<script>alert(1)</script>&"))
    html = report._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in html
    ET.fromstring(f"<root>{html}</root>")  # still well-formed


def test_run_html_holds_every_task() -> None:
    run = RunReport({"a": TaskReport(_line("a")), "b": TaskReport(_line("b", 3))})
    html = run._repr_html_()
    root = ET.fromstring(f"<root>{html}</root>")
    assert [c.text for c in root.iter("caption")] == [
        "a  6 blocks, 2 workers, 2.0 s wall",
        "b  9 blocks, 3 workers, 2.0 s wall",
    ]
    assert "run report: 2 tasks" in html


def _spans(sent: list[float], dur: list[float], worker: list[int], failed: list[bool]) -> Spans:
    s = np.asarray(sent, dtype=np.float64)
    return Spans(
        sent=s,
        returned=s + np.asarray(dur),
        worker=np.asarray(worker, dtype=np.int64),
        failed=np.asarray(failed, dtype=bool),
    )


def test_timeline_draws_one_row_per_worker_and_failed_attempts_apart() -> None:
    spans = _spans(
        [0.0, 1.0, 5.0, 0.0, 9.0],
        [1.0, 1.0, 1.0, 3.0, 1.0],
        [0, 0, 0, 1, NO_WORKER],
        [False, False, True, False, False],
    )
    svg = ET.fromstring(timeline_svg(spans, 0.0, 10.0))
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.text and "worker" in t.text]
    assert labels == ["worker 0", "worker 1", "no worker"]
    rects = list(svg.iter(f"{SVG}rect"))
    red = [r for r in rects if r.get("fill") == "#d65f5f"]
    assert len(red) == 1
    assert "failed attempt 5.00 s to 6" in "".join(red[0].itertext())
    # worker 0's two adjacent blocks [0, 2) merge into one bar
    busy0 = [r for r in rects if r.get("y") == "0" and r.get("fill") == "#4878d0"]
    assert len(busy0) == 1
    assert float(busy0[0].get("width", 0)) > 0


def test_timeline_of_a_million_blocks_stays_small() -> None:
    n = 1_000_000
    sent = np.arange(n, dtype=np.float64) * 0.001
    spans = Spans(sent, sent + 0.0009, np.arange(n) % 8, np.zeros(n, dtype=bool))
    svg = timeline_svg(spans, 0.0, n * 0.001)
    assert svg.count("<rect") == 8  # one busy stretch per worker, not one per block
    assert len(svg) < 10_000


def test_timeline_caps_its_rows() -> None:
    spans = _spans([0.0] * 40, [1.0] * 40, list(range(40)), [False] * 40)
    svg = timeline_svg(spans, 0.0, 1.0)
    assert "(+ 8 more workers)" in svg
    assert svg.count("<rect") == 32


def test_timeline_ticks_are_round() -> None:
    assert round_ticks(17.32) == [0.0, 5.0, 10.0, 15.0]
    assert round_ticks(1.2) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert round_ticks(0.0) == [0.0]
    assert round_ticks(100.0) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
