"""Real workloads, issue 38: what blocks that read zarr chunks cost under each runner.

Generates its own data: a ``size``^3 uint8 zarr v3 array of uniform random values, chunks
64^3, zstd (zarr's default codecs with ``ZstdCodec()``), made once per campaign in the data
directory. Workloads (``real/work.py``), each over the whole volume, zero-padded at its edge:

* W1: gaussian sigma=2 (scipy.ndimage, float32, rounded to uint8), write 128^3, context 8;
* W2: threshold (> 127), 32^3 blocks, no context (the output chunked 32^3: 32^3 blocks
  writing 64^3 chunks race in zarr's read-modify-write of a chunk, and lose writes);
* W3: smooth (gaussian, 64^3, context 8) -> threshold and label (scipy.ndimage.label, context
  4, ``read_write_conflict=True``; labels numbered per block so that outputs do not depend on
  the order blocks ran in), ``workers`` workers in all.

Runners (``real/runners.py``): ``single`` (one process, z-y-x order: the ideal is its
block-time sum / workers), ``split`` (a static split of the block loop over ``workers``
forked processes, contiguous halves, a barrier between stages; ``split-shuffled``: each half
in a random order), ``bellis`` (``workers``
workers; W3 with ``requires={"cpu": 1}`` and ``resources={"cpu": workers}``),
``bellis+inputs`` (the same with ``Task(inputs=[...])``, where bellis has it: each task
declares its input and, so that an input the run writes is never cached, its output; a
variant ``bellis:KEY=VALUE[:KEY=VALUE]`` passes Task keywords, compared in the same run),
``bellis-base`` (``bellis`` imported from ``--base-src DIR``, an earlier commit's ``src``
folder: before and after in one interleaved run), ``daisy``
(daisy 2.0.0 as ``import daisy``, ``num_workers=workers`` per task: daisy has no shared
budget) and ``dask`` (dask.array, ``map_overlap``, threaded scheduler with ``workers`` threads).

Each measurement is a fresh process; repetitions are interleaved, the runner order rotated
per repetition, and each record holds the wall, the load average before and after, the
driver's and the reaped children's CPU, and the block times the kernels measured inside the
block function (read, compute, write: dask's are the compute only). Every output is hashed
and compared with the ``single`` runner's, byte for byte; a mismatch is an error.

    python benchmarks/bench_real.py --size 256 --reps 3 --workloads W1,W2,W3
    python benchmarks/bench_real.py --size 64 --reps 1 --runners single,split,bellis
    python benchmarks/bench_real.py --bellis-opt resource_tracking=true   # every bellis run
    python benchmarks/bench_real.py --runners split,bellis,bellis:resource_tracking=true
    python benchmarks/bench_real.py --runners \
        split,bellis+inputs,bellis+inputs:env.OMP_NUM_THREADS=1   # an environment

Prints a markdown table per workload: medians, and ratios against the static split (the
median over repetitions of the paired ratio); then, per bellis task, the input cache's
counters (``task.report().input_cache``: decodes per block = misses / blocks), bellis's
locality counters (``TaskState.locality_*``) and the peak RSS of the largest reaped
process (``ru_maxrss`` of the children: a worker, or a split process). ``--raw FILE``
keeps the records (JSONL).
Exit status 1 when a measurement failed or an output differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from real import runners as _runners, work  # noqa: E402

DEFAULT_RUNNERS = ["single", "split", "bellis", "bellis+inputs", "daisy", "dask"]


def _parse_opts(items: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        low = value.lower()
        if low in ("true", "false"):
            opts[key] = low == "true"
        else:
            try:
                opts[key] = json.loads(value)
            except ValueError:
                opts[key] = value
    return opts


def _read_timings(timing_dir: str, per_axis: dict[str, int]) -> dict[str, Any]:
    """Block-time sums per kernel from the per-process logs, and how spatially coherent each
    process's stream of blocks was: ``neighbour_share``, the share of blocks that follow,
    in the same process, a grid neighbour (26-neighbourhood) of the same kernel."""
    per: dict[str, dict[str, float]] = {}
    pids = 0
    follows = neighbours = 0
    for name in os.listdir(timing_dir):
        pids += 1
        last: dict[str, int] = {}
        with open(os.path.join(timing_dir, name)) as f:
            for line in f:
                kernel, r, c, w, cpu, idx = line.split("\t")
                d = per.setdefault(
                    kernel, {"blocks": 0, "read": 0.0, "compute": 0.0, "write": 0.0, "cpu": 0.0}
                )
                d["blocks"] += 1
                d["read"] += float(r)
                d["compute"] += float(c)
                d["write"] += float(w)
                d["cpu"] += float(cpu)
                i, n = int(idx), per_axis.get(kernel, 0)
                if i >= 0 and n and kernel in last:
                    a, b = last[kernel], i
                    ga = (a // (n * n), a // n % n, a % n)
                    gb = (b // (n * n), b // n % n, b % n)
                    follows += 1
                    neighbours += max(abs(x - y) for x, y in zip(ga, gb, strict=True)) == 1
                last[kernel] = int(idx)
    total = {
        k: sum(d[k] for d in per.values()) for k in ("blocks", "read", "compute", "write", "cpu")
    }
    total["sum"] = total["read"] + total["compute"] + total["write"]
    share = neighbours / follows if follows else float("nan")
    return {"per_kernel": per, "total": total, "processes": pids, "neighbour_share": share}


def measure_one(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    stages = work.WORKLOADS[args.workload]
    raw = work.ensure_raw(args.data, args.size)
    run_dir = tempfile.mkdtemp(prefix=f"run-{args.workload}-", dir=args.data)
    try:
        paths = {"raw": raw}
        for stage in stages:
            paths[stage.output] = os.path.join(run_dir, f"{stage.output}.zarr")
            work.make_array(paths[stage.output], args.size, stage.dtype, stage.out_chunk)
        timing_dir = os.path.join(run_dir, "timing")
        os.mkdir(timing_dir)
        base, *variant = args.runner.split(":")
        options = _parse_opts(args.bellis_opt + variant) if base.startswith("bellis") else {}
        # env.NAME=VALUE items set the measurement's environment (``campaign``), not Task
        options = {k: v for k, v in options.items() if not k.startswith("env.")}
        if base == "bellis+inputs":
            options["inputs"] = True
        fn = _runners.RUNNERS[base]
        cwd = os.getcwd()
        os.chdir(run_dir)
        load0 = os.getloadavg()
        self0 = resource.getrusage(resource.RUSAGE_SELF)
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        try:
            info = fn(_runners.Job(stages, paths, timing_dir, args.size, args.workers, options))
        finally:
            wall = time.perf_counter() - t0
            os.chdir(cwd)
        self1 = resource.getrusage(resource.RUSAGE_SELF)
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load1 = os.getloadavg()
        rec: dict[str, Any] = {
            "status": "ok",
            "runner": args.runner,
            "workload": args.workload,
            "size": args.size,
            "workers": args.workers,
            "options": {k: v for k, v in options.items()},
            "wall_s": wall,
            "load_before": load0,
            "load_after": load1,
            "driver_cpu_s": (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime),
            "children_cpu_s": (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime),
            # peak RSS (KiB, Linux) of the largest reaped descendant (a worker; the split's
            # processes) and of the measurement process itself (the driver; single's loop)
            "children_maxrss_kib": kids1.ru_maxrss,
            "self_maxrss_kib": self1.ru_maxrss,
            "blocks": _read_timings(
                timing_dir, {st.kernel: args.size // st.write for st in stages}
            ),
            "info": info,
        }
        if args.check:
            rec["digests"] = {s.output: work.digest(paths[s.output]) for s in stages}
        return rec
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _one_main(args: argparse.Namespace) -> int:
    try:
        rec = measure_one(args)
        code = 0
    except Exception as exc:  # a failed measurement is a record, and exit status 1
        import traceback

        rec = {
            "status": "error",
            "runner": args.runner,
            "workload": args.workload,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
        code = 1
    with open(args.json, "w") as f:
        json.dump(rec, f)
    return code


def _available(
    runners: list[str], explicit: bool, base_src: str | None = None
) -> tuple[list[str], list[str]]:
    keep, notes = [], []
    for r in runners:
        base, *variant = r.split(":")
        if base not in _runners.RUNNERS or (variant and not base.startswith("bellis")):
            raise SystemExit(
                f"--runners: unknown runner {r!r}; use {sorted(_runners.RUNNERS)}, or "
                "bellis:KEY=VALUE[:KEY=VALUE] for a bellis variant"
            )
        ok, why = True, ""
        if base == "bellis+inputs" and not _runners.bellis_has_inputs():
            ok, why = False, "bellis.Task has no inputs= parameter"
        elif base == "bellis-base" and not base_src:
            ok, why = False, "no --base-src (the src folder of the bellis to compare with)"
        elif r == "daisy" and not _runners.daisy_available():
            ok, why = False, "daisy 2.0.0 not installed (.ci/install_anchors.sh)"
        elif r == "dask" and not _runners.dask_available():
            ok, why = False, "dask not installed"
        if ok:
            keep.append(r)
        else:
            notes.append(f"{r}: skipped, {why}")
            if explicit:
                print(f"warning: {r} skipped: {why}", file=sys.stderr)
    return keep, notes


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(
    records: list[dict[str, Any]], runners: list[str], workloads: list[str], workers: int
) -> tuple[str, list[str]]:
    """The markdown tables, and the list of problems (failed runs, differing outputs)."""
    problems: list[str] = []
    lines: list[str] = []
    for wl in workloads:
        recs = [r for r in records if r.get("workload") == wl]
        for r in recs:
            if r["status"] != "ok":
                problems.append(f"{wl} {r['runner']} rep {r.get('rep')}: {r['error']}")
        ok = [r for r in recs if r["status"] == "ok"]
        ref = next((r["digests"] for r in ok if r["runner"] == "single" and "digests" in r), None)
        if ref is not None:
            for r in ok:
                if "digests" in r and r["digests"] != ref:
                    bad = [k for k in ref if r["digests"].get(k) != ref[k]]
                    problems.append(
                        f"{wl} {r['runner']} rep {r['rep']}: output differs from "
                        f"single's: {', '.join(bad)}"
                    )
        by: dict[str, list[dict[str, Any]]] = {}
        for r in ok:
            by.setdefault(r["runner"], []).append(r)
        split = {r["rep"]: r for r in by.get("split", [])}
        single_sum = _med([r["blocks"]["total"]["sum"] for r in by.get("single", [])])
        ideal = single_sum / workers
        loads = [r["load_before"][0] for r in ok]
        lines.append(f"### {wl}: {work.describe(wl, ok[0]['size'] if ok else 0)}")
        lines.append("")
        lines.append(
            f"ideal (single's block-time sum / {workers}) = {ideal:.2f} s; "
            f"load average (1 min) at the runs' starts: median {_med(loads):.2f}, "
            f"range {min(loads, default=0):.2f}-{max(loads, default=0):.2f}"
        )
        lines.append("")
        lines.append(
            "| runner | runs | wall s | wall / split | ideal / wall | block sum s | "
            "sum / split | read s | compute s | write s | block CPU s | CPU / split | "
            "driver CPU s | all CPU s | neighbour share |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name in runners:
            rs = by.get(name, [])
            if not rs:
                continue
            walls = [r["wall_s"] for r in rs]
            sums = [r["blocks"]["total"]["sum"] for r in rs]
            wr = [r["wall_s"] / split[r["rep"]]["wall_s"] for r in rs if r["rep"] in split]
            sr = [
                r["blocks"]["total"]["sum"] / split[r["rep"]]["blocks"]["total"]["sum"]
                for r in rs
                if r["rep"] in split
            ]
            tot = {
                k: _med([r["blocks"]["total"][k] for r in rs])
                for k in ("read", "compute", "write", "cpu")
            }
            cr = [
                r["blocks"]["total"]["cpu"] / split[r["rep"]]["blocks"]["total"]["cpu"]
                for r in rs
                if r["rep"] in split
            ]
            allcpu = _med([r["driver_cpu_s"] + r["children_cpu_s"] for r in rs])
            share = _med([r["blocks"].get("neighbour_share", float("nan")) for r in rs])
            lines.append(
                f"| {name} | {len(rs)} | {_med(walls):.2f} | {_med(wr):.3f} | "
                f"{ideal / _med(walls):.3f} | {_med(sums):.2f} | {_med(sr):.3f} | "
                f"{tot['read']:.2f} | {tot['compute']:.2f} | {tot['write']:.2f} | "
                f"{tot['cpu']:.2f} | {_med(cr):.3f} | "
                f"{_med([r['driver_cpu_s'] for r in rs]):.2f} | {allcpu:.2f} | {share:.2f} |"
            )
        lines.append("")
        lines.extend(_cache_table(by, runners))
    return "\n".join(lines), problems


def _cache_table(by: dict[str, list[dict[str, Any]]], runners: list[str]) -> list[str]:
    """Per bellis runner and task: the input cache's counters (decodes per block = misses
    / blocks), bellis's own locality counters, and the peak RSS of the largest process."""
    rows = []
    for name in runners:
        rs = by.get(name, [])
        rss = _med([r.get("children_maxrss_kib", float("nan")) / 1024 for r in rs])
        own = _med([r.get("self_maxrss_kib", float("nan")) / 1024 for r in rs])
        tasks = (rs[0].get("info") or {}).get("tasks") if rs else None
        if not tasks:
            rows.append(f"| {name} | - | - | - | - | - | - | - | - | {rss:.0f} | {own:.0f} |")
            continue
        for tid in tasks:
            per = [r["info"]["tasks"][tid] for r in rs if tid in r["info"].get("tasks", {})]

            def med(key: str, per: list[dict[str, Any]] = per) -> float:
                return _med([float((t["input_cache"] or {}).get(key, 0)) for t in per])

            has = any(t["input_cache"] for t in per)
            dec = _med(
                [(t["input_cache"] or {}).get("misses", 0) / max(1, t["blocks"]) for t in per]
            )
            loc = _med(
                [t["locality_local"] / t["locality_blocks"] for t in per if t["locality_blocks"]]
            )
            step = _med(
                [t["locality_steps"] / t["locality_blocks"] for t in per if t["locality_blocks"]]
            )
            cache = (
                f"{med('hits'):.0f} | {med('misses'):.0f} | **{dec:.3f}** | "
                f"{med('miss_bytes') / 2**20:.1f} | {med('bypassed'):.0f}"
                if has
                else "- | - | - | - | -"
            )
            rows.append(
                f"| {name} | {tid} | {cache} | {loc:.3f} | {step:.2f} | {rss:.0f} | {own:.0f} |"
            )
    return [
        "| runner | task | cache hits | misses (decodes) | decodes / block | decoded MiB | "
        "bypassed reads | bellis locality (local share) | mean step | peak RSS MiB, "
        "largest child | peak RSS MiB, driver |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def campaign(args: argparse.Namespace) -> int:
    explicit = args.runners is not None
    wanted = args.runners.split(",") if explicit else list(DEFAULT_RUNNERS)
    runners, notes = _available(wanted, explicit, args.base_src)
    workloads = args.workloads.split(",")
    for wl in workloads:
        if wl not in work.WORKLOADS:
            raise SystemExit(f"--workloads: unknown workload {wl!r}; use {sorted(work.WORKLOADS)}")
    if args.size % 128:
        raise SystemExit(f"--size {args.size}: must be a multiple of 128 (W1's blocks); e.g. 256")
    own_data = args.data is None
    data = args.data or tempfile.mkdtemp(prefix="bench-real-")
    os.makedirs(data, exist_ok=True)
    records: list[dict[str, Any]] = []
    raw_out = open(args.raw, "a") if args.raw else None
    try:
        t0 = time.perf_counter()
        work.ensure_raw(data, args.size)
        print(
            f"data: {data}/raw_{args.size}.zarr ({time.perf_counter() - t0:.1f} s)", file=sys.stderr
        )
        for rep in range(args.reps):
            k = rep % len(runners)
            order = runners[k:] + runners[:k]
            for wl in workloads:
                for name in order:
                    out = os.path.join(data, f"rec-{rep}-{wl}-{name}.json")
                    cmd = [
                        sys.executable,
                        os.path.abspath(__file__),
                        "--one",
                        "--runner",
                        name,
                        "--workload",
                        wl,
                        "--size",
                        str(args.size),
                        "--data",
                        data,
                        "--workers",
                        str(args.workers),
                        "--json",
                        out,
                    ]
                    cmd += [f"--bellis-opt={o}" for o in args.bellis_opt]
                    if not args.check:
                        cmd.append("--no-check")
                    env = None
                    envs = [v[4:] for v in name.split(":")[1:] if v.startswith("env.")]
                    if envs:  # a variant's environment: bellis+inputs:env.NAME=VALUE
                        env = dict(os.environ)
                        env.update(e.partition("=")[::2] for e in envs)
                    if name.split(":")[0] == "bellis-base":
                        # that bellis first on the path (ahead of the installed one)
                        env = dict(env or os.environ)
                        env["PYTHONPATH"] = os.pathsep.join(
                            [os.path.abspath(args.base_src)]
                            + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                        )
                    proc = subprocess.run(
                        cmd,
                        timeout=args.timeout,
                        stdin=subprocess.DEVNULL,
                        stdout=sys.stderr,
                        env=env,
                    )
                    try:
                        with open(out) as f:
                            rec = json.load(f)
                        os.unlink(out)
                    except (OSError, ValueError):
                        rec = {
                            "status": "error",
                            "runner": name,
                            "workload": wl,
                            "error": f"no record (exit status {proc.returncode})",
                        }
                    rec["rep"] = rep
                    records.append(rec)
                    if raw_out:
                        raw_out.write(json.dumps(rec) + "\n")
                        raw_out.flush()
                    wall = f"{rec['wall_s']:.2f} s" if rec["status"] == "ok" else rec["error"]
                    print(f"rep {rep} {wl} {name}: {wall}", file=sys.stderr)
    finally:
        if raw_out:
            raw_out.close()
        if own_data and not args.keep_data:
            shutil.rmtree(data, ignore_errors=True)
    text, problems = report(records, runners, workloads, args.workers)
    head = (
        f"size {args.size}^3, chunks 64^3 zstd, {args.workers} workers, {args.reps} "
        f"repetitions, runners {', '.join(runners)}"
    )
    print(head)
    for n in notes:
        print(f"- {n}")
    print()
    print(text)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=512, help="edge of the volume (multiple of 128)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default="W1,W2,W3")
    ap.add_argument(
        "--runners",
        default=None,
        help=f"comma-separated, from {','.join(DEFAULT_RUNNERS)} (default: all that are installed)",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--bellis-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Task keyword for the bellis runners, e.g. resource_tracking=false",
    )
    ap.add_argument(
        "--base-src",
        default=None,
        metavar="DIR",
        help="runner bellis-base: bellis imported from DIR (the src folder of an earlier "
        "commit: git archive COMMIT src | tar -x -C /tmp/base)",
    )
    ap.add_argument("--data", default=None, help="data directory (default: a temporary one)")
    ap.add_argument("--keep-data", action="store_true")
    ap.add_argument("--raw", default=None, help="append every record to this JSONL file")
    ap.add_argument(
        "--no-check", dest="check", action="store_false", help="do not hash the outputs"
    )
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runner", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return _one_main(args)
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
