"""``bellis verify`` where its inputs are not as the run left them, as a user meets it: a
script (a subprocess, real workers or serial mode) writes real zarr v3 arrays, and
``bellis verify`` / ``bellis status`` run as commands.

* an output that cannot be read (a relative path recorded by an older bellis and a verify
  from another directory, a deleted array, permission denied) says nothing about the
  blocks' data: exit status 2, a message naming the output and the fix, nothing reset;
* several stores verified at once are counted after the resets that touch them;
* the blocks the last verify listed move with the store when the volume grows.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bellis._tracking import TrackingStore
from kit.user_script import run_script

pytest.importorskip("funlib.geometry")

SCRIPT = """
import os, sys
import numpy as np
import zarr
import bellis as daisy
from funlib.geometry import Roi

MODE, START, TWO = {mode!r}, {start!r}, {two!r}
C = 4  # voxels per chunk and per block of a
if not os.path.exists("a.zarr"):
    zarr.create_array("a.zarr", shape=(24, 16), chunks=(C, C), dtype="float32")
    zarr.create_array("b.zarr", shape=(24, 16), chunks=(C // 2, C // 2), dtype="float32")


def sl(roi):
    return tuple(slice(o, o + s) for o, s in zip(roi.offset, roi.shape))


def write_a(block):
    za = zarr.open_array("a.zarr", mode="r+")
    za[sl(block.write_roi)] = 1.0 + block.write_roi.offset[0] * 100 + block.write_roi.offset[1]


def write_b(block):
    za = zarr.open_array("a.zarr", mode="r")
    zb = zarr.open_array("b.zarr", mode="r+")
    zb[sl(block.write_roi)] = float(za[sl(block.read_roi)].sum())


total = Roi((START, 0), (24 - START, 16))
w = Roi((0, 0), (C, C))
# outputs by relative paths, as a user in the run's folder writes them
a = daisy.Task("a", total, w, w, write_a, max_workers=2, outputs=["a.zarr"],
               verify_outputs=True, tracking_path="tracking/a")
tasks = [a]
if TWO:  # b reads a with half a block of context each side
    b = daisy.Task("b", total, Roi((0, 0), (2 * C, 2 * C)), Roi((C // 2, C // 2), (C, C)),
                   write_b, max_workers=2, outputs=["b.zarr"], verify_outputs=True,
                   tracking_path="tracking/b")
    tasks = a + b
ok = daisy.run_blockwise(tasks, multiprocessing=MODE == "distributed", progress=False)
sys.exit(0 if ok else 3)
"""


def _run(run: Path, mode: str, start: int = 8, two: bool = False) -> None:
    run.mkdir(exist_ok=True)
    text = SCRIPT.format(mode=mode, start=start, two=two)
    proc = run_script(run, text, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _drop_file_privileges() -> None:
    """In the child, before exec: a root process drops the capabilities that let it read
    any file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so file modes apply to it too."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _bellis(cwd: Path, *args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "bellis", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        preexec_fn=_drop_file_privileges if unprivileged else None,
    )


def _done(store: Path) -> int:
    with TrackingStore.open_readonly(store) as s:
        return int(np.count_nonzero(np.asarray(s.done)))


def _status(store: Path) -> str:
    proc = _bellis(store.parent, "status", str(store))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_an_output_that_cannot_be_read_exits_2_and_resets_nothing(
    tmp_path: Path, mode: str
) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _run(run, mode)
    store = run / "tracking" / "a"
    blocks = 16
    record_file = store / "outputs.json"
    record = json.loads(record_file.read_text())
    # the output was given as "a.zarr" in the run's folder: recorded by its absolute path
    assert record["outputs"][0]["store"] == str(run / "a.zarr")

    # so a verify from another directory reads the same array: everything verifies
    proc = _bellis(elsewhere, "verify", str(store), "--reset", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert (result["done"], result["verified"], result["reset"]) == (blocks, blocks, {})
    assert _done(store) == blocks

    def refused(*args: str, unprivileged: bool = False) -> str:
        """A verify --reset that must exit 2 and leave every marker and verify.json."""
        before = (store / "verify.json").read_bytes()
        proc = _bellis(elsewhere, "verify", str(store), "--reset", *args, unprivileged=unprivileged)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == ""
        assert _done(store) == blocks
        assert (store / "verify.json").read_bytes() == before
        return proc.stderr

    # an outputs.json of an older bellis, with the relative path as the script gave it:
    # read from elsewhere it would be no array (or another one), so it is refused
    old = json.loads(record_file.read_text())
    old["outputs"][0]["store"] = "a.zarr"
    record_file.write_text(json.dumps(old))
    err = refused()
    assert "outputs[0] is at the relative path 'a.zarr'" in err
    assert 'absolute path into its "store" field' in err and "nothing was reset" in err
    record_file.write_text(json.dumps(record))

    # permission denied: on one chunk file (a block's read, in the verify processes), and
    # on the array's folder (its metadata cannot be read: the array cannot be opened)
    chunk = run / "a.zarr" / "c" / "3" / "2"
    for path, where, workers in (
        (chunk, "Permission denied", "2"),
        (run / "a.zarr", f"cannot open output {run / 'a.zarr'}", "1"),
    ):
        mode_bits = path.stat().st_mode
        path.chmod(0)
        try:
            err = refused("--workers", workers, unprivileged=True)
        finally:
            path.chmod(mode_bits)
        assert where in err and "nothing was reset" in err, err
        assert str(run / "a.zarr") in err

    # the array deleted (or its file system not mounted): the same
    shutil.rmtree(run / "a.zarr")
    for workers in ("1", "2"):
        err = refused("--workers", workers)
        assert f"cannot open output {run / 'a.zarr'}" in err and "nothing was reset" in err
        assert "FileNotFoundError" in err
    assert f"verified    {blocks} verified, 0 mismatched, 0 unverifiable" in _status(store)


def test_several_stores_are_counted_after_the_resets_that_touch_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run(run, "distributed", two=True)
    a, b = run / "tracking" / "a", run / "tracking" / "b"
    blocks_a, blocks_b = 16, 9
    assert (_done(a), _done(b)) == (blocks_a, blocks_b)
    # a's block (1, 1) (voxels [12, 16) x [4, 8): its chunk) is lost; b's blocks read
    # voxels [4g + 8, 4g + 16) x [4h, 4h + 8), so 2 x 2 of them read it
    (run / "a.zarr" / "c" / "3" / "1").unlink()
    readers = 4

    # b named first: a's reset clears b's readers, and b is counted after it
    proc = _bellis(tmp_path, "verify", str(b), str(a), "--reset", "--json", "--workers", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res_b, res_a = json.loads(proc.stdout)  # in the order given
    assert (res_a["task"], res_b["task"]) == ("a", "b")
    assert [(m["kind"], m["block"]) for m in res_a["mismatches"]] == [("missing", [1, 1])]
    assert res_a["reset"] == {str(a): 1, str(b): readers}
    assert (res_b["done"], res_b["verified"], res_b["mismatches"]) == (
        blocks_b - readers,
        blocks_b - readers,
        [],
    )
    assert (_done(a), _done(b)) == (blocks_a - 1, blocks_b - readers)
    record_b = json.loads((b / "verify.json").read_text())
    assert (record_b["checked"], record_b["verified"]) == (blocks_b - readers,) * 2

    # the rerun redoes them; then both verify, and status counts them verified
    _run(run, "distributed", two=True)
    proc = _bellis(tmp_path, "verify", str(b), str(a), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(r["done"], r["verified"]) for r in json.loads(proc.stdout)] == [
        (blocks_b, blocks_b),
        (blocks_a, blocks_a),
    ]


def _verified_codes(store: Path) -> np.ndarray[Any, Any]:
    """The report's per-block verify codes (-1 not done, 0 no checksum, 1 verified,
    2 mismatched) of ``store``, on its tracking grid."""
    from bellis._report._data import load_store

    data = load_store(store)
    assert data.verify_codes is not None
    with TrackingStore.open_readonly(store) as s:
        grid = tuple(s.grid_shape)
    return np.asarray(data.verify_codes).reshape(grid)


def test_the_blocks_a_verify_listed_move_with_a_grown_volume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run(run, "serial", start=8)  # a over rows [8, 24): a 4 x 4 grid
    store = run / "tracking" / "a"
    # lose the chunk of the block at rows [12, 16), columns [4, 8): grid cell (1, 1)
    (run / "a.zarr" / "c" / "3" / "1").unlink()
    proc = _bellis(tmp_path, "verify", str(store), "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert [(m["kind"], m["block"]) for m in result["mismatches"]] == [("missing", [1, 1])]
    expected = np.ones((4, 4), dtype=np.int8)
    expected[1, 1] = 2
    np.testing.assert_array_equal(_verified_codes(store), expected)

    # the volume grows by two blocks at its start: the store migrates (cell shift [2, 0])
    # and the new blocks run; the lost block is the grown grid's (3, 1), still mismatched
    _run(run, "distributed", start=0)
    expected = np.ones((6, 4), dtype=np.int8)
    expected[3, 1] = 2
    np.testing.assert_array_equal(_verified_codes(store), expected)
    assert "verified    23 verified, 1 mismatched, 0 unverifiable" in _status(store)
    record = json.loads((store / "verify.json").read_text())
    assert (record["grid"], record["missing"]) == ([6, 4], [3 * 4 + 1])

    # a record still of the old grid (a crash between the migration's commit and its
    # rewrite) names cells of another grid: its readers list none of them
    record.update(grid=[4, 4], missing=[1 * 4 + 1])
    (store / "verify.json").write_text(json.dumps(record))
    np.testing.assert_array_equal(_verified_codes(store), np.ones((6, 4), dtype=np.int8))
    assert "verified    24 verified, 0 mismatched, 0 unverifiable" in _status(store)
