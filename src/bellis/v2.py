"""The native bellis (daisy v2) surface, without the daisy 1.x shims (``SerialServer``,
``num_workers=``, ``upstream_tasks=``, lists of tasks), with bellis's own additions:
launchers, skip masks, the error classes and the reports.

As in daisy 2.0.0's ``daisy.v2``, the deprecated done-marker names are here too
(``set_done_marker_basedir`` and ``get_done_marker_basedir``, which warn with
:class:`~bellis.errors.BellisDeprecationWarning`), and ``__version__``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _HOMES, _load_public_name, logging

if TYPE_CHECKING:
    from funlib.geometry import Coordinate, Roi

    from ._block import Block, BlockStats, BlockStatus, heartbeat
    from ._client import Client, Context
    from ._graph import BlockwiseDependencyGraph
    from ._html_report import write_report
    from ._profiling import profile_block
    from ._progress import JsonProgressObserver
    from ._report import BlockRecord, RunReport, Stat, TaskReport, WorkerRecord
    from ._runner import Server, run_blockwise
    from ._scheduler import Scheduler
    from ._skipmask import skip_mask_from_rois, skip_mask_from_volume
    from ._state import TaskState
    from ._task import (
        Pipeline,
        Task,
        get_done_marker_basedir,
        get_tracking_basedir,
        set_done_marker_basedir,
        set_tracking_basedir,
    )
    from ._trace import write_trace
    from ._version import __version__
    from ._workers._dask import DaskLauncher
    from ._workers._launchers import LocalLauncher, WorkerLauncher
    from ._workers._slurm import SlurmLauncher
    from .errors import (
        BellisError,
        ConfigurationError,
        LayoutMismatch,
        TaskAbandonedError,
        TrackingError,
    )

    DependencyGraph = BlockwiseDependencyGraph

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
    "DaskLauncher",
    "DependencyGraph",
    "JsonProgressObserver",
    "LayoutMismatch",
    "LocalLauncher",
    "Pipeline",
    "Roi",
    "RunReport",
    "Scheduler",
    "Server",
    "SlurmLauncher",
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

# Names load on first use, each from the module that defines it (as ``bellis``'s do), so a
# worker function of an ``import bellis.v2 as daisy`` script that touches ``daisy.Client``
# loads neither numpy nor the driver's modules. v2's Task and Scheduler are the native ones.
_V2_HOMES = {name: _HOMES[name] for name in __all__ if name in _HOMES} | {
    "Task": ("bellis._task", "Task"),
    "Scheduler": ("bellis._scheduler", "Scheduler"),
}


def _cluster_launcher(name: str) -> Any:
    """``SlurmLauncher`` or ``DaskLauncher``, imported on first use (the Dask one needs
    ``distributed``); None for any other name."""
    if name == "SlurmLauncher":
        from ._workers._slurm import SlurmLauncher

        return SlurmLauncher
    if name == "DaskLauncher":
        from ._workers._dask import DaskLauncher

        return DaskLauncher
    return None


def __getattr__(name: str) -> Any:
    if name in _V2_HOMES:
        return _load_public_name(name, _V2_HOMES, globals())
    raise AttributeError(f"module 'bellis.v2' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
