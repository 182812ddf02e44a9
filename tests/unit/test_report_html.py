"""The HTML report's pure parts: advice rules, busy-time binning, volume downsampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bellis._report._advice import advice
from bellis._report._data import StoreData
from bellis._report._figures import (
    TIMELINE_BLOCKS,
    _downsample,
    run_windows,
    volume_factor,
    volume_payload,
)
from bellis._report._gantt import ATTEMPT_COLOUR, _busy_bins, timeline_figure
from bellis._sizes import format_iec, recommended_memory


def _store(n: int = 100, **stats: np.ndarray) -> StoreData:
    done = np.ones(n, dtype=bool)
    return StoreData(
        "t", Path("/nowhere"), (n,), done, np.zeros(n, dtype=np.uint32), dict(stats), []
    )


def test_recommended_memory_is_the_peak_plus_a_quarter_in_64_mib_steps() -> None:
    assert recommended_memory(100 << 20) == 128 << 20
    assert recommended_memory(300 << 20) == 384 << 20
    assert recommended_memory(3.4 * (1 << 30)) == 68 * (64 << 20)  # 4.25 GiB
    assert recommended_memory(4 << 30) == 5 << 30
    assert recommended_memory(0) == 64 << 20


def test_advice_reads_the_figures() -> None:
    wall = np.full(100, 1.0)
    wall[:7] = 6.0
    s = _store(
        wall_seconds=wall,
        cpu_seconds=wall * 0.2,
        peak_rss_bytes=np.full(100, 3 << 30, dtype=np.uint64),
    )
    s.failures[99] = 1
    s.done[99] = False
    lines = advice([s])
    assert "t: 1 block(s) failed and are not done" in lines[0]
    assert (
        "t: p99 peak RSS 3.0 GiB, max 3.0 GiB: a memory request of 3.8 GiB covers every block "
        "(max + 25%, rounded up to 64 MiB, as bellis.plan recommends)" in lines
    ), lines
    assert any("cpu / wall = 0.20: blocks mostly wait" in x for x in lines), lines
    assert any("7 block(s) took more than 5x the median" in x for x in lines), lines


def test_advice_names_the_rule_that_abandoned_the_last_run() -> None:
    """An abandoned run's line keeps the rule that fired, the option that changes it and
    whether a rerun gets further: the advice says all three (issue 35 item 1)."""
    s = _store(10)
    s.done[:] = False
    s.failures[:3] = 1
    said = {
        "reason": "10 blocks failed in a row",
        "rule": "10 blocks failed in a row with no block done in between",
        "option": "Task(max_consecutive_failures=...)",
        "lost": 10,
        "untried": 7,
        "rerun": "a rerun can get further: it runs the 7 block(s) never tried first",
        "can_progress": True,
    }
    s.runs.append({"task_id": "t", "outcome": "abandoned", "abandoned": said})
    lines = advice([s])
    assert "blocks never tried" in lines[0], lines
    (line,) = [x for x in lines if "abandoned" in x]
    assert line == (
        "t: the last run abandoned the task (10 blocks failed in a row): the rule that fired "
        "is 10 blocks failed in a row with no block done in between; "
        "Task(max_consecutive_failures=...) changes it; a rerun can get further: it runs the "
        "7 block(s) never tried first"
    )
    s.runs.append({"task_id": "t", "outcome": "failed"})  # a later run: no such line
    assert not [x for x in advice([s]) if "abandoned" in x]


def test_advice_names_binary_sizes_in_binary_units() -> None:
    """300 * 2**20 bytes is 300 MiB (314.6 MB): the advice says MiB, as the page's axes and
    hover texts do, never a binary count labelled MB."""
    rss = np.full(100, 300 << 20, dtype=np.uint64)
    rss[0] = 1536  # 1.5 KiB: the smallest block
    ones = np.ones(100)
    lines = advice([_store(peak_rss_bytes=rss, wall_seconds=ones, cpu_seconds=ones)])
    assert lines == [
        "t: p99 peak RSS 300.0 MiB, max 300.0 MiB: a memory request of 384.0 MiB covers every "
        "block (max + 25%, rounded up to 64 MiB, as bellis.plan recommends)"
    ]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (int(25.5 * 2**20), "25.5 MiB"),
        (3 << 30, "3.0 GiB"),
        (2 << 40, "2.0 TiB"),
        (float("nan"), "-"),
    ],
)
def test_format_size_uses_the_page_units(n: float, text: str) -> None:
    assert format_iec(n) == text


def test_no_advice_without_data() -> None:
    assert advice([_store(10, wall_seconds=np.ones(10), cpu_seconds=np.ones(10))]) == []
    assert advice([_store(100)]) == []  # untracked: done and failures only


def test_busy_bins_integrate_intervals() -> None:
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    busy = _busy_bins(np.array([0.5, 2.0]), np.array([1.5, 2.25]), edges)
    assert np.allclose(busy, [0.5, 0.5, 0.25, 0.0])


def test_downsample_keeps_the_maximum() -> None:
    a = np.arange(27, dtype=np.float32).reshape(3, 3, 3)
    out = _downsample(a, 2, 0.0)
    assert out.shape == (2, 2, 2)
    assert out[0, 0, 0] == a[:2, :2, :2].max() and out[1, 1, 1] == 26


def test_volume_payload_of_a_1d_grid() -> None:
    s = _store(5, wall_seconds=np.arange(5, dtype=np.float32) + 1)
    s.failures[2] = 3
    s.done[2] = False
    p = volume_payload(s)
    assert p is not None and p["shape"] == [1, 5] and p["ndim"] == 1
    assert set(p["metrics"]) == {"state", "failures", "wall_seconds"}


def test_pipeline_tasks_share_a_run_window() -> None:
    a, b = _store(1), _store(1)
    b.task_id = "u"
    a.runs = [{"run_started_at": 1.0, "run_finished_at": 2.0}]
    b.runs = [{"run_started_at": 1.0, "run_finished_at": 2.0}]
    assert run_windows([a, b]) == [("t run 1, u run 1", 1.0, 2.0)]


def test_volume_factor_bounds_cells_and_planes() -> None:
    assert volume_factor((4, 4, 4)) == 1
    assert volume_factor((64, 64, 64)) == 1  # 2^18 cells, 64 x 64 planes
    assert volume_factor((100, 100, 100)) == 2
    assert volume_factor((1000, 1000)) == 4  # 250 x 250 planes
    assert volume_factor((1, 2000, 2000)) == 8


def _stamped(n: int, failed: list[int]) -> StoreData:
    """``n`` cells run one after another by workers 0 and 1; ``failed`` cells are not
    done and hold the stamps of their last failed attempt (worker 1)."""
    sent = 100.0 + np.arange(n, dtype=np.float64)
    s = _store(
        n,
        worker_id=(np.arange(n) % 2).astype(np.int32),
        sent_at=sent,
        returned_at=sent + 0.5,
        wall_seconds=np.full(n, 0.5),
    )
    s.done[failed] = False
    s.failures[failed] = 2
    s.stats["worker_id"][failed] = 1
    s.runs = [
        {
            "task_id": "t",
            "run_started_at": 99.0,
            "run_finished_at": 100.0 + n,
            "blocks": {"count": n},
        },
    ]
    return s


def _attempt_traces(fig: dict[str, object]) -> list[dict[str, object]]:
    data = fig["data"]
    assert isinstance(data, list)
    return [t for t in data if ATTEMPT_COLOUR in str(t.get("line")) + str(t.get("marker"))]


def test_failed_attempts_get_bars_of_their_own() -> None:
    s = _stamped(10, [3, 7])
    fig = timeline_figure([s])
    assert fig is not None
    bars, hover = _attempt_traces(fig)
    assert bars["name"] == "t: failed attempt" and bars["mode"] == "lines"
    assert bars["x"] == [4.0, 4.5, None, 8.0, 8.5, None]  # sent_at to returned_at, from t0 99
    texts = hover["text"]
    assert isinstance(texts, list) and len(texts) == 2
    assert "block (3,): <b>failed attempt</b>" in texts[0] and "worker 1" in texts[0]
    assert "failures 2" in texts[0] and "sent +4.000 s, returned +4.500 s" in texts[0]
    # the done blocks keep their own bars; the failed cells are not among them
    done_texts = [t for tr in fig["data"] if tr not in (bars, hover) for t in tr.get("text", [])]
    assert len(done_texts) == 8 and not any("block (3,)" in t for t in done_texts)
    assert "2 failed attempts" in fig["layout"]["title"]["text"]


def test_failed_attempts_in_the_binned_timeline() -> None:
    n = 3 * TIMELINE_BLOCKS
    failed = list(range(5, n, 2))[: TIMELINE_BLOCKS + 1]  # too many for a bar each
    fig = timeline_figure([_stamped(n, failed)])
    assert fig is not None and fig["data"][0]["type"] == "heatmap"
    (marks,) = _attempt_traces(fig)
    assert marks["y"] == ["t · worker 1"] * len(marks["text"])
    counts = [int(t.split("<b>")[1].split(" ")[0]) for t in marks["text"]]
    assert sum(counts) == len(failed)
    few = timeline_figure([_stamped(n, [5, 9])])
    assert few is not None
    bars, hover = _attempt_traces(few)
    assert bars["y"] == ["t · worker 1", "t · worker 1", None] * 2
    assert "block (9,): <b>failed attempt</b>" in hover["text"][1]


def test_run_menu_labels_every_run() -> None:
    s = _stamped(4, [])
    s.runs = [
        {"task_id": "t", "run_started_at": 0.0, "run_finished_at": 90.0, "blocks": {"count": 3}},
        {
            "task_id": "t",
            "run_started_at": 86400.0,
            "run_finished_at": 86402.5,
            "blocks": {"count": 1, "skipped": 3},
        },
    ]
    fig = timeline_figure([s])
    assert fig is not None
    labels = [b["label"] for b in fig["layout"]["updatemenus"][0]["buttons"]]
    assert labels[0] == "all runs"
    assert labels[1].startswith("run 1: 1970-01-01 00:00:00 UTC, 3 blocks, wall ")
    assert labels[2].startswith("run 2: 1970-01-02 00:00:00 UTC, 1 blocks (3 skipped), wall ")


def test_gpu_advice_and_maps_only_where_the_gpu_was_measured() -> None:
    from bellis._report._figures import volume_payload

    ones = np.ones(100)
    util = np.full(100, 23.0, dtype=np.float32)
    util[:10] = np.nan  # blocks whose process had no GPU
    mem = np.full(100, 2 << 30, dtype=np.uint64)
    s = _store(wall_seconds=ones, cpu_seconds=ones, gpu_util_pct=util, gpu_mem_bytes=mem)
    assert advice([s]) == [
        "t: the GPU is busy 23% of block time (mean SM utilisation): the blocks wait on IO "
        "or on the CPU; read ahead, or give each worker more CPUs"
    ]
    payload = volume_payload(s)
    assert payload is not None
    assert {"gpu_util_pct", "gpu_mem_bytes"} <= set(payload["labels"])
    # the seed's NaN and 0 everywhere: no GPU line, no GPU map
    none = _store(
        wall_seconds=ones,
        cpu_seconds=ones,
        gpu_util_pct=np.full(100, np.nan, dtype=np.float32),
        gpu_mem_bytes=np.zeros(100, dtype=np.uint64),
    )
    assert advice([none]) == []
    payload = volume_payload(none)
    assert payload is not None
    assert not {"gpu_util_pct", "gpu_mem_bytes"} & set(payload["labels"])
    busy = _store(wall_seconds=ones, cpu_seconds=ones, gpu_util_pct=np.full(100, 90.0))
    assert advice([busy]) == []
