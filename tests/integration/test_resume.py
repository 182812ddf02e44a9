"""End-to-end resumption through the block tracking store (SPEC §4, §2.8, §7 items 39-60).

Every test runs real tasks through ``run_blockwise``, serially and with subprocess
workers where both apply, and checks what landed on disk with zarr-python and what the
process function was called for (each call appends its block id to a file).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import bellis
from bellis._tracking import StoreLayout, TrackingStore

MODES = [pytest.param(False, id="serial"), pytest.param(True, id="distributed")]


def roi(offset: tuple[int, ...], shape: tuple[int, ...]) -> bellis.Roi:
    return bellis.Roi(offset, shape)


def recorder(
    log: Path, fail_flag: Path | None = None, fail_at: tuple[int, ...] = ()
) -> Callable[[Any], None]:
    """A process function that appends ``block_id[1]`` to ``log``.

    While ``fail_flag`` exists, blocks whose write offset is ``fail_at`` fail.
    """
    log_s = str(log)
    flag_s = None if fail_flag is None else str(fail_flag)

    def process(block: Any) -> None:
        import os

        with open(log_s, "a") as fh:
            fh.write(f"{block.block_id[1]}\n")
        if flag_s is not None and os.path.exists(flag_s):
            if tuple(int(x) for x in block.write_roi.offset) == fail_at:
                block.status = bellis.BlockStatus.FAILED

    return process


def calls(log: Path) -> Counter[int]:
    if not log.exists():
        return Counter()
    return Counter(int(x) for x in log.read_text().split())


def grid_task(
    task_id: str,
    fn: Callable[[Any], None],
    *,
    total: tuple[int, ...] = (40, 40),
    block: int = 10,
    context: int = 0,
    **kw: Any,
) -> bellis.Task:
    dims = len(total)
    return bellis.Task(
        task_id,
        total_roi=roi((0,) * dims, total),
        read_roi=roi((-context,) * dims, (block + 2 * context,) * dims),
        write_roi=roi((0,) * dims, (block,) * dims),
        process_function=fn,
        max_workers=2,
        **kw,
    )


def run(tasks: Any, mp: bool, **kw: Any) -> dict[str, Any]:
    return bellis.run_blockwise(  # type: ignore[no-any-return]
        tasks, multiprocessing=mp, progress=False, return_states=True, **kw
    )


def done_of(path: Path) -> np.ndarray[Any, Any]:
    group: Any = zarr.open_group(str(path), mode="r")
    return np.asarray(group["done"][:])


def failures_of(path: Path) -> np.ndarray[Any, Any]:
    group: Any = zarr.open_group(str(path), mode="r")
    return np.asarray(group["failures"][:])


# -- first run, full resume ------------------------------------------------------------------


@pytest.mark.parametrize("mp", MODES)
def test_first_run_marks_everything_done_and_a_rerun_calls_nothing(
    tmp_path: Path, mp: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "track" / "t"
    task = grid_task("t", recorder(log), tracking_path=store)
    states = run([task], mp)
    assert states["t"].completed_count == 16 and states["t"].skipped_count == 0
    assert len(calls(log)) == 16
    assert all(n == 1 for n in calls(log).values())
    done = done_of(store)
    assert done.shape == (4, 4) and done.dtype == np.uint8
    assert (done == 1).all()
    assert (failures_of(store) == 0).all()
    capfd.readouterr()

    log.unlink()
    states = run([task], mp)
    st = states["t"]
    assert calls(log) == Counter()
    assert st.skipped_count == st.completed_count == st.total_block_count == 16
    assert st.failed_count == 0 and st.orphaned_count == 0
    out = capfd.readouterr().out
    assert "Skipped: 16" in out
    assert (done_of(store) == 1).all()


# -- failures, orphans, and the rerun after a fix --------------------------------------------


@pytest.mark.parametrize("mp", MODES)
def test_rerun_after_a_fix_processes_exactly_the_failed_and_orphaned_blocks(
    tmp_path: Path, mp: bool
) -> None:
    flag = tmp_path / "bug"
    flag.write_text("present")
    log_a, log_b = tmp_path / "a.txt", tmp_path / "b.txt"
    track = tmp_path / "track"
    # a: 4x4 blocks, the block at (10, 10) fails permanently after one retry
    a = grid_task("a", recorder(log_a, flag, (10, 10)), tracking_path=track / "a", max_retries=1)
    # b reads a one-block-wide context, so each b block depends on 3x3 a blocks
    b = grid_task("b", recorder(log_b), context=10, tracking_path=track / "b")
    states = run(_pipe(a, b), mp)
    sa, sb = states["a"], states["b"]
    assert sa.failed_count == 1 and sa.completed_count == 15
    assert sb.total_block_count == 4
    assert sb.orphaned_count == 4 and sb.completed_count == 0
    first_a, first_b = calls(log_a), calls(log_b)
    failed_id = next(k for k, n in first_a.items() if n == 2)
    assert sorted(n for n in first_a.values()) == [1] * 15 + [2]
    assert first_b == Counter()

    fail_cells = failures_of(track / "a")
    assert fail_cells[1, 1] == 2  # max_retries=1: two attempts, both counted
    assert int(fail_cells.sum()) == 2
    done_a = done_of(track / "a")
    assert done_a[1, 1] == 0 and int(done_a.sum()) == 15
    # b's tracking grid is anchored at total_roi: its 2x2 blocks sit at cells 1..2
    assert (done_of(track / "b") == 0).all()

    failed = a.failed_blocks()
    assert [blk.block_id for blk in failed] == [("a", failed_id)]
    assert tuple(failed[0].write_roi.offset) == (10, 10)
    assert b.failed_blocks() == []

    flag.unlink()
    log_a.unlink()
    states = run(_pipe(a, b), mp)
    assert calls(log_a) == Counter({failed_id: 1})
    assert len(calls(log_b)) == 4
    assert all(n == 1 for n in calls(log_b).values())
    assert states["a"].skipped_count == 15 and states["a"].completed_count == 16
    assert states["b"].skipped_count == 0 and states["b"].completed_count == 4
    assert (done_of(track / "a") == 1).all()
    done_b = done_of(track / "b")
    assert done_b[1:3, 1:3].all() and int(done_b.sum()) == 4
    assert a.failed_blocks() == []


def _pipe(a: bellis.Task, b: bellis.Task) -> Any:
    return a + b


# -- layout mismatch, rm -rf, reset ----------------------------------------------------------


@pytest.mark.parametrize("mp", MODES)
def test_changed_write_roi_raises_layout_mismatch_then_reset_recovers(
    tmp_path: Path, mp: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "track" / "t"
    run([grid_task("t", recorder(log), tracking_path=store)], mp)
    capfd.readouterr()
    changed = grid_task("t", recorder(log), block=20, tracking_path=store)
    log.unlink()
    with pytest.raises(bellis.LayoutMismatch) as info:
        run([changed], mp)
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert "was written for a different task layout" in msg
    assert f"rm -rf {store}" in msg
    assert "Execution Summary" not in capfd.readouterr().out
    assert not log.exists()
    assert (done_of(store) == 1).all() and done_of(store).shape == (4, 4)

    assert changed.reset() == str(store)
    assert not store.exists()
    assert changed.reset() is None
    states = run([changed], mp)
    assert states["t"].completed_count == 4
    assert len(calls(log)) == 4
    assert done_of(store).shape == (2, 2) and (done_of(store) == 1).all()


@pytest.mark.parametrize("mp", MODES)
def test_rm_rf_of_a_mismatched_store_runs_cleanly(tmp_path: Path, mp: bool) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "track" / "t"
    run([grid_task("t", recorder(log), tracking_path=store)], mp, summary=False)
    changed = grid_task("t", recorder(log), total=(40, 40), block=8, tracking_path=store)
    with pytest.raises(bellis.LayoutMismatch):
        run([changed], mp, summary=False)
    shutil.rmtree(store)
    log.unlink()
    states = run([changed], mp, summary=False)
    assert states["t"].completed_count == 25 and len(calls(log)) == 25
    assert (done_of(store) == 1).all()


# -- path resolution --------------------------------------------------------------------------


def test_tracking_basedir_places_the_store_and_false_overrides_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    bellis.set_tracking_basedir(base)
    log = tmp_path / "calls.txt"
    run([grid_task("seg", recorder(log))], False, summary=False)
    assert (done_of(base / "seg") == 1).all()

    off = grid_task("other", recorder(log), tracking_path=False)
    log.unlink()
    run([off], False, summary=False)
    assert len(calls(log)) == 16
    assert not (base / "other").exists()
    assert sorted(p.name for p in base.iterdir()) == ["seg"]
    log.unlink()
    run([off], False, summary=False)  # untracked: a rerun executes everything
    assert len(calls(log)) == 16


def test_no_path_and_no_basedir_creates_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    before = sorted(p.name for p in tmp_path.iterdir())
    run([grid_task("t", recorder(log))], False, summary=False)
    run([grid_task("t", recorder(log))], False, summary=False)
    assert sum(calls(log).values()) == 32
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "logs")
    assert after == sorted({*before, "calls.txt"})


@pytest.mark.parametrize("mp", MODES)
def test_block_tracking_false_neither_reads_nor_writes(tmp_path: Path, mp: bool) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "track" / "t"
    fresh = tmp_path / "track" / "fresh"
    run([grid_task("t", recorder(log), tracking_path=store)], mp, summary=False)
    files = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    log.unlink()
    states = run(
        [
            grid_task("t", recorder(log), tracking_path=store),
            grid_task("u", recorder(log), tracking_path=fresh),
        ],
        mp,
        block_tracking=False,
        summary=False,
    )
    assert states["t"].skipped_count == 0 and states["t"].completed_count == 16
    assert sum(calls(log).values()) == 32
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == files
    assert not fresh.exists()


def test_deprecated_done_marker_aliases(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    with pytest.warns(DeprecationWarning, match="set_tracking_basedir"):
        bellis.set_done_marker_basedir(tmp_path / "markers")
    assert bellis.get_tracking_basedir() == tmp_path / "markers"
    with pytest.warns(DeprecationWarning, match="get_tracking_basedir"):
        assert bellis.get_done_marker_basedir() == tmp_path / "markers"
    run([grid_task("m", recorder(log))], False, summary=False)
    assert (done_of(tmp_path / "markers" / "m") == 1).all()

    explicit = tmp_path / "explicit"
    with pytest.warns(DeprecationWarning, match="tracking_path"):
        task = grid_task("e", recorder(log), done_marker_path=explicit)
    assert task.tracking_path == str(explicit) == task.done_marker_path
    log.unlink()
    run([task], False, summary=False)
    run([task], False, summary=False)
    assert len(calls(log)) == 16 and all(n == 1 for n in calls(log).values())
    assert (done_of(explicit) == 1).all()


# -- prechecks: done marker, skip mask, check function ---------------------------------------


def test_done_marker_is_checked_before_the_check_function(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "t"
    run([grid_task("t", recorder(log), tracking_path=store)], False, summary=False)
    checked: list[Any] = []

    def never_done(block: Any) -> bool:
        checked.append(block.block_id)
        return False

    with pytest.warns(UserWarning, match="check_function"):
        task = grid_task("t", recorder(log), tracking_path=store, check_function=never_done)
    log.unlink()
    states = run([task], False, summary=False)
    assert checked == []
    assert calls(log) == Counter()
    assert states["t"].skipped_count == 16


@pytest.mark.parametrize("mp", MODES)
def test_check_skips_are_recorded_and_mask_skips_are_not(
    tmp_path: Path, mp: bool, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "t"

    def left_column_done(block: Any) -> bool:
        return int(block.write_roi.offset[1]) == 0

    probe = grid_task("t", recorder(log))
    mask = np.zeros(probe.block_grid_shape, dtype=np.uint8)
    mask[3, :] = 1  # the bottom row; its first cell is also a check_function skip
    with pytest.warns(UserWarning, match="check_function"):
        task = grid_task(
            "t",
            recorder(log),
            tracking_path=store,
            check_function=left_column_done,
            skip_mask=mask,
        )
    caplog.set_level(logging.INFO, logger="bellis._run._progress")
    states = run([task], mp)
    st = states["t"]
    # the mask is consulted before the check function: (3, 0) counts as masked
    assert st.skipped_count == 4 + 3 and st.completed_count == 16
    assert len(calls(log)) == 9
    done = done_of(store)
    expected = np.zeros((4, 4), dtype=np.uint8)
    expected[:3, :] = 1  # executed and check-skipped blocks
    np.testing.assert_array_equal(done, expected)
    messages = [r.getMessage() for r in caplog.records if r.name == "bellis._run._progress"]
    assert any(
        "task 't': resumed" in m and "7/16" in m and "skip mask" in m and "check function" in m
        for m in messages
    ), messages

    # without the mask, exactly the masked blocks run
    log.unlink()
    caplog.clear()
    states = run([grid_task("t", recorder(log), tracking_path=store)], mp)
    assert len(calls(log)) == 4 and all(n == 1 for n in calls(log).values())
    assert states["t"].skipped_count == 12
    assert (done_of(store) == 1).all()
    messages = [r.getMessage() for r in caplog.records if r.name == "bellis._run._progress"]
    assert any("12/16 blocks skipped via done markers" in m for m in messages), messages


@pytest.mark.parametrize("mp", MODES)
def test_masked_upstream_releases_its_dependents(tmp_path: Path, mp: bool) -> None:
    log_a, log_b = tmp_path / "a.txt", tmp_path / "b.txt"
    a = grid_task(
        "a",
        recorder(log_a),
        skip_mask=np.ones((4, 4), dtype=np.uint8),
        tracking_path=tmp_path / "a",
    )
    b = bellis.Task(
        "b",
        total_roi=roi((0, 0), (40, 40)),
        read_roi=roi((-10, -10), (30, 30)),
        write_roi=roi((0, 0), (10, 10)),
        process_function=recorder(log_b),
        max_workers=2,
    )
    states = run(a + b, mp, summary=False)
    assert calls(log_a) == Counter()
    assert len(calls(log_b)) == 4
    assert states["a"].skipped_count == 16 and states["b"].completed_count == 4
    assert (done_of(tmp_path / "a") == 0).all()


# -- grown and shrunk volumes -----------------------------------------------------------------


@pytest.mark.parametrize("mp", MODES)
def test_grown_volume_resumes(tmp_path: Path, mp: bool) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "t"
    run([grid_task("t", recorder(log), total=(40, 40), tracking_path=store)], mp, summary=False)
    log.unlink()

    grown = grid_task("t", _offset_recorder(log), total=(60, 50), tracking_path=store)
    states = run([grown], mp, summary=False)
    st = states["t"]
    assert st.total_block_count == 30 and st.skipped_count == 16 and st.completed_count == 30
    got = {tuple(int(v) for v in line.split(",")) for line in log.read_text().split()}
    assert len(log.read_text().split()) == 14
    assert got == {(y, x) for y in range(0, 60, 10) for x in range(0, 50, 10)} - {
        (y, x) for y in range(0, 40, 10) for x in range(0, 40, 10)
    }
    done = done_of(store)
    assert done.shape == (6, 5) and (done == 1).all()

    shrunk = grid_task("t", recorder(log), total=(30, 50), tracking_path=store)
    with pytest.raises(bellis.LayoutMismatch, match="was written for a different task layout"):
        run([shrunk], mp, summary=False)
    assert done_of(store).shape == (6, 5)


def test_volume_grown_on_the_leading_side_with_a_context_resumes(tmp_path: Path) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "t"

    def task(offset: tuple[int, int], shape: tuple[int, int]) -> bellis.Task:
        return bellis.Task(
            "t",
            total_roi=roi(offset, shape),
            read_roi=roi((-10, -10), (30, 30)),
            write_roi=roi((0, 0), (10, 10)),
            process_function=_offset_recorder(log),
            tracking_path=store,
        )

    run([task((0, 0), (60, 60))], False, summary=False)
    assert len(log.read_text().split()) == 16
    log.unlink()
    states = run([task((-20, 0), (80, 70))], False, summary=False)
    st = states["t"]
    assert st.total_block_count == 30 and st.skipped_count == 16
    got = {tuple(int(v) for v in line.split(",")) for line in log.read_text().split()}
    old = {(y, x) for y in range(10, 50, 10) for x in range(10, 50, 10)}
    new = {(y, x) for y in range(-10, 50, 10) for x in range(10, 60, 10)}
    assert len(log.read_text().split()) == 14 and got == new - old
    expected = np.zeros((8, 7), dtype=np.uint8)
    expected[1:7, 1:6] = 1  # the grid grew by two cells on top; context shift is one cell
    np.testing.assert_array_equal(done_of(store), expected)


def _offset_recorder(log: Path) -> Callable[[Any], None]:
    log_s = str(log)

    def process(block: Any) -> None:
        with open(log_s, "a") as fh:
            fh.write(",".join(str(int(v)) for v in block.write_roi.offset) + "\n")

    return process


# -- grid anchors -----------------------------------------------------------------------------


@pytest.mark.parametrize("mp", MODES)
def test_tracking_grid_anchor_and_skip_mask_anchor_with_a_block_wide_context(
    tmp_path: Path, mp: bool
) -> None:
    log = tmp_path / "calls.txt"
    store = tmp_path / "t"
    # total 100x100, context 10, write 10: 8x8 blocks, tracking grid 10x10 (cells 1..8)
    task = grid_task("t", _offset_recorder(log), total=(100, 100), context=10, tracking_path=store)
    assert tuple(task.block_grid_shape) == (8, 8)
    mask = bellis.skip_mask_from_rois(task, [roi((10, 10), (10, 20))])
    assert mask.shape == (8, 8)
    assert mask[0, 0] == 0 and mask[0, 1] == 0 and int((mask == 0).sum()) == 2
    by_volume = np.zeros((8, 8), dtype=bool)
    by_volume[0, 0] = by_volume[0, 1] = True
    np.testing.assert_array_equal(bellis.skip_mask_from_volume(task, by_volume), mask)
    masked = grid_task(
        "t",
        _offset_recorder(log),
        total=(100, 100),
        context=10,
        tracking_path=store,
        skip_mask=mask,
    )
    states = run([masked], mp, summary=False)
    assert states["t"].skipped_count == 62
    assert sorted(log.read_text().split()) == ["10,10", "10,20"]
    done = done_of(store)
    assert done.shape == (10, 10)
    expected = np.zeros((10, 10), dtype=np.uint8)
    expected[1, 1] = expected[1, 2] = 1  # block (0, 0) sits at cell context // write = 1
    np.testing.assert_array_equal(done, expected)

    log.unlink()
    run([task], mp, summary=False)
    assert len(log.read_text().split()) == 62
    expected[1:9, 1:9] = 1
    np.testing.assert_array_equal(done_of(store), expected)


# -- zarr-python reads a store in flight -------------------------------------------------------


def _peeking_function(store_s: str, out_s: str, at: tuple[int, int]) -> Callable[[Any], None]:
    def process(block: Any) -> None:
        if tuple(int(v) for v in block.write_roi.offset) == at:
            import zarr as z

            group: Any = z.open_group(store_s, mode="r")
            seen = int(group["done"][:].sum())
            with open(out_s, "w") as fh:
                fh.write(str(seen))

    return process


def test_zarr_reads_the_store_while_a_distributed_run_is_in_flight(tmp_path: Path) -> None:
    store = tmp_path / "t"
    out = tmp_path / "seen.txt"
    task = bellis.Task(
        "t",
        total_roi=roi((0, 0), (40, 40)),
        read_roi=roi((0, 0), (10, 10)),
        write_roi=roi((0, 0), (10, 10)),
        process_function=_peeking_function(str(store), str(out), (30, 30)),
        max_workers=1,
        tracking_path=store,
    )
    run([task], True, summary=False)
    # one worker, blocks in cartesian order: the last block sees the 15 before it done
    assert int(out.read_text()) == 15
    assert (done_of(store) == 1).all()


# -- resuming a large fully done task ------------------------------------------------------------


def _layout_of(task: bellis.Task) -> StoreLayout:
    g = task._geom
    w = tuple(int(x) for x in task.write_roi.offset)
    r = tuple(int(x) for x in task.read_roi.offset)
    return StoreLayout(g.total_offset, g.total_shape, r, g.read_shape, w, g.write_shape, g.fit)


def test_a_fully_done_million_block_task_resumes_without_calling_anything(
    tmp_path: Path,
) -> None:
    store = tmp_path / "big"
    log = tmp_path / "calls.txt"
    task = grid_task("big", recorder(log), total=(1000, 1000), block=1, tracking_path=store)
    with TrackingStore.open(store, _layout_of(task), resource_tracking=False) as ts:
        ts.done[...] = 1
    t0 = time.perf_counter()
    states = run([task], False, summary=False)
    elapsed = time.perf_counter() - t0
    print(f"resume of 10^6 done blocks: {elapsed:.3f} s")
    st = states["big"]
    assert st.total_block_count == 10**6
    assert st.skipped_count == st.completed_count == 10**6
    assert calls(log) == Counter()


@pytest.mark.parametrize("task_id", ["../precious", "a/../../precious", "/abs/store", "."])
def test_task_id_cannot_reach_outside_the_tracking_basedir(task_id: str, tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me\n")
    bellis.set_tracking_basedir(base)
    task = bellis.Task(
        task_id, roi((0,), (4,)), roi((0,), (1,)), roi((0,), (1,)), process_function=print
    )
    with pytest.raises(bellis.ConfigurationError, match=r"task_id=.* cannot name a store under"):
        task.reset()
    with pytest.raises(bellis.ConfigurationError, match=r"pass Task\(tracking_path=\.\.\.\)"):
        bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
    assert (precious / "data").read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "precious"]


def _fail_at_30(block: Any) -> None:
    if block.write_roi.offset[0] == 30:
        block.status = bellis.BlockStatus.FAILED


def test_failed_blocks_of_a_grown_volume_are_the_blocks_that_failed(tmp_path: Path) -> None:
    def task(offset: int, size: int, stride: int = 10) -> Any:
        return bellis.Task(
            "t",
            roi((offset,), (size,)),
            roi((0,), (stride,)),
            roi((0,), (stride,)),
            process_function=_fail_at_30,
            max_retries=0,
            tracking_path=str(tmp_path / "t"),
        )

    first = task(0, 100)
    bellis.run_blockwise(first, multiprocessing=False, progress=False, summary=False)
    assert [b.write_roi for b in first.failed_blocks()] == [roi((30,), (10,))]
    # the volume grew at its start: the store's cells are remapped, not misread
    assert [b.write_roi for b in task(-20, 120).failed_blocks()] == [roi((30,), (10,))]
    # another block size cannot read this store at all
    with pytest.raises(bellis.TrackingError, match="written for a different task layout"):
        task(0, 100, stride=20).failed_blocks()
