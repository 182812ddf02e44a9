"""The Grid Engine side of the SgeLauncher tests: whether a qmaster takes jobs here
(``.ci/sge_setup.sh``), the jobs a test started (by their name prefix) and how they ended."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest


def sge_unavailable_reason() -> str | None:
    """Why no Grid Engine queue can take jobs here (None: one can)."""
    for tool in ("qsub", "qstat", "qdel", "qacct", "qconf"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    try:
        out = subprocess.run(["qstat", "-f"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"qstat failed: {exc}"
    if out.returncode != 0:
        return f"qstat -f failed: {out.stderr.strip()}"
    queues = [line.split() for line in out.stdout.splitlines() if "@" in line.split(" ")[0]]
    if not any(len(q) == 5 for q in queues):  # a sixth column is a state: alarm, error, ...
        return f"no queue instance is available: {out.stdout.strip()!r}"
    return None


def needs_sge() -> list[pytest.MarkDecorator]:
    """The marks of an SGE test: ``sge``, and skipped (with the reason) without a queue."""
    reason = sge_unavailable_reason()
    return [
        pytest.mark.sge,
        pytest.mark.skipif(reason is not None, reason=f"no Grid Engine: {reason}"),
    ]


def active_jobs(prefix: str) -> list[tuple[str, str, str]]:
    """(job number, state, name) of the pending or running jobs whose name starts with
    ``prefix``."""
    out = subprocess.run(["qstat", "-xml"], capture_output=True, text=True, timeout=30, check=True)
    rows = []
    for job in ET.fromstring(out.stdout).iter("job_list"):
        name = job.findtext("JB_name") or ""
        if name.startswith(prefix):
            rows.append((job.findtext("JB_job_number") or "", job.findtext("state") or "", name))
    return rows


def accounting(job_id: str) -> list[dict[str, str]]:
    """``qacct -j``'s records of ``job_id`` (a job number, or ``<number>.<task>``)."""
    number, _, task = job_id.partition(".")
    args = ["qacct", "-j", number, *(["-t", task] if task else [])]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=True)
    records: list[dict[str, str]] = []
    for line in out.stdout.splitlines():
        if line.startswith("=========="):
            records.append({})
            continue
        key, _, value = line.partition(" ")
        if records and key:
            records[-1][key] = value.strip()
    return records
