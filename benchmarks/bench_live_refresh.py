"""The live page's refresh of a big store: before and after reading only what changed
(issue 39).

Makes tracking stores of 10^6 and 10^7 cells (a square 2-D grid of 1 x 1 blocks: a serial
run creates each store and stops at its first block; the bench then writes the chunk
files in place, as a run does: half the cells done, every 997th failed). Two server
processes build the page's state (``LiveState.json_bytes``, the whole answer, uncached)
of the same stores: **before** from ``--base`` (a ``src`` folder of main before this
work), **after** from this tree. Interleaved per repetition (which goes first
alternates): a refresh with nothing changed, then 1% of the cells (scattered at random,
the worst case for reading what changed) marked done, and a refresh of each. Prints the
medians and the paired ratios, and the load average before and after.

    git archive <base> src | tar -x -C /tmp/base-live
    python -m compileall -q src /tmp/base-live/src
    python benchmarks/bench_live_refresh.py --base /tmp/base-live/src [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MAKE = """
import sys
import bellis

SIDE = int(sys.argv[2])

def process(block):
    raise RuntimeError("the store is made: stop")

task = bellis.Task(
    "big",
    total_roi=bellis.Roi((0, 0), (SIDE, SIDE)),
    read_roi=bellis.Roi((0, 0), (1, 1)),
    write_roi=bellis.Roi((0, 0), (1, 1)),
    process_function=process,
    max_retries=0,
    read_write_conflict=False,
    tracking_path=sys.argv[1],
)
try:
    bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
except Exception:
    pass
"""

SERVER = """
import json, sys, time
from pathlib import Path
from bellis._report._live import LiveState

states = {}
for line in sys.stdin:
    store = Path(line.strip())
    state = states.get(store)
    if state is None:
        state = states[store] = LiveState([store], min_interval_seconds=0.0)
    t = time.perf_counter()
    body = state.json_bytes()
    took = time.perf_counter() - t
    done = json.loads(body)["tasks"][0].get("done")
    print(json.dumps({"seconds": took, "done": done, "bytes": len(body)}), flush=True)
"""


def make(root: Path, side: int) -> tuple[Path, np.memmap]:  # type: ignore[type-arg]
    store = root / f"s{side}"
    script = root / "make.py"
    script.write_text(MAKE)
    subprocess.run([sys.executable, str(script), str(store), str(side)], check=True)
    n = side * side
    done = np.memmap(store / "done" / "c" / "0" / "0", dtype=np.uint8, mode="r+", shape=(n,))
    failures = np.memmap(store / "failures" / "c" / "0" / "0", dtype="<u4", mode="r+", shape=(n,))
    done[: n // 2] = 1
    failures[::997] = 1
    done[::997] = 0
    failures.flush()
    done.flush()
    del failures
    return store, done


class Server:
    def __init__(self, src: str) -> None:
        env = dict(os.environ, PYTHONPATH=src)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def refresh(self, store: Path) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{store}\n")
        self.proc.stdin.flush()
        answer: dict[str, float] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the src folder of the code before")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sides", default="1000,3163", help="grid sides (10^6, 10^7 cells)")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    rng = np.random.default_rng(0)
    print(f"load average before {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-live-refresh-") as tmp:
        root = Path(tmp)
        servers = {"before": Server(args.base), "after": Server(here)}
        try:
            for side in map(int, args.sides.split(",")):
                store, done = make(root, side)
                for s in servers.values():  # the first build (the whole store) of each
                    s.refresh(store)
                times: dict[tuple[str, str], list[float]] = {}
                for rep in range(args.reps):
                    order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
                    for case in ("nothing changed", "1% changed"):
                        if case == "1% changed":
                            left = np.flatnonzero(done[:] == 0)
                            pick = rng.choice(left, size=done.size // 100, replace=False)
                            done[np.sort(pick)] = 1
                        seen = set()
                        for name in order:
                            got = servers[name].refresh(store)
                            times.setdefault((name, case), []).append(got["seconds"])
                            seen.add(got["done"])
                        assert len(seen) == 1, f"before and after disagree: {seen}"
                print(f"{side}x{side} = {side * side:,} cells, {args.reps} repetitions")
                for case in ("nothing changed", "1% changed"):
                    b, a = times[("before", case)], times[("after", case)]
                    ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
                    print(
                        f"  {case}: before median {statistics.median(b):.4f} s, after median "
                        f"{statistics.median(a):.4f} s, after/before paired median {ratio:.3f}"
                    )
                del done
        finally:
            for s in servers.values():
                s.close()
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
