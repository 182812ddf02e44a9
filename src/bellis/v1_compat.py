"""The daisy 1.x compatibility surface: what ``import bellis`` (``import bellis as daisy``) gives.

Differences from :mod:`bellis.v2`: ``Task`` also accepts ``num_workers=`` and
``upstream_tasks=`` (deprecated), ``SerialServer`` exists, and ``run_blockwise`` and
``Scheduler`` accept a list of tasks.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import logging as logging
from ._names import HOMES, PUBLIC_NAMES as _PUBLIC_NAMES, load_public_name
from ._run._checks import _pipeline_from_list
from ._scheduling._scheduler import Scheduler as _Scheduler
from ._task import Task as _V2Task
from .errors import BellisDeprecationWarning

# ``import bellis`` offers this module's names: the one list is ``bellis.__all__``. Task and
# Scheduler are defined below; every other name loads on first use from its home
# (``bellis.HOMES``), the same object ``bellis`` gives.
__all__ = list(_PUBLIC_NAMES)


class Task(_V2Task):
    """daisy 1.x-compatible Task: also takes ``num_workers=`` and ``upstream_tasks=``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        upstream = kwargs.pop("upstream_tasks", None)
        if "num_workers" in kwargs:
            if "max_workers" in kwargs:
                raise TypeError("pass either max_workers (v2) or num_workers (v1.x), not both")
            warnings.warn(
                "num_workers is deprecated; use max_workers",
                BellisDeprecationWarning,
                stacklevel=2,
            )
            kwargs["max_workers"] = kwargs.pop("num_workers")
        super().__init__(*args, **kwargs)
        if upstream:
            warnings.warn(
                "upstream_tasks is deprecated; compose tasks with `up + down` (Pipeline)",
                BellisDeprecationWarning,
                stacklevel=2,
            )
        self.upstream_tasks: list[Any] = list(upstream or [])


class Scheduler(_Scheduler):
    """daisy's Scheduler; the compat form also accepts a list of tasks."""

    def __init__(self, pipeline: Any, **kwargs: Any) -> None:
        if isinstance(pipeline, list | tuple):
            pipeline = _pipeline_from_list(list(pipeline))
        super().__init__(pipeline, **kwargs)


def __getattr__(name: str) -> Any:
    if name in HOMES:
        return load_public_name(name, HOMES, globals())
    raise AttributeError(f"module 'bellis.v1_compat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
