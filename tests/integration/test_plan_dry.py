"""Issue 28, item 1: ``bellis.plan(...)`` and ``run_blockwise(..., dry_run=True)`` run nothing,
write nothing, and count what a run would do.

A user script plans a two-task pipeline (the upstream task with read/write conflicts, the
downstream one with a skip mask) before any run, runs it for real once (some upstream
blocks fail, so the downstream blocks that read them are orphaned: a half-done store), and
plans again. Every block writes a file when it runs, so a file that appears while planning
is a block that ran. The test compares the plans with counts it makes itself, block by
block, from the public API (``BlockwiseDependencyGraph``'s blocks, the files the blocks
left), for each fit mode, serial and distributed.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

import bellis
from bellis import Roi
from kit.user_script import run_script

FITS = ("valid", "overhang", "shrink")
MODES = ("serial", "distributed")
CONTEXT = 3
WRITE = 10
EXTENT = (50, 47)  # the write region: 5 whole blocks on axis 0, 4 and a part on axis 1
MASK_ROI = Roi((0, 0), (20, 100))  # the downstream task skips blocks that touch it

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import bellis
    from bellis import Roi

    fit, mode = sys.argv[1], sys.argv[2]
    C, W, E = CONTEXT, WRITE, EXTENT
    base = os.getcwd()

    def record(kind, block):
        d = os.path.join(base, kind)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, str(block.block_id[1])), "w").close()

    def up(block):
        if tuple(int(o) for o in block.write_roi.offset) >= (4 * W, 3 * W):
            record("failed_a", block)
            block.status = bellis.BlockStatus.FAILED
            return
        record("done_a", block)

    def down(block):
        record("done_b", block)

    total = Roi((-C, -C), (E[0] + 2 * C, E[1] + 2 * C))
    read, write = Roi((0, 0), (W + 2 * C,) * 2), Roi((C, C), (W, W))
    a = bellis.Task("a", total, read, write, process_function=up, fit=fit, max_retries=0,
                    read_write_conflict=True, max_workers=3)
    shape = bellis.Task("b", total, read, write, fit=fit, read_write_conflict=False)
    mask = bellis.skip_mask_from_rois(shape, [Roi(*MASK)], skip_inside=True)
    b = bellis.Task("b", total, read, write, process_function=down, fit=fit, max_retries=0,
                    read_write_conflict=False, max_workers=2, skip_mask=mask)
    bellis.set_tracking_basedir(os.path.join(base, "tracking"))
    distributed = mode == "distributed"

    def listing():
        out = {}
        for root, _, files in os.walk(base):
            for f in files:
                p = os.path.join(root, f)
                st = os.stat(p)
                out[os.path.relpath(p, base)] = (st.st_size, st.st_mtime_ns)
        return out

    before = listing()
    p1 = bellis.plan(a + b, multiprocessing=distributed)
    p1b = bellis.run_blockwise(a + b, multiprocessing=distributed, dry_run=True)
    assert listing() == before, sorted(set(listing()) ^ set(before))
    print("@@" + json.dumps({"before": p1.to_json(), "before_dry": p1b.to_json()}))
    ok = bellis.run_blockwise(a + b, multiprocessing=distributed, progress=False, summary=False)
    before = listing()
    p2 = bellis.run_blockwise(a + b, multiprocessing=distributed, dry_run=True)
    assert listing() == before, sorted(set(listing()) ^ set(before))
    print("@@" + json.dumps({"after": p2.to_json(), "ok": ok}))
    """
).replace("CONTEXT, WRITE, EXTENT", repr((CONTEXT, WRITE, EXTENT)))
SCRIPT = SCRIPT.replace("Roi(*MASK)", f"Roi({tuple(MASK_ROI.offset)}, {tuple(MASK_ROI.shape)})")


def _blocks(fit: str, conflict: bool) -> tuple[list[Any], int]:
    """The task's blocks, as the public dependency graph lists them, and its level count."""
    total = Roi((-CONTEXT, -CONTEXT), (EXTENT[0] + 2 * CONTEXT, EXTENT[1] + 2 * CONTEXT))
    graph = bellis.BlockwiseDependencyGraph(
        "x",
        Roi((0, 0), (WRITE + 2 * CONTEXT,) * 2),
        Roi((CONTEXT, CONTEXT), (WRITE, WRITE)),
        read_write_conflict=conflict,
        fit=fit,
        total_read_roi=total,
    )
    return [blk for blk, _ in graph.enumerate_all_dependencies()], graph.num_levels


def _ids(tmp_path: Path, kind: str) -> set[int]:
    d = tmp_path / kind
    return {int(p.name) for p in d.iterdir()} if d.exists() else set()


def _plans(out: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("@@"):
            found.update(json.loads(line[2:]))
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fit", FITS)
def test_plans_count_what_a_run_does_and_run_nothing(tmp_path: Path, fit: str, mode: str) -> None:
    proc = run_script(tmp_path, SCRIPT, fit, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plans = _plans(proc.stdout)
    assert "bellis plan" in proc.stdout and "failed before" in proc.stdout  # the table

    blocks_a, levels_a = _blocks(fit, True)
    blocks_b, _ = _blocks(fit, False)
    masked_ids = {blk.block_id[1] for blk in blocks_b if blk.write_roi.intersects(MASK_ROI)}
    assert 0 < len(masked_ids) < len(blocks_b)
    workers_a = 3 if mode == "distributed" else 0
    launcher = "local" if mode == "distributed" else "serial"

    for key in ("before", "before_dry"):
        a, b = plans[key]["tasks"]
        assert plans[key]["mode"] == mode
        assert (a["task_id"], b["task_id"]) == ("a", "b")
        assert (a["blocks"], a["done"], a["masked"], a["failed_before"], a["left"]) == (
            len(blocks_a),
            0,
            0,
            0,
            len(blocks_a),
        )
        assert (b["blocks"], b["done"], b["masked"], b["failed_before"], b["left"]) == (
            len(blocks_b),
            0,
            len(masked_ids),
            0,
            len(blocks_b) - len(masked_ids),
        )
        assert a["levels"] == levels_a > 1 and b["levels"] == 1
        assert b["max_parallel"] == b["left"]  # no conflicts: every block left at once
        assert 0 < a["max_parallel"] < a["left"]
        assert a["downstream"] == ["b"] and b["upstream"] == ["a"]
        assert a["upstream"] == [] and b["downstream"] == []
        assert (
            not a["store_exists"] and a["store_to_allocate_bytes"] == a["store_reserved_bytes"] > 0
        )
        assert a["store"] == os.path.join(str(tmp_path), "tracking", "a")
        assert a["launcher"] == b["launcher"] == launcher
        assert a["workers"] == min(workers_a, a["max_parallel"])
        assert b["workers"] == (2 if mode == "distributed" else 0)
    # nothing ran while planning: the blocks' files appeared only with the real run
    done_a, failed_a, done_b = (_ids(tmp_path, k) for k in ("done_a", "failed_a", "done_b"))
    assert done_a and failed_a and done_b

    a, b = plans["after"]["tasks"]
    assert plans["ok"] is False
    assert (a["blocks"], a["done"], a["masked"], a["failed_before"], a["left"]) == (
        len(blocks_a),
        len(done_a),
        0,
        len(failed_a),
        len(blocks_a) - len(done_a),
    )
    masked_not_done = masked_ids - done_b
    assert (b["blocks"], b["done"], b["masked"], b["failed_before"]) == (
        len(blocks_b),
        len(done_b),
        len(masked_not_done),
        0,
    )
    assert b["left"] == len(blocks_b) - len(done_b) - len(masked_not_done) > 0
    assert a["store_exists"] and b["store_exists"]
    assert a["store_to_allocate_bytes"] == 0  # the run reserved its chunks
    assert a["workers"] == min(workers_a, a["max_parallel"])
    assert 0 < a["max_parallel"] <= a["left"]


SLURM_SCRIPT = textwrap.dedent(
    """
    import json, os
    import bellis
    from bellis import Roi

    def process(block):
        open(os.path.join(os.getcwd(), "ran"), "a").close()

    t = bellis.Task("t", Roi((0, 0), (100, 100)), Roi((0, 0), (10, 10)), Roi((0, 0), (10, 10)),
                    process_function=process, max_workers=6, requires={"gpu": 1})
    bellis.set_tracking_basedir("tracking")
    plan = bellis.run_blockwise(t, launcher=bellis.SlurmLauncher(time_limit=5),
                                resources={"gpu": 4}, dry_run=True)
    print("@@" + json.dumps(plan.to_json()))
    """
)


def test_a_dry_run_on_slurm_submits_no_job(tmp_path: Path) -> None:
    # an sbatch first on PATH that leaves a mark: the dry run must never call it
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path / 'sbatch-called'}\nexit 1\n")
    (shim / "sbatch").chmod(0o755)
    proc = run_script(
        tmp_path, SLURM_SCRIPT, env={"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (t,) = _plans(proc.stdout)["tasks"]
    assert not (tmp_path / "sbatch-called").exists() and not (tmp_path / "ran").exists()
    assert not (tmp_path / "tracking").exists()
    assert (t["launcher"], t["blocks"], t["left"], t["max_workers"]) == ("slurm", 100, 100, 6)
    assert t["workers"] == 4  # max_workers 6, but the resources hold 4 workers' gpus


NOTES_SCRIPT = textwrap.dedent(
    """
    import json, os
    import bellis
    from bellis import Roi

    def process(block):
        pass

    def check(block):
        open(os.path.join(os.getcwd(), "checked"), "a").close()
        return False

    bellis.set_tracking_basedir("tracking")
    small = bellis.Task("t", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)),
                        process_function=process)
    assert bellis.run_blockwise(small, multiprocessing=False, progress=False, summary=False)
    # the same task id with another block size: the store belongs to another layout
    big = bellis.Task("t", Roi((0,), (100,)), Roi((0,), (20,)), Roi((0,), (20,)),
                      process_function=process, check_function=check)
    plan = bellis.plan(big, multiprocessing=False, show=False)
    print("@@" + json.dumps(plan.to_json()))
    """
)


def test_a_plan_notes_a_store_of_another_layout_and_an_uncalled_check_function(
    tmp_path: Path,
) -> None:
    proc = run_script(tmp_path, NOTES_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (t,) = _plans(proc.stdout)["tasks"]
    assert not (tmp_path / "checked").exists()  # the check function was never called
    assert (t["blocks"], t["done"], t["left"], t["ready_at_start"]) == (5, 0, 5, 5)
    assert t["check_function"] is True and not t["store_exists"]
    notes = " ".join(t["notes"])
    assert "belongs to another layout" in notes and "LayoutMismatch" in notes
    assert "a check_function runs for each of the 5 blocks left" in notes
