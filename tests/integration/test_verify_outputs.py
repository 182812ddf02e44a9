"""Verified blocks and ``bellis verify``, as a user meets them: a two-task pipeline in a
script (a subprocess, real workers or serial mode) writes real zarr v3 arrays; the data is
then damaged outside bellis, and ``bellis verify`` (another subprocess) must find exactly
the damage, ``--reset`` must make the next run redo exactly the damaged blocks and the
downstream blocks that read them, and a final verify must pass.

Task ``a`` writes array A, one block per chunk, with ``verify_outputs=True``. Task ``b``
reads A with half a block of context on each side and writes the sum it read into B. A is
stored without compression (zarr's ``bytes`` codec only), so a chunk file holds the raw
float32 values: changing one of its bytes changes one value, which zarr reads without
complaint, and only the checksum can tell ("changed"). A deleted chunk file reads as the
fill value ("missing"). A is a plain zarr array, or a funlib.persistence ``Array`` with a
voxel size of 2 and an offset of (8, 16) world units.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from bellis._tracking import TrackingStore
from kit.user_script import run_script

pytest.importorskip("funlib.persistence")

SCRIPT = """
import json, os, sys, time
import numpy as np
import zarr
import bellis as daisy
from funlib.geometry import Roi

ROOT, MODE, KIND, HANG = {root!r}, {mode!r}, {kind!r}, {hang!r}
EMPTY, VERIFY, CA, CHECK = {empty!r}, {verify!r}, {chunk_a!r}, {check!r}
VS, OFF = (2, 2) if KIND == "funlib" else (1, 1), (8, 16) if KIND == "funlib" else (0, 0)
N, C = 32, 8  # voxels per axis, voxels per chunk (= one block of a)
A, B = os.path.join(ROOT, "a.zarr"), os.path.join(ROOT, "b.zarr")
if not os.path.exists(A):
    za = zarr.create_array(A, shape=(N, N), chunks=(CA, CA), dtype="float32", compressors=None)
    zb = zarr.create_array(B, shape=(N, N), chunks=(C // 2, C // 2), dtype="float32")
    if KIND != "funlib":
        za.attrs["voxel_size"], za.attrs["offset"] = list(VS), list(OFF)
    zb.attrs["voxel_size"], zb.attrs["offset"] = list(VS), list(OFF)


def log(task, block):
    with open(os.path.join(ROOT, "log-%d" % os.getpid()), "a") as f:
        f.write(json.dumps([task, list(block.write_roi.offset)]) + "\\n")


def vox(roi):
    return tuple(slice((o - f) // v, (o + s - f) // v)
                 for o, s, f, v in zip(roi.offset, roi.shape, OFF, VS))


def write_a(block):
    za = zarr.open_array(A, mode="r+")
    sl = vox(block.write_roi)
    values = np.arange(C * C, dtype="float32").reshape(C, C) + 1000 * (block.block_id[1] + 1)
    if HANG and list(block.write_roi.offset) == HANG:
        za[sl[0].start : sl[0].start + C // 2, sl[1]] = values[: C // 2]  # half of it
        with open(os.path.join(ROOT, "hung"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    if EMPTY and list(block.write_roi.offset) == EMPTY:
        pass  # this block forgets to write its output
    elif KIND == "funlib":
        from funlib.persistence import Array
        Array(za, offset=OFF, voxel_size=VS)[block.write_roi] = values
    else:
        za[sl] = values
    log("a", block)


def write_b(block):
    za = zarr.open_array(A, mode="r")
    zb = zarr.open_array(B, mode="r+")
    zb[vox(block.write_roi)] = float(za[vox(block.read_roi)].sum())
    log("b", block)


total = Roi(OFF, (N * VS[0], N * VS[1]))
wa = Roi((0, 0), (C * VS[0], C * VS[1]))
ctx = (C // 2 * VS[0], C // 2 * VS[1])
rb = Roi((0, 0), (2 * C * VS[0], 2 * C * VS[1]))
wb = Roi(ctx, (C * VS[0], C * VS[1]))
if KIND == "funlib":
    from funlib.persistence import Array
    out_a = Array(zarr.open_array(A, mode="r"), offset=OFF, voxel_size=VS)
else:
    out_a = A
a = daisy.Task("a", total, wa, wa, write_a, max_workers=2, outputs=[out_a],
               verify_outputs=VERIFY, write_safety="serialize" if CA > C else "error",
               tracking_path=os.path.join(ROOT, "tracking", "a"))
b = daisy.Task("b", total, rb, wb, write_b, max_workers=2, outputs=[B],
               tracking_path=os.path.join(ROOT, "tracking", "b"))
if CHECK:  # Task.verify() from this script (no main guard), in 2 processes
    r = a.verify(workers=2)
    print(json.dumps({{"ok": r.ok, "verified": r.verified, "missing": len(r.missing),
                      "changed": len(r.changed), "unverifiable": len(r.unverifiable)}}))
    sys.exit(0)
ok = daisy.run_blockwise(a + b, multiprocessing=MODE == "distributed", progress=False)
sys.exit(0 if ok else 3)
"""

N, C = 32, 8


def _vs(kind: str) -> tuple[tuple[int, int], tuple[int, int]]:
    return ((2, 2), (8, 16)) if kind == "funlib" else ((1, 1), (0, 0))


def _script(
    root: Path,
    mode: str,
    kind: str,
    hang: list[int] | None = None,
    empty: list[int] | None = None,
    verify: bool | str = True,
    chunk_a: int = 8,
    check: bool = False,
) -> str:
    return SCRIPT.format(
        root=str(root),
        mode=mode,
        kind=kind,
        hang=hang,
        empty=empty,
        verify=verify,
        chunk_a=chunk_a,
        check=check,
    )


def _run(root: Path, mode: str, kind: str, chunk_a: int = 8) -> None:
    proc = run_script(root, _script(root, mode, kind, chunk_a=chunk_a), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _verify(root: Path, *args: str) -> tuple[int, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "verify", str(root / "tracking" / "a"), "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    return proc.returncode, result


def _done_blocks(root: Path, task: str) -> set[tuple[int, ...]]:
    """The block coordinates (tracking cells less the context's) marked done."""
    store = TrackingStore.open_readonly(root / "tracking" / task)
    try:
        done = np.asarray(store.done)
        record = store.record or {}
    finally:
        store.close()
    shift = [u // w for u, w in zip(record["context_ul"], record["write_stride"], strict=True)]
    return {
        tuple(int(c) - s for c, s in zip(cell, shift, strict=True)) for cell in np.argwhere(done)
    }


def _status(root: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(root / "tracking" / "a")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _verified_figure(root: Path) -> np.ndarray[Any, Any]:
    """The report's "verified" volume figure of task a: one code per block (1 verified,
    2 mismatched, 0 no checksum, NaN not done)."""
    from bellis._report._data import load_store
    from bellis._report._figures import volume_payload

    payload = volume_payload(load_store(root / "tracking" / "a"))
    assert payload is not None
    spec = payload["metrics"]["verified"]
    return np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<f4").reshape(N // C, N // C)


def _logged(root: Path) -> dict[str, list[tuple[int, ...]]]:
    """What the run's block functions logged: per task, the blocks' write offsets."""
    out: dict[str, list[tuple[int, ...]]] = {"a": [], "b": []}
    for f in root.glob("log-*"):
        for line in f.read_text().splitlines():
            task, offset = json.loads(line)
            out[task].append(tuple(offset))
    return out


def _a_offset(kind: str, block: tuple[int, int]) -> tuple[int, ...]:
    vs, off = _vs(kind)
    return tuple(o + g * C * v for o, g, v in zip(off, block, vs, strict=True))


def _b_readers(bad: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Blocks of b whose read ROI (voxels [8g, 8g + 16) per axis) meets an a block's write
    ROI (voxels [8j, 8j + 8)), computed from the intervals."""
    grid = (N - C) // C  # b's blocks per axis: the total less the context, per write shape
    out = set()
    for j in bad:
        for g0 in range(grid):
            for g1 in range(grid):
                if all(
                    C * g < C * jj + C and C * g + 2 * C > C * jj
                    for g, jj in zip((g0, g1), j, strict=True)
                ):
                    out.add((g0, g1))
    return out


def _expected(root: Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A and B as a run that wrote every block once leaves them."""
    a = np.zeros((N, N), dtype=np.float32)
    ids = {}
    from bellis._block import cantor_number  # the spatial id a block of a gets

    for g0 in range(N // C):
        for g1 in range(N // C):
            ids[(g0, g1)] = cantor_number([g0, g1])
            a[C * g0 : C * g0 + C, C * g1 : C * g1 + C] = np.arange(C * C).reshape(C, C) + 1000 * (
                ids[(g0, g1)] + 1
            )
    b = np.zeros((N, N), dtype=np.float32)
    for g0 in range((N - C) // C):
        for g1 in range((N - C) // C):
            s = a[C * g0 : C * g0 + 2 * C, C * g1 : C * g1 + 2 * C].sum()
            h = C // 2
            b[h + C * g0 : h + C * g0 + C, h + C * g1 : h + C * g1 + C] = s
    return a, b


#: where the damage goes, per layout of A's chunks: the chunk file deleted, the chunk file
#: and byte changed, and the blocks of a each damage hits
DAMAGE = {
    # one block per chunk: a block owns its chunk, whose stored bytes its checksum covers
    "own": (("1", "1"), ("2", "3"), 101, {(1, 1)}, {(2, 3)}),
    # chunks of 2 x 2 blocks (write_safety="serialize"): checksums of the decoded values;
    # byte 33 of chunk (0, 0) is in value (0, 8), which block (0, 1) wrote
    "shared": (("1", "1"), ("0", "0"), 33, {(2, 2), (2, 3), (3, 2), (3, 3)}, {(0, 1)}),
}


@pytest.mark.parametrize(
    ("mode", "kind", "units"),
    [
        ("distributed", "plain", "own"),
        ("serial", "funlib", "own"),
        ("distributed", "funlib", "own"),
        ("serial", "plain", "shared"),
        ("distributed", "plain", "shared"),
    ],
)
def test_verify_finds_exactly_the_damage_and_reset_repairs_it(
    tmp_path: Path, mode: str, kind: str, units: str
) -> None:
    chunk_a = C if units == "own" else 2 * C
    _run(tmp_path, mode, kind, chunk_a)
    record = json.loads((tmp_path / "tracking" / "a" / "outputs.json").read_text())
    assert record["outputs"][0]["readback"] == ("stored" if units == "own" else "data")
    code, result = _verify(tmp_path)
    assert code == 0, result
    blocks = (N // C) ** 2
    assert result["done"] == result["verified"] == blocks
    assert result["mismatches"] == []

    # damage A outside bellis: delete one chunk file, and change one byte of another (an
    # uncompressed chunk: one float32 value changes, and zarr reads it without complaint)
    deleted, changed, byte, missing_blocks, changed_blocks = DAMAGE[units]
    (tmp_path / "a.zarr" / "c").joinpath(*deleted).unlink()
    chunk = (tmp_path / "a.zarr" / "c").joinpath(*changed)
    raw = bytearray(chunk.read_bytes())
    assert len(raw) == chunk_a * chunk_a * 4  # the bytes codec alone: the raw values
    raw[byte] ^= 0x40
    chunk.write_bytes(bytes(raw))
    bad = missing_blocks | changed_blocks

    code, result = _verify(tmp_path)
    assert code == 1
    # Task.verify() from a script finds the same
    proc = run_script(tmp_path, _script(tmp_path, mode, kind, chunk_a=chunk_a, check=True))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "ok": False,
        "verified": blocks - len(missing_blocks | changed_blocks),
        "missing": len(missing_blocks),
        "changed": len(changed_blocks),
        "unverifiable": 0,
    }
    found = {(m["kind"], tuple(m["block"])) for m in result["mismatches"]}
    assert found == {("missing", b) for b in missing_blocks} | {
        ("changed", b) for b in changed_blocks
    }
    assert result["verified"] == blocks - len(bad)
    first = min(missing_blocks)
    missing = next(m for m in result["mismatches"] if tuple(m["block"]) == first)
    assert "chunk file(s) absent" in missing["detail"]
    assert list(missing["write_roi"][0]) == list(_a_offset(kind, first))
    # a verify without --reset changes no done marker
    assert len(_done_blocks(tmp_path, "a")) == blocks
    # bellis status and the report's volume map show what the verify found
    line = f"verified    {blocks - len(bad)} verified, {len(bad)} mismatched, 0 unverifiable"
    assert line in _status(tmp_path)
    figure = np.ones((N // C, N // C), dtype=np.float32)
    for b in bad:
        figure[b] = 2.0
    np.testing.assert_array_equal(_verified_figure(tmp_path), figure)

    code, result = _verify(tmp_path, "--reset")
    assert code == 1
    # the reset blocks are not done any more: neither verified nor mismatched
    line = f"verified    {blocks - len(bad)} verified, 0 mismatched, 0 unverifiable"
    assert line in _status(tmp_path)
    readers = _b_readers(sorted(bad))
    all_a = {(i, j) for i in range(N // C) for j in range(N // C)}
    all_b = {(i, j) for i in range((N - C) // C) for j in range((N - C) // C)}
    assert _done_blocks(tmp_path, "a") == all_a - bad
    assert _done_blocks(tmp_path, "b") == all_b - readers
    assert result["reset"] == {
        str(tmp_path / "tracking" / "a"): len(bad),
        str(tmp_path / "tracking" / "b"): len(readers),
    }

    for f in tmp_path.glob("log-*"):
        f.unlink()
    _run(tmp_path, mode, kind, chunk_a)
    # the redone blocks carry new checksums: bellis status and the report count them as
    # verified, not as what the last verify (the one that reset them) found
    line = f"verified    {blocks} verified, 0 mismatched, 0 unverifiable"
    assert line in _status(tmp_path)
    np.testing.assert_array_equal(
        _verified_figure(tmp_path), np.ones((N // C, N // C), dtype=np.float32)
    )
    logged = _logged(tmp_path)
    # the rerun redid exactly the damaged blocks and the downstream blocks that read them
    assert sorted(logged["a"]) == sorted(_a_offset(kind, b) for b in bad)
    vs, off = _vs(kind)
    assert sorted(logged["b"]) == sorted(
        tuple(o + (C // 2 + g * C) * v for o, g, v in zip(off, b, vs, strict=True)) for b in readers
    )
    code, result = _verify(tmp_path)
    assert code == 0, result
    assert result["verified"] == blocks
    a, b = _expected(tmp_path)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[:], a)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "b.zarr"))[:], b)
    # the pipeline's tracking basedir: task b declares outputs but does not verify them
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "verify", str(tmp_path / "tracking")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tracking/b: its task does not verify outputs, skipped" in proc.stderr
    assert proc.stdout.splitlines()[1].split() == ["a", str(blocks), str(blocks), "0", "0", "0"]


def _marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (the driver and its workers)."""
    needle = f"BELLIS_VERIFY_TEST={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :].startswith(b"Z"):
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_sigkill_during_a_write_leaves_the_block_not_done_and_resume_verifies(
    tmp_path: Path, mode: str
) -> None:
    marker = f"{os.getpid()}-{mode}"
    script = tmp_path / "user_script.py"
    script.write_text(_script(tmp_path, mode, "plain", hang=[8, 16]))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "BELLIS_VERIFY_TEST": marker},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        hung = tmp_path / "hung"
        deadline = time.monotonic() + 240
        while not hung.exists():
            assert proc.poll() is None, "the run ended before its block hung"
            assert time.monotonic() < deadline, "the block never started"
            time.sleep(0.05)
        # half the block's data is in A: SIGKILL the run (driver and workers) mid-write
        deadline = time.monotonic() + 30
        while pids := _marked(marker):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            assert time.monotonic() < deadline, f"could not kill the run: {pids}"
            time.sleep(0.02)
        proc.wait(timeout=30)
    finally:
        for pid in _marked(marker):  # the run's driver and workers, however this ended
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert (1, 2) not in _done_blocks(tmp_path, "a")

    # the resume (the same script, nothing hangs now) redoes it; then every block verifies
    hung.unlink()
    _run(tmp_path, mode, "plain")
    assert (1, 2) in _done_blocks(tmp_path, "a")
    code, result = _verify(tmp_path)
    assert code == 0, result
    assert result["verified"] == (N // C) ** 2
    a, _b = _expected(tmp_path)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[:], a)


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_a_block_whose_output_reads_back_empty_is_a_failed_attempt(
    tmp_path: Path, mode: str
) -> None:
    proc = run_script(tmp_path, _script(tmp_path, mode, "plain", empty=[8, 16]), timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the run did not complete
    assert _done_blocks(tmp_path, "a") == {(i, j) for i in range(N // C) for j in range(N // C)} - {
        (1, 2)
    }
    store = TrackingStore.open_readonly(tmp_path / "tracking" / "a")
    try:
        assert int(store.failures[1, 2]) == 3  # every attempt (max_retries=2) failed
    finally:
        store.close()
    lines = (tmp_path / "tracking" / "a" / "errors.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["coord"] for r in records] == [[1, 2]] * 3
    for r in records:
        assert "has no data in the block's write ROI [8, 16]+(8, 8)" in json.dumps(r)
        assert "reads back as the fill value everywhere" in json.dumps(r)


@pytest.mark.parametrize("mode", ["distributed", "serial"])
def test_allow_empty_accepts_a_block_that_wrote_only_the_fill_value(
    tmp_path: Path, mode: str
) -> None:
    text = _script(tmp_path, mode, "plain", empty=[8, 16], verify="allow_empty")
    proc = run_script(tmp_path, text, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code, result = _verify(tmp_path)
    assert code == 0, result
    assert result["verified"] == (N // C) ** 2
