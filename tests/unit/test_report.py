"""Aggregates, reports, runs.jsonl and the Resource Utilization panel (bellis._stats._reports)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given, settings, strategies as st

from bellis._block import BlockStats
from bellis._report._panel import format_bytes, format_duration, render_panel
from bellis._state import TaskState
from bellis._stats._reports import (
    COUNTER_KEYS,
    RunReport,
    Stat,
    TaskAggregates,
    TaskReport,
    Trend,
    Welford,
    append_run_line,
    counters_from_state,
    read_last_run,
    read_runs,
    task_report_json,
    validate_run_line,
)
from bellis._stats._timeline import TimelineSet
from bellis.errors import TrackingError

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)

# ------------------------------------------------------------------ accumulators


@settings(deadline=None)
@given(st.lists(finite, min_size=1, max_size=200))
def test_welford_matches_numpy(xs: list[float]) -> None:
    w = Welford()
    for x in xs:
        w.add(x)
    a = np.array(xs)
    assert w.n == len(xs)
    assert w.mean == pytest.approx(a.mean(), rel=1e-9, abs=1e-6)
    expected_std = a.std(ddof=1) if len(xs) > 1 else 0.0
    assert w.std == pytest.approx(expected_std, rel=1e-6, abs=1e-5)
    assert w.min == a.min() and w.max == a.max()
    assert w.total == pytest.approx(a.sum(), rel=1e-9, abs=1e-6)


@settings(deadline=None)
@given(st.lists(finite, max_size=60), st.lists(finite, max_size=60))
def test_welford_merge_equals_one_stream(xs: list[float], ys: list[float]) -> None:
    a, b, both = Welford(), Welford(), Welford()
    for x in xs:
        a.add(x)
        both.add(x)
    for y in ys:
        b.add(y)
        both.add(y)
    a.merge(b)
    assert a.n == both.n
    assert a.mean == pytest.approx(both.mean, rel=1e-9, abs=1e-6)
    assert a.std == pytest.approx(both.std, rel=1e-6, abs=1e-5)
    assert a.total == pytest.approx(both.total, rel=1e-9, abs=1e-6)
    if both.n:
        assert (a.min, a.max) == (both.min, both.max)


def test_welford_std_is_zero_below_two_samples() -> None:
    w = Welford()
    assert w.std == 0.0
    w.add(3.5)
    assert w.std == 0.0 and w.mean == 3.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e4), min_size=2, max_size=300))
def test_trend_matches_polyfit(ys: list[float]) -> None:
    t = Trend()
    for y in ys:
        t.add(y)
    slope = np.polyfit(np.arange(len(ys)), np.array(ys), 1)[0]
    assert t.slope == pytest.approx(slope, rel=1e-6, abs=1e-6)


def test_trend_is_zero_when_degenerate() -> None:
    t = Trend()
    assert t.slope == 0.0
    t.add(5.0)
    assert t.slope == 0.0
    t.add(7.0)
    assert t.slope == pytest.approx(2.0)


def test_trend_is_stable_on_a_long_run() -> None:
    t = Trend()
    for i in range(200_000):
        t.add(1e4 + 0.001 * i)
    assert t.slope == pytest.approx(0.001, rel=1e-6)


def test_stat_round_trips_through_a_dict() -> None:
    w = Welford()
    for x in (1.0, 2.0, 4.0):
        w.add(x)
    s = Stat.from_welford(w)
    assert s == Stat.from_dict(json.loads(json.dumps(s.to_dict())))
    assert (s.n, s.min, s.max, s.total) == (3, 1.0, 4.0, 7.0)
    assert Stat.from_welford(Welford()) == Stat.empty() == Stat(0, 0.0, 0.0, 0.0, 0.0, 0.0)


# -------------------------------------------------------------------- aggregates


def _stats(wall: float, cpu: float = 0.001, rss: int = 1 << 20, children: float = 0.0) -> Any:
    return BlockStats(wall, cpu, rss, 100, 50, math.nan, 0, children).to_tuple()


def test_aggregates_keep_failed_blocks_out_of_block_statistics() -> None:
    agg = TaskAggregates()
    agg.add_block(0.0105, _stats(0.010), failed=False)
    agg.add_block(0.0205, _stats(0.020), failed=False)
    agg.add_block(9.0, _stats(8.9), failed=True)
    agg.add_failed_attempts(2)
    agg.add_skipped(3)
    j = agg.to_json()
    assert j["count"] == 2 and j["failed_attempts"] == 3 and j["skipped"] == 3
    assert j["round_trip"]["n"] == 2 and j["wall"]["max"] == pytest.approx(0.020)
    assert j["overhead"]["mean"] == pytest.approx(0.0005)
    assert j["trend_ms_per_block"] == pytest.approx(10.0)
    assert j["io_read_bytes"] == 200 and j["io_write_bytes"] == 100
    assert j["cpu_children"]["total"] == 0.0


def test_aggregates_without_measurements_have_null_stats() -> None:
    agg = TaskAggregates()
    agg.add_block(0.5, None, failed=False)
    j = agg.to_json()
    assert j["round_trip"]["n"] == 1
    for key in ("wall", "cpu", "peak_rss", "overhead", "cpu_children"):
        assert j[key] is None
    assert j["trend_ms_per_block"] is None and j["io_read_bytes"] is None


def test_aggregates_serial_blocks_have_no_round_trip_or_overhead() -> None:
    agg = TaskAggregates()
    agg.add_block(None, _stats(0.01, children=0.5), failed=False)
    j = agg.to_json()
    assert j["round_trip"] is None and j["overhead"] is None
    assert j["wall"]["n"] == 1 and j["cpu_children"]["mean"] == 0.5


def test_aggregates_accept_seven_field_stats_from_daisy() -> None:
    agg = TaskAggregates()
    agg.add_block(0.02, _stats(0.01)[:7], failed=False)
    assert agg.to_json()["cpu_children"] is None and agg.wall.n == 1


def _table(rows: list[tuple[Any, ...]]) -> Any:
    from bellis._stats._aggregates import STATS_DTYPE

    return np.array(rows, dtype=STATS_DTYPE)


def test_batched_and_single_measurements_aggregate_alike_in_completion_order() -> None:
    """The server's batch path (add_measured) and the per-block path (add_block) give the
    same figures, and mixing them keeps the completion order the trend is fitted on."""
    walls = [0.010, 0.012, 0.030, 0.011, 0.050, 0.013, 0.020, 0.040]
    rows = [BlockStats(w, w / 2, 1 << 20, 7, 3, math.nan, 0, 0.25).to_tuple() for w in walls]
    one = TaskAggregates()
    for w, r in zip(walls, rows, strict=True):
        one.add_block(w + 0.001, r, failed=False)
    mixed = TaskAggregates()
    mixed.add_measured(np.array([w + 0.001 for w in walls[:3]]), _table(rows[:3]))
    mixed.add_block(walls[3] + 0.001, rows[3], failed=False)
    mixed.add_block(walls[4] + 0.001, rows[4], failed=True)  # a failure: counted apart
    mixed.add_block(walls[4] + 0.001, rows[4], failed=False)
    mixed.add_measured(np.array([w + 0.001 for w in walls[5:]]), _table(rows[5:]))
    a, b = one.to_json(), mixed.to_json()
    assert b["failed_attempts"] == 1
    b["failed_attempts"] = 0
    assert a["count"] == b["count"] == len(walls)
    assert b["trend_ms_per_block"] == pytest.approx(a["trend_ms_per_block"])
    for key in ("round_trip", "wall", "cpu", "peak_rss", "overhead", "cpu_children"):
        for field in ("n", "mean", "std", "min", "max", "total"):
            assert b[key][field] == pytest.approx(a[key][field]), (key, field)
    assert a["io_read_bytes"] == b["io_read_bytes"] == 7 * len(walls)
    assert a["io_write_bytes"] == b["io_write_bytes"] == 3 * len(walls)


# ------------------------------------------------------------------ report JSON


def _counters(**over: int) -> dict[str, int]:
    d = dict.fromkeys(COUNTER_KEYS, 0)
    d.update(over)
    return d


def _distributed_line(
    n_workers: int = 3,
    blocks_per_worker: int = 4,
    *,
    resource_tracking: bool = True,
    task_id: str = "seg",
) -> dict[str, Any]:
    agg = TaskAggregates()
    ts = TimelineSet()
    for w in range(n_workers):
        tl = ts.spawned(w, 0.0)
        tl.slot = w % 2
        tl.log_files = (f"logs/{task_id}/worker_{w % 2}.out", f"logs/{task_id}/worker_{w % 2}.err")
        tl.reported_setup(0.040)
        tl.first_acquire(0.060)
        t = 0.060
        for _ in range(blocks_per_worker):
            t += 0.0001
            tl.sent(t)
            t += 0.0505
            tl.returned(t)
            agg.add_block(0.0505, _stats(0.0502) if resource_tracking else None, failed=False)
        tl.shutdown_requested(t + 0.0002)
        tl.exited(t + 0.0252, "clean")
    total = n_workers * blocks_per_worker
    return task_report_json(
        task_id=task_id,
        outcome="completed",
        mode="distributed",
        run_started_at=1745780000.12,
        run_finished_at=1745780000.41,
        resource_tracking=resource_tracking,
        counters=_counters(total=total, completed=total, worker_starts=n_workers),
        blocks=agg,
        workers=ts.to_json(),
    )


def test_run_line_is_valid_and_round_trips() -> None:
    line = _distributed_line()
    assert validate_run_line(line) == []
    assert line["schema"] == 2 and line["wall_seconds"] == pytest.approx(0.29)
    assert json.loads(json.dumps(line, allow_nan=False)) == line
    r = TaskReport.from_json(line)
    assert r.to_json() == line
    again = TaskReport.from_json(r.to_json())
    assert again.blocks == r.blocks and again.workers == r.workers
    assert r.blocks.count == 12 and r.blocks.round_trip is not None
    assert r.blocks.round_trip.n == 12
    assert r.workers.count == 3 and r.workers.exits == {"clean": 3}
    assert r.worker(1).blocks == 4 and r.worker(1).exit == "clean"
    assert r.worker(1).setup == pytest.approx(0.040)
    assert r.worker(1).launch == pytest.approx(0.020)
    assert r.worker(2).slot == 0
    assert r.worker(2).log_files == ("logs/seg/worker_0.out", "logs/seg/worker_0.err")
    assert r.counters["completed"] == 12
    with pytest.raises(KeyError, match="no worker 7"):
        r.worker(7)


def test_serial_run_line_has_an_empty_workers_section() -> None:
    agg = TaskAggregates()
    agg.add_block(None, _stats(0.01), failed=False)
    line = task_report_json(
        task_id="s",
        outcome="completed",
        mode="serial",
        run_started_at=10.0,
        run_finished_at=10.5,
        resource_tracking=True,
        counters=_counters(total=1, completed=1),
        blocks=agg,
    )
    assert validate_run_line(line) == []
    r = TaskReport(line)
    assert r.workers.count == 0 and r.workers.records == () and r.blocks.round_trip is None


def test_task_report_json_rejects_unknown_outcome_and_mode() -> None:
    kw: dict[str, Any] = dict(
        task_id="t",
        run_started_at=0.0,
        run_finished_at=1.0,
        resource_tracking=False,
        counters=_counters(),
        blocks=TaskAggregates(),
    )
    with pytest.raises(ValueError, match="outcome"):
        task_report_json(outcome="done", mode="serial", **kw)
    with pytest.raises(ValueError, match="mode"):
        task_report_json(outcome="completed", mode="threads", **kw)


def test_counters_from_state() -> None:
    s = TaskState(task_id="t", total_block_count=5, completed_count=4, failed_count=1)
    c = counters_from_state(s)
    assert set(c) == set(COUNTER_KEYS) and c["total"] == 5 and c["failed"] == 1


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.update(schema=3), "schema"),
        (lambda d: d.update(outcome="done"), "outcome"),
        (lambda d: d.update(mode="threads"), "mode"),
        (lambda d: d.update(wall_seconds=-1.0), "wall_seconds"),
        (lambda d: d.update(resource_tracking="yes"), "resource_tracking"),
        (lambda d: d["counters"].pop("total"), "counters.total"),
        (lambda d: d["blocks"].update(count=-1), "blocks.count"),
        (lambda d: d["blocks"]["wall"].update(std=-0.5), "blocks.wall"),
        (lambda d: d["blocks"]["round_trip"].update(n=99), "more samples"),
        (lambda d: d["workers"]["exits"].update(vanished=1), "unknown exit kind"),
        (lambda d: d["workers"]["records"].pop(), "records"),
        (lambda d: d["workers"]["records"][0].update(exit="error"), "only clean exits"),
        (lambda d: d["workers"]["records"][0].update(exit="gone"), "records[0].exit"),
        (lambda d: d["workers"]["records"][0].update(idle=None), "records[0].idle"),
        (lambda d: d.update(workers=[]), "workers: must be an object"),
    ],
)
def test_validate_run_line_finds_problems(mutate: Any, fragment: str) -> None:
    line = _distributed_line()
    mutate(line)
    problems = validate_run_line(line)
    assert any(fragment in p for p in problems), problems


def test_validate_run_line_allows_unknown_keys() -> None:
    line = _distributed_line()
    line["future_field"] = {"x": 1}
    line["blocks"]["gpu"] = None
    assert validate_run_line(line) == []
    assert validate_run_line([1, 2]) == ["a run line must be a JSON object, got list"]


def test_run_report_holds_task_reports() -> None:
    a = TaskReport(_distributed_line(task_id="a"))
    b = TaskReport(_distributed_line(task_id="b", resource_tracking=False))
    run = RunReport({"a": a, "b": b})
    assert run["a"] is a and run.task("b") is b and "a" in run and len(run) == 2
    assert list(run) == ["a", "b"]
    j = run.to_json()
    assert j["schema"] == 2 and set(j["tasks"]) == {"a", "b"}
    back = RunReport.from_json(j)
    assert back["b"].to_json() == b.to_json()


# --------------------------------------------------------------------- runs.jsonl


def test_runs_jsonl_appends_one_line_per_run(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "store" / "runs.jsonl"
    assert read_last_run(path) is None and read_runs(path) == []
    first = _distributed_line(task_id="one")
    second = _distributed_line(task_id="two")
    append_run_line(path, first)
    append_run_line(path, second)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert [d["task_id"] for d in read_runs(path)] == ["one", "two"]
    last = read_last_run(path)
    assert last == second and validate_run_line(last) == []


def test_runs_jsonl_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    append_run_line(path, _distributed_line(task_id="good"))
    with open(path, "ab") as f:
        f.write(b'{"schema": 1, "task_id": "torn", "blo')
    last = read_last_run(path)
    assert last is not None and last["task_id"] == "good"
    append_run_line(path, _distributed_line(task_id="after"))
    assert [d["task_id"] for d in read_runs(path)] == ["good", "after"]
    assert read_last_run(path)["task_id"] == "after"  # type: ignore[index]


def test_runs_jsonl_reads_the_last_line_of_a_long_history(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    big = _distributed_line(n_workers=40, task_id="big")
    for i in range(30):
        big["run_started_at"] = float(i)
        append_run_line(path, big)
    assert path.stat().st_size > 3 * (1 << 16)
    last = read_last_run(path)
    assert last is not None and last["run_started_at"] == 29.0
    path.write_bytes(path.read_bytes() + b"\n\n  \ngarbage")
    assert read_last_run(path)["run_started_at"] == 29.0  # type: ignore[index]


def test_runs_jsonl_refuses_non_finite_numbers(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        append_run_line(tmp_path / "runs.jsonl", {"schema": 1, "x": math.nan})


def test_only_garbage_gives_none(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"not json\n[1, 2]\n")
    assert read_last_run(path) is None and read_runs(path) == []


# -------------------------------------------------------------- tracking store reads


def _store(tmp_path: Path, grid: tuple[int, ...], *, stamps: bool = True) -> Path:
    """A tracking store written with zarr-python itself, as the tracking layer lays it out."""
    root = tmp_path / "store"
    zarr.open_group(root, mode="w")
    dtypes = {
        "done": "uint8",
        "failures": "uint32",  # every store has it (SPEC §4.2)
        "wall_seconds": "float32",
        "cpu_seconds": "float32",
        "peak_rss_bytes": "uint64",
        "io_read_bytes": "uint64",
        "io_write_bytes": "uint64",
        "gpu_util_pct": "float32",
        "gpu_mem_bytes": "uint64",
    }
    if stamps:
        dtypes |= {
            "cpu_children_seconds": "float32",
            "worker_id": "uint32",
            "sent_at": "float64",
            "returned_at": "float64",
        }
    for name, dtype in dtypes.items():
        zarr.create_array(
            root / name,
            shape=grid,
            chunks=grid,
            dtype=dtype,
            fill_value=0,
            compressors=None,
            filters=None,
            zarr_format=3,
        )
    return root


def _write(root: Path, name: str, coord: tuple[int, ...], value: float) -> None:
    a = zarr.open_array(root / name, mode="r+")
    a[coord] = value


def test_block_reads_the_store_arrays(tmp_path: Path) -> None:
    root = _store(tmp_path, (2, 3))
    for name, value in [
        ("done", 1),
        ("wall_seconds", 0.5),
        ("cpu_seconds", 0.25),
        ("peak_rss_bytes", 3 << 20),
        ("io_read_bytes", 100),
        ("io_write_bytes", 200),
        ("gpu_util_pct", math.nan),
        ("cpu_children_seconds", 1.5),
        ("worker_id", 2),
        ("sent_at", 1745780000.5),
        ("returned_at", 1745780001.0),
    ]:
        _write(root, name, (1, 2), value)
    _write(root, "done", (0, 1), 1)  # done but never measured (skipped via done marker)
    _write(root, "done", (1, 0), 1)
    _write(root, "worker_id", (1, 0), 2**32 - 1)  # serial: no managed worker
    _write(root, "returned_at", (1, 0), 5.0)
    _write(root, "wall_seconds", (1, 0), 0.125)
    r = TaskReport(_distributed_line(), store_path=root)
    rec = r.block((1, 2))
    assert rec is not None and rec.coord == (1, 2)
    assert rec.worker_id == 2 and rec.sent_at == 1745780000.5 and rec.returned_at == 1745780001.0
    assert rec.stats is not None
    assert rec.stats.wall_seconds == 0.5 and rec.stats.cpu_seconds == 0.25
    assert rec.stats.peak_rss_bytes == 3 << 20 and rec.stats.io_write_bytes == 200
    assert math.isnan(rec.stats.gpu_util_pct) and rec.stats.cpu_children_seconds == 1.5
    assert r.block(5) == rec  # flat C-order index of (1, 2)
    assert r.block((0, 0)) is None  # not done
    skipped = r.block((0, 1))
    assert skipped is not None and skipped.stats is None and skipped.worker_id is None
    serial = r.block((1, 0))
    assert serial is not None and serial.worker_id is None and serial.stats is not None
    assert [b.coord for b in r.block_records()] == [(0, 1), (1, 0), (1, 2)]
    with pytest.raises(IndexError):
        r.block((2, 0))
    with pytest.raises(IndexError):
        r.block(6)
    with pytest.raises(IndexError):
        r.block((1,))


def test_block_reads_see_later_writes(tmp_path: Path) -> None:
    root = _store(tmp_path, (4,))
    r = TaskReport(_distributed_line(), store_path=root)
    assert r.block(3) is None
    for name, value in (("done", 1), ("wall_seconds", 2.0), ("returned_at", 9.0)):
        _write(root, name, (3,), value)
    rec = r.block(3)
    assert rec is not None and rec.stats is not None and rec.stats.wall_seconds == 2.0


def test_block_reads_tolerate_a_daisy_store_without_stamps(tmp_path: Path) -> None:
    root = _store(tmp_path, (3,), stamps=False)
    _write(root, "done", (0,), 1)
    _write(root, "wall_seconds", (0,), 0.75)
    _write(root, "done", (2,), 1)
    r = TaskReport(_distributed_line(), store_path=root)
    rec = r.block(0)
    assert rec is not None and rec.stats is not None
    assert rec.stats.wall_seconds == 0.75 and rec.stats.cpu_children_seconds == 0.0
    assert rec.worker_id is None and rec.sent_at is None and rec.returned_at is None
    unmeasured = r.block(2)
    assert unmeasured is not None and unmeasured.stats is None


def test_block_reads_without_a_store(tmp_path: Path) -> None:
    r = TaskReport(_distributed_line())
    assert r.block((0, 0)) is None and list(r.block_records()) == []
    empty = TaskReport(_distributed_line(), store_path=tmp_path / "nothing")
    assert empty.block(0) is None and list(empty.block_records()) == []


def test_block_reads_reject_a_compressed_array(tmp_path: Path) -> None:
    root = tmp_path / "store"
    zarr.open_group(root, mode="w")
    zarr.create_array(root / "done", shape=(4,), chunks=(2,), dtype="uint8", fill_value=0)
    with pytest.raises(TrackingError, match="single-chunk"):
        TaskReport(_distributed_line(), store_path=root).block(0)


# -------------------------------------------------------------------------- panel


def _tokens(line: str) -> list[str]:
    return [t for t in re.split(r"\s{2,}", line.strip()) if t]


def test_panel_layout_tokens_and_order() -> None:
    text = render_panel([TaskReport(_distributed_line())])
    lines = text.split("\n")
    assert lines[0] == "Resource Utilization" and lines[1] == "-" * 20 and lines[2] == ""
    assert re.fullmatch(r"  seg  12 blocks, 3 workers, 290\.0 ms wall", lines[3])
    labels = [_tokens(line)[0] for line in lines[4:]]
    assert labels[:16] == [
        "blocks",
        "round trip",
        "wall",
        "cpu",
        "peak RSS",
        "io",
        "overhead",
        "trend",
        "workers",
        "startup",
        "idle",
        "teardown",
        "exits",
        "logs",
        "id",
        "0",
    ]
    body = {_tokens(line)[0]: _tokens(line)[1:] for line in lines[4:]}
    assert body["round trip"] == ["50.5 ms ± 0.0 ms"]
    assert body["wall"] == ["50.2 ms ± 0.0 ms"]
    assert body["cpu"] == ["1.0 ms ± 0.0 ms"]
    assert body["peak RSS"] == ["1.0 MiB ± 0.0 B"]
    assert body["io"] == ["read 1.2 KiB", "write 600.0 B"]
    assert body["overhead"] == ["300.0 µs ± 0.0 µs"]
    assert body["trend"] == ["∠ +0.0000 ms/block"]
    assert body["startup"] == ["60.0 ms ± 0.0 ms"]
    assert body["exits"] == ["3 clean"]
    assert body["logs"] == ["logs/seg/worker_<slot>.out and .err"]
    header = _tokens(lines[4 + labels.index("id")])
    assert header == [
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
    ]
    row = _tokens(lines[4 + labels.index("0")])
    assert row == [
        "0",
        "0",
        "60.0 ms",
        "4",
        "400.0 µs",
        "100.0 µs ± 0.0 µs",
        "202.0 ms",
        "50.5 ms ± 0.0 ms",
        "25.0 ms",
        "clean",
    ]
    assert "see task.report()" not in text


def test_panel_caps_the_worker_table_at_ten_rows() -> None:
    r = TaskReport(_distributed_line(n_workers=13, blocks_per_worker=1))
    lines = render_panel([r]).split("\n")
    rows = [line for line in lines if re.match(r"\s+\d+\s{2,}\d", line)]
    assert [int(_tokens(line)[0]) for line in rows] == list(range(10))
    assert "(+ 3 more workers — see task.report().workers.records" in lines[-1]
    assert len(render_panel([r], max_worker_rows=20).split("\n")) == len(lines) + 2


def test_panel_without_resource_tracking_shows_round_trip_and_workers_only() -> None:
    text = render_panel([TaskReport(_distributed_line(resource_tracking=False))])
    labels = [_tokens(line)[0] for line in text.split("\n")[4:]]
    assert labels[:3] == ["blocks", "round trip", "workers"]
    for hidden in ("wall", "cpu", "peak RSS", "io", "overhead", "trend", "cpu children"):
        assert hidden not in labels


def _serial_report(resource_tracking: bool, blocks: int = 3) -> TaskReport:
    agg = TaskAggregates()
    for _ in range(blocks):
        agg.add_block(None, _stats(0.002, children=0.0015), failed=False)
    return TaskReport(
        task_report_json(
            task_id="ser",
            outcome="completed",
            mode="serial",
            run_started_at=0.0,
            run_finished_at=0.0071,
            resource_tracking=resource_tracking,
            counters=_counters(total=blocks, completed=blocks),
            blocks=agg,
        )
    )


def test_panel_omission_rules() -> None:
    assert render_panel([]) == ""
    assert render_panel([_serial_report(False)]) == ""
    assert render_panel([_serial_report(True, blocks=0)]) == ""
    text = render_panel([_serial_report(True)])
    assert "  ser  3 blocks, 0 workers, 7.1 ms wall" in text
    labels = [_tokens(line)[0] for line in text.split("\n")[4:]]
    assert labels == ["blocks", "wall", "cpu", "cpu children", "peak RSS", "io", "trend"]
    assert "cpu children  1.5 ms ± 0.0 ms" in text
    both = render_panel([_serial_report(False), TaskReport(_distributed_line(task_id="d"))])
    assert "ser" not in both and "  d  12 blocks" in both


def test_panel_lists_every_exit_kind() -> None:
    line = _distributed_line()
    recs = line["workers"]["records"]
    recs[1].update(exit="error", teardown=None)
    recs[2].update(exit="timeout", teardown=None)
    line["workers"]["exits"] = {"clean": 1, "timeout": 1, "error": 1}
    assert validate_run_line(line) == []
    text = render_panel([TaskReport(line)])
    assert "exits" in text and "1 clean, 1 timeout, 1 error" in text
    assert re.search(r"  1  .*  -\s+error$", text, re.M)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0.0 µs"),
        (25.9e-6, "25.9 µs"),
        (0.000999, "999.0 µs"),
        (0.0505, "50.5 ms"),
        (0.2921, "292.1 ms"),
        (1.0, "1.0 s"),
        (3725.25, "3725.2 s"),
        (None, "-"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0.0 B"),
        (1023, "1023.0 B"),
        (1126, "1.1 KiB"),
        (int(25.5 * 2**20), "25.5 MiB"),
        (3 * 2**30, "3.0 GiB"),
        (2**40, "1.0 TiB"),
        (5 * 2**50, "5.0 PiB"),
        (2**60, "1024.0 PiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_trend_prints_signed_with_four_decimals() -> None:
    line = _distributed_line()
    line["blocks"]["trend_ms_per_block"] = -0.00274
    assert "∠ -0.0027 ms/block" in render_panel([TaskReport(line)])
    line["blocks"]["trend_ms_per_block"] = 0.0027
    assert "∠ +0.0027 ms/block" in render_panel([TaskReport(line)])


def test_gpu_figures_count_only_the_blocks_that_measured_them() -> None:
    from bellis._stats._aggregates import STATS_DTYPE, TaskAggregates

    nan = math.nan
    agg = TaskAggregates()
    agg.add_block(0.1, (0.05, 0.01, 1 << 20, 0, 0, nan, 0, 0.0), False)  # no GPU here
    agg.add_block(0.1, (0.05, 0.01, 1 << 20, 0, 0, 80.0, 2 << 30, 0.0), False)
    agg.add_block(0.1, (0.05, 0.01, 1 << 20, 0, 0, 0.0, 0, 0.0), False)  # a measured zero
    table = np.zeros(3, dtype=STATS_DTYPE)
    table["gpu_util_pct"] = [nan, 40.0, nan]
    table["gpu_mem_bytes"] = [0, 1 << 30, 3 << 30]  # the last: memory sampled, no util sample
    agg.add_measured(np.full(3, 0.1), table)
    j = agg.to_json()
    assert j["gpu_util"]["n"] == 3
    assert j["gpu_util"]["mean"] == pytest.approx(40.0)
    assert j["gpu_mem"]["n"] == 4
    assert j["gpu_mem"]["max"] == 3 << 30
    assert j["wall"]["n"] == 6
    # nothing measured: no figure at all rather than zeros
    none = TaskAggregates()
    none.add_block(0.1, (0.05, 0.01, 1 << 20, 0, 0, nan, 0, 0.0), False)
    assert none.to_json()["gpu_util"] is None and none.to_json()["gpu_mem"] is None


def test_a_schema_1_line_without_gpu_figures_still_reads() -> None:
    line = _distributed_line()
    line["schema"] = 1
    line["blocks"].pop("gpu_util", None)
    line["blocks"].pop("gpu_mem", None)
    assert validate_run_line(line) == []
    report = TaskReport(line)
    assert report.schema == 1
    assert report.blocks.gpu_util is None and report.blocks.gpu_mem is None


def test_the_panel_names_gpu_figures_only_when_measured() -> None:
    from bellis._report._panel import panel_rows

    line = _distributed_line()
    labels = [label for label, _ in panel_rows(TaskReport(line))[0]]
    assert "gpu util" not in labels and "gpu mem" not in labels
    line["blocks"]["gpu_util"] = {
        "n": 4,
        "mean": 61.5,
        "std": 2.0,
        "min": 58,
        "max": 64,
        "total": 246.0,
    }
    line["blocks"]["gpu_mem"] = {
        "n": 4,
        "mean": 2 << 30,
        "std": 0.0,
        "min": 2 << 30,
        "max": 2 << 30,
        "total": 8 << 30,
    }
    rows = dict(panel_rows(TaskReport(line))[0])
    assert rows["gpu util"] == "61.5 % ± 2.0 %"
    assert rows["gpu mem"] == "2.0 GiB ± 0.0 B"


def test_panel_shows_cpu_children_only_when_a_block_started_a_child() -> None:
    """No block started a child: no ``cpu children`` row (it would read 0.0 µs ± 0.0 µs);
    one did: the row is there."""
    without = render_panel([TaskReport(_distributed_line())])
    assert "cpu children" not in without
    agg = TaskAggregates()
    agg.add_block(0.05, _stats(0.05), failed=False)
    agg.add_block(0.05, _stats(0.05, children=0.25), failed=False)
    line = _distributed_line()
    line["blocks"] = agg.to_json()
    rows = [x.split() for x in render_panel([TaskReport(line)]).splitlines()]
    (row,) = [r for r in rows if r[:2] == ["cpu", "children"]]
    assert row[2:] == ["125.0", "ms", "±", "176.8", "ms"]


def test_panel_title_gives_the_tasks_own_wall() -> None:
    """The title's wall is the task's own span (first block sent to last returned) when
    the run line has it; the run's wall (``wall_seconds``) otherwise."""
    line = _distributed_line()
    assert render_panel([TaskReport(line)]).splitlines()[3].endswith("290.0 ms wall")
    line["first_sent_at"] = line["run_started_at"] + 0.05
    line["last_returned_at"] = line["run_started_at"] + 0.175
    r = TaskReport(line)
    assert r.task_wall_seconds == pytest.approx(0.125)
    assert r.blocks_per_second == pytest.approx(12 / 0.125)
    assert render_panel([r]).splitlines()[3].endswith("125.0 ms wall")
    assert validate_run_line(line) == []
