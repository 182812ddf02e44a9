"""Tracking stores cross between daisy 2.0.0 and bellis in both directions.

The fixture ``daisy_store_fixture/`` was written by daisy 2.0.0 for the task below
(total ((0,0),(24,34)), read ((-2,-2),(14,14)), write 10x10, fit valid): a block grid of
2x3 in a tracking grid of [3, 4], with resource arrays.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import bellis

daisy = pytest.importorskip("daisy", reason="daisy 2.0.0 is not installed")

pytestmark = pytest.mark.daisy

FIXTURE = Path(__file__).parent / "daisy_store_fixture"
MODES = [pytest.param(False, id="serial"), pytest.param(True, id="distributed")]
ALL_OFFSETS = {(y, x) for y in (2, 12) for x in (2, 12, 22)}


def offset_recorder(log: Path, fail_at: tuple[int, int] | None = None) -> Any:
    log_s = str(log)

    def process(block: Any) -> None:
        off = tuple(int(v) for v in block.write_roi.offset)
        with open(log_s, "a") as fh:
            fh.write(f"{off[0]},{off[1]}\n")
        if off == fail_at:
            block.status = bellis.BlockStatus.FAILED

    return process


def offsets(log: Path) -> list[tuple[int, ...]]:
    if not log.exists():
        return []
    return [tuple(int(v) for v in line.split(",")) for line in log.read_text().split()]


def task_args(module: Any, fn: Any, path: Path) -> dict[str, Any]:
    return dict(
        total_roi=module.Roi((0, 0), (24, 34)),
        read_roi=module.Roi((-2, -2), (14, 14)),
        write_roi=module.Roi((0, 0), (10, 10)),
        process_function=fn,
        fit="valid",
        tracking_path=str(path),
    )


def done_of(path: Path) -> np.ndarray[Any, Any]:
    group: Any = zarr.open_group(str(path), mode="r")
    return np.asarray(group["done"][:])


@pytest.mark.parametrize("mp", MODES)
def test_a_daisy_store_resumes_in_bellis(tmp_path: Path, mp: bool) -> None:
    store = tmp_path / "fx"
    shutil.copytree(FIXTURE, store)
    group_before = (store / "zarr.json").read_bytes()
    assert (done_of(store)[:2, :3] == 1).all()
    # forget two blocks, as if daisy had been interrupted before finishing them
    chunk = store / "done" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    assert len(raw) == 12
    raw[0 * 4 + 1] = 0  # cell (0, 1): block (0, 1), write offset (2, 12)
    raw[1 * 4 + 2] = 0  # cell (1, 2): block (1, 2), write offset (12, 22)
    chunk.write_bytes(bytes(raw))

    log = tmp_path / "calls.txt"
    task = bellis.Task("fx", max_workers=2, **task_args(bellis, offset_recorder(log), store))
    states = bellis.run_blockwise(
        [task], multiprocessing=mp, progress=False, return_states=True, summary=False
    )
    assert sorted(offsets(log)) == [(2, 12), (12, 22)]
    st = states["fx"]
    assert st.skipped_count == 4 and st.completed_count == 6 and st.total_block_count == 6
    expected = np.zeros((3, 4), dtype=np.uint8)
    expected[:2, :3] = 1
    np.testing.assert_array_equal(done_of(store), expected)
    # bellis adds its structural layout record next to daisy's hash, which stays as it was
    attrs = json.loads((store / "zarr.json").read_text())["attributes"]
    assert attrs["daisy_task_hash"] == json.loads(group_before)["attributes"]["daisy_task_hash"]
    # the failure the daisy run recorded at (1, 2) survives
    group: Any = zarr.open_group(str(store), mode="r")
    assert int(group["failures"][1, 2]) == 1

    log.unlink()
    bellis.run_blockwise([task], multiprocessing=mp, progress=False, summary=False)
    assert offsets(log) == []


def test_a_bellis_store_resumes_in_daisy(tmp_path: Path) -> None:
    store = tmp_path / "fx"
    log = tmp_path / "bellis.txt"
    task = bellis.Task(
        "fx",
        max_retries=0,
        read_write_conflict=False,
        **task_args(bellis, offset_recorder(log, (12, 12)), store),
    )
    states = bellis.run_blockwise(
        [task], multiprocessing=False, progress=False, return_states=True, summary=False
    )
    assert states["fx"].failed_count == 1
    assert set(offsets(log)) == ALL_OFFSETS
    hash_written = json.loads((store / "zarr.json").read_text())["attributes"]["daisy_task_hash"]
    fixture_hash = json.loads((FIXTURE / "zarr.json").read_text())["attributes"]["daisy_task_hash"]
    assert hash_written == fixture_hash
    # bellis's per-block code version (issue 26) is in the store daisy opens next
    assert (store / "code_version" / "zarr.json").is_file()

    seen: list[tuple[int, ...]] = []
    dtask = daisy.Task(
        "fx",
        read_write_conflict=False,
        **task_args(daisy, lambda b: seen.append(tuple(int(v) for v in b.write_roi.offset)), store),
    )
    dstates = daisy.run_blockwise(
        [dtask], multiprocessing=False, progress=False, return_states=True, summary=False
    )
    assert seen == [(12, 12)]
    assert dstates["fx"].skipped_count == 5
    assert dstates["fx"].completed_count == 6
    expected = np.zeros((3, 4), dtype=np.uint8)
    expected[:2, :3] = 1
    np.testing.assert_array_equal(done_of(store), expected)

    # and the store daisy finished resumes fully in bellis again
    log.unlink()
    states = bellis.run_blockwise(
        [task], multiprocessing=False, progress=False, return_states=True, summary=False
    )
    assert offsets(log) == [] and states["fx"].skipped_count == 6


def test_bellis_status_reads_a_daisy_store(tmp_path: Path) -> None:
    store = tmp_path / "fx"
    shutil.copytree(FIXTURE, store)
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(store)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert str(store) in out
    lines = [line.split() for line in out.splitlines()]
    assert ["done", "6"] in lines
    # daisy records only the layout hash: which cells hold a block is unknown, so the cells
    # not done are an upper bound on the untouched blocks
    assert any(line[:4] == ["untouched", "at", "most", "6"] for line in lines), out
    assert ["grid", "3", "x", "4", "=", "12", "cells"] in lines
    assert ["###.", "###.", "...."] == [
        ln for ln in (line.strip() for line in out.splitlines()) if ln
    ][-3:]
    assert bellis._tracking.format_status(store).strip() == out.strip()


def test_a_verified_bellis_store_resumes_in_daisy(tmp_path: Path) -> None:
    """A store with ``output_checksum`` (``verify_outputs``) and ``outputs.json``: daisy
    2.0.0 opens it, skips its done blocks, and bellis then still verifies every block."""
    store = tmp_path / "fx"
    out = str(tmp_path / "out.zarr")
    arr = zarr.create_array(out, shape=(20, 30), chunks=(10, 10), dtype="uint8")
    arr.attrs["voxel_size"], arr.attrs["offset"] = [1, 1], [2, 2]

    def write(block: Any) -> None:
        off = tuple(int(v) - 2 for v in block.write_roi.offset)
        zarr.open_array(out, mode="r+")[off[0] : off[0] + 10, off[1] : off[1] + 10] = 7

    task = bellis.Task(
        "fx",
        read_write_conflict=False,
        outputs=[out],
        verify_outputs=True,
        **task_args(bellis, write, store),
    )
    assert bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
    assert (store / "output_checksum" / "zarr.json").is_file()

    seen: list[Any] = []
    dtask = daisy.Task("fx", read_write_conflict=False, **task_args(daisy, seen.append, store))
    dstates = daisy.run_blockwise(
        [dtask], multiprocessing=False, progress=False, return_states=True, summary=False
    )
    assert seen == [] and dstates["fx"].skipped_count == 6
    result = task.verify(workers=1)
    assert result.ok and result.verified == 6
