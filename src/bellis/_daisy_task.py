"""daisy 2.0.0's module path ``daisy._task`` under ``bellis as-daisy``, a thin alias.

``bellis._task`` is bellis's own module of that name (``Task``, ``Pipeline``, the tracking
basedir); daisy's ``_task`` also handed out the client and the model classes
(``from daisy._task import Client``). Under the hook ``daisy._task`` is this module: the
names of both, each bellis's public object (``Task`` and ``Scheduler`` are the native
``bellis.v2`` ones, as in daisy's ``_task``).
"""

from __future__ import annotations

from ._names import lazy_alias as _lazy_alias

_OFFERED = (
    "Block",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Client",
    "Context",
    "Coordinate",
    "DependencyGraph",
    "Pipeline",
    "Roi",
    "Scheduler",
    "Task",
    "TaskState",
    "get_done_marker_basedir",
    "get_tracking_basedir",
    "profile_block",
    "set_done_marker_basedir",
    "set_tracking_basedir",
)
__all__ = list(_OFFERED)


__getattr__, __dir__ = _lazy_alias("bellis._daisy_task", _OFFERED, globals())
