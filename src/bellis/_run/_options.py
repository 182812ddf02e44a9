"""``run_blockwise``'s options, declared once.

Every way into a run (``run_blockwise``, ``Server.run_blockwise``,
``SerialServer.run_blockwise``, ``_run_serial``, ``bellis.plan`` and ``run_blockwise(...,
dry_run=True)``) keeps the public signature daisy's users call (SPEC §3), and turns its
arguments into one :class:`RunOptions` at once; below that, only the options object
travels. ``tests/unit/test_run_options.py`` checks that each public signature's names and
defaults are those declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RunOptions"]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The options of ``run_blockwise(pipeline, ...)``, with its defaults."""

    #: True: workers run the blocks; False: this process runs them (serial mode)
    multiprocessing: bool = True
    #: the global resource budget (``{"gpu": 2, ...}``), checked by the run
    resources: dict[str, int] | None = None
    #: the progress display: True/False, "json", a path, or an observer
    progress: Any = True
    #: read and write the tracking stores (False: run every block, record nothing)
    block_tracking: bool = True
    #: return the ``{task_id: TaskState}`` dict instead of a bool
    return_states: bool = False
    #: the host workers dial (None: chosen from the launchers)
    host: str | None = None
    #: print the summary and the panel at the end
    summary: bool = True
    #: the default launcher (None: a LocalLauncher); a task's own launcher wins
    launcher: Any = None
    #: run nothing; return the run's ``bellis.Plan``
    dry_run: bool = False
    #: serve the live page while the run goes on: True (a free port) or a port number
    #: (docs/live.md)
    dashboard: bool | int = False
