"""What the live page costs a run (issue 39): ``dist_noop_w2`` (10,000 no-op blocks of a
100 x 100 grid, ``read_write_conflict=False``, 2 worker processes) with a tracking store
(the page is drawn from it), in three cases, each run in a fresh process, interleaved
A, B, C, A, B, C ...:

- A: main before this work (``--base SRC``, a ``src`` folder of the base commit), no page;
- B: this tree, ``dashboard=False``;
- C: this tree, ``dashboard=True`` and a client polling ``/api/state.json`` every
  ``--poll`` seconds (default 0.1 s, far more often than a page's 1.5 s: the first poll
  goes out as soon as the URL is printed, so even a short run is polled).

Each child times ``run_blockwise`` alone (imports and the interpreter's start are not in
it). Prints the medians, their ratios B/A and C/A, the median of the per-repetition
ratios (each repetition's B and C over its own A: slow swings of a shared machine's load
cancel), the polls answered and the load average before and after.

    git archive <base> src | tar -x -C /tmp/base
    python benchmarks/bench_live_dashboard.py --base /tmp/base/src [--reps 11] [--blocks 10000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def noop(block: object) -> None:
    pass


class _Catch(io.TextIOBase):
    """stderr that also remembers the live page's URL."""

    def __init__(self, inner: io.TextIOBase) -> None:
        self.inner = inner
        self.url: str | None = None
        self.seen = threading.Event()

    def write(self, s: str) -> int:
        m = re.search(r"live page at (http://\S+)", s)
        if m:
            self.url = m.group(1)
            self.seen.set()
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


def child(root: Path, dashboard: bool, poll: float, blocks: int) -> dict[str, float]:
    import bellis

    side = round(blocks**0.5)
    task = bellis.Task(
        "bench",
        total_roi=bellis.Roi((0, 0), (side, side)),
        read_roi=bellis.Roi((0, 0), (1, 1)),
        write_roi=bellis.Roi((0, 0), (1, 1)),
        process_function=noop,
        num_workers=2,
        read_write_conflict=False,
        tracking_path=str(root / "bench"),
    )
    polls = 0
    stop = threading.Event()
    catch = _Catch(sys.stderr)  # type: ignore[arg-type]

    def poller() -> None:
        nonlocal polls
        catch.seen.wait()
        assert catch.url is not None
        state = catch.url.replace("/?token=", "/api/state.json?token=")
        while not stop.is_set():
            try:
                with urllib.request.urlopen(state, timeout=10) as r:
                    r.read()
                polls += 1
            except OSError:
                pass
            stop.wait(poll)

    thread = threading.Thread(target=poller, daemon=True)
    old, sys.stderr = sys.stderr, catch  # type: ignore[assignment]
    kw = {"dashboard": True} if dashboard else {}
    try:
        if dashboard:
            thread.start()
        t0 = time.perf_counter()
        ok = bellis.run_blockwise([task], progress=False, summary=False, **kw)
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        catch.seen.set()
        if dashboard:
            thread.join()
        sys.stderr = old
    assert ok
    return {"wall": wall, "polls": polls}


def run_case(src: Path, dashboard: bool, poll: float, blocks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(src))
        out = subprocess.run(
            [sys.executable, __file__, "--child", tmp, str(int(dashboard)), str(poll), str(blocks)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
    found: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return found


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        tmp, dash, poll, blocks = sys.argv[2:6]
        print(json.dumps(child(Path(tmp), dash == "1", float(poll), int(blocks))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the base commit's src folder")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--poll", type=float, default=0.1)
    args = ap.parse_args()
    cases = {
        "A": (args.base.resolve(), False),
        "B": (SRC, False),
        "C": (SRC, True),
    }
    walls: dict[str, list[float]] = {k: [] for k in cases}
    polls: list[float] = []
    load0 = os.getloadavg()
    for _ in range(args.reps):
        for name, (src, dash) in cases.items():
            r = run_case(src, dash, args.poll, args.blocks)
            walls[name].append(r["wall"])
            if dash:
                polls.append(r["polls"])
    load1 = os.getloadavg()
    med = {k: statistics.median(v) for k, v in walls.items()}
    rate = {k: args.blocks / v for k, v in med.items()}
    print(f"{args.blocks} blocks, 2 workers, {args.reps} reps, interleaved A B C")
    print(f"A (main before, no page)        median {med['A']:.3f} s ({rate['A']:,.0f} blocks/s)")
    print(f"B (this tree, no page)          median {med['B']:.3f} s ({rate['B']:,.0f} blocks/s)")
    print(
        f"C (this tree, page polled {args.poll} s) median {med['C']:.3f} s "
        f"({rate['C']:,.0f} blocks/s; polls answered per run: median "
        f"{statistics.median(polls):.0f})"
    )
    print(f"ratio of medians B/A {med['B'] / med['A']:.3f}, C/A {med['C'] / med['A']:.3f}")
    paired = {
        k: statistics.median(x / a for x, a in zip(walls[k], walls["A"], strict=True))
        for k in ("B", "C")
    }
    print(f"median of the per-rep ratios B/A {paired['B']:.3f}, C/A {paired['C']:.3f}")
    print(f"walls A {[round(w, 3) for w in walls['A']]}")
    print(f"walls B {[round(w, 3) for w in walls['B']]}")
    print(f"walls C {[round(w, 3) for w in walls['C']]}")
    print(f"load average before {load0}, after {load1}")


if __name__ == "__main__":
    main()
