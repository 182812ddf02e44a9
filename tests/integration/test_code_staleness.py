"""Staleness flows downstream (issue 26, item 4), as a user runs it: a 2-task pipeline
script in a subprocess writes real zarr arrays; B reads A with a context, so one B block
reads up to four A blocks. After A's threshold constant is edited (A's code only), a
rerun with ``on_code_change="rerun"`` redoes exactly A's blocks, then every B block that
reads them, and the arrays equal a fresh run's, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.user_script import run_script

SCRIPT = """
import os
import sys
import time

import numpy as np
import zarr

import bellis as daisy
from funlib.geometry import Roi

THRESHOLD = 0.5


def mark(kind, block):
    folder = os.environ["RECORDS"]
    os.makedirs(folder, exist_ok=True)
    offset = "_".join(str(int(c)) for c in block.write_roi.offset)
    with open(os.path.join(folder, f"{kind}_{offset}"), "w") as f:
        f.write(str(time.monotonic_ns()))


def upstream(block):
    raw = zarr.open_array("data/raw.zarr", mode="r")
    out = zarr.open_array("data/a.zarr", mode="r+")
    sl = block.write_roi.to_slices()
    out[sl] = (raw[sl] > THRESHOLD).astype("uint8") * 3 + 1
    mark("up", block)


def downstream(block):
    a = zarr.open_array("data/a.zarr", mode="r")
    out = zarr.open_array("data/b.zarr", mode="r+")
    window = a[block.read_roi.to_slices()].astype("uint32")
    inner = window[2:-2, 2:-2]
    out[block.write_roi.to_slices()] = inner * 10 + int(window.sum()) % 7
    mark("down", block)


if not os.path.exists("data/a.zarr"):
    for name, dtype, chunks in (("a", "uint8", (10, 10)), ("b", "uint32", (2, 2))):
        zarr.create_array(f"data/{name}.zarr", shape=(40, 40), chunks=chunks, dtype=dtype,
                          fill_value=0)
daisy.set_tracking_basedir("tracking")
policy = os.environ.get("POLICY", "rerun")
a = daisy.Task("A", Roi((0, 0), (40, 40)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)),
               upstream, read_write_conflict=False, on_code_change=policy, max_workers=2)
b = daisy.Task("B", Roi((0, 0), (40, 40)), Roi((0, 0), (14, 14)), Roi((2, 2), (10, 10)),
               downstream, read_write_conflict=False, upstream_tasks=[a],
               on_code_change=policy, max_workers=2)
tasks = [a] if os.environ.get("ONLY") == "A" else [a, b]
ok = daisy.run_blockwise(tasks, multiprocessing=os.environ["MODE"] == "dist", progress=False)
sys.exit(0 if ok else 3)
"""

EDITED = SCRIPT.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
MODES = ["serial", "dist"]
A_BLOCKS = [(i * 10, j * 10) for i in range(4) for j in range(4)]
B_BLOCKS = [(2 + i * 10, 2 + j * 10) for i in range(3) for j in range(3)]


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    raw = np.random.default_rng(7).random((40, 40)).astype("float32")
    zarr.create_array(str(path / "data" / "raw.zarr"), data=raw, chunks=(10, 10))
    return path


def _run(folder: Path, text: str, records: str, mode: str, **env: str) -> dict[str, int]:
    """Run the script; the blocks it ran: ``{"up_10_20": monotonic ns, ...}``."""
    proc = run_script(
        folder, text, name="pipeline.py", env={"RECORDS": records, "MODE": mode, **env}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = folder / records
    if not out.exists():
        return {}
    return {p.name: int(p.read_text()) for p in out.iterdir()}


def _reads(b: tuple[int, int], a: tuple[int, int]) -> bool:
    """Whether B's block at write offset ``b`` reads A's block at offset ``a``: its read
    box [b - 2, b + 12) meets [a, a + 10) on both axes."""
    return all(bo - 2 < ao + 10 and ao < bo + 12 for bo, ao in zip(b, a, strict=True))


def _name(kind: str, offset: tuple[int, int]) -> str:
    return f"{kind}_{offset[0]}_{offset[1]}"


def _check_order(made: dict[str, int]) -> None:
    """Every B block ran after every A block of this run that it reads."""
    for b in B_BLOCKS:
        if _name("down", b) not in made:
            continue
        for a in A_BLOCKS:
            if _reads(b, a) and _name("up", a) in made:
                assert made[_name("up", a)] < made[_name("down", b)], (a, b)


def _chunk_bytes(folder: Path) -> dict[str, bytes]:
    data = folder / "data"
    return {
        str(p.relative_to(data)): p.read_bytes()
        for p in sorted(data.rglob("*"))
        if p.is_file() and not p.name.startswith("raw") and "raw.zarr" not in p.parts
    }


def _same_as_fresh(folder: Path, tmp_path: Path, mode: str) -> None:
    fresh = _folder(tmp_path / "fresh")
    _run(fresh, EDITED, "run1", mode)
    for name in ("a", "b"):
        got = zarr.open_array(str(folder / "data" / f"{name}.zarr"), mode="r")[:]
        want = zarr.open_array(str(fresh / "data" / f"{name}.zarr"), mode="r")[:]
        assert np.array_equal(got, want), name
        assert int(want.astype(np.int64).sum()) > 0
    assert _chunk_bytes(folder) == _chunk_bytes(fresh)


def _all(kind: str, blocks: list[tuple[int, int]]) -> set[str]:
    return {_name(kind, o) for o in blocks}


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_code_change_reruns_its_blocks_then_their_readers(
    tmp_path: Path, mode: str
) -> None:
    folder = _folder(tmp_path / "work")
    assert set(_run(folder, SCRIPT, "run1", mode)) == _all("up", A_BLOCKS) | _all("down", B_BLOCKS)
    made = _run(folder, EDITED, "run2", mode)
    # exactly A's blocks (its code changed), then every B block reading them (all of B)
    assert set(made) == _all("up", A_BLOCKS) | _all("down", B_BLOCKS)
    _check_order(made)
    _same_as_fresh(folder, tmp_path, mode)
    # and nothing is stale any more
    assert _run(folder, EDITED, "run3", mode) == {}


@pytest.mark.parametrize("mode", MODES)
def test_blocks_redone_in_a_later_run_make_their_readers_stale(tmp_path: Path, mode: str) -> None:
    """A is rerun alone under new code; B's blocks, made in an earlier run than the A
    blocks they read, are stale in the next pipeline run: warned about by default, run
    again with "rerun"."""
    folder = _folder(tmp_path / "work")
    _run(folder, SCRIPT, "run1", mode)
    assert set(_run(folder, EDITED, "run2", mode, ONLY="A")) == _all("up", A_BLOCKS)
    proc = run_script(
        folder, EDITED, name="pipeline.py", env={"RECORDS": "run3", "MODE": mode, "POLICY": "warn"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (folder / "run3").exists()
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "redone after" in line]
    assert len(lines) == 2, proc.stdout + proc.stderr  # one WARNING, one summary line
    assert all("9 " in line and "of A" in line and "B" in line for line in lines), lines
    made = _run(folder, EDITED, "run4", mode)
    assert set(made) == _all("down", B_BLOCKS)
    _same_as_fresh(folder, tmp_path, mode)


@pytest.mark.parametrize("mode", MODES)
def test_one_upstream_block_redone_reruns_exactly_its_readers(tmp_path: Path, mode: str) -> None:
    """One A block loses its done marker (as a check that found its output bad would
    leave it): it runs again, and so do exactly the B blocks whose read box meets it."""
    folder = _folder(tmp_path / "work")
    _run(folder, SCRIPT, "run1", mode)
    group = zarr.open_group(str(folder / "tracking" / "A"), mode="r+")
    done = group["done"]
    done[1, 2] = 0  # the block writing [10, 20) x [20, 30)
    made = _run(folder, SCRIPT, "run2", mode)
    readers = [b for b in B_BLOCKS if _reads(b, (10, 20))]
    assert len(readers) == 4
    assert set(made) == {"up_10_20"} | _all("down", readers)
    _check_order(made)
    line = json.loads((folder / "tracking" / "B" / "runs.jsonl").read_text().splitlines()[-1])
    assert line["counters"]["skipped"] == 5


def test_no_store_upstream_makes_nothing_stale(tmp_path: Path) -> None:
    """An upstream task without tracking runs every time; nothing records when, so its
    readers are never stale."""
    folder = _folder(tmp_path / "work")
    script = SCRIPT.replace(
        "upstream, read_write_conflict=False,",
        "upstream, tracking_path=False, read_write_conflict=False,",
    )
    assert "tracking_path=False" in script
    _run(folder, script, "run1", "serial")
    made = _run(folder, script, "run2", "serial")
    assert set(made) == _all("up", A_BLOCKS)


def test_status_of_the_store_reads_after_a_rerun(tmp_path: Path) -> None:
    """The store stays readable by the CLI after the clears and the rerun."""
    folder = _folder(tmp_path / "work")
    _run(folder, SCRIPT, "run1", "serial")
    _run(folder, EDITED, "run2", "serial")
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(folder / "tracking" / "B")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "done        9" in proc.stdout


@pytest.mark.parametrize("mode", MODES)
def test_error_policy_names_the_upstream_and_runs_nothing(tmp_path: Path, mode: str) -> None:
    folder = _folder(tmp_path / "work")
    _run(folder, SCRIPT, "run1", mode)
    zarr.open_group(str(folder / "tracking" / "A"), mode="r+")["done"][0, 0] = 0
    proc = run_script(
        folder,
        SCRIPT,
        name="pipeline.py",
        env={"RECORDS": "run2", "MODE": mode, "POLICY": "error"},
    )
    assert proc.returncode == 1
    assert not (folder / "run2").exists()
    assert "bellis.errors.CodeChangedError" in proc.stderr
    # B's block at (2, 2) is the only one whose read box [0, 14)^2 meets A's [0, 10)^2
    assert 'task "B": 1 done block(s) read blocks of upstream task(s) A' in proc.stderr
