"""Where the time of a block's read goes, issue 38: a 64^3 block with an 8-voxel margin
(80^3) read from a zarr v3 array chunked 64^3 (zstd) touches 27 chunks.

    python benchmarks/real/profile_read.py [--size 512] [--reps 40] [--data DIR]

One process, page cache warm (every chunk file read once before). Each figure is the median
over ``--reps`` repetitions, interleaved (every repetition runs every measurement once, in a
rotated order) and spread over interior block positions; the load average is printed.

Measured, for the 27 chunks of one block read:

* ``zarr 80^3``: ``arr[80^3]`` through zarr (the block's read today);
* ``files``: the 27 chunk files read (``open`` + ``read``), nothing else;
* ``decode``: ``numcodecs.zstd.Zstd.decode`` of the 27 buffers, one thread (what zarr runs);
  random data does not compress, so this is nearly a copy; the same for 27 chunks of
  smoothed noise that compress (the ratio is printed), nearer what real volumes cost;
* ``copy from dict``: the 80^3 assembled from a dict of decoded 64^3 chunks (a decoded-chunk
  cache hit, all 27 chunks held);
* ``files+decode+copy``: the read without zarr: the floor of an encoded-bytes path;
* ``zarr 27 x chunk``: the 27 chunks read one by one through zarr, then assembled;
* ``zarr 1 chunk``, ``zarr 32^3``: one aligned chunk, and a 32^3 part of one chunk;
* ``sync hop`` and ``to_thread hop``: zarr's ``sync()`` of an empty coroutine, and of one
  ``asyncio.to_thread`` (zarr's codecs and its LocalStore each hop once per chunk).

The machinery (``zarr 80^3`` minus files, decode and copy) is what zarr adds: the event loop,
per-chunk tasks, thread hops, selection arithmetic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from real import work

C = work.CHUNK


def chunk_file(root: str, idx: tuple[int, int, int]) -> str:
    return os.path.join(root, "c", *(str(i) for i in idx))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--cprofile",
        action="store_true",
        help="also profile 24 reads through zarr's async API on this thread's own loop and "
        "print the call counts per read (the thread-pool hops run elsewhere)",
    )
    args = ap.parse_args()
    import zarr
    from numcodecs.zstd import Zstd
    from zarr.core.sync import sync

    data = args.data or tempfile.mkdtemp(prefix="bench-read-")
    os.makedirs(data, exist_ok=True)
    root = work.ensure_raw(data, args.size)
    arr = zarr.open_array(root, mode="r")
    codec = Zstd()
    n = args.size // C
    # interior blocks: a 64^3 block at chunk (i, j, k) with margin 8 touches chunks i-1..i+1
    positions = [
        (i, j, k) for i in range(1, n - 1) for j in range(1, n - 1) for k in range(1, n - 1)
    ]
    rng = np.random.default_rng(0)
    rng.shuffle(positions)
    for p in [(i, j, k) for i in range(n) for j in range(n) for k in range(n)]:
        with open(chunk_file(root, p), "rb") as f:
            f.read()  # warm the page cache

    def neighbours(p: tuple[int, int, int]) -> list[tuple[int, int, int]]:
        return [
            (p[0] + a, p[1] + b, p[2] + c)
            for a in (-1, 0, 1)
            for b in (-1, 0, 1)
            for c in (-1, 0, 1)
        ]

    def sel80(p: tuple[int, int, int]) -> tuple[slice, ...]:
        return tuple(slice(q * C - 8, q * C + C + 8) for q in p)

    def files(p: Any) -> list[bytes]:
        out = []
        for q in neighbours(p):
            with open(chunk_file(root, q), "rb") as f:
                out.append(f.read())
        return out

    def decode(bufs: list[bytes]) -> list[Any]:
        return [np.frombuffer(codec.decode(b), dtype=np.uint8).reshape(C, C, C) for b in bufs]

    def assemble(p: tuple[int, int, int], chunks: dict[tuple[int, int, int], Any]) -> Any:
        out = np.empty((C + 16,) * 3, dtype=np.uint8)
        lo = [q * C - 8 for q in p]
        for q, ch in chunks.items():
            src, dst = [], []
            for d in range(3):
                a = max(lo[d], q[d] * C)
                b = min(lo[d] + C + 16, q[d] * C + C)
                src.append(slice(a - q[d] * C, b - q[d] * C))
                dst.append(slice(a - lo[d], b - lo[d]))
            out[tuple(dst)] = ch[tuple(src)]
        return out

    decoded = {}
    for p in positions:
        for q in neighbours(p):
            if q not in decoded:
                with open(chunk_file(root, q), "rb") as f:
                    decoded[q] = decode([f.read()])[0]

    async def noop() -> None:
        return None

    async def hop() -> None:
        await asyncio.to_thread(int)

    # the random volume does not compress (zstd stores it raw: decoding is a copy); real
    # volumes do: the same decode for chunks of smoothed noise (a rough EM-like ratio)
    from scipy import ndimage

    smooth = ndimage.gaussian_filter(
        np.random.default_rng(1).integers(0, 256, (C,) * 3).astype(np.float32), 2.0
    )
    smooth = np.clip(np.rint(smooth), 0, 255).astype(np.uint8)  # about 2.5:1
    packed = codec.encode(smooth)
    ratio = smooth.nbytes / len(packed)
    packed27 = [packed] * 27

    def m_decode_packed(p: Any) -> None:
        decode(packed27)

    def m_zarr80(p: Any) -> None:
        arr[sel80(p)]

    def m_files(p: Any) -> None:
        files(p)

    bufs_of = {p: files(p) for p in positions}

    def m_decode(p: Any) -> None:
        decode(bufs_of[p])

    def m_dict(p: Any) -> None:
        assemble(p, {q: decoded[q] for q in neighbours(p)})

    def m_bypass(p: Any) -> None:
        assemble(p, dict(zip(neighbours(p), decode(files(p)), strict=True)))

    def m_zarr27(p: Any) -> None:
        assemble(p, {q: arr[tuple(slice(x * C, x * C + C) for x in q)] for q in neighbours(p)})

    def m_chunk(p: Any) -> None:
        arr[tuple(slice(x * C, x * C + C) for x in p)]

    def m_32(p: Any) -> None:
        arr[tuple(slice(x * C + 16, x * C + 48) for x in p)]

    def m_sync(p: Any) -> None:
        sync(noop())

    def m_hop(p: Any) -> None:
        sync(hop())

    # sanity: every path gives zarr's bytes
    p0 = positions[0]
    want = arr[sel80(p0)]
    assert np.array_equal(assemble(p0, {q: decoded[q] for q in neighbours(p0)}), want)
    assert np.array_equal(
        assemble(p0, dict(zip(neighbours(p0), decode(files(p0)), strict=True))), want
    )

    ms: list[tuple[str, Callable[[Any], None]]] = [
        ("zarr 80^3 (27 chunks)", m_zarr80),
        ("files (27 open+read)", m_files),
        ("decode (27 x zstd, 1 thread)", m_decode),
        (f"decode (27 x zstd, compressible {ratio:.1f}:1)", m_decode_packed),
        ("copy from decoded dict", m_dict),
        ("files+decode+copy (no zarr)", m_bypass),
        ("zarr 27 x 1 chunk + copy", m_zarr27),
        ("zarr 1 aligned chunk", m_chunk),
        ("zarr 32^3 in one chunk", m_32),
        ("zarr sync() hop", m_sync),
        ("zarr sync(to_thread) hop", m_hop),
    ]
    wall: dict[str, list[float]] = {k: [] for k, _ in ms}
    cpu: dict[str, list[float]] = {k: [] for k, _ in ms}
    load0 = os.getloadavg()
    for r in range(args.reps):
        p = positions[r % len(positions)]
        k = r % len(ms)
        for name, fn in ms[k:] + ms[:k]:
            c0, t0 = time.process_time(), time.perf_counter()
            fn(p)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    load1 = os.getloadavg()
    print(
        f"zarr {zarr.__version__}, numcodecs Zstd, {args.size}^3 uint8, chunks {C}^3, "
        f"{args.reps} repetitions, load average {load0[0]:.2f} -> {load1[0]:.2f}"
    )
    print()
    print("| measurement | median ms | min ms | process CPU ms (median) |")
    print("|---|---|---|---|")
    for name, _ in ms:
        print(
            f"| {name} | {statistics.median(wall[name]) * 1e3:.3f} | "
            f"{min(wall[name]) * 1e3:.3f} | {statistics.median(cpu[name]) * 1e3:.3f} |"
        )
    med = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
    rest = (
        med["zarr 80^3 (27 chunks)"]
        - med["files (27 open+read)"]
        - med["decode (27 x zstd, 1 thread)"]
        - med["copy from decoded dict"]
    )
    print()
    print(f"zarr machinery in the 80^3 read (zarr - files - decode - copy): {rest:.2f} ms")
    if args.cprofile:
        profile_counts(arr, [sel80(p) for p in positions[:24]])
    return 0


def profile_counts(arr: Any, sels: list[tuple[slice, ...]]) -> None:
    """cProfile of ``AsyncArray.getitem`` run on this thread's loop: calls per read."""
    import cProfile
    import pstats

    aa = arr._async_array

    async def go() -> None:
        for s in sels:
            await aa.getitem(s)

    asyncio.run(go())
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(go())
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    wanted = ("put", "call_soon", "concurrent_map", "to_thread", "create_task", "_run_once")
    print()
    print(f"calls per 80^3 read ({len(sels)} reads profiled):")
    for (_file, _line, name), (_cc, nc, *_rest) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        if name in wanted or name.endswith(("put'>", "'put' of '_queue.SimpleQueue' objects>")):
            print(f"  {name}: {nc / len(sels):.0f}")


if __name__ == "__main__":
    sys.exit(main())
