"""The live page's HTTP server: the page at ``/`` and its state at ``/api/state.json``.

The standard library's :class:`http.server.ThreadingHTTPServer` in a daemon thread, and
no new dependency: the page is one static HTML file with its script inline, and its data
one JSON document it fetches every 1.5 s, so neither a websocket nor an async framework
buys anything.

Safe by default: it binds 127.0.0.1 unless told otherwise; every request needs the
token (``?token=...``, compared in constant time; wrong or missing: 403); it serves
exactly those two resources, and the documents it is given by fixed name (the run's HTML
report and Chrome trace, made from the stores when asked), and answers 404 to every other
path, so no path ever names a file (``/../../etc/passwd`` and ``/%2e%2e/`` are paths like
any other). It prints its URL, with the token, once to stderr.
"""

from __future__ import annotations

import hmac
import secrets
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

from ._live_page import PAGE

__all__ = ["LiveServer"]

_STATE_PATH = "/api/state.json"
_POLL_SECONDS = 0.05


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        tokens = parse_qs(parts.query).get("token", [])
        token = tokens[0] if len(tokens) == 1 else ""
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            self._send(403, b"403 forbidden: this page needs the token its URL was printed with\n")
            return
        if parts.path == "/":
            self._send(200, PAGE.encode("utf-8"), "text/html; charset=utf-8")
        elif parts.path == _STATE_PATH:
            try:
                body = self.server.state()
            except Exception as exc:  # say it on the page; the server stays up
                self._send(500, f"500 cannot read the state: {exc}\n".encode())
                return
            self._send(200, body, "application/json")
        elif parts.path in self.server.documents:
            make, kind = self.server.documents[parts.path]
            try:
                body = make()
            except Exception as exc:  # say it; the server stays up
                self._send(500, f"500 cannot make {parts.path[1:]}: {exc}\n".encode())
                return
            self._send(200, body, kind)
        else:
            self._send(404, b"404 not found: this server has only its page and its state\n")

    def do_HEAD(self) -> None:
        self._send(405, b"")

    do_POST = do_PUT = do_DELETE = do_HEAD

    def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a page polling every 1.5 s would write a line per poll."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    token: str
    state: Callable[[], bytes]
    documents: Mapping[str, tuple[Callable[[], bytes], str]]


class LiveServer:
    """Serves the live page of ``state`` (a callable returning the JSON bytes) on
    ``host:port`` (port 0: any free one) in a daemon thread; ``documents`` adds fixed
    paths (``{"/report.html": (make, content type)}``), each made by its callable when
    asked (the report and the trace of the stores: :meth:`LiveState.documents`)."""

    def __init__(
        self,
        state: Callable[[], bytes],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        documents: Mapping[str, tuple[Callable[[], bytes], str]] | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.httpd = _Server((host, port), _Handler)
        self.httpd.token = self.token
        self.httpd.state = state
        self.httpd.documents = dict(documents or {})
        # the loop looks for a shutdown every 50 ms: ``close`` (at a run's end) waits at
        # most that long, where the default half second would lengthen every short run
        self.thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": _POLL_SECONDS},
            name="bellis-live",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.httpd.server_address[0])
        return f"http://{host}:{self.port}/?token={self.token}"

    def start(self, err: TextIO | None = None) -> LiveServer:
        """Start serving; print the URL once to ``err`` (stderr)."""
        self.thread.start()
        out = sys.stderr if err is None else err
        out.write(f"bellis: live page at {self.url}\n")
        out.flush()
        return self

    def close(self) -> None:
        """Stop serving and close the socket (also when :meth:`start` never ran)."""
        started = self.thread.ident is not None
        if started:
            self.httpd.shutdown()
        self.httpd.server_close()
        if started:
            self.thread.join(timeout=5)
