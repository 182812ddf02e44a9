"""The calls that run up the layers, each through one named seam.

The daisy API puts two calls on objects that sit low in the package:

* ``Pipeline.run_blockwise()`` and ``Task.run_blockwise()``: a task is model
  (:mod:`bellis._task`); the entry point that runs it (:mod:`bellis._entrypoints`) sits
  above the runner, which imports the model.
* ``TaskReport.to_html()``, ``.panel()`` and ``._repr_html_()``: a report is a statistic
  (:mod:`bellis._stats._reports`); the page, the panel and the notebook view that draw it
  (:mod:`bellis._report`) import the statistics.

An import statement for either would close a loop in the import graph. Instead the lower
module calls a function here, and this module resolves the upper one by name when the call
is made (:func:`importlib.import_module`). :data:`UPWARD` names every target; the layering
test (``tests/unit/test_layering.py``) checks that each one really lies above its caller,
and that no other module imports a bellis module by name (``_names``, the public face's
lazy loader, excepted).

This module imports nothing of bellis. Add a seam only when a public API forces the call
onto a lower object; everything else imports downwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, Final, cast

__all__ = [
    "UPWARD",
    "render_panel",
    "run_blockwise",
    "task_report_html",
    "write_report_html",
]

#: seam -> (the module that calls it, "module:function" it resolves to)
UPWARD: Final[dict[str, tuple[str, str]]] = {
    "run_blockwise": ("bellis._task", "bellis._entrypoints:run_blockwise"),
    "render_panel": ("bellis._stats._reports", "bellis._report._panel:render_panel"),
    "task_report_html": ("bellis._stats._reports", "bellis._report._notebook:task_report_html"),
    "write_report_html": ("bellis._stats._reports", "bellis._report._html:report_html_for"),
}


def _resolve(seam: str) -> Callable[..., Any]:
    module, _, name = UPWARD[seam][1].partition(":")
    return cast(Callable[..., Any], getattr(import_module(module), name))


def run_blockwise(pipeline: object, **kwargs: Any) -> bool:
    """``bellis.run_blockwise(pipeline, **kwargs)``, for ``Pipeline.run_blockwise``."""
    return cast(bool, _resolve("run_blockwise")(pipeline, **kwargs))


def render_panel(reports: Sequence[object]) -> str:
    """The Resource Utilization panel of ``reports``, for ``TaskReport.panel()``."""
    return cast(str, _resolve("render_panel")(reports))


def task_report_html(report: object) -> str:
    """Jupyter's view of one task's report, for ``TaskReport._repr_html_()``."""
    return cast(str, _resolve("task_report_html")(report))


def write_report_html(report: object, path: str | os.PathLike[str]) -> Path:
    """Write the HTML report of ``report``'s stores to ``path``, for ``to_html()``."""
    return cast(Path, _resolve("write_report_html")(report, path))
