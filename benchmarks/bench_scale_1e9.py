"""Scale benchmarks for issue 18: 10^9-block tasks and pipelines of many tasks.

Every figure is measured in a fresh interpreter (one subprocess per case), so the peak
RSS (``VmHWM``) is that of the case alone. Stores go under ``--dir`` (default: a new
directory under /tmp) and are deleted at the end unless ``--keep``.

    PYTHONPATH=src python benchmarks/bench_scale_1e9.py dist     [--side 1000] [--blocks 10000]
    PYTHONPATH=src python benchmarks/bench_scale_1e9.py perblock [--sides 22,1000] [--blocks 100000]
    PYTHONPATH=src python benchmarks/bench_scale_1e9.py resume   [--side 1000]
    PYTHONPATH=src python benchmarks/bench_scale_1e9.py status   [--side 1000]   (also times report)
    PYTHONPATH=src python benchmarks/bench_scale_1e9.py migrate  [--old 900] [--side 1000]
    PYTHONPATH=src python benchmarks/bench_scale_1e9.py pipeline [--tasks 10,50,200] [--blocks 1000]

``dist``: a 3-D conflict task of side^3 blocks (write 10, context 2), tracking on, resource
tracking off, run on 2 local workers; the time from before ``Task(...)`` until the driver
has seen ``--blocks`` blocks completed (the run is then interrupted with SIGINT). Targets at
side 1000: < 20 s, driver peak RSS < 4 GiB.

``perblock``: µs per block of a serial and of a distributed (2 workers) no-op run: the
slope of completed blocks over time between the first progress sample with a completed
block and the sample that reaches ``--blocks`` (or the end of the task). Target: the figure
at side 1000 (10^9 blocks) within 1.5x of the figure at side 22 (~10^4 blocks).

``resume``: a store with every block done; a serial run of the task skips all of them.
Target < 60 s, < 4 GiB. ``status``: ``bellis status`` and ``bellis report`` on that store
(CLI subprocesses). Targets < 10 s each. ``migrate``: a done store of old^3 blocks opened
by a task of side^3 blocks (the grown-volume migration). Target < 120 s.

``pipeline``: chains and fan-ins of N tasks of ``--blocks`` blocks each; scheduler
construction time and µs per block of a serial no-op run, for each N.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WRITE = 10
CONTEXT = 2


def vm_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return -1


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def noop(block: object) -> None:
    pass


class _Stamper:
    """A no-op block function (picklable) that stamps block 1 and every 500th."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.n = 0

    def __call__(self, block: object) -> None:
        self.n += 1
        if self.n == 1 or self.n % 500 == 0:
            with open(f"{self.directory}/{os.getpid()}", "a") as f:
                f.write(f"{self.n} {time.time()}\n")


def conflict_task(daisy: Any, task_id: str, side: int, store: Path | None, fn: Any = noop) -> Any:
    total = daisy.Roi((0, 0, 0), tuple(side * WRITE + 2 * CONTEXT for _ in range(3)))
    read = daisy.Roi((0, 0, 0), (WRITE + 2 * CONTEXT,) * 3)
    write = daisy.Roi((CONTEXT,) * 3, (WRITE,) * 3)
    return daisy.Task(
        task_id,
        total,
        read,
        write,
        process_function=fn,
        read_write_conflict=True,
        tracking_path=store if store is not None else False,
        resource_tracking=False,
        max_workers=2,
    )


class StopAfter:
    """A progress observer: records (time, completed) samples; SIGINTs the run at ``n``."""

    def __init__(self, task_id: str, n: int) -> None:
        self.task_id = task_id
        self.n = n
        self.samples: list[tuple[float, int]] = []
        self.reached: float | None = None

    def _sample(self, states: Any) -> None:
        c = states[self.task_id].completed_count
        now = time.perf_counter()
        self.samples.append((now, c))
        if c >= self.n and self.reached is None:
            self.reached = now
            os.kill(os.getpid(), signal.SIGINT)

    def on_start(self, states: Any) -> None:
        self._sample(states)

    def on_progress(self, states: Any) -> None:
        self._sample(states)

    def on_finish(self, states: Any) -> None:
        self._sample(states)

    def per_block_us(self) -> tuple[float, int]:
        """µs per block between the first sample with a completed block and the first
        sample at or past ``n`` (or the last sample)."""
        first = next((s for s in self.samples if s[1] > 0), None)
        last = next((s for s in self.samples if s[1] >= self.n), self.samples[-1])
        if first is None or last[1] <= first[1]:
            return float("nan"), 0
        return (last[0] - first[0]) / (last[1] - first[1]) * 1e6, last[1] - first[1]


def _run_until(daisy: Any, task: Any, n: int, multiprocessing: bool) -> tuple[StopAfter, bool]:
    obs = StopAfter(task.task_id, n)
    interrupted = False
    try:
        daisy.run_blockwise([task], multiprocessing=multiprocessing, progress=obs, summary=False)
    except KeyboardInterrupt:
        interrupted = True
    return obs, interrupted


# -- cases (each runs in its own interpreter) ----------------------------------------------


def case_dist(args: argparse.Namespace) -> dict[str, Any]:
    import bellis as daisy

    store = Path(args.dir) / f"dist-{args.side}"
    t0 = time.perf_counter()
    task = conflict_task(daisy, "big", args.side, store)
    obs, interrupted = _run_until(daisy, task, args.blocks, True)
    t_end = time.perf_counter()
    reached = obs.reached
    return {
        "case": "dist",
        "blocks": args.side**3,
        "until_n": args.blocks,
        "seconds_to_n": None if reached is None else reached - t0,
        "first_sample_s": obs.samples[0][0] - t0,
        "seconds_total_with_shutdown": t_end - t0,
        "peak_rss_gib": vm_hwm_bytes() / 2**30,
        "interrupted": interrupted,
        "load": load(),
    }


def case_perblock(args: argparse.Namespace) -> dict[str, Any]:
    import bellis as daisy

    mp = args.mode == "dist"
    t0 = time.perf_counter()
    if mp:
        # the workers stamp their first block and every 500th in a file per process;
        # µs per block = the span from the first stamp to the last over the blocks between
        stamp_dir = Path(args.dir) / f"stamps-{args.side}"
        shutil.rmtree(stamp_dir, ignore_errors=True)
        stamp_dir.mkdir(parents=True)
        task = conflict_task(daisy, "pb", args.side, None, _Stamper(str(stamp_dir)))
        _run_until(daisy, task, args.blocks, mp)
        firsts, lasts, counted = [], [], 0
        for f in stamp_dir.iterdir():
            rows = [ln.split() for ln in f.read_text().splitlines()]
            firsts.append(float(rows[0][1]))
            lasts.append(float(rows[-1][1]))
            counted += int(rows[-1][0]) - 1
        us = (max(lasts) - min(firsts)) / counted * 1e6 if counted else float("nan")
    else:
        # serial: the block function runs here, so it times the blocks itself (from the
        # first block to the n-th, or to the last block of a smaller task)
        stamps: list[float] = []  # first block, last block
        n = args.blocks

        def timed(block: object) -> None:
            now = time.perf_counter()
            if stamps:
                stamps[1] = now
            else:
                stamps.extend((now, now))
            timed.count += 1  # type: ignore[attr-defined]
            if timed.count >= n:  # type: ignore[attr-defined]
                os.kill(os.getpid(), signal.SIGINT)

        timed.count = 0  # type: ignore[attr-defined]
        task = conflict_task(daisy, "pb", args.side, None, timed)
        try:
            daisy.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
        except KeyboardInterrupt:
            pass
        counted = timed.count - 1  # type: ignore[attr-defined]
        end = stamps[1]
        us = (end - stamps[0]) / counted * 1e6
    return {
        "case": f"perblock-{args.mode}",
        "blocks": args.side**3,
        "us_per_block": us,
        "counted_blocks": counted,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_gib": vm_hwm_bytes() / 2**30,
        "load": load(),
    }


def layout_of(task: Any) -> Any:
    from bellis._tracking import StoreLayout

    g = task._geom
    return StoreLayout(
        g.total_offset,
        g.total_shape,
        tuple(int(x) for x in task.read_roi.offset),
        g.read_shape,
        tuple(int(x) for x in task.write_roi.offset),
        g.write_shape,
        g.fit,
    )


def case_fill(args: argparse.Namespace) -> dict[str, Any]:
    """Create a store of side^3 cells with every block done (the setup of resume/status)."""
    import bellis as daisy
    from bellis._tracking import TrackingStore

    store = Path(args.dir) / f"done-{args.side}"
    task = conflict_task(daisy, "big", args.side, store)
    t0 = time.perf_counter()
    with TrackingStore.open(store, layout_of(task), resource_tracking=False) as ts:
        flat = ts.done.reshape(-1)
        step = 1 << 26
        for i in range(0, flat.size, step):
            flat[i : i + step] = 1
    du = subprocess.run(["du", "-sb", str(store)], capture_output=True, text=True).stdout
    return {
        "case": "fill",
        "blocks": args.side**3,
        "fill_s": time.perf_counter() - t0,
        "store_bytes": int(du.split()[0]),
        "path": str(store),
    }


def case_resume(args: argparse.Namespace) -> dict[str, Any]:
    import bellis as daisy

    store = Path(args.dir) / f"done-{args.side}"

    def never(block: object) -> None:
        raise AssertionError("a fully done task must not call its process function")

    t0 = time.perf_counter()
    task = conflict_task(daisy, "big", args.side, store, never)
    states = daisy.run_blockwise(
        [task], multiprocessing=False, progress=False, return_states=True, summary=False
    )
    wall = time.perf_counter() - t0
    st = states["big"]
    n = args.side**3
    return {
        "case": "resume",
        "blocks": n,
        "wall_s": wall,
        "peak_rss_gib": vm_hwm_bytes() / 2**30,
        "ok": st.skipped_count == st.completed_count == st.total_block_count == n,
        "load": load(),
    }


def _timed_cli(argv: list[str]) -> tuple[float, int, str]:
    cmd = ["/usr/bin/time", "-f", "MAXRSS %M", sys.executable, "-m", "bellis", *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr[-2000:]}")
    rss = [ln for ln in proc.stderr.splitlines() if ln.startswith("MAXRSS")]
    return wall, int(rss[-1].split()[1]) * 1024, proc.stdout


def case_status(args: argparse.Namespace) -> dict[str, Any]:
    store = Path(args.dir) / f"done-{args.side}"
    html = Path(args.dir) / "report.html"
    s_wall, s_rss, out = _timed_cli(["status", str(store)])
    r_wall, r_rss, _ = _timed_cli(["report", str(store), "-o", str(html)])
    return {
        "case": "status+report",
        "blocks": args.side**3,
        "status_s": s_wall,
        "status_rss_gib": s_rss / 2**30,
        "report_s": r_wall,
        "report_rss_gib": r_rss / 2**30,
        "report_html_mb": html.stat().st_size / 1e6,
        "status_head": out.splitlines()[:8],
        "load": load(),
    }


def case_migrate(args: argparse.Namespace) -> dict[str, Any]:
    """Open a done store of old^3 cells with the layout of a side^3 task (as a run does)."""
    import bellis as daisy
    from bellis._tracking import TrackingStore

    store = Path(args.dir) / f"done-{args.old}"
    task = conflict_task(daisy, "big", args.side, store)
    t0 = time.perf_counter()
    with TrackingStore.open(store, layout_of(task), resource_tracking=False) as ts:
        wall = time.perf_counter() - t0
        migrated = ts.migrated_from
        n_done = int(np.count_nonzero(ts.done))
    return {
        "case": "migrate",
        "old_blocks": args.old**3,
        "blocks": args.side**3,
        "wall_s": wall,
        "migrated_from": migrated,
        "done_after": n_done,
        "peak_rss_gib": vm_hwm_bytes() / 2**30,
        "load": load(),
    }


def _pipeline(daisy: Any, shape: str, n: int, side: int) -> Any:
    total = daisy.Roi((0, 0, 0), (side * WRITE,) * 3)
    read = daisy.Roi((-CONTEXT,) * 3, (WRITE + 2 * CONTEXT,) * 3)
    write = daisy.Roi((0,) * 3, (WRITE,) * 3)

    tasks = [
        daisy.Task(
            f"t{i:04d}",
            total,
            read,
            write,
            process_function=noop,
            fit="shrink",
            tracking_path=False,
        )
        for i in range(n)
    ]
    if shape == "chain":
        edges = [(tasks[i - 1], tasks[i]) for i in range(1, n)]
    else:  # fan-in: n - 1 independent tasks feed the last one
        edges = [(tasks[i], tasks[-1]) for i in range(n - 1)]
    return daisy.Pipeline(tasks, edges)


def case_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    import bellis as daisy

    side = round(args.blocks ** (1 / 3))
    tasks = _pipeline(daisy, args.shape, args.tasks, side)
    t0 = time.perf_counter()
    scheduler = daisy.Scheduler(tasks)
    construct = time.perf_counter() - t0
    del scheduler
    t0 = time.perf_counter()
    c0 = time.process_time()
    states = daisy.run_blockwise(
        tasks,
        multiprocessing=args.mode == "dist",
        progress=False,
        return_states=True,
        summary=False,
    )
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    n_blocks = sum(s.total_block_count for s in states.values())
    ok = all(s.completed_count == s.total_block_count for s in states.values())
    return {
        "case": f"pipeline-{args.shape}-{args.mode}",
        "tasks": args.tasks,
        "blocks": n_blocks,
        "construct_s": construct,
        "run_s": wall,
        "us_per_block": wall / n_blocks * 1e6,
        "driver_cpu_us_per_block": cpu / n_blocks * 1e6,
        "ok": ok,
        "peak_rss_gib": vm_hwm_bytes() / 2**30,
        "load": load(),
    }


CASES = {
    "dist": case_dist,
    "perblock": case_perblock,
    "fill": case_fill,
    "resume": case_resume,
    "status": case_status,
    "migrate": case_migrate,
    "pipeline": case_pipeline,
}


def run_case(name: str, argv: list[str], timeout: float = 1800) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "_case", name, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"case {name} failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=[*CASES, "_case", "all"])
    parser.add_argument("case", nargs="?")
    parser.add_argument("--side", type=int, default=1000)
    parser.add_argument("--sides", default="22,1000")
    parser.add_argument("--blocks", type=int, default=10_000)
    parser.add_argument("--mode", default="serial", choices=["serial", "dist"])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--old", type=int, default=900)
    parser.add_argument("--shape", default="chain", choices=["chain", "fanin"])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--tasks-list", default="10,50,200")
    parser.add_argument("--with-status", action="store_true")
    args = parser.parse_args()
    if args.command == "_case":
        print(json.dumps(CASES[args.case](args)))
        return 0
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bellis-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        common = ["--dir", str(base), "--side", str(args.side), "--blocks", str(args.blocks)]
        if args.command == "dist":
            print(json.dumps(run_case("dist", common)))
        elif args.command == "resume":
            print(json.dumps(run_case("fill", common)))
            print(json.dumps(run_case("resume", common)))
            if args.with_status:
                print(json.dumps(run_case("status", common)))
        elif args.command == "status":
            print(json.dumps(run_case("fill", common)))
            print(json.dumps(run_case("status", common)))
        elif args.command == "migrate":
            old = ["--dir", str(base), "--side", str(args.old)]
            print(json.dumps(run_case("fill", old)))
            print(json.dumps(run_case("migrate", [*common, "--old", str(args.old)])))
        elif args.command == "pipeline":
            for shape in ("chain", "fanin"):
                for n in [int(x) for x in args.tasks_list.split(",")]:
                    argv = [
                        "--blocks",
                        str(args.blocks),
                        "--shape",
                        shape,
                        "--tasks",
                        str(n),
                        "--mode",
                        args.mode,
                    ]
                    print(json.dumps(run_case("pipeline", argv)))
        elif args.command == "perblock":
            for side in [int(s) for s in args.sides.split(",")]:
                for mode in ("serial", "dist"):
                    argv = [
                        "--dir",
                        str(base),
                        "--side",
                        str(side),
                        "--blocks",
                        str(args.blocks),
                        "--mode",
                        mode,
                    ]
                    print(json.dumps(run_case("perblock", argv)))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
