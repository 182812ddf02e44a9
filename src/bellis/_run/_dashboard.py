"""``run_blockwise(..., dashboard=True | PORT)``: the live page served by the driver.

The same page and JSON as ``bellis serve`` (``_report._live``), for the stores this run
opened, served on 127.0.0.1 from a daemon thread for as long as the run goes on. Nothing
happens per block: the state is read from the stores (read-only, as ``bellis serve``
reads them) only when a page asks, at most once a second. See ``docs/live.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._donemarks import BlockStore
from .._report._live import LiveState
from .._report._live_server import LiveServer
from ._checks import _config_error

__all__ = ["check_dashboard", "start_dashboard"]


def check_dashboard(value: Any) -> int | None:
    """The port ``dashboard`` asks for (0: any free one), None for no page; raises
    ConfigurationError for anything but a bool or a port number."""
    if value is False or value is None:
        return None
    if value is True:
        return 0
    if isinstance(value, int) and 0 <= value <= 65535:
        return value
    raise _config_error(
        f"dashboard={value!r}: pass True (any free port), a port number 0..65535, or False",
        "dashboard",
    )


def start_dashboard(port: int | None, stores: Mapping[str, BlockStore]) -> LiveServer | None:
    """Serve the live page of ``stores`` on 127.0.0.1:``port``; None when ``port`` is
    None. Raises ConfigurationError when no task has a store (the page is drawn from the
    stores) or the port cannot be bound."""
    if port is None:
        return None
    if not stores:
        raise _config_error(
            "dashboard=True draws its page from the tracking stores, and no task of this "
            "run has one: pass Task(tracking_path=...) or call bellis.set_tracking_basedir("
            "...), and keep block_tracking=True",
            "dashboard",
        )
    state = LiveState([Path(s.path) for s in stores.values()])
    try:
        server = LiveServer(state.json_bytes, port=port)
    except OSError as exc:
        raise _config_error(
            f"dashboard={port}: cannot listen on 127.0.0.1:{port}: {exc}; pass another port "
            "or True (any free one)",
            "dashboard",
        ) from exc
    return server.start()
