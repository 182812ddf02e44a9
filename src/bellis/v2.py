"""The native bellis (daisy v2) surface, without the daisy 1.x shims (``SerialServer``,
``num_workers=``, ``upstream_tasks=``, lists of tasks), with bellis's own additions:
launchers, skip masks, the error classes and the reports.

As in daisy 2.0.0's ``daisy.v2``, the deprecated done-marker names are here too
(``set_done_marker_basedir`` and ``get_done_marker_basedir``, which warn with
:class:`~bellis.errors.BellisDeprecationWarning`), and ``__version__``."""

from __future__ import annotations

from typing import Any

from . import logging as logging
from ._names import PUBLIC_NAMES as _PUBLIC_NAMES, V1_ONLY, V2_HOMES, load_public_name

# One list (``bellis.__all__``, from ``bellis.HOMES``) less the 1.x-only names. Names load
# on first use, each from the module that defines it (as ``bellis``'s do), so a worker
# function of an ``import bellis.v2 as daisy`` script that touches ``daisy.Client`` loads
# neither numpy nor the driver's modules. v2's Task and Scheduler are the native ones.
__all__ = [name for name in _PUBLIC_NAMES if name not in V1_ONLY]


def __getattr__(name: str) -> Any:
    if name in V2_HOMES:
        return load_public_name(name, V2_HOMES, globals())
    raise AttributeError(f"module 'bellis.v2' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
