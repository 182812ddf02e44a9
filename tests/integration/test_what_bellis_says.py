"""Issue 35 item 5: what bellis says that isn't so. Each test drives bellis as a user does
(a script in a subprocess, or the CLI) and checks the text against ground truth it computes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

BELLIS = [sys.executable, "-m", "bellis"]


def _demo(workdir: Path, size: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BELLIS, "demo", "--workdir", str(workdir), "--size", str(size), "--serial"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_demo_at_a_new_size_builds_the_new_volume(tmp_path: Path) -> None:
    """`bellis demo --size N` over a demo folder of another size kept the old volume,
    "completed" blocks that wrote nothing and ended in a TaskAbandonedError traceback."""
    import zarr

    work = tmp_path / "demo"
    first = _demo(work, 40)
    assert first.returncode == 0, first.stderr
    second = _demo(work, 64)
    assert second.returncode == 0, second.stderr
    assert "Traceback" not in second.stderr + second.stdout
    assert "Resumed" not in second.stdout  # nothing of the old size was skipped
    root = zarr.open_group(str(work / "demo.zarr"), mode="r")
    raw = np.asarray(root["raw"][:], dtype=np.float32)
    assert raw.shape == (64, 64, 64)
    # smoothed: the 3x3x3 mean of raw, the edge repeated at the faces
    pad = np.pad(raw, 1, mode="edge")
    mean = sum(
        pad[1 + dz : 65 + dz, 1 + dy : 65 + dy, 1 + dx : 65 + dx]
        for dz in (-1, 0, 1)
        for dy in (-1, 0, 1)
        for dx in (-1, 0, 1)
    ) / np.float32(27.0)
    smoothed = np.asarray(root["smoothed"][:])
    assert smoothed.shape == (64, 64, 64)
    assert np.abs(smoothed - mean).max() < 1e-4
    labels = np.asarray(root["labels"][:])
    assert np.array_equal(labels > 0, smoothed > 0.25)
    counts = np.asarray(root["counts"][:])
    assert counts.shape == (2, 2, 2)
    for cell in np.ndindex(2, 2, 2):
        sl = tuple(slice(32 * c, 32 * c + 32) for c in cell)
        assert counts[cell] == len(np.unique(labels[sl][labels[sl] > 0]))
    assert "holds a 40x40x40 volume, not 64x64x64 (--size 64): building it again" in (
        second.stderr
    )
    assert "✔" in second.stdout and "failed" not in second.stderr.lower()
