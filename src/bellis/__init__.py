"""bellis: blockwise processing of huge n-dimensional volumes, daisy v2 compatible.

``import bellis as daisy`` runs daisy scripts. This module is the daisy 1.x-compatible
surface (the same names as :mod:`bellis.v1_compat`); :mod:`bellis.v2` is the native one.
Names load on first use, each from the module that defines it, so a worker process that
touches ``bellis.Client`` (or ``Context``, ``Block``, ``Roi``...) imports neither numpy nor
zarr.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._names import HOMES, PUBLIC_NAMES, import_numpy, load_public_name

if TYPE_CHECKING:  # what type checkers see; test_public_api checks it against HOMES
    from funlib.geometry import Coordinate as Coordinate, Roi as Roi

    from . import logging as logging
    from ._block import (
        Block as Block,
        BlockStats as BlockStats,
        BlockStatus as BlockStatus,
        heartbeat as heartbeat,
    )
    from ._entrypoints import (
        SerialServer as SerialServer,
        Server as Server,
        run_blockwise as run_blockwise,
    )
    from ._graph import BlockwiseDependencyGraph as BlockwiseDependencyGraph
    from ._launchers._base import (
        LocalLauncher as LocalLauncher,
        WorkerLauncher as WorkerLauncher,
    )
    from ._launchers._dask import DaskLauncher as DaskLauncher
    from ._launchers._lsf import LsfLauncher as LsfLauncher
    from ._launchers._pbs import PbsLauncher as PbsLauncher
    from ._launchers._sge import SgeLauncher as SgeLauncher
    from ._launchers._slurm import SlurmLauncher as SlurmLauncher
    from ._plan._api import plan as plan
    from ._plan._model import Plan as Plan
    from ._report._html import write_report as write_report
    from ._report._trace import write_trace as write_trace
    from ._run._progress import JsonProgressObserver as JsonProgressObserver
    from ._skipmask import (
        skip_mask_from_rois as skip_mask_from_rois,
        skip_mask_from_volume as skip_mask_from_volume,
    )
    from ._state import TaskState as TaskState
    from ._stats._reports import (
        BlockRecord as BlockRecord,
        RunReport as RunReport,
        Stat as Stat,
        TaskReport as TaskReport,
        WorkerRecord as WorkerRecord,
    )
    from ._task import (
        Pipeline as Pipeline,
        get_done_marker_basedir as get_done_marker_basedir,
        get_tracking_basedir as get_tracking_basedir,
        set_done_marker_basedir as set_done_marker_basedir,
        set_tracking_basedir as set_tracking_basedir,
    )
    from ._version import __version__ as __version__
    from ._worker._client import Client as Client, Context as Context
    from ._worker._profiling import profile_block as profile_block
    from .errors import (
        BellisError as BellisError,
        CodeChangedError as CodeChangedError,
        ConfigurationError as ConfigurationError,
        ConnectionLostError as ConnectionLostError,
        DependencyCycleError as DependencyCycleError,
        LayoutMismatch as LayoutMismatch,
        ProtocolError as ProtocolError,
        TaskAbandonedError as TaskAbandonedError,
        TrackingError as TrackingError,
        WorkerError as WorkerError,
        WorkerStartError as WorkerStartError,
    )
    from .logging import get_worker_log_basename as get_worker_log_basename
    from .v1_compat import Scheduler as Scheduler, Task as Task

    DependencyGraph = BlockwiseDependencyGraph

_SUBMODULES = ("logging", "v2", "v1_compat", "block", "errors")
#: daisy 2.0.0's other module paths, kept as thin aliases (``daisy._runner._run_serial``
#: after ``import bellis as daisy``); tests/compat/daisy_modules.json lists daisy's modules
_DAISY_PATHS = (
    "cl_monitor",
    "_daisy",
    "_progress",
    "_runner",
    "_subprocess_worker",
    "_task",
    "_worker_processes",
)
_NEED_NUMPY = ("v1_compat", "_runner", "_task")

__all__ = list(PUBLIC_NAMES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES or name in _DAISY_PATHS:
        # submodules load on their own: `from . import logging` inside bellis must not
        # pull in the whole public surface (worker processes stay light)
        if name in _NEED_NUMPY:
            import_numpy()
        return importlib.import_module(f"bellis.{name}")
    if name in HOMES:
        return load_public_name(name, HOMES, globals())
    raise AttributeError(f"module 'bellis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(_SUBMODULES))
