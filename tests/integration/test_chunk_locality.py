"""Chunk-level locality (issue 38 item 2): the share of a block's declared-input chunks
that its worker had read for an earlier block, from the per-block counts of the workers'
chunk caches, in the run's statistics (``TaskState``, ``runs.jsonl``), ``task.report()``,
the summary's panel, ``bellis status`` and the HTML report.

The test computes the expected share itself from the block and chunk geometry and the
order each process ran its blocks in (two workers, or serial mode)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from kit.user_script import run_script

SHAPE = (40, 160)
CHUNKS = (20, 20)
CONTEXT = 5
WRITE = 10

SCRIPT = """
import contextlib, io, json, os, sys
import zarr
import bellis
from bellis import Roi

HERE = os.getcwd()
MODE = os.environ["MODE"]
raw = zarr.open_array(os.path.join(HERE, "raw.zarr"), mode="r")

def process(block):
    r = block.read_roi
    data = raw[r.offset[0] : r.end[0], r.offset[1] : r.end[1]]
    assert data.shape == (20, 20)
    with open(os.path.join(HERE, "order", str(os.getpid())), "a") as f:
        f.write(f"{block.write_roi.offset[0]} {block.write_roi.offset[1]}\\n")

task = bellis.Task(
    "t", Roi((0, 0), (40, 160)), Roi((0, 0), (20, 20)), Roi((5, 5), (10, 10)),
    process_function=process, read_write_conflict=False, max_workers=2, fit="valid",
    inputs=[raw], tracking_path=os.path.join(HERE, "track"),
)
states = bellis.run_blockwise(
    [task], multiprocessing=MODE == "dist", progress=False, return_states=True
)
s = states["t"]
report = task.report()
report.to_html(os.path.join(HERE, "report.html"))
from bellis._cli._main import main as bellis_command
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = bellis_command(["status", os.path.join(HERE, "track")])
with open(os.path.join(HERE, "result.json"), "w") as f:
    json.dump(
        {
            "state": [s.completed_count, s.chunk_reads, s.chunk_hits],
            "counters": [report.counters["chunk_reads"], report.counters["chunk_hits"]],
            "share": report.chunk_locality,
            "status": out.getvalue(),
            "panel": report.panel(),
            "code": code,
        },
        f,
    )
"""


def _chunks_of(offset: tuple[int, int]) -> list[tuple[int, int]]:
    """The chunks a block's read ROI (20 x 20 from ``offset``) touches."""
    ranges = [
        range(o // c, (o + 2 * CONTEXT + WRITE - 1) // c + 1)
        for o, c in zip(offset, CHUNKS, strict=True)
    ]
    return list(itertools.product(*ranges))


@pytest.mark.parametrize("mode", ["dist", "serial"])
def test_the_chunk_locality_is_what_each_workers_order_gives(tmp_path: Path, mode: str) -> None:
    raw = zarr.create_array(tmp_path / "raw.zarr", shape=SHAPE, chunks=CHUNKS, dtype="uint8")
    raw[...] = np.arange(SHAPE[0] * SHAPE[1], dtype=np.uint8).reshape(SHAPE)
    (tmp_path / "order").mkdir()
    proc = run_script(tmp_path, SCRIPT, name="chunks.py", env={"MODE": mode}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the expected figure: per process, its blocks in the order it ran them, each chunk
    # it read before counted once per later block that reads it (the cache holds all 16)
    reads = hits = blocks = 0
    files = list((tmp_path / "order").iterdir())
    # (in a distributed run one worker may take every block: the figure holds either way)
    assert 1 <= len(files) <= (2 if mode == "dist" else 1), files
    for f in files:
        seen: set[tuple[int, int]] = set()
        for line in f.read_text().splitlines():
            w0, w1 = (int(x) for x in line.split())
            chunks = _chunks_of((w0 - CONTEXT, w1 - CONTEXT))
            reads += len(chunks)
            hits += sum(1 for c in chunks if c in seen)
            seen.update(chunks)
            blocks += 1
    # 3 x 15 blocks; a read ROI spans 1 or 2 chunks per axis: (1 + 2 + 1) x (8 x 1 + 7 x 2)
    assert blocks == 3 * 15 and reads == 4 * 22
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["state"] == [blocks, reads, hits]
    assert result["counters"] == [reads, hits]
    assert result["share"] == pytest.approx(hits / reads)
    share = f"{100.0 * hits / reads:.1f}%"
    line = f"{share} of input chunks read by their worker for an earlier block ({hits} of {reads})"
    assert result["code"] == 0
    assert f"chunk locality  {line}" in result["status"], result["status"]
    if mode == "dist":  # a panel (the summary's, task.report()'s) shows distributed runs
        assert line in result["panel"] and line in proc.stdout
    page = (tmp_path / "report.html").read_text()
    assert f"{share} ({hits} of {reads})" in page
