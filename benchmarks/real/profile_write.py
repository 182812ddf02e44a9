"""Where the time of a block's write goes, issue 38: one chunk-aligned write of a 32^3 and
of a 64^3 chunk (uint8, zstd, zarr v3 on the local disk), as W2 writes its outputs.

    python benchmarks/real/profile_write.py [--reps 200] [--data DIR]

One process. Each figure is the median over ``--reps`` repetitions, interleaved (every
repetition runs every measurement once, in a rotated order), each writing a different
chunk of a 512^3 array (32^3 chunks: 4,096 of them; 64^3 chunks: 512). The values are a
thresholded random volume (0 or 1, as W2's outputs: zstd compresses them ~8:1). The load
average is printed.

Measured, per chunk:

* ``zarr []=``: ``arr[chunk] = value`` through zarr-python (W2's write today);
* ``zarr async, own loop``: the same write through zarr's async API awaited on a loop in
  this thread (no hop to zarr's loop thread; its encode and file write still go to threads);
* ``sync() hop`` and ``sync(to_thread) hop``: zarr's ``sync()`` of an empty coroutine, and of
  one ``asyncio.to_thread`` (zarr's zstd codec and its LocalStore each hop once per chunk);
* ``encode``: ``numcodecs.zstd.Zstd.encode`` of the chunk's bytes (what zarr's codec runs);
* ``file write``: the encoded bytes to a temporary file in the chunk's folder, then
  ``os.replace`` (what zarr's LocalStore does, and what the direct path does);
* ``encode + write``: both, in this thread: the floor;
* ``bellis direct``: ``bellis._worker._chunkwrite.write_chunks`` (checks, cast, encode,
  write), the direct write path of declared outputs.

Every path's file is checked byte for byte against zarr's for the same values first.
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

SIZE = 512


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--data", default=None)
    args = ap.parse_args()
    import zarr

    data = args.data or tempfile.mkdtemp(prefix="bench-write-")
    rng = np.random.default_rng(0)
    print(f"zarr {zarr.__version__}, load average {os.getloadavg()}", flush=True)
    for c in (32, 64):
        measure(c, data, args.reps, rng)
    print(f"\nload average after: {os.getloadavg()}")
    return 0


def measure(c: int, data: str, reps: int, rng: Any) -> None:
    """Time each way of writing a ``c``^3 chunk (see the module's docstring) and print."""
    import zarr
    from numcodecs.zstd import Zstd
    from zarr.codecs import ZstdCodec
    from zarr.core.sync import sync

    from bellis._worker._chunkwrite import write_chunks

    codec = Zstd()
    args_reps = reps
    path = os.path.join(data, f"out{c}.zarr")
    arr = zarr.create_array(
        path,
        shape=(SIZE,) * 3,
        chunks=(c,) * 3,
        dtype="uint8",
        compressors=ZstdCodec(),
        overwrite=True,
    )
    n = SIZE // c
    positions = [(i, j, k) for i in range(n) for j in range(n) for k in range(n)]
    rng.shuffle(positions)
    values = [(rng.integers(0, 256, (c,) * 3) > 127).astype(np.uint8) for _ in range(8)]
    state = {"i": 0}

    def nxt() -> tuple[tuple[slice, ...], Any, str]:
        i = state["i"] = state["i"] + 1
        p = positions[i % len(positions)]
        sel = tuple(slice(q * c, q * c + c) for q in p)
        return sel, values[i % len(values)], os.path.join(path, "c", *map(str, p))

    async def noop() -> None:
        return None

    async def hop() -> None:
        await asyncio.to_thread(int)

    loop = asyncio.new_event_loop()

    def m_zarr() -> None:
        sel, v, _ = nxt()
        arr[sel] = v

    def m_async() -> None:
        sel, v, _ = nxt()
        loop.run_until_complete(arr.async_array.setitem(sel, v))

    def m_sync() -> None:
        sync(noop())

    def m_hop() -> None:
        sync(hop())

    def m_encode() -> None:
        _, v, _ = nxt()
        codec.encode(v.reshape(-1))

    encoded = codec.encode(values[0].reshape(-1))

    def put(file: str, blob: Any) -> None:
        tmp = file + ".tmp.partial"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, file)

    def m_write() -> None:
        _, _, file = nxt()
        put(file, encoded)

    def m_both() -> None:
        _, v, file = nxt()
        put(file, codec.encode(v.reshape(-1)))

    def m_direct() -> None:
        sel, v, _ = nxt()
        assert write_chunks(arr, sel, v)

    # every file of every chunk exists (the folders too) before timing; then check
    # that each path writes zarr's bytes
    arr[...] = 1
    sel, v, file = nxt()
    arr[sel] = v
    with open(file, "rb") as f:
        want = f.read()
    for label, write in (
        ("encode + write", lambda: put(file, codec.encode(v.reshape(-1)))),
        ("bellis direct", lambda: write_chunks(arr, sel, v)),
        ("zarr async", lambda: loop.run_until_complete(arr.async_array.setitem(sel, v))),
    ):
        os.remove(file)
        write()
        with open(file, "rb") as f:
            assert f.read() == want, f"{label}: not zarr's bytes"
    ms: list[tuple[str, Callable[[], None]]] = [
        ("zarr []=", m_zarr),
        ("zarr async, own loop", m_async),
        ("sync() hop", m_sync),
        ("sync(to_thread) hop", m_hop),
        ("encode (zstd)", m_encode),
        ("file write (tmp + replace)", m_write),
        ("encode + write", m_both),
        ("bellis direct", m_direct),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in ms}
    for rep in range(args_reps):
        k = rep % len(ms)
        for name, fn in ms[k:] + ms[:k]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    loop.close()
    print(
        f"\n{c}^3 chunk (uint8, zstd level 0, {len(encoded)} bytes encoded of "
        f"{c**3}); medians of {args_reps}, ms"
    )
    print("| measurement | median ms | p10 ms | p90 ms |")
    print("|---|---|---|---|")
    for name, _ in ms:
        t = sorted(times[name])
        print(
            f"| {name} | {statistics.median(t) * 1e3:.3f} | "
            f"{t[len(t) // 10] * 1e3:.3f} | {t[len(t) * 9 // 10] * 1e3:.3f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
