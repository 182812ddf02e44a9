"""daisy 2.0.0's module path ``daisy._daisy`` (its compiled core), kept as a thin alias.

The classes and functions daisy's core exported under their public names are bellis's
(``daisy._daisy.Roi is bellis.Roi``; ``Task`` and ``Scheduler`` are the native
``bellis.v2`` ones). Each loads on first use, as ``bellis``'s names do; the core's private
functions have no counterpart.
"""

from __future__ import annotations

from ._names import lazy_alias as _lazy_alias

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


__getattr__, __dir__ = _lazy_alias("bellis._daisy", _OFFERED, globals())
