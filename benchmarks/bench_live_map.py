"""The live page's map of a 10^6-block task (issue 39, item 4): how big the state is, how
long the server takes to build it, and how long headless Chromium takes to load and draw
the page, against the same for a 10 x 10 task.

Makes tracking stores of a SIDE x SIDE grid and of a 10 x 10 grid (serial runs of no-op
blocks, every 997th block failed), serves each with ``bellis serve`` and measures:

- the answer of ``/api/state.json`` (built from the store: a pass over its arrays, the map
  aggregated into tiles of at most 250,000 cells), fresh and cached;
- the wall time of a whole ``chromium --dump-dom`` call that loads the page, fetches the
  state and draws it (``data-rendered="yes"``), for the big and the small store
  interleaved: their difference bounds what the big map adds to a refresh. (The page's
  own clock cannot time it: under ``--virtual-time-budget`` it stands still while the
  script runs.)

    PYTHONPATH=src python benchmarks/bench_live_map.py [--side 1000] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MAKE = """
import sys
import bellis

SIDE = int(sys.argv[2])

def process(block):
    if block.block_id[1] % 997 == 0:
        block.status = bellis.BlockStatus.FAILED

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
bellis.run_blockwise([task], multiprocessing=False, progress=False, summary=False)
"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Served:
    """``bellis serve STORE`` in a subprocess, and its URL."""

    def __init__(self, store: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bellis", "serve", str(store)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.url = ""
        for line in self.proc.stderr:
            m = re.search(r"live page at (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        assert self.url, "bellis serve printed no URL"

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


def make(root: Path, name: str, side: int) -> Path:
    store = root / name
    script = root / "make.py"
    script.write_text(MAKE)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(script), str(store), str(side)], check=True)
    print(f"store of {side}x{side} blocks made in {time.perf_counter() - t0:.1f} s")
    return store


def state_times(url: str, reps: int) -> None:
    state = url.replace("/?token=", "/api/state.json?token=")
    builds, cached = [], []
    size = 0
    for _ in range(reps):
        time.sleep(1.1)  # past the cache's second: a fresh build
        t = time.perf_counter()
        with urllib.request.urlopen(state, timeout=120) as r:
            size = len(r.read())
        builds.append(time.perf_counter() - t)
        t = time.perf_counter()
        with urllib.request.urlopen(state, timeout=120) as r:
            r.read()
        cached.append(time.perf_counter() - t)
    print(
        f"  state.json {size / 1e3:.0f} kB; built in median {statistics.median(builds):.3f} s "
        f"{[round(b, 3) for b in builds]}, cached {statistics.median(cached):.4f} s"
    )


def page_wall(exe: str, url: str) -> float:
    profile = tempfile.mkdtemp(prefix="bench-live-map-chromium-")
    try:
        t = time.perf_counter()
        out = subprocess.run(
            [
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        ).stdout
        wall = time.perf_counter() - t
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert 'data-rendered="yes"' in out, out[-500:]
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-live-map-") as tmp:
        root = Path(tmp)
        big, small = make(root, "big", args.side), make(root, "small", 10)
        served = [Served(big), Served(small)]
        try:
            for name, s in zip(("big", "small"), served, strict=True):
                print(name)
                state_times(s.url, args.reps)
            exe = chromium()
            if exe is None:
                print("chromium absent: the page's load not measured")
                return
            walls: dict[str, list[float]] = {"big": [], "small": []}
            for _ in range(args.reps):
                for name, s in zip(("big", "small"), served, strict=True):
                    walls[name].append(page_wall(exe, s.url))
            med = {k: statistics.median(v) for k, v in walls.items()}
            paired = statistics.median(
                b - s for b, s in zip(walls["big"], walls["small"], strict=True)
            )
            print(
                f"chromium whole call: big median {med['big']:.2f} s "
                f"{[round(w, 2) for w in walls['big']]}, small median {med['small']:.2f} s "
                f"{[round(w, 2) for w in walls['small']]}; big - small, paired median "
                f"{paired:.2f} s"
            )
        finally:
            for s in served:
                s.close()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
