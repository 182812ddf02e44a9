"""The public ways into a run: ``run_blockwise``, ``Server``, ``SerialServer`` and daisy's
``_run_serial``, and where each call goes.

This module is thin and sits above :mod:`bellis._run` and :mod:`bellis._plan`. Each entry
point keeps daisy's signature (SPEC §3), turns its arguments into one
:class:`~bellis._run._options.RunOptions`, and routes the call:

* ``dry_run=True``: to :func:`bellis._plan._api.plan`, which runs nothing;
* under ``bellis plan -- python script.py`` (``BELLIS_PLAN`` set): to the planner, which
  prints and records the call's plan and answers as a completed run would;
* otherwise: the run itself (:func:`bellis._run._runner.execute`).

The run's result is then settled the entry point's way: ``run_blockwise`` raises
:class:`~bellis.errors.TaskAbandonedError`; a server returns the states and never raises it.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import logging as blog
from ._plan._api import plan_run, planned_states
from ._plan._script import settings as script_planning
from ._run._observers import AttachableObservers
from ._run._options import RunOptions
from ._run._runner import RunResult, RunSettings, execute
from ._state import TaskState
from ._worker._client import Context
from .errors import BellisDeprecationWarning

__all__ = ["SerialServer", "Server", "run_blockwise"]


def _route(settings: RunSettings) -> RunResult:
    """Run ``settings``; under ``bellis plan`` (``BELLIS_PLAN``), plan it instead: the
    result then says what a completed run would (docs/plan.md)."""
    if script_planning() is None:
        return execute(settings)
    order, states = planned_states(settings)
    return RunResult(states=states, order=order)


def run_blockwise(
    pipeline: Any,
    multiprocessing: bool = True,
    resources: dict[str, int] | None = None,
    progress: Any = True,
    block_tracking: bool = True,
    return_states: bool = False,
    host: str | None = None,
    summary: bool = True,
    launcher: Any = None,
    dry_run: bool = False,
    dashboard: bool | int = False,
) -> Any:
    """Run a task, a pipeline or a list of tasks to completion.

    Returns True iff every block of every task completed (skips count as completed), or
    the ``{task_id: TaskState}`` dict with ``return_states=True``. Raises
    :class:`TaskAbandonedError` (a ``RuntimeError``) after the summary when a task
    exhausted its worker restarts, ``KeyboardInterrupt`` on SIGINT/SIGTERM, and
    :class:`ConfigurationError` (``invalid configuration: ...``) before anything runs.
    ``dry_run=True`` runs nothing and returns the run's ``bellis.Plan`` (docs/plan.md).
    ``dashboard=True`` (or a port) serves the live page on 127.0.0.1 while the run goes
    on, its URL printed to stderr (docs/live.md).
    """
    options = RunOptions(
        multiprocessing=multiprocessing,
        resources=resources,
        progress=progress,
        block_tracking=block_tracking,
        return_states=return_states,
        host=host,
        summary=summary,
        launcher=launcher,
        dry_run=dry_run,
        dashboard=dashboard,
    )
    if options.dry_run:
        return plan_run(pipeline, options)
    result = _route(RunSettings.build(pipeline, options))
    return result.settle(options.return_states, raise_abandoned=True)


class Server(AttachableObservers):
    """Runs pipelines in distributed mode (daisy's ``Server``). Never raises for abandonment.

    ``hostname`` and ``port`` are set while a run listens, so external workers can join
    (``bellis worker --host H --port P ...``); ``last_report`` holds the last RunReport.
    """

    def __init__(
        self,
        stop_event: Any = None,
        *,
        external_workers: bool = False,
        on_listen: Any = None,
    ) -> None:
        self.hostname: str | None = None
        self.port: int | None = None
        self.secret: bytes | None = None
        self.last_report: Any = None
        self.last_task_order: list[str] = []
        self.external_workers = external_workers
        self._listen_callback = on_listen
        self._init_observers()

    def worker_context(self, task_id: str) -> str:
        """The context string an external worker of ``task_id`` needs to join this run.

        Valid while a run listens (from an ``on_listen`` callback, or another thread); pass
        it to ``bellis worker --context ...`` or set it as ``BELLIS_CONTEXT``. It holds the
        run's secret: treat it as a password.
        """

        if self.hostname is None or self.port is None or self.secret is None:
            raise RuntimeError(
                "Server.worker_context() is only available while a run is listening; call it "
                "from Server(on_listen=...) or from another thread during run_blockwise()"
            )
        base = blog.get_log_basedir()
        return Context(
            hostname=self.hostname,
            port=self.port,
            task_id=task_id,
            worker_id=-1,
            logdir="" if base is None else str(base),
            secret=self.secret.hex(),
        ).to_env()

    def _listening(self, host: str, port: int, secret: bytes) -> None:
        """The run listens: external workers may join from now on."""
        self.hostname = host
        self.port = port
        self.secret = secret
        if self._listen_callback is not None:
            self._listen_callback(self)

    def run_blockwise(
        self,
        pipeline: Any,
        resources: dict[str, int] | None = None,
        progress: Any = True,
        block_tracking: bool = True,
        host: str | None = None,
        summary: bool = True,
        launcher: Any = None,
    ) -> dict[str, TaskState]:
        options = RunOptions(
            multiprocessing=True,
            resources=resources,
            progress=self._observers.progress_for(progress),
            block_tracking=block_tracking,
            return_states=True,
            host=host,
            summary=summary,
            launcher=launcher,
        )
        settings = RunSettings.build(
            pipeline, options, external=self.external_workers, on_listen=self._listening
        )
        result = _route(settings)
        self.last_report = result.report
        self.last_task_order = result.order
        states: dict[str, TaskState] = result.settle(True, raise_abandoned=False)
        return states


class SerialServer(AttachableObservers):
    """daisy 1.x's serial runner (deprecated): ``SerialServer().run_blockwise(tasks)``."""

    def __init__(self) -> None:
        warnings.warn(
            "SerialServer is deprecated; use run_blockwise(..., multiprocessing=False)",
            BellisDeprecationWarning,
            stacklevel=2,
        )
        self._init_observers()

    def run_blockwise(self, tasks: Any, block_tracking: bool = True) -> dict[str, TaskState]:
        options = RunOptions(multiprocessing=False, progress=False, block_tracking=block_tracking)
        settings = RunSettings.build(
            tasks, options, serial_observer=self._observers.progress_for(False)
        )
        states: dict[str, TaskState] = _route(settings).settle(True, raise_abandoned=False)
        return states


def _run_serial(
    pipeline: Any, block_tracking: bool = True, summary: bool = True
) -> dict[str, TaskState]:
    """daisy's private serial entry point, which daisy's examples teach (``mws.py``): the
    blocks run in this process, with no progress display; returns ``{task_id: TaskState}``.
    An exception from a block propagates; a task's outcome is never raised."""
    options = RunOptions(
        multiprocessing=False, progress=False, block_tracking=block_tracking, summary=summary
    )
    states: dict[str, TaskState] = _route(RunSettings.build(pipeline, options)).settle(
        True, raise_abandoned=False
    )
    return states
