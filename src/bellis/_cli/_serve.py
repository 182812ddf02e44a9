"""``bellis serve TRACKPATH...``: the live page of a run in another process, or finished.

Reads only the tracking stores, read-only (never the run lock), through
``_report._live``; serves them with ``_report._live_server`` until Ctrl-C (exit 0) or
SIGTERM. See ``docs/live.md``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

__all__ = ["add_serve_parser"]


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--port must be a number 0..65535, not {text!r}"
        ) from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be 0..65535 (0: any free port), not {value}")
    return value


def _cmd_serve(args: argparse.Namespace) -> int:
    from .._donemarks import location_name
    from .._report._data import find_stores
    from .._report._live import LiveState
    from .._report._live_server import LiveServer
    from ..errors import TrackingError

    try:
        stores = find_stores(args.paths)
    except TrackingError as exc:
        print(f"bellis serve: {exc}", file=sys.stderr)
        return 2
    state = LiveState(stores)  # local folders and s3:// URLs alike (docs/cloud.md)
    try:
        server = LiveServer(
            state.json_bytes, host=args.host, port=args.port, documents=state.documents()
        )
    except OSError as exc:
        print(
            f"bellis serve: cannot listen on {args.host}:{args.port}: {exc}; choose another "
            "--port (0: any free one)",
            file=sys.stderr,
        )
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    names = ", ".join(location_name(s) for s in stores)
    try:  # a Ctrl-C from the URL's first line on ends it cleanly
        print(f"bellis serve: {len(stores)} stores ({names}); Ctrl-C to stop", file=sys.stderr)
        server.start(sys.stderr)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("bellis serve: stopped", file=sys.stderr)
    finally:
        server.close()
    return 0


def add_serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve the live page of a run from its tracking store(s), until Ctrl-C",
        description="PATH is a task's tracking store, or a folder that holds several (a "
        "pipeline's tracking basedir), or an s3:// URL of either (docs/cloud.md). The "
        "stores are read read-only, so a run may be writing them. The URL, with its "
        "token, is printed once to stderr; see docs/live.md for reaching it through an "
        "SSH tunnel.",
    )
    v.add_argument("paths", nargs="+", metavar="PATH", help="tracking store(s) or basedir(s)")
    v.add_argument(
        "--port", type=_port, default=0, help="the port to listen on (default 0: any free one)"
    )
    v.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to bind (default 127.0.0.1: this machine only; reach it through "
        "an SSH tunnel)",
    )
    v.set_defaults(fn=_cmd_serve)
