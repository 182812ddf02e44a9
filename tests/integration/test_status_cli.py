"""``bellis status PATH``: counts and a map of a tracking store, from a subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import bellis

FIXTURE = Path(__file__).parent.parent / "compat" / "daisy_store_fixture"


def status(path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def fields(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


def map_rows(out: str, n: int) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip()][-n:]


def failing_at(offset: tuple[int, ...]) -> Any:
    def process(block: Any) -> None:
        if tuple(int(v) for v in block.write_roi.offset) == offset:
            block.status = bellis.BlockStatus.FAILED

    return process


def test_status_of_a_2d_store_with_failures(tmp_path: Path) -> None:
    store = tmp_path / "t"
    task = bellis.Task(
        "t",
        total_roi=bellis.Roi((0, 0), (30, 40)),
        read_roi=bellis.Roi((0, 0), (10, 10)),
        write_roi=bellis.Roi((0, 0), (10, 10)),
        process_function=failing_at((10, 20)),
        max_retries=1,
        read_write_conflict=False,
        tracking_path=store,
    )
    bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
    proc = status(store)
    assert proc.returncode == 0, proc.stderr
    rows = fields(proc.stdout)
    assert ["grid", "3", "x", "4", "=", "12", "cells"] in rows
    assert ["done", "11"] in rows
    assert ["failed", "1", "(failures", ">", "0", "and", "not", "done)"] in rows
    assert ["untouched", "0"] in rows
    assert any(r[:2] == ["attempts", "2"] for r in rows), proc.stdout
    assert map_rows(proc.stdout, 3) == ["####", "##x#", "####"]


def test_status_of_a_3d_store_shows_the_middle_slice(tmp_path: Path) -> None:
    store = tmp_path / "vol"
    skip = np.zeros((3, 2, 3), dtype=np.uint8)
    skip[:, 1, :] = 1  # nothing in the second row of every slice
    task = bellis.Task(
        "vol",
        total_roi=bellis.Roi((0, 0, 0), (30, 20, 30)),
        read_roi=bellis.Roi((0, 0, 0), (10, 10, 10)),
        write_roi=bellis.Roi((0, 0, 0), (10, 10, 10)),
        process_function=failing_at((-1, -1, -1)),
        skip_mask=skip,
        tracking_path=store,
    )
    assert tuple(task.block_grid_shape) == (3, 2, 3)
    bellis.run_blockwise([task], multiprocessing=True, progress=False, summary=False)
    proc = status(store)
    assert proc.returncode == 0, proc.stderr
    rows = fields(proc.stdout)
    assert ["grid", "3", "x", "2", "x", "3", "=", "18", "cells"] in rows
    assert ["done", "9"] in rows and ["untouched", "9"] in rows
    assert map_rows(proc.stdout, 2) == ["###", "..."]


def _status_in_flight(store_s: str, out_s: str, at: tuple[int, int]) -> Any:
    def process(block: Any) -> None:
        if tuple(int(v) for v in block.write_roi.offset) == at:
            import subprocess as sp
            import sys as s

            res = sp.run(
                [s.executable, "-m", "bellis", "status", store_s],
                capture_output=True,
                text=True,
                timeout=60,
            )
            with open(out_s, "w") as fh:
                fh.write(f"{res.returncode}\n{res.stdout}{res.stderr}")

    return process


def test_status_while_a_run_is_in_flight(tmp_path: Path) -> None:
    store = tmp_path / "t"
    out = tmp_path / "status.txt"
    task = bellis.Task(
        "t",
        total_roi=bellis.Roi((0, 0), (20, 40)),
        read_roi=bellis.Roi((0, 0), (10, 10)),
        write_roi=bellis.Roi((0, 0), (10, 10)),
        process_function=_status_in_flight(str(store), str(out), (10, 30)),
        max_workers=1,
        tracking_path=store,
    )
    bellis.run_blockwise([task], multiprocessing=True, progress=False, summary=False)
    text = out.read_text()
    code, report = text.split("\n", 1)
    assert code == "0", report
    rows = fields(report)
    # one worker, cartesian order: the last block sees the seven before it done
    assert ["done", "7"] in rows and ["untouched", "1"] in rows
    assert map_rows(report, 2) == ["####", "###."]
    final = status(store)
    assert ["done", "8"] in fields(final.stdout)


def test_status_of_a_daisy_store(tmp_path: Path) -> None:
    store = tmp_path / "fx"
    shutil.copytree(FIXTURE, store)
    proc = status(store)
    assert proc.returncode == 0, proc.stderr
    rows = fields(proc.stdout)
    # daisy 2.0.0 records only the layout hash: the 6 cells not done may hold no block
    assert ["done", "6"] in rows and any(r[:4] == ["untouched", "at", "most", "6"] for r in rows)
    assert map_rows(proc.stdout, 3) == ["###.", "###.", "...."]


def test_status_without_a_store_fails_cleanly(tmp_path: Path) -> None:
    proc = status(tmp_path / "nothing")
    assert proc.returncode != 0
    assert "no block tracking at" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
