"""Processes seen from ``/proc``: whether one is alive, and waiting for one to go."""

from __future__ import annotations

import time


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def gone(pid: int, within: float) -> bool:
    """Whether ``pid`` is gone, waiting up to ``within`` seconds for it to go."""
    end = time.monotonic() + within
    while pid_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True
