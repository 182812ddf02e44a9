"""The daisy 1.x compatibility surface: what ``import bellis`` (``import bellis as daisy``) gives.

Differences from :mod:`bellis.v2`: ``Task`` also accepts ``num_workers=`` and
``upstream_tasks=`` (deprecated), ``SerialServer`` exists, and ``run_blockwise`` and
``Scheduler`` accept a list of tasks.
"""

from __future__ import annotations

import warnings
from typing import Any

from funlib.geometry import Coordinate, Roi

from . import logging
from ._block import Block, BlockStats, BlockStatus, heartbeat
from ._client import Client, Context
from ._graph import BlockwiseDependencyGraph
from ._html_report import write_report
from ._profiling import profile_block
from ._progress import JsonProgressObserver
from ._report import BlockRecord, RunReport, Stat, TaskReport, WorkerRecord
from ._runner import SerialServer, Server, _pipeline_from_list, run_blockwise
from ._scheduler import Scheduler as _Scheduler
from ._skipmask import skip_mask_from_rois, skip_mask_from_volume
from ._state import TaskState
from ._task import (
    Pipeline,
    get_done_marker_basedir,
    get_tracking_basedir,
    set_done_marker_basedir,
    set_tracking_basedir,
)
from ._task import Task as _V2Task
from ._trace import write_trace
from ._version import __version__
from ._workers._launchers import LocalLauncher, WorkerLauncher
from .errors import (
    BellisError,
    ConfigurationError,
    LayoutMismatch,
    TaskAbandonedError,
    TrackingError,
)
from .logging import get_worker_log_basename
from .v2 import _cluster_launcher

__all__ = [
    "BellisError",
    "Block",
    "BlockRecord",
    "BlockStats",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "ConfigurationError",
    "Context",
    "Coordinate",
    "DaskLauncher",  # noqa: F822 - loaded on first use (needs distributed)
    "DependencyGraph",
    "JsonProgressObserver",
    "LayoutMismatch",
    "LocalLauncher",
    "Pipeline",
    "Roi",
    "RunReport",
    "Scheduler",
    "SerialServer",
    "Server",
    "SlurmLauncher",  # noqa: F822 - loaded on first use
    "Stat",
    "Task",
    "TaskAbandonedError",
    "TaskReport",
    "TaskState",
    "TrackingError",
    "WorkerLauncher",
    "WorkerRecord",
    "__version__",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "get_worker_log_basename",
    "heartbeat",
    "logging",
    "profile_block",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "skip_mask_from_rois",
    "skip_mask_from_volume",
    "write_report",
    "write_trace",
]

DependencyGraph = BlockwiseDependencyGraph


class Task(_V2Task):
    """daisy 1.x-compatible Task: also takes ``num_workers=`` and ``upstream_tasks=``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        upstream = kwargs.pop("upstream_tasks", None)
        if "num_workers" in kwargs:
            if "max_workers" in kwargs:
                raise TypeError("pass either max_workers (v2) or num_workers (v1.x), not both")
            warnings.warn(
                "num_workers is deprecated; use max_workers",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs["max_workers"] = kwargs.pop("num_workers")
        super().__init__(*args, **kwargs)
        if upstream:
            warnings.warn(
                "upstream_tasks is deprecated; compose tasks with `up + down` (Pipeline)",
                DeprecationWarning,
                stacklevel=2,
            )
        self.upstream_tasks: list[Any] = list(upstream or [])


class Scheduler(_Scheduler):
    """daisy's Scheduler; the compat form also accepts a list of tasks."""

    def __init__(self, pipeline: Any, **kwargs: Any) -> None:
        if isinstance(pipeline, list | tuple):
            pipeline = _pipeline_from_list(list(pipeline))
        super().__init__(pipeline, **kwargs)


def __getattr__(name: str) -> Any:
    launcher = _cluster_launcher(name)
    if launcher is None:
        raise AttributeError(f"module 'bellis' has no attribute {name!r}")
    return launcher
