"""Headless Chromium for the report tests: load a page, run a probe, read the DOM back.

``load(page, probe_js)`` copies the page with two scripts added: an error collector at
the top of ``<head>`` (``window.onerror`` and unhandled rejections) and, at the end,
a probe that waits for ``<body data-rendered="yes">``, runs ``probe_js`` (an async
function body that returns a JSON-able value) and writes the result and the errors
into ``<pre id="bellis-probe">``. Chromium's ``--dump-dom`` then prints the DOM, and its
net log says which network requests the page made (:func:`page_requests`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

_COLLECT = (
    "<script>window.__errs=[];window.onerror=function(m){window.__errs.push(String(m));};"
    "window.addEventListener('unhandledrejection',function(e){"
    "window.__errs.push('unhandled rejection: '+String(e.reason));});"
    "var _ce=console.error;console.error=function(){window.__errs.push("
    "'console.error: '+Array.prototype.join.call(arguments,' '));_ce.apply(console,arguments);};"
    "</script>"
)

_PROBE = """<script>
(function(){
  var t0 = Date.now();
  function finish(v){
    var pre = document.createElement('pre'); pre.id = 'bellis-probe';
    pre.textContent = JSON.stringify({result: v, errors: window.__errs,
                                      rendered: document.body.getAttribute('data-rendered')});
    document.body.appendChild(pre);
  }
  var probe = async function(){ %s };
  var iv = setInterval(function(){
    if (document.body.getAttribute('data-rendered') === 'yes' || Date.now() - t0 > %d) {
      clearInterval(iv);
      probe().then(finish, function(e){ window.__errs.push('probe: ' + e); finish(null); });
    }
  }, 50);
})();
</script>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _instrument(page: Path, out: Path, probe_js: str, wait_ms: int) -> None:
    text = page.read_text(encoding="utf-8")
    head = text.index("<head>") + len("<head>")
    text = text[:head] + _COLLECT + text[head:]
    end = text.rindex("</body>")
    text = text[:end] + (_PROBE % (probe_js, wait_ms)) + text[end:]
    out.write_text(text, encoding="utf-8")


def _run(args: list[str], profile: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    assert exe is not None
    return subprocess.run(
        [exe, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def page_requests(net_log: Path) -> list[str]:
    """The URLs the page asked for, from Chromium's ``--log-net-log`` file: every request
    job with an initiator (a page's; Chromium's own background requests have none), less
    ``file:``, ``data:`` and ``blob:`` URLs."""
    log = json.loads(net_log.read_text(encoding="utf-8"))
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log.get("events", []):
        params = event.get("params") or {}
        url = params.get("url")
        if event.get("type") != start or not isinstance(url, str):
            continue
        if params.get("initiator") in (None, "not an origin"):
            continue
        if not url.startswith(("file:", "data:", "blob:")):
            urls.append(url)
    return urls


def load(page: Path, probe_js: str = "return null;", *, wait_ms: int = 60_000) -> dict[str, Any]:
    """Load ``page`` headless, run the probe; returns {result, errors, rendered, dom,
    requests} (``requests``: the network requests the page made, :func:`page_requests`)."""
    page = page.resolve()
    work = Path(tempfile.mkdtemp(prefix="bellis-browser-", dir=page.parent))
    try:
        copy = work / "page.html"
        _instrument(page, copy, probe_js, wait_ms)
        net_log = work / "net-log.json"
        proc = _run(
            [
                f"--virtual-time-budget={wait_ms * 2}",
                f"--log-net-log={net_log}",
                "--dump-dom",
                copy.as_uri(),
            ],
            work / "profile",
            timeout=wait_ms / 1000 * 4 + 60,
        )
        dom = proc.stdout
        start = dom.find('<pre id="bellis-probe">')
        if start < 0:
            raise AssertionError(
                f"the probe never ran (rc {proc.returncode}); stderr: {proc.stderr[-2000:]}"
            )
        import html

        raw = dom[start + len('<pre id="bellis-probe">') : dom.index("</pre>", start)]
        found: dict[str, Any] = json.loads(html.unescape(raw))
        found["dom"] = dom
        found["requests"] = page_requests(net_log)
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def screenshot(page: Path, png: Path, *, size: str = "1200,2400", wait_ms: int = 30_000) -> None:
    """A PNG of the page's top ``size`` pixels, after ``wait_ms`` of virtual time."""
    page, png = page.resolve(), png.resolve()
    profile = Path(tempfile.mkdtemp(prefix="bellis-shot-", dir=png.parent))
    try:
        proc = _run(
            [
                f"--window-size={size}",
                f"--virtual-time-budget={wait_ms}",
                "--hide-scrollbars",
                f"--screenshot={png}",
                page.as_uri(),
            ],
            profile,
            timeout=wait_ms / 1000 * 4 + 60,
        )
        assert png.is_file(), f"no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def png_colours(png: Path) -> int:
    """How many distinct RGB(A) pixel values an 8-bit RGB/RGBA PNG holds (zlib only)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            assert body[8] == 8 and body[9] in (2, 6), "only 8-bit RGB/RGBA PNGs"
            channels = 3 if body[9] == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * channels
    prev = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        line = raw[y * (stride + 1) : (y + 1) * (stride + 1)]
        ftype, cur = line[0], bytearray(line[1:])
        for i in range(stride):
            a = cur[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if ftype == 1:
                cur[i] = (cur[i] + a) & 255
            elif ftype == 2:
                cur[i] = (cur[i] + b) & 255
            elif ftype == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            for x in range(0, stride, channels * 4):
                colours.add(bytes(cur[x : x + 3]))
        prev = cur
    return len(colours)


def dump_dom(url: str, *, budget_ms: int = 8000, timeout: float = 240) -> str:
    """Load ``url`` (an http page: the live page) headless and return its DOM once
    ``budget_ms`` of virtual time have passed; asserts the page said it rendered
    (``<body data-rendered="yes">``)."""
    profile = Path(tempfile.mkdtemp(prefix="bellis-live-"))
    try:
        proc = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], profile, timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert 'data-rendered="yes"' in proc.stdout, proc.stderr[-2000:]
    return proc.stdout
