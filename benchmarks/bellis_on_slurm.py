"""bellis with every run's workers as SLURM jobs, for the shared harness's cases.

``python3 ../shared/bench/compare.py --impl NAME=PYTHON:bellis_on_slurm ...`` with this
folder on ``PYTHONPATH``: ``run_blockwise`` gets ``launcher=SlurmLauncher(...)`` (the CI
cluster's ``oversub`` partition where there is one, so that a run's jobs start at once on
a small node) unless the caller passes a launcher, and the module stands in for ``bellis``.
"""

import functools
import subprocess
import sys

import bellis

_run_blockwise = bellis.run_blockwise


def _partition() -> str | None:
    out = subprocess.run(
        ["sinfo", "-h", "-p", "oversub", "-o", "%P"], capture_output=True, text=True, check=False
    )
    return "oversub" if out.stdout.strip() else None


@functools.wraps(_run_blockwise)
def run_blockwise(*args, **kwargs):  # type: ignore[no-untyped-def]
    kwargs.setdefault(
        "launcher",
        bellis.SlurmLauncher(
            partition=_partition(), mem="500M", poll_interval=0.5, job_name_prefix="bench"
        ),
    )
    return _run_blockwise(*args, **kwargs)


bellis.run_blockwise = run_blockwise
sys.modules[__name__] = bellis
