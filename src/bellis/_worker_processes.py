"""daisy 2.0.0's module path ``daisy._worker_processes``, kept as a thin alias.

In daisy it spawns and feeds worker subprocesses. bellis's local launcher does that work
(:mod:`bellis._launchers._base`, ``LocalLauncher``), which this path offers; daisy's
private spawn helpers have no counterpart.
"""

from __future__ import annotations

from ._launchers._base import LocalLauncher as LocalLauncher
from ._names import HOMES as _HOMES, load_public_name as _load_public_name

__all__ = ["LocalLauncher"]

for _name in __all__:
    _load_public_name(_name, _HOMES, globals())
del _name
