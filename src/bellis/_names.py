"""The public names of ``bellis``, ``bellis.v1_compat`` and ``bellis.v2``: one table, and
the loader that imports each name from its home module on first use.

Kept apart from ``bellis/__init__.py`` so that the public modules read the table without
importing each other (``bellis`` names ``v1_compat``'s classes for type checkers).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

# Where each public name is defined, loaded on first use. Only ``Task`` and ``Scheduler``
# are v1_compat's own (they accept the 1.x forms); everything else comes from its home
# module, so a worker function that touches ``bellis.Client`` loads the client and no more.
HOMES: dict[str, tuple[str, str]] = {
    "BellisError": ("bellis.errors", "BellisError"),
    "Block": ("bellis._block", "Block"),
    "BlockRecord": ("bellis._stats._reports", "BlockRecord"),
    "BlockStats": ("bellis._block", "BlockStats"),
    "BlockStatus": ("bellis._block", "BlockStatus"),
    "BlockwiseDependencyGraph": ("bellis._graph", "BlockwiseDependencyGraph"),
    "Client": ("bellis._worker._client", "Client"),
    "CodeChangedError": ("bellis.errors", "CodeChangedError"),
    "ConfigurationError": ("bellis.errors", "ConfigurationError"),
    "ConnectionLostError": ("bellis.errors", "ConnectionLostError"),
    "Context": ("bellis._worker._client", "Context"),
    "Coordinate": ("funlib.geometry", "Coordinate"),
    "DaskLauncher": ("bellis._launchers._dask", "DaskLauncher"),
    "DependencyCycleError": ("bellis.errors", "DependencyCycleError"),
    "DependencyGraph": ("bellis._graph", "BlockwiseDependencyGraph"),
    "JsonProgressObserver": ("bellis._run._progress", "JsonProgressObserver"),
    "LayoutMismatch": ("bellis.errors", "LayoutMismatch"),
    "LocalLauncher": ("bellis._launchers._base", "LocalLauncher"),
    "LsfLauncher": ("bellis._launchers._lsf", "LsfLauncher"),
    "PbsLauncher": ("bellis._launchers._pbs", "PbsLauncher"),
    "Pipeline": ("bellis._task", "Pipeline"),
    "Plan": ("bellis._plan._model", "Plan"),
    "ProtocolError": ("bellis.errors", "ProtocolError"),
    "Roi": ("funlib.geometry", "Roi"),
    "RunReport": ("bellis._stats._reports", "RunReport"),
    "Scheduler": ("bellis.v1_compat", "Scheduler"),
    "SerialServer": ("bellis._entrypoints", "SerialServer"),
    "SgeLauncher": ("bellis._launchers._sge", "SgeLauncher"),
    "Server": ("bellis._entrypoints", "Server"),
    "SlurmLauncher": ("bellis._launchers._slurm", "SlurmLauncher"),
    "Stat": ("bellis._stats._reports", "Stat"),
    "Task": ("bellis.v1_compat", "Task"),
    "TaskAbandonedError": ("bellis.errors", "TaskAbandonedError"),
    "TaskReport": ("bellis._stats._reports", "TaskReport"),
    "TaskState": ("bellis._state", "TaskState"),
    "TrackingError": ("bellis.errors", "TrackingError"),
    "WorkerError": ("bellis.errors", "WorkerError"),
    "WorkerLauncher": ("bellis._launchers._base", "WorkerLauncher"),
    "WorkerRecord": ("bellis._stats._reports", "WorkerRecord"),
    "WorkerStartError": ("bellis.errors", "WorkerStartError"),
    "__version__": ("bellis._version", "__version__"),
    "get_done_marker_basedir": ("bellis._task", "get_done_marker_basedir"),
    "get_tracking_basedir": ("bellis._task", "get_tracking_basedir"),
    "get_worker_log_basename": ("bellis.logging", "get_worker_log_basename"),
    "heartbeat": ("bellis._block", "heartbeat"),
    "plan": ("bellis._plan._api", "plan"),
    "profile_block": ("bellis._worker._profiling", "profile_block"),
    "run_blockwise": ("bellis._entrypoints", "run_blockwise"),
    "set_done_marker_basedir": ("bellis._task", "set_done_marker_basedir"),
    "set_tracking_basedir": ("bellis._task", "set_tracking_basedir"),
    "skip_mask_from_rois": ("bellis._skipmask", "skip_mask_from_rois"),
    "skip_mask_from_volume": ("bellis._skipmask", "skip_mask_from_volume"),
    "write_trace": ("bellis._report._trace", "write_trace"),
    "write_report": ("bellis._report._html", "write_report"),
}
#: The public names: those above and the submodule ``logging`` (daisy's ``daisy.logging``).
#: ``bellis.v1_compat`` has the same list and ``bellis.v2`` all of it but :data:`V1_ONLY`.
PUBLIC_NAMES = sorted([*HOMES, "logging"])
#: The names only the daisy 1.x surface has; the native ``bellis.v2`` leaves them out.
V1_ONLY = frozenset({"SerialServer", "get_worker_log_basename"})
#: ``bellis.v2``'s own names: the native Task and Scheduler (the 1.x ones extend them).
V2_OWN_HOMES: dict[str, tuple[str, str]] = {
    "Task": ("bellis._task", "Task"),
    "Scheduler": ("bellis._scheduling._scheduler", "Scheduler"),
}
#: ``bellis.v2``'s table: ``bellis``'s names less :data:`V1_ONLY`, with its own.
V2_HOMES: dict[str, tuple[str, str]] = {
    name: home for name, home in HOMES.items() if name not in V1_ONLY
} | V2_OWN_HOMES
# public modules whose classes keep them as their home (see _claim_public_home)
_OWN_PUBLIC_HOMES = frozenset({"bellis.errors"})
# the homes that neither import numpy nor compute with it: the names a worker uses
LIGHT_HOMES = frozenset(
    {
        "bellis.errors",
        "bellis._block",
        "bellis._worker._client",
        "bellis._state",
        "bellis._version",
        "bellis._worker._profiling",
        "bellis._run._progress",
        "bellis.logging",
        "bellis._launchers._base",
        "bellis._launchers._slurm",
        "bellis._launchers._lsf",
        "bellis._launchers._pbs",
        "bellis._launchers._sge",
        "bellis._launchers._dask",
        "funlib.geometry",
    }
)

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


def import_numpy() -> None:
    if "numpy" in sys.modules or _BLAS_SPIN_VARIABLE in os.environ:
        return
    os.environ[_BLAS_SPIN_VARIABLE] = _BLAS_SPIN_LOG2_CYCLES
    try:
        importlib.import_module("numpy")
    finally:
        os.environ.pop(_BLAS_SPIN_VARIABLE, None)


def load_public_name(
    name: str, homes: Mapping[str, tuple[str, str]], namespace: dict[str, Any]
) -> Any:
    """Import ``name`` from its home module (numpy first, bounded, where that needs it) and
    keep it in ``namespace``, the globals of the public module asking for it."""
    module_name, attribute = homes[name]
    if module_name not in LIGHT_HOMES:
        import_numpy()
    value = getattr(importlib.import_module(module_name), attribute)
    if isinstance(value, type):
        _claim_public_home(value, (module_name, attribute))
    namespace[name] = value
    return value


def lazy_alias(
    module_name: str, offered: tuple[str, ...], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a thin alias module of daisy's (``_daisy``,
    ``_daisy_task``): each name of ``offered`` is bellis's public object of that name
    (``V2_HOMES``), loaded on first use into ``namespace``, the alias module's globals."""

    def getattr_(name: str) -> Any:
        if name in offered:
            return load_public_name(name, V2_HOMES, namespace)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(offered))

    return getattr_, dir_


def _claim_public_home(cls: type, home: tuple[str, str]) -> None:
    """Let a public class of bellis's name its public module, not the private one that
    defines it: ``repr(bellis.Task)`` reads ``<class 'bellis.Task'>``, ``bellis.v2``'s own
    Task ``<class 'bellis.v2.Task'>``. ``home`` is the table entry it was loaded from.

    The public module is the one whose table holds the class under its own name at that
    entry (``DependencyGraph`` is ``bellis.BlockwiseDependencyGraph``). Foreign classes
    (funlib's Roi) are left alone, and so are the errors: ``bellis.errors`` is their
    documented home, and a traceback names an error the same way whatever loaded first.

    Pickle and cloudpickle find a class by ``__module__`` and ``__qualname__``: the public
    module's lazy ``__getattr__`` gives this same object, and that module is loaded (this
    runs when a name loads from it). A public class is top-level: its qualname is its name.
    """
    name = cls.__name__
    if cls.__qualname__ != name or cls.__module__ in _OWN_PUBLIC_HOMES:
        return
    if not cls.__module__.startswith("bellis."):
        return
    if HOMES.get(name) == home:
        cls.__module__ = "bellis"
    elif V2_OWN_HOMES.get(name) == home:
        cls.__module__ = "bellis.v2"
