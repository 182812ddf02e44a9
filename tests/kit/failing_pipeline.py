"""A user's pipeline whose blocks fail in known ways, run as a script in a subprocess.

One task ``seg`` on a 4 x 10 block grid (blocks of 10 x 10), two workers, two retries,
a timeout of 1 s, a restart budget for every failure that ends a worker (a timeout, or a
worker's first block raising). Its
script picks the failing blocks itself, and this module names the same blocks, so a test
checks what bellis recorded against the script's own choice:

* :data:`VALUE_BLOCKS` raise ``ValueError("bad voxel size")`` on every attempt (the line
  marked ``LINE_VALUE``);
* :data:`KEY_BLOCKS` raise ``KeyError("missing channel")`` (``LINE_KEY``);
* :data:`TIMEOUT_BLOCK` sleeps past the timeout (not in serial mode);
* with ``flaky=True``, :data:`FLAKY_BLOCK` raises ``RuntimeError("flaky once")`` on its
  first attempt only (``LINE_FLAKY``) and is then done, in 0.3 s: a red bar in the report's
  timeline, wide enough to click.

``run_failing(tmp_path, mode)`` writes ``my_pipeline.py`` and runs it; the error records
tests and the HTML report's failure tests share it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

VALUE_BLOCKS = ((1, 2),)
KEY_BLOCKS = ((2, 5), (0, 9))
TIMEOUT_BLOCK = (3, 7)
FLAKY_BLOCK = (3, 1)
#: attempts per block that always fails: 1 + max_retries
ATTEMPTS = 3

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import bellis as daisy

    def process(block):
        y, x = (int(v) // 10 for v in block.write_roi.offset)
        print(f"start block {block.block_id} at {y},{x}", flush=True)
        if (y, x) in VALUE_BLOCKS:
            raise ValueError("bad voxel size")  # LINE_VALUE
        if (y, x) in KEY_BLOCKS:
            raise KeyError("missing channel")  # LINE_KEY
        if FLAKY and (y, x) == FLAKY_BLOCK:
            if not MARKER.exists():
                MARKER.write_text("x")
                raise RuntimeError("flaky once")  # LINE_FLAKY
            time.sleep(0.3)  # its done attempt: a bar wide enough to click in the report
        if (y, x) == TIMEOUT_BLOCK and MODE != "serial":
            time.sleep(60)

    def task(store):
        return daisy.Task(
            "seg",
            total_roi=daisy.Roi((0, 0), (40, 100)),
            read_roi=daisy.Roi((0, 0), (10, 10)),
            write_roi=daisy.Roi((0, 0), (10, 10)),
            process_function=process,
            max_retries=2,
            num_workers=2,
            timeout=1,
            max_worker_restarts=50,
            read_write_conflict=False,
            tracking_path=store,
            resource_tracking=TRACKED,
        )

    MODE = sys.argv[1]
    FLAKY = "flaky" in sys.argv[3:]
    TRACKED = "tracked" in sys.argv[3:]
    MARKER = Path(__file__).with_name("flaky-failed-once")
    if __name__ == "__main__":
        try:
            ok = daisy.run_blockwise([task(sys.argv[2])], multiprocessing=MODE != "serial")
            print("RESULT", ok)
        except Exception as exc:
            print("RAISED", type(exc).__name__)
    """
)


@dataclass(frozen=True)
class FailingRun:
    """What a run of the script left: the script, its tracking store and its output."""

    script: Path
    store: Path
    output: str

    def line_of(self, marker: str) -> int:
        """The script's line that holds ``marker`` (``LINE_VALUE``, ``LINE_KEY``, ...)."""
        lines = self.script.read_text().splitlines()
        return next(i + 1 for i, line in enumerate(lines) if marker in line)


def script_text() -> str:
    """The script, with this module's choice of failing blocks written into it."""
    names = {
        "VALUE_BLOCKS": VALUE_BLOCKS,
        "KEY_BLOCKS": KEY_BLOCKS,
        "TIMEOUT_BLOCK": TIMEOUT_BLOCK,
        "FLAKY_BLOCK": FLAKY_BLOCK,
    }
    head = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    return SCRIPT.replace("import bellis as daisy\n", "import bellis as daisy\n" + head, 1)


def run_failing(
    tmp_path: Path, mode: str = "distributed", *, tracked: bool = False, flaky: bool = False
) -> FailingRun:
    """Run the script in ``tmp_path`` (``mode``: ``distributed`` or ``serial``) with its
    store at ``tmp_path / "store"``; ``tracked``: with resource tracking (the report's
    timeline needs it); ``flaky``: with :data:`FLAKY_BLOCK` failing once."""
    script = tmp_path / "my_pipeline.py"
    script.write_text(script_text())
    store = tmp_path / "store"
    flags = [f for f, on in (("tracked", tracked), ("flaky", flaky)) if on]
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(store), *flags],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    return FailingRun(script, store, proc.stdout + proc.stderr)
