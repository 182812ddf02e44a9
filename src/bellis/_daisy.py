"""daisy 2.0.0's module path ``daisy._daisy`` (its compiled core), kept as a thin alias.

The classes and functions daisy's core exported under their public names are bellis's
(``daisy._daisy.Roi is bellis.Roi``; ``Task`` and ``Scheduler`` are the native
``bellis.v2`` ones). Each loads on first use, as ``bellis``'s names do; the core's private
functions have no counterpart.
"""

from __future__ import annotations

from typing import Any

from ._names import V2_HOMES as _V2_HOMES, load_public_name as _load_public_name

_OFFERED = (
    "Block",
    "BlockStats",
    "BlockStatus",
    "BlockwiseDependencyGraph",
    "Context",
    "Coordinate",
    "DependencyGraph",
    "Pipeline",
    "Roi",
    "Scheduler",
    "Task",
    "TaskState",
    "get_done_marker_basedir",
    "profile_block",
    "set_done_marker_basedir",
)
__all__ = list(_OFFERED)


def __getattr__(name: str) -> Any:
    if name in _OFFERED:
        return _load_public_name(name, _V2_HOMES, globals())
    raise AttributeError(f"module 'bellis._daisy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
