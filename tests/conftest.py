"""Shared fixtures: every test gets its own log and tracking directories, and fails if it
leaves child processes behind."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _children(pid: int) -> set[int]:
    """Live descendants of ``pid`` (from /proc), zombies excluded."""
    out: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    parent: dict[int, int] = {}
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        if rest and rest[0] == b"Z":
            continue
        parent[int(e)] = int(rest[1])
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                out.add(c)
                frontier.append(c)
    return out


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import bellis
    from bellis import logging as blog

    monkeypatch.chdir(tmp_path)
    old_log = blog.get_log_basedir()
    old_mode = blog.get_log_mode()
    old_track = bellis.get_tracking_basedir()
    blog.set_log_basedir(tmp_path / "logs")
    bellis.set_tracking_basedir(None)
    before = _children(os.getpid())
    yield
    blog.set_log_basedir(old_log)
    blog.set_log_mode(old_mode)
    bellis.set_tracking_basedir(old_track)
    deadline = time.monotonic() + 5.0
    leaked = _children(os.getpid()) - before
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = _children(os.getpid()) - before
    if leaked:
        details = []
        for p in sorted(leaked):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                details.append(f"{p}: {cmd}")
            except OSError:
                details.append(str(p))
            try:
                os.kill(p, 9)
            except OSError:
                pass
        pytest.fail("test leaked child processes:\n" + "\n".join(details))
