"""What the live page costs a run (issue 39): a run of 10,000 no-op blocks, 2 workers,
with a tracking store, without the page (A), with ``dashboard=True`` and no page open (B),
and with a page polling ``/api/state.json`` every 0.5 s (C), interleaved A, B, C, A, B, C ... in one
process; prints the medians, their ratios and the load average.

    python benchmarks/bench_live_dashboard.py [REPS]
"""

from __future__ import annotations

import io
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import bellis


def noop(block: object) -> None:
    pass


class _Catch(io.TextIOBase):
    """stderr that also remembers the live page's URL."""

    def __init__(self, inner: io.TextIOBase) -> None:
        self.inner = inner
        self.url: str | None = None

    def write(self, s: str) -> int:
        m = re.search(r"live page at (http://\S+)", s)
        if m:
            self.url = m.group(1)
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()


def one(root: Path, i: int, dashboard: bool, page: bool) -> tuple[float, int]:
    task = bellis.Task(
        f"t{i}",
        total_roi=bellis.Roi((0, 0), (100, 100)),
        read_roi=bellis.Roi((0, 0), (1, 1)),
        write_roi=bellis.Roi((0, 0), (1, 1)),
        process_function=noop,
        max_workers=2,
        read_write_conflict=False,
        tracking_path=str(root / f"t{i}"),
    )
    polls = 0
    stop = threading.Event()
    catch = _Catch(sys.stderr)  # type: ignore[arg-type]

    def poll() -> None:
        nonlocal polls
        while not stop.is_set():
            if catch.url and page:
                state = catch.url.replace("/?token=", "/api/state.json?token=")
                try:
                    with urllib.request.urlopen(state, timeout=10) as r:
                        r.read()
                    polls += 1
                except OSError:
                    pass
            stop.wait(0.5)

    poller = threading.Thread(target=poll, daemon=True)
    old, sys.stderr = sys.stderr, catch  # type: ignore[assignment]
    try:
        poller.start()
        t0 = time.perf_counter()
        assert bellis.run_blockwise([task], progress=False, summary=False, dashboard=dashboard)
        wall = time.perf_counter() - t0
    finally:
        stop.set()
        poller.join()
        sys.stderr = old
    return wall, polls


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cases = {"A": (False, False), "B": (True, False), "C": (True, True)}
    walls: dict[str, list[float]] = {k: [] for k in cases}
    polls = 0
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for _ in range(reps):
            for name, (dash, page) in cases.items():
                wall, answered = one(Path(tmp), n, dash, page)
                n += 1
                walls[name].append(wall)
                polls += answered
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"A (no dashboard)               median {med['A']:.3f} s")
    print(f"B (dashboard, no page open)    median {med['B']:.3f} s")
    print(f"C (dashboard, a page polling)  median {med['C']:.3f} s ({polls} polls answered)")
    print(f"ratio B/A {med['B'] / med['A']:.3f}, C/A {med['C'] / med['A']:.3f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
