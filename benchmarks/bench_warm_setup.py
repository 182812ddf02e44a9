"""W2 of issue 37: opening the arrays per block, once per worker with ``Task(setup=...)``,
and once per worker in a hand-written spawn function.

4,096 blocks of 32^3 from a 512^3 uint8 zarr v3 array (chunks 64^3, zstd, random values,
made here in a temporary folder), a threshold kernel that writes a uint8 zarr v3 output
(chunks 32^3: one chunk per block), 2 workers. Variants, each one fresh process per
measurement, interleaved (the order rotates every repetition):

* ``per_block``: ``zarr.open_array`` of input and output inside the block function (the
  daisy tutorial's way);
* ``setup``: the same block function as ``fn(block, ctx)``, the arrays opened once per worker
  by ``Task(setup=open_arrays)``;
* ``open_once``: a spawn function (no arguments) that opens the arrays once and runs its own
  ``Client().acquire_block()`` loop, the way to open once before ``setup=``;
* ``daisy_per_block``: daisy 2.0.0's ``per_block`` (where ``import daisy`` is daisy 2.0.0).

What is timed: the ``run_blockwise`` call, in the measuring process. Each run's output is
checked (every block written, and equal to the threshold of its input on sampled blocks).
Reported: per variant the median wall; per repetition the ratios to ``open_once`` of that
repetition, and their medians; the load average before and after each measurement.

    python benchmarks/bench_warm_setup.py --reps 5 --json /tmp/w2.json

``--size 256`` makes a 256^3 volume (512 blocks) for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BLOCK = 32
VARIANTS = ("per_block", "setup", "open_once", "daisy_per_block")
DATA = os.environ.get("W2_DATA", "")


# -- what the workers run (shipped by value from the measuring process's __main__) ---------


def open_arrays() -> tuple[Any, Any]:
    import zarr

    data = os.environ["W2_DATA"]
    return zarr.open_array(data + "/raw.zarr", mode="r"), zarr.open_array(
        data + "/mask.zarr", mode="r+"
    )


def _threshold(block: Any, raw: Any, mask: Any) -> None:
    o = block.write_roi.offset
    s = block.write_roi.shape
    index = tuple(slice(a, a + n) for a, n in zip(o, s, strict=True))
    mask[index] = (raw[index] > 127).view("uint8")


def per_block(block: Any) -> None:
    raw, mask = open_arrays()
    _threshold(block, raw, mask)


def with_ctx(block: Any, arrays: Any) -> None:
    _threshold(block, *arrays)


def open_once_worker() -> None:
    import bellis

    raw, mask = open_arrays()
    client = bellis.Client()
    while True:
        with client.acquire_block() as block:
            if block is None:
                break
            _threshold(block, raw, mask)


# -- one measurement ---------------------------------------------------------------------


def measure(variant: str, data: str, size: int) -> dict[str, Any]:
    import numpy as np
    import zarr

    zarr.create_array(
        data + "/mask.zarr",
        shape=(size,) * 3,
        chunks=(BLOCK,) * 3,
        dtype="uint8",
        overwrite=True,
    )
    if variant == "daisy_per_block":
        import daisy
    else:
        import bellis as daisy
    from funlib.geometry import Roi

    fn: Any = {
        "per_block": per_block,
        "daisy_per_block": per_block,
        "setup": with_ctx,
        "open_once": open_once_worker,
    }[variant]
    kw: dict[str, Any] = {"setup": open_arrays} if variant == "setup" else {}
    task = daisy.Task(
        "w2",
        total_roi=Roi((0, 0, 0), (size,) * 3),
        read_roi=Roi((0, 0, 0), (BLOCK,) * 3),
        write_roi=Roi((0, 0, 0), (BLOCK,) * 3),
        process_function=fn,
        read_write_conflict=False,
        max_workers=2,
        **kw,
    )
    run_kw: dict[str, Any] = {"multiprocessing": True, "progress": False}
    if variant != "daisy_per_block":
        run_kw["summary"] = False
    import resource

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reaped workers
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    load0 = os.getloadavg()[0]
    c0 = cpu()
    t0 = time.perf_counter()
    ok = daisy.run_blockwise([task], **run_kw)
    wall = time.perf_counter() - t0
    cpu_seconds = cpu() - c0
    load1 = os.getloadavg()[0]
    if not ok:
        raise SystemExit(f"{variant}: run_blockwise returned {ok!r}")
    raw = zarr.open_array(data + "/raw.zarr", mode="r")
    mask = zarr.open_array(data + "/mask.zarr", mode="r")
    n = (size // BLOCK) ** 3
    written = sum(1 for _ in Path(data, "mask.zarr", "c").rglob("*") if _.is_file())
    if written != n:
        raise SystemExit(f"{variant}: {written} output chunks, not {n}")
    rng = np.random.default_rng(0)
    for _ in range(8):
        z, y, x = (int(v) * BLOCK for v in rng.integers(0, size // BLOCK, 3))
        index = (slice(z, z + BLOCK), slice(y, y + BLOCK), slice(x, x + BLOCK))
        if not np.array_equal(mask[index], (raw[index] > 127).view("uint8")):
            raise SystemExit(f"{variant}: wrong output at {z, y, x}")
    return {
        "variant": variant,
        "impl": f"{daisy.__name__} {getattr(daisy, '__version__', '')}".strip(),
        "wall": wall,
        "cpu": cpu_seconds,
        "blocks": n,
        "load_before": load0,
        "load_after": load1,
    }


# -- the campaign --------------------------------------------------------------------------


def make_data(folder: str, size: int) -> None:
    import numpy as np
    import zarr
    from zarr.codecs import ZstdCodec

    raw = zarr.create_array(
        folder + "/raw.zarr",
        shape=(size,) * 3,
        chunks=(64,) * 3,
        dtype="uint8",
        compressors=ZstdCodec(),
    )
    rng = np.random.default_rng(37)
    for z in range(0, size, 64):
        raw[z : z + 64] = rng.integers(0, 256, (64, size, size), dtype=np.uint8)


def has_daisy2() -> bool:
    code = "import daisy, sys; sys.exit(0 if daisy.__version__ == '2.0.0' else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def campaign(reps: int, size: int, variants: list[str]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bellis-w2-") as data:
        make_data(data, size)
        for rep in range(reps):
            order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
            for variant in order:
                cwd = Path(data, "run")
                cwd.mkdir(exist_ok=True)
                proc = subprocess.run(
                    [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--one",
                        variant,
                        "--size",
                        str(size),
                    ],
                    capture_output=True,
                    text=True,
                    cwd=cwd,
                    env={**os.environ, "W2_DATA": data},
                    timeout=1800,
                )
                if proc.returncode != 0:
                    raise SystemExit(f"{variant} failed:\n{proc.stdout}\n{proc.stderr}")
                rec = json.loads(proc.stdout.strip().splitlines()[-1])
                rec["rep"] = rep
                results.append(rec)
                print(
                    f"rep {rep} {variant:16s} {rec['wall']:7.3f} s  cpu {rec['cpu']:7.2f} s  load "
                    f"{rec['load_before']:.2f}->{rec['load_after']:.2f}",
                    file=sys.stderr,
                )
    return summarize(results, variants)


def summarize(results: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    by = {v: [r for r in results if r["variant"] == v] for v in variants}
    out: dict[str, Any] = {"records": results, "variants": {}}
    base = {r["rep"]: r for r in by.get("open_once", [])}
    for v in variants:
        walls = [r["wall"] for r in by[v]]
        ratios = [r["wall"] / base[r["rep"]]["wall"] for r in by[v] if r["rep"] in base]
        cpus = [r["cpu"] for r in by[v]]
        cpu_ratios = [r["cpu"] / base[r["rep"]]["cpu"] for r in by[v] if r["rep"] in base]
        out["variants"][v] = {
            "impl": by[v][0]["impl"] if by[v] else None,
            "median_wall": statistics.median(walls),
            "walls": walls,
            "ratios_to_open_once": ratios,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "median_cpu": statistics.median(cpus),
            "cpus": cpus,
            "cpu_ratios_to_open_once": cpu_ratios,
            "median_cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
        }
    loads = [x for r in results for x in (r["load_before"], r["load_after"])]
    out["load_average"] = {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}
    return out


def markdown(summary: dict[str, Any], reps: int, size: int) -> str:
    n = (size // BLOCK) ** 3
    lines = [
        f"{n} blocks of {BLOCK}^3 from a {size}^3 uint8 zarr v3 array, 2 workers, {reps} "
        "interleaved repetitions (fresh process each), load average "
        f"{summary['load_average']['min']:.2f}-{summary['load_average']['max']:.2f} "
        f"(median {summary['load_average']['median']:.2f}).",
        "",
        "| variant | impl | median wall (s) | wall / open_once (paired median; each rep) "
        "| CPU s (driver + workers) | CPU / open_once (paired median; each rep) |",
        "|---|---|---|---|---|---|",
    ]
    for v, d in summary["variants"].items():
        ratios = ", ".join(f"{r:.3f}" for r in d["ratios_to_open_once"])
        med = "-" if d["median_ratio"] is None else f"{d['median_ratio']:.3f}"
        cpu_ratios = ", ".join(f"{r:.3f}" for r in d["cpu_ratios_to_open_once"])
        cmed = "-" if d["median_cpu_ratio"] is None else f"{d['median_cpu_ratio']:.3f}"
        lines.append(
            f"| {v} | {d['impl']} | {d['median_wall']:.3f} | **{med}** ({ratios}) "
            f"| {d['median_cpu']:.1f} | **{cmed}** ({cpu_ratios}) |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--json", default=None)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, os.environ["W2_DATA"], args.size)))
        return
    variants = [v for v in args.variants.split(",") if v]
    if "daisy_per_block" in variants and not has_daisy2():
        print("daisy 2.0.0 is not installed here: daisy_per_block left out", file=sys.stderr)
        variants.remove("daisy_per_block")
    summary = campaign(args.reps, args.size, variants)
    summary["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(markdown(summary, args.reps, args.size))


if __name__ == "__main__":
    main()
