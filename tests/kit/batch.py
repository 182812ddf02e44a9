"""The LSF and PBS stand-ins (``kit/standins``) for the batch launcher tests: put one
system's commands first on PATH with a fresh state folder, and read the jobs it ran."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

STANDINS = Path(__file__).parent / "standins"


def use_standins(system: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put ``system``'s stand-in commands (``lsf`` or ``pbs``) first on PATH, with their
    state in a new folder under ``tmp_path``; the folder."""
    state = tmp_path / f"{system}-state"
    state.mkdir()
    monkeypatch.setenv("BELLIS_STANDIN_STATE", str(state))
    monkeypatch.setenv("PATH", f"{STANDINS / system}{os.pathsep}{os.environ['PATH']}")
    return state


def job_records(state: Path) -> list[dict[str, Any]]:
    """Every job (or array element) the stand-ins ran, as they recorded it."""
    out = []
    for path in sorted((state / "jobs").glob("*.json")):
        out.append(json.loads(path.read_text()))
    return out


def active(state: Path) -> list[dict[str, Any]]:
    """The jobs that have not ended."""
    return [r for r in job_records(state) if r["state"] != "done"]


def drained(state: Path, seconds: float = 30.0) -> list[dict[str, Any]]:
    """The jobs still active after waiting up to ``seconds`` for none to be (a cancelled
    job's supervisor records its end within a poll)."""
    deadline = time.monotonic() + seconds
    while (left := active(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def make_launcher(system: str, prefix: str, **kwargs: Any) -> Any:
    import bellis

    kwargs.setdefault("poll_interval", 0.3)
    if system == "lsf":
        return bellis.LsfLauncher(job_name_prefix=prefix, **kwargs)
    return bellis.PbsLauncher(job_name_prefix=prefix, **kwargs)
