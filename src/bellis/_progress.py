"""daisy 2.0.0's module path ``daisy._progress``, kept as a thin alias.

``from daisy._progress import JsonProgressObserver`` reaches ``bellis.JsonProgressObserver``
(:mod:`bellis._run._progress`). daisy's private helpers of that module (its summary
printers) have no counterpart here: bellis prints its own summary (``docs/output.md``).
"""

from __future__ import annotations

from ._names import HOMES as _HOMES, load_public_name as _load_public_name
from ._run._progress import JsonProgressObserver as JsonProgressObserver

__all__ = ["JsonProgressObserver"]

for _name in __all__:
    _load_public_name(_name, _HOMES, globals())
del _name
