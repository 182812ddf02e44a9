"""Cost of one block's measurement, in microseconds.

Run: ``PYTHONPATH=src python benchmarks/bench_profile_block.py [--children]``.

Prints the median over many rounds of the mean cost of

* an empty ``with profile_block(block): pass`` (the standalone measurement, also what a
  hand-written ``Client.acquire_block`` loop gets), and
* ``Meter.restart()`` + ``Meter.finish()``, the chained measurement bellis's own worker
  loop and serial mode use for blocks that run back to back,

once for a process without children and, with ``--children``, once more while a child
process (``sleep``) is alive, which adds the ``/proc`` descendant walk.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from funlib.geometry import Roi

from bellis._block import Block
from bellis._worker._profiling import Meter, profile_block


def measure(rounds: int, per_round: int) -> tuple[float, float]:
    """Median and minimum over ``rounds`` of the mean µs per enter + exit of ``per_round``
    scopes (the minimum is the figure least disturbed by other load on the machine)."""
    block = Block(Roi((0,), (10,)), Roi((0,), (10,)), Roi((0,), (10,)), task_id="bench")
    perf = time.perf_counter
    samples: list[float] = []
    for _ in range(rounds):
        t0 = perf()
        for _ in range(per_round):
            block.stats = None
            with profile_block(block):
                pass
        samples.append((perf() - t0) / per_round * 1e6)
    return statistics.median(samples), min(samples)


def measure_chained(rounds: int, per_round: int) -> tuple[float, float]:
    """As :func:`measure`, for ``Meter.restart()`` + ``Meter.finish()``."""
    meter = Meter()
    meter.start()
    meter.finish()
    perf = time.perf_counter
    samples: list[float] = []
    for _ in range(rounds):
        t0 = perf()
        for _ in range(per_round):
            meter.restart()
            meter.finish()
        samples.append((perf() - t0) / per_round * 1e6)
    return statistics.median(samples), min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--per-round", type=int, default=1000)
    parser.add_argument("--children", action="store_true", help="also measure with a live child")
    args = parser.parse_args()
    measure(3, args.per_round)  # warm up: open the /proc descriptors, fill caches
    measure_chained(3, args.per_round)
    med, best = measure(args.rounds, args.per_round)
    print(f"profile_block enter+exit, no children: median {med:.1f} µs, min {best:.1f} µs")
    med, best = measure_chained(args.rounds, args.per_round)
    print(f"chained Meter restart+finish, no children: median {med:.1f} µs, min {best:.1f} µs")
    if args.children:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            med, best = measure(max(args.rounds // 5, 3), max(args.per_round // 10, 10))
            print(
                f"profile_block enter+exit, one live child: median {med:.1f} µs, min {best:.1f} µs"
            )
        finally:
            child.kill()
            child.wait()


if __name__ == "__main__":
    main()
