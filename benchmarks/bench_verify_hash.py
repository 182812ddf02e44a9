"""Which hash `Task(verify_outputs=True)` uses: crc32c (google-crc32c, a zarr dependency),
xxhash's xxh3_64 and hashlib's blake2b (8-byte digest), on a 128^3 float32 block (8 MiB)
already in memory, as the worker's read-back hands it over. Interleaved repetitions;
prints the median per hash and its throughput.

    .venv/bin/python benchmarks/bench_verify_hash.py --reps 31
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=31)
    args = ap.parse_args()
    data = np.random.default_rng(0).random((128, 128, 128), dtype=np.float32)
    view = memoryview(data).cast("B")
    ro = data.view()  # google-crc32c takes read-only buffers only (not a memoryview)
    ro.flags.writeable = False
    hashes = {}
    import google_crc32c

    hashes["crc32c (google-crc32c)"] = lambda: google_crc32c.value(ro)
    try:
        import xxhash

        hashes["xxh3_64 (xxhash)"] = lambda: xxhash.xxh3_64_intdigest(view)
        hashes["xxh64 (xxhash)"] = lambda: xxhash.xxh64_intdigest(view)
    except ImportError:
        print("xxhash not installed: skipped")
    hashes["blake2b-64 (hashlib)"] = lambda: hashlib.blake2b(view, digest_size=8).digest()
    times: dict[str, list[float]] = {name: [] for name in hashes}
    for _ in range(args.reps):
        for name, fn in hashes.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    size = data.nbytes
    print(f"{size / 2**20:.0f} MiB block, {args.reps} interleaved repetitions (medians)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:24s} {med * 1e3:7.2f} ms  {size / med / 2**30:6.2f} GiB/s")


if __name__ == "__main__":
    main()
