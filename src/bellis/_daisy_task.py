"""daisy 2.0.0's module path ``daisy._task`` under ``bellis as-daisy``, a thin alias.

``bellis._task`` is bellis's own module of that name (``Task``, ``Pipeline``, the tracking
basedir); daisy's ``_task`` also handed out the client and the model classes
(``from daisy._task import Client``). Under the hook ``daisy._task`` is this module: the
names of both, each bellis's public object (``Task`` and ``Scheduler`` are the native
``bellis.v2`` ones, as in daisy's ``_task``).
"""

from __future__ import annotations

from typing import Any

from ._names import V2_HOMES as _V2_HOMES, load_public_name as _load_public_name

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


def __getattr__(name: str) -> Any:
    if name in _OFFERED:
        return _load_public_name(name, _V2_HOMES, globals())
    raise AttributeError(f"module 'bellis._daisy_task' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
