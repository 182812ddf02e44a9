"""What verified outputs cost (issue 27, item 5), each case against its baseline measured in
the same campaign, repetitions interleaved (A B A B ...), every run in a fresh interpreter.

``write``   2 workers write blocks of 128^3 float32 (8 MiB), one block per chunk, into a
            local zarr v3 array (zarr's default codecs: zstd), with ``resource_tracking``;
            ``verify_outputs=True`` against the same run without. The figure is the median
            per-block wall time from the tracking store (the read-back runs inside it), and
            the run's wall. Each block's data is a precomputed smooth volume plus the
            block's id (no compute: the write is all the block does, the worst case for
            the ratio).
``read``    ``bellis verify`` (the stores the ``write`` case left, ``--workers 2``) against a
            plain parallel zarr read of the same blocks: a pool of 2 spawned processes that
            each open the array once and read their share of the write ROIs (what verify
            does, without the checksum and the comparison). Throughput in MiB/s, pool
            start included in both.
``noop``    20,000 no-op blocks on 2 workers with a tracking store: ``outputs=[array]``
            declared (nothing else) against no outputs, and against the same array made
            (zarr imported in the driver) but not declared. Run wall.
``micro``   in one process: a 128^3 block written, then read back and checksummed by
            ``ReadBack`` (stored: the chunk file; data: decoded values), medians.

Usage::

    python -m compileall -q src
    .venv/bin/python benchmarks/bench_verify_outputs.py --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

WRITE = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import zarr
    import bellis
    from funlib.geometry import Roi

    root, verify, n = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    shared = sys.argv[4] == "data"  # chunks of 2 blocks: the read-back decodes the values
    B = 128
    path = os.path.join(root, "out.zarr")
    zarr.create_array(path, shape=(n * B, 2 * B, 2 * B), chunks=(B, B, 2 * B if shared else B),
                      dtype="float32", overwrite=True)
    BASE = []

    def process(block):
        if not BASE:
            z, y, x = np.mgrid[0:B, 0:B, 0:B].astype(np.float32)
            BASE.append(np.sin(z / 9) + np.cos(y / 7) * np.sin(x / 5))
        arr = zarr.open_array(path, mode="r+")
        r = block.write_roi
        arr[tuple(slice(b, e) for b, e in zip(r.begin, r.end))] = BASE[0] + block.block_id[1]

    total = Roi((0, 0, 0), (n * B, 2 * B, 2 * B))
    w = Roi((0, 0, 0), (B, B, B))
    task = bellis.Task("w", total, w, w, process, max_workers=2, outputs=[path],
                       verify_outputs=verify, resource_tracking=True,
                       write_safety="serialize" if shared else "error",
                       tracking_path=os.path.join(root, "track"))
    t0 = time.perf_counter()
    ok = bellis.run_blockwise([task], progress=False, summary=False)
    wall = time.perf_counter() - t0
    from bellis._tracking import TrackingStore
    s = TrackingStore.open_readonly(os.path.join(root, "track"))
    walls = np.asarray(s.stats["wall_seconds"]).reshape(-1)
    s.close()
    print(json.dumps({"ok": ok, "wall": wall, "block_median": float(np.median(walls)),
                      "blocks": int(walls.size)}))
    """
)

VERIFY = textwrap.dedent(
    """
    import json, sys, time
    from bellis._outputs._verify import verify_stores
    t0 = time.perf_counter()
    (r,) = verify_stores([sys.argv[1]], workers=2)
    print(json.dumps({"wall": time.perf_counter() - t0, "verified": r.verified}))
    """
)

PLAIN = textwrap.dedent(
    """
    import json, multiprocessing, sys, time
    from concurrent.futures import ProcessPoolExecutor

    ARR = {}

    def read(path, rois):
        import zarr
        arr = ARR.get(path)
        if arr is None:
            arr = ARR[path] = zarr.open_array(path, mode="r")
        n = 0
        for roi in rois:
            n += arr[tuple(slice(b, e) for b, e in roi)].nbytes
        return n

    if __name__ == "__main__":
        path, n = sys.argv[1], int(sys.argv[2])
        B = 128
        rois = [[(z * B, z * B + B), (y * B, y * B + B), (x * B, x * B + B)]
                for z in range(n) for y in range(2) for x in range(2)]
        t0 = time.perf_counter()
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(2, mp_context=ctx) as pool:
            size = max(1, -(-len(rois) // 8))
            got = sum(f.result() for f in [pool.submit(read, path, rois[i:i + size])
                                           for i in range(0, len(rois), size)])
        print(json.dumps({"wall": time.perf_counter() - t0, "bytes": got}))
    """
)

NOOP = textwrap.dedent(
    """
    import json, os, sys, time
    import zarr
    import bellis
    from funlib.geometry import Roi

    root, declared, n = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    path = os.path.join(root, "o.zarr")
    if sys.argv[2] != "0":  # "2": the array made (zarr imported), but not declared
        zarr.create_array(path, shape=(n,), chunks=(1,), dtype="uint8", overwrite=True)

    def process(block):
        pass

    task = bellis.Task("n", Roi((0,), (n,)), Roi((0,), (1,)), Roi((0,), (1,)), process,
                       max_workers=2, read_write_conflict=False,
                       outputs=[path] if declared else None,
                       tracking_path=os.path.join(root, "track-%d" % time.monotonic_ns()))
    t0 = time.perf_counter()
    ok = bellis.run_blockwise([task], progress=False, summary=False)
    print(json.dumps({"ok": ok, "wall": time.perf_counter() - t0}))
    """
)


MICRO = textwrap.dedent(
    """
    import json, statistics, sys, time
    import numpy as np
    import zarr
    from bellis._outputs._readback import ReadBack

    root, reps = sys.argv[1], int(sys.argv[2])
    B = 128
    z, y, x = np.mgrid[0:B, 0:B, 0:B].astype(np.float32)
    base = np.sin(z / 9) + np.cos(y / 7) * np.sin(x / 5)
    out = {}
    for mode, chunks in (("stored", (B, B, B)), ("data", (B, B, 2 * B))):
        path = f"{root}/micro-{mode}.zarr"
        arr = zarr.create_array(path, shape=(4 * B, B, 2 * B), chunks=chunks, dtype="float32",
                                overwrite=True)
        rb = ReadBack([[path, "", [1, 1, 1], [0, 0, 0], mode == "stored"]])
        writes, backs = [], []
        for rep in range(reps):
            i = rep % 4
            iv = [(i * B, i * B + B), (0, B), (0, B)]
            t0 = time.perf_counter()
            arr[i * B:i * B + B, :, :B] = base + rep
            t1 = time.perf_counter()
            rb.checksum(iv)
            t2 = time.perf_counter()
            writes.append(t1 - t0)
            backs.append(t2 - t1)
        out[mode] = [statistics.median(writes), statistics.median(backs)]
    print(json.dumps(out))
    """
)


def _run(code: str, *args: str, cwd: str) -> dict[str, float]:
    # a file, not -c: the spawned pool processes of PLAIN import their function from it
    script = os.path.join(cwd, f"bench_{abs(hash(code))}.py")
    with open(script, "w") as fh:
        fh.write(code)
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, cwd=cwd, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _ratio(a: list[float], b: list[float]) -> str:
    pairs = sorted(x / y for x, y in zip(a, b, strict=True))
    return (
        f"median {statistics.median(a) / statistics.median(b):.3f} "
        f"(paired ratios {pairs[0]:.3f} .. {pairs[-1]:.3f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--slabs", type=int, default=4, help="128^3 blocks along axis 0 (x 4)")
    ap.add_argument("--noop-blocks", type=int, default=20_000)
    ap.add_argument("--only", choices=("write", "read", "noop", "micro"), default=None)
    ap.add_argument(
        "--readback",
        choices=("stored", "data"),
        default="stored",
        help="stored: a block per chunk (the read-back checksums the chunk files); data: "
        "chunks of 2 blocks, write_safety='serialize' (it decodes the values)",
    )
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-verify-")
    n = args.slabs
    mib = n * 4 * 8
    try:
        if args.only in (None, "write", "read"):
            res: dict[str, list[dict[str, float]]] = {"plain": [], "verified": []}
            reads: dict[str, list[float]] = {"verify": [], "zarr": []}
            for rep in range(args.reps):
                for name, flag in (("plain", "0"), ("verified", "1")):
                    d = os.path.join(tmp, name)
                    shutil.rmtree(d, ignore_errors=True)
                    os.makedirs(d)
                    r = _run(WRITE, d, flag, str(n), args.readback, cwd=d)
                    assert r["ok"], r
                    res[name].append(r)
                if args.only in (None, "read"):
                    d = os.path.join(tmp, "verified")
                    order = ("verify", "zarr") if rep % 2 == 0 else ("zarr", "verify")
                    for which in order:
                        if which == "verify":
                            r = _run(VERIFY, os.path.join(d, "track"), cwd=d)
                            assert r["verified"] == n * 4, r
                        else:
                            r = _run(PLAIN, os.path.join(d, "out.zarr"), str(n), cwd=d)
                        reads[which].append(r["wall"])
                print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
            pb = [r["block_median"] for r in res["plain"]]
            vb = [r["block_median"] for r in res["verified"]]
            print(f"readback {args.readback}")
            print(f"write: {n * 4} blocks of 128^3 float32 ({mib} MiB), 2 workers, ", end="")
            print(f"{args.reps} reps")
            print(
                f"  block wall, median of medians: plain {statistics.median(pb) * 1e3:.1f} ms, "
                f"verified {statistics.median(vb) * 1e3:.1f} ms"
            )
            print(f"  verified / plain block wall: {_ratio(vb, pb)}")
            pw = [r["wall"] for r in res["plain"]]
            vw = [r["wall"] for r in res["verified"]]
            print(f"  verified / plain run wall:   {_ratio(vw, pw)}")
            if reads["verify"]:
                v, z = reads["verify"], reads["zarr"]
                print(f"read: {mib} MiB, 2 processes")
                print(
                    f"  bellis verify {mib / statistics.median(v):.0f} MiB/s, plain parallel "
                    f"zarr read {mib / statistics.median(z):.0f} MiB/s"
                )
                print(f"  verify throughput / plain read throughput: {_ratio(z, v)}")
        if args.only in (None, "micro"):
            r = _run(MICRO, tmp, str(args.reps * 4), cwd=tmp)
            print(f"micro: one process, 128^3 float32 blocks, {args.reps * 4} reps (medians)")
            for mode, (w, b) in r.items():
                print(
                    f"  readback {mode}: write {w * 1e3:.1f} ms, read-back + checksum "
                    f"{b * 1e3:.2f} ms = {b / w:.1%} of the write"
                )
        if args.only in (None, "noop"):
            walls: dict[str, list[float]] = {"none": [], "declared": [], "zarr_only": []}
            for _rep in range(args.reps):
                for name, flag in (("none", "0"), ("declared", "1"), ("zarr_only", "2")):
                    r = _run(NOOP, tmp, flag, str(args.noop_blocks), cwd=tmp)
                    assert r["ok"], r
                    walls[name].append(r["wall"])
            print(f"noop: {args.noop_blocks} blocks, 2 workers, tracking, {args.reps} reps")
            print(
                f"  run wall median: none {statistics.median(walls['none']):.3f} s, declared "
                f"{statistics.median(walls['declared']):.3f} s"
            )
            print(f"  declared / none: {_ratio(walls['declared'], walls['none'])}")
            print(
                f"  declared / the same array made but not declared: "
                f"{_ratio(walls['declared'], walls['zarr_only'])}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
