"""bellis: blockwise processing of huge n-dimensional volumes, daisy v2 compatible.

``import bellis as daisy`` runs daisy scripts. This module is the daisy 1.x-compatible
surface (the same names as :mod:`bellis.v1_compat`); :mod:`bellis.v2` is the native one.
Names load on first use, so worker processes start without importing numpy or zarr.
"""

from __future__ import annotations

import importlib
import os
import sys
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
_NEED_NUMPY = ("v2", "v1_compat")

# OpenBLAS (numpy's BLAS) starts a helper thread per core when numpy is imported, and
# each spins for about 2**28 CPU cycles (~0.1 s of a core) after start-up and after
# every BLAS call before it sleeps. In a driver whose workers start at the same moment,
# on a small machine, that spin takes a core from them (measured on a 2-core VM: 62 ms
# of CPU right after `import numpy`; a 2-worker run started 25 ms later). When bellis is
# the first to import numpy and the user has not chosen a value, it loads numpy with the
# spin bounded to 2**20 cycles (well under a millisecond), and restores the environment
# at once, so the setting stays with this process's OpenBLAS and reaches no child.
_BLAS_SPIN_VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
_BLAS_SPIN_LOG2_CYCLES = "20"


def _import_numpy() -> None:
    if "numpy" in sys.modules or _BLAS_SPIN_VARIABLE in os.environ:
        return
    os.environ[_BLAS_SPIN_VARIABLE] = _BLAS_SPIN_LOG2_CYCLES
    try:
        importlib.import_module("numpy")
    finally:
        os.environ.pop(_BLAS_SPIN_VARIABLE, None)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        # submodules load on their own: `from . import logging` inside bellis must not
        # pull in the whole public surface (worker processes stay light)
        if name in _NEED_NUMPY:
            _import_numpy()
        return importlib.import_module(f"bellis.{name}")
    if name in __all__:
        _import_numpy()
        compat = importlib.import_module("bellis.v1_compat")
        value = getattr(compat, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bellis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(_SUBMODULES))
