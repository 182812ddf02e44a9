"""The live page's tests (``bellis serve`` and ``run_blockwise(dashboard=...)``): start a
server the way a user does and read what it serves.

- :func:`serve`: ``bellis serve PATHS`` in a subprocess, yielding the URL it printed;
- :func:`driver_page`: a user's script (``python script.py ARGS``) whose run serves the
  page, yielding the process and the URL it printed;
- :func:`get`, :func:`state_of`, :func:`task_of`: a resource, the page's JSON, one task's;
- :func:`status_json`: ``bellis status PATH --json``, the ground truth of a store;
- :func:`block_pre`: the block details the page shows (``<pre id="block">``);
- :data:`needs_chromium`: skip a browser test where there is no Chromium
  (:func:`kit.browser.dump_dom` loads a page).

Every process started here ends in a ``finally``.
"""

from __future__ import annotations

import html
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kit import browser

__all__ = [
    "block_pre",
    "driver_page",
    "get",
    "needs_chromium",
    "resource",
    "serve",
    "state_of",
    "status_json",
    "task_of",
]

needs_chromium = pytest.mark.skipif(
    browser.chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's)"
)
_URL = re.compile(r"live page at (http://\S+)")


def _pump(proc: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put("")

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    return lines, pumping


def _url(proc: subprocess.Popen[str], lines: queue.Queue[str]) -> str:
    seen: list[str] = []
    while True:
        line = lines.get(timeout=180)
        seen.append(line)
        assert line, f"it ended (rc {proc.wait()}) before printing a URL: {''.join(seen)}"
        m = _URL.search(line)
        if m:
            return m.group(1)


def _end(proc: subprocess.Popen[str], pumping: threading.Thread) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    pumping.join(timeout=60)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@contextmanager
def serve(*paths: Path, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """``bellis serve PATHS`` in a subprocess; yields the URL it printed (with its token),
    and ends it with SIGINT (as Ctrl-C does), which must exit 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bellis", "serve", *map(str, paths), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, pumping = _pump(proc)
    try:
        yield _url(proc, lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        _end(proc, pumping)


@contextmanager
def driver_page(script: Path, *args: str, cwd: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python SCRIPT ARGS`` (a run with ``dashboard=True``) in ``cwd``; yields the
    process and the URL its run printed. The caller lets the run end (``communicate``);
    a run still going when the block ends is killed."""
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    lines, pumping = _pump(proc)
    try:
        yield proc, _url(proc, lines)
    finally:
        _end(proc, pumping)


def get(url: str) -> tuple[int, bytes]:
    """The status and the body of ``url`` (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def resource(url: str, path: str) -> str:
    """The URL of ``path`` on the page's server at ``url``, with the page's token."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/{path.lstrip('/')}?{parts.query}"


def state_of(url: str) -> dict[str, Any]:
    """The page's JSON (``/api/state.json``) of the server at ``url``."""
    code, body = get(resource(url, "api/state.json"))
    assert code == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


def task_of(url: str, index: int = 0) -> dict[str, Any]:
    """One task's part of the page's JSON."""
    found: dict[str, Any] = state_of(url)["tasks"][index]
    return found


def status_json(store: Path) -> dict[str, Any]:
    """``bellis status STORE --json``: what the store holds, as the CLI reads it."""
    proc = subprocess.run(
        [sys.executable, "-m", "bellis", "status", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def block_pre(dom: str) -> tuple[dict[str, str], str]:
    """The ``data-*`` attributes and the text of the page's block details."""
    m = re.search(r"<pre id=\"block\"([^>]*)>(.*?)</pre>", dom, re.S)
    assert m, dom[-3000:]
    attrs = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', m.group(1)))
    return attrs, html.unescape(m.group(2))
