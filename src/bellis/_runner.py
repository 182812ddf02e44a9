"""daisy 2.0.0's module path ``daisy._runner``, kept as a thin alias.

daisy's examples and tests import ``from daisy._runner import _run_serial``; under
``bellis as-daisy`` (and ``import bellis as daisy``) that path reaches bellis's runner. The
objects are bellis's own (:mod:`bellis._entrypoints`): ``Server`` and ``run_blockwise``
are ``bellis.Server`` and ``bellis.run_blockwise``.
"""

from __future__ import annotations

from ._entrypoints import (
    SerialServer as SerialServer,
    Server as Server,
    _run_serial as _run_serial,
    run_blockwise as run_blockwise,
)
from ._names import HOMES as _HOMES, load_public_name as _load_public_name

__all__ = ["SerialServer", "Server", "run_blockwise"]

# the same objects as ``bellis.Server`` ...: loaded as ``bellis`` loads them, so that they
# name their public home whichever way a script reached them first
for _name in __all__:
    _load_public_name(_name, _HOMES, globals())
del _name
