"""The SLURM side of the launcher tests: whether a controller takes jobs here, the jobs a
test started (by their name prefix), and wrappers around the SLURM commands on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

# every state in which a job still holds or waits for a node
ACTIVE = "PENDING,RUNNING,COMPLETING,CONFIGURING,SUSPENDED"


def slurm_unavailable_reason() -> str | None:
    """Why no SLURM controller can take jobs here (None: one can)."""
    for tool in ("sbatch", "squeue", "sinfo", "scancel", "scontrol"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    try:
        out = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed: {exc}"
    if out.returncode != 0 or not out.stdout.strip():
        return f"sinfo failed: {out.stderr.strip()}"
    return None


def needs_slurm() -> list[pytest.MarkDecorator]:
    """The marks of a SLURM test: ``slurm``, and skipped (with the reason) without a
    controller. A module's ``pytestmark``, or one ``pytest.param``'s ``marks``."""
    reason = slurm_unavailable_reason()
    return [
        pytest.mark.slurm,
        pytest.mark.skipif(reason is not None, reason=f"no SLURM controller: {reason}"),
    ]


def job_prefix(tmp_path: Path, letters: str) -> str:
    """A job name prefix unique to this test, so concurrent runs never see each other's
    jobs: ``letters`` (two, one pair per test file) and a hash of ``tmp_path``."""
    return letters + str(abs(hash(str(tmp_path))) % 10**8)


def jobs_named(
    prefix: str, states: str = "all", *, each_array_task: bool = False
) -> list[tuple[str, str, str]]:
    """(job id, state, name) of every job whose name starts with ``prefix``; with
    ``each_array_task`` a pending array is listed task by task (``squeue -r``)."""
    expand = ["-r"] if each_array_task else []
    out = subprocess.run(
        ["squeue", "-h", *expand, "-t", states, "-o", "%i|%T|%j"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = [line.split("|", 2) for line in out.stdout.splitlines() if line.count("|") >= 2]
    return [(r[0], r[1], r[2]) for r in rows if r[2].startswith(prefix)]


def active_jobs(prefix: str, *, each_array_task: bool = False) -> list[tuple[str, str, str]]:
    """The jobs of ``prefix`` that have not ended."""
    return jobs_named(prefix, ACTIVE, each_array_task=each_array_task)


def drained(
    prefix: str, seconds: float, *, each_array_task: bool = False
) -> list[tuple[str, str, str]]:
    """The jobs of ``prefix`` still active after waiting up to ``seconds`` for none to be."""
    deadline = time.monotonic() + seconds
    while (active := active_jobs(prefix, each_array_task=each_array_task)) and (
        time.monotonic() < deadline
    ):
        time.sleep(1.0)
    return active


def scontrol_job(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields of ``job_id``."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(item.split("=", 1) for item in out.stdout.split() if "=" in item)


def oversub_partition() -> str | None:
    """The CI cluster's oversubscribed partition (``.ci/slurm_setup.sh``), where one CPU
    holds many jobs; None where there is none."""
    out = subprocess.run(
        ["sinfo", "-h", "-p", "oversub", "-o", "%P"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "oversub" if out.stdout.strip() else None


def wrap_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: dict[str, str]) -> None:
    """Put first on PATH, for each ``name: lines`` of ``before``, a ``name`` that runs the
    shell ``lines``, then the real command."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    for name, lines in before.items():
        real = shutil.which(name)
        assert real is not None
        (shim / name).write_text(f'#!/bin/sh\n{lines}exec {real} "$@"\n')
        (shim / name).chmod(0o755)
    if str(shim) not in os.environ["PATH"].split(os.pathsep):
        monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
