"""Start-up cost and throughput of SLURM-launched workers against local subprocesses.

Run: ``python benchmarks/bench_slurm.py [--blocks 2000] [--workers 2] [--rounds 1]``
on a machine with a SLURM controller (``.ci/slurm_setup.sh``); the benchmark folder must be
on a file system the SLURM nodes see (it is the current directory).

For each launcher it runs one task of ``--blocks`` no-op blocks with ``--workers`` workers and
prints: start-up (``run_blockwise`` called → first block started), blocks/s after the first
block (until ``run_blockwise`` returned, teardown included) and the total wall time.

``--scale N`` instead starts N SLURM workers at once (one job array) in ``--partition``
(default ``oversub``, the CI cluster's shared partition) on blocks of ``--block-ms``
milliseconds, with counting wrappers of ``sbatch``/``squeue``/``scontrol``/``scancel`` first
on PATH, and prints a markdown table: the wall, when the first and the last worker took
their first block, how many workers served blocks, the exits, and the calls per command.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import bellis
from bellis import LocalLauncher
from bellis._launchers._slurm import SlurmLauncher

_first_seen: list[bool] = []


def noop_block(marker_dir: str, block: Any) -> None:
    """Do nothing; the first block of each worker stamps the time it started."""
    if not _first_seen:
        _first_seen.append(True)
        path = os.path.join(marker_dir, f"first-{os.getpid()}")
        with open(path, "w") as f:
            f.write(f"{time.time():.6f}")


def run_once(launcher: Any, blocks: int, workers: int, workdir: Path) -> tuple[float, float, float]:
    """(start-up seconds, blocks/s after the first block, total seconds) of one run."""
    marker = Path(tempfile.mkdtemp(prefix="marks-", dir=workdir))
    task = bellis.Task(
        "noop",
        bellis.Roi((0,), (blocks,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=functools.partial(noop_block, str(marker)),
        read_write_conflict=False,
        max_workers=workers,
    )
    t0 = time.time()
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    t_end = time.time()
    assert states["noop"].completed_count == blocks, states["noop"]
    firsts = [float(p.read_text()) for p in marker.glob("first-*")]
    first = min(firsts)
    return first - t0, blocks / (t_end - first), t_end - t0


_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")


def _count_calls(workdir: Path) -> Path:
    """Counting wrappers of the SLURM commands, first on PATH; the file they append to."""
    log = workdir / "slurm-calls"
    shim = workdir / "shim"
    shim.mkdir()
    for name in _COMMANDS:
        real = shutil.which(name)
        assert real is not None, f"{name} is not on PATH"
        (shim / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexec {real} "$@"\n')
        (shim / name).chmod(0o755)
    os.environ["PATH"] = f"{shim}{os.pathsep}{os.environ['PATH']}"
    return log


def sleep_block(seconds: float, block: Any) -> None:
    time.sleep(seconds)


def run_scale(args: argparse.Namespace, workdir: Path) -> None:
    log = _count_calls(workdir)
    n = args.scale
    launcher = SlurmLauncher(
        job_name_prefix="benchscale",
        partition=args.partition,
        mem=args.mem,
        poll_interval=args.poll_interval,
    )
    task = bellis.Task(
        "scale",
        bellis.Roi((0,), (args.blocks,)),
        bellis.Roi((0,), (1,)),
        bellis.Roi((0,), (1,)),
        process_function=functools.partial(sleep_block, args.block_ms / 1000.0),
        read_write_conflict=False,
        max_workers=n,
    )
    t0 = time.monotonic()
    states = bellis.run_blockwise(
        task, launcher=launcher, return_states=True, progress=False, summary=False
    )
    wall = time.monotonic() - t0
    state = states["scale"]
    assert state.completed_count == args.blocks and state.failed_count == 0, state
    report = task.report()
    served = [r for r in report.workers.records if r.blocks > 0 and r.startup is not None]
    firsts = sorted(r.startup for r in served if r.startup is not None)
    calls = {name: 0 for name in _COMMANDS}
    for line in log.read_text().splitlines():
        calls[line.split(" ", 1)[0]] += 1
    print(
        "| workers | blocks × ms | wall s | first / last worker's first block s | "
        "workers that served blocks | worker starts | exits | " + " | ".join(_COMMANDS) + " |"
    )
    print("|" + "---|" * (7 + len(_COMMANDS)))
    exits = ", ".join(f"{v} {k}" for k, v in sorted(report.workers.exits.items()))
    print(
        f"| {n} | {args.blocks} × {args.block_ms:g} | {wall:.1f} | {firsts[0]:.1f} / "
        f"{firsts[-1]:.1f} | {len(served)} | {state.worker_start_count} | {exits} | "
        + " | ".join(str(calls[c]) for c in _COMMANDS)
        + " |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scale", type=int, default=0, help="start this many SLURM workers")
    parser.add_argument("--block-ms", type=float, default=10.0)
    parser.add_argument("--partition", default="oversub")
    parser.add_argument("--mem", default="100M")
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bellis-bench-slurm-", dir=Path.cwd()))
    bellis.logging.set_log_basedir(workdir / "logs")
    bellis.set_tracking_basedir(None)
    if args.scale:
        run_scale(args, workdir)
        return
    launchers: dict[str, Any] = {
        "local": LocalLauncher(),
        "slurm": SlurmLauncher(job_name_prefix="bench"),
    }
    print(f"{args.blocks} no-op blocks, {args.workers} workers, {args.rounds} round(s)")
    print(f"{'launcher':<8} {'start-up s':>11} {'blocks/s':>10} {'total s':>9}")
    for name, launcher in launchers.items():
        rows = [run_once(launcher, args.blocks, args.workers, workdir) for _ in range(args.rounds)]
        startup = statistics.median(r[0] for r in rows)
        rate = statistics.median(r[1] for r in rows)
        total = statistics.median(r[2] for r in rows)
        print(f"{name:<8} {startup:>11.2f} {rate:>10.0f} {total:>9.2f}")


if __name__ == "__main__":
    main()
