"""The real-workload benchmark (benchmarks/bench_real.py) at a tiny size: every runner's
outputs equal the single process's, byte for byte, and the single process's are right.

Correctness only: no wall-clock figure is asserted. Runners that are not installed (daisy
2.0.0, dask, ``inputs=`` in bellis) are skipped by the benchmark itself and listed.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_real.py"
SIZE = 128


def _digest(a: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_every_runner_writes_the_single_process_bytes(tmp_path: Path) -> None:
    pytest.importorskip("scipy")  # the benchmark's kernels; in the test extras
    raw = tmp_path / "records.jsonl"
    data = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--size",
            str(SIZE),
            "--reps",
            "1",
            "--raw",
            str(raw),
            "--data",
            str(data),
            "--keep-data",
            "--timeout",
            "600",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in raw.read_text().splitlines()]
    by = {(r["workload"], r["runner"]): r for r in records}
    runners = {r["runner"] for r in records}
    assert {"single", "split", "bellis"} <= runners, runners
    # bellis has Task(inputs=...): the runner that declares them is on, and its workers'
    # decoded-chunk caches served reads (W2: 8 blocks of 32^3 per 64^3 chunk)
    assert "bellis+inputs" in runners, proc.stdout
    for wl, tid in (("W1", "gaussian"), ("W2", "threshold"), ("W3", "smooth")):
        cache = by[(wl, "bellis+inputs")]["info"]["tasks"][tid]["input_cache"]
        assert cache["misses"] > 0, (wl, cache)
        assert cache["hits"] > 0 or wl == "W1", (wl, cache)  # W1 at 128^3: one block
        assert cache["miss_bytes"] == cache["misses"] * 64**3, (wl, cache)
    for wl in ("W1", "W2", "W3"):
        ref = by[(wl, "single")]
        assert ref["status"] == "ok", ref
        for name in runners:
            rec = by[(wl, name)]
            assert rec["status"] == "ok", rec
            assert rec["digests"] == ref["digests"], (wl, name)
            # every block ran once and was measured inside the block function
            blocks = (
                (SIZE // 128) ** 3
                if wl == "W1"
                else ((SIZE // 32) ** 3 if wl == "W2" else 2 * (SIZE // 64) ** 3)
            )
            assert rec["blocks"]["total"]["blocks"] == blocks, (wl, name, rec["blocks"])
    # the single process's outputs are right: W2 is the threshold of the generated volume
    volume = zarr.open_array(str(data / f"raw_{SIZE}.zarr"), mode="r")[...]
    assert volume.dtype == np.uint8 and volume.std() > 50  # random, not a constant
    assert by[("W2", "single")]["digests"]["w2_mask"] == _digest((volume > 127).astype(np.uint8))
    # and W1 is the smoothing of its one padded block, computed here without the kernels
    from scipy import ndimage

    padded = np.pad(volume, 8).astype(np.float32)
    smooth = ndimage.gaussian_filter(padded, 2.0, mode="reflect")[8:-8, 8:-8, 8:-8]
    expect = np.clip(np.rint(smooth), 0, 255).astype(np.uint8)
    assert by[("W1", "single")]["digests"]["w1_smooth"] == _digest(expect)
    # the report: a table per workload, ratios against the split
    assert "wall / split" in proc.stdout and "### W3" in proc.stdout
