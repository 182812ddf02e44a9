"""bellis: blockwise processing of huge n-dimensional volumes, daisy v2 compatible.

``import bellis as daisy`` runs daisy scripts. This module is the daisy 1.x-compatible
surface (the same names as :mod:`bellis.v1_compat`); :mod:`bellis.v2` is the native one.
Names load on first use, so worker processes start without importing numpy or zarr.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "SerialServer",
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
    "get_worker_log_basename",
    "logging",
    "profile_block",
    "run_blockwise",
    "set_done_marker_basedir",
    "set_tracking_basedir",
    "skip_mask_from_rois",
    "skip_mask_from_volume",
]


_SUBMODULES = ("logging", "v2", "v1_compat", "block", "errors")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        # submodules load on their own: `from . import logging` inside bellis must not
        # pull in the whole public surface (worker processes stay light)
        return importlib.import_module(f"bellis.{name}")
    if name in __all__:
        compat = importlib.import_module("bellis.v1_compat")
        value = getattr(compat, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bellis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(_SUBMODULES))
