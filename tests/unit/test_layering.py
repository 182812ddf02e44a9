"""Imports run one way (STYLE.md): geometry -> block/task -> graph -> scheduler -> protocol
-> server/client -> runner. The tracking store, the profiler and the report modules see
only the block types, the errors and themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "bellis"

# a module may import (at module level) only modules of the same or a lower rank
RANK = {
    "errors": 0,
    "_state": 0,
    "_streams": 0,
    "_version": 0,
    "_code_origin": 0,
    "logging": 0,
    "_block": 1,
    "_graph": 2,
    "_profiling": 2,
    "_skipmask": 2,
    "_report": 2,
    "_aggregates": 2,
    "_runlog": 2,
    "_notebook": 3,
    "_timeline": 2,
    "_tracking": 2,
    "_panel": 3,
    "_report_data": 3,
    "_report_figures": 3,
    "_report_advice": 3,
    "_report_page": 3,
    "_report_timeline": 3,
    "_html_report": 3,
    "_task": 3,
    "_trace": 3,
    "_scheduler": 4,
    "_serial": 5,
    "_protocol": 5,
    "_client": 6,
    "_progress": 6,
    "_workers": 6,
    "_server": 7,
    "_observers": 7,
    "_runner": 8,
    "_worker": 8,
    "_demo": 9,
    "_cli": 9,
    "_watch": 9,
    "_as_daisy": 9,
    "cl_monitor": 9,
    "v1_compat": 9,
    "v2": 9,
    "block": 9,
    "worker": 9,
    "__init__": 9,
    "__main__": 9,
}

# these see only what is listed (plus themselves), at any depth of the file
RESTRICTED = {
    "_tracking": {"errors", "_block"},
    "_profiling": {"errors", "_block"},
    # _html_report: TaskReport.to_html / RunReport.to_html, imported when called
    "_report": {
        "errors",
        "_block",
        "_runlog",
        "_panel",
        "_aggregates",
        "_notebook",
        "_html_report",
    },
    "_notebook": {"errors", "_block", "_panel", "_aggregates", "_runlog"},
    "_aggregates": {"errors", "_block"},
    "_runlog": {"errors"},
    "_panel": {"errors", "_block", "_runlog", "_aggregates"},
    "_timeline": {"errors", "_block", "_report", "_aggregates"},
    "_protocol": {"errors", "_block"},  # the wire form of BlockStats
}

# deliberate upward imports inside functions (convenience entry points)
ALLOWED_LAZY_UPWARD = {
    ("_task", "_runner"),  # Task.run_blockwise / Task.report
    ("_task", "_tracking"),  # Task.reset / Task.failed_blocks
    ("_workers", "_client"),  # the worker exit codes
    # the views of a report import the report; its methods that show them import them when called
    ("_report", "_html_report"),  # TaskReport.to_html / RunReport.to_html
    ("_report", "_panel"),  # TaskReport.panel / RunReport.panel
    ("_report", "_notebook"),  # TaskReport._repr_html_ (Jupyter)
}


def _group(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported bellis group, imported inside a function?) for every import in a file.

    Imports under ``if TYPE_CHECKING:`` are annotations only and are not counted.
    """
    parts = path.relative_to(SRC).parts
    package = parts[:-1]  # () for bellis itself, ("_tracking",) for a subpackage
    found: list[tuple[str, bool]] = []

    def targets(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            if node.level - 1 > len(package):
                return []
            if base:  # inside a subpackage: the group is the subpackage itself
                return [base[0]]
            if node.module:
                return [node.module.split(".")[0]]
            return [a.name for a in node.names]
        mod = node.module or ""
        if mod == "bellis":
            return [a.name for a in node.names]
        if mod.startswith("bellis."):
            return [mod.split(".")[1]]
        return []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if (
                isinstance(child, ast.If)
                and isinstance(child.test, ast.Name)
                and child.test.id == "TYPE_CHECKING"
            ):
                continue
            inner = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom):
                found.extend((t, inner) for t in targets(child))
            elif isinstance(child, ast.Import):
                found.extend(
                    (a.name.split(".")[1], inner)
                    for a in child.names
                    if a.name.startswith("bellis.")
                )
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


FILES = sorted(p for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_run_one_way(path: Path) -> None:
    me = _group(path)
    assert me in RANK, f"give {me} a rank in this test"
    problems = []
    for target, nested in _imports(path):
        if target == me or target not in RANK:
            continue
        if me in RESTRICTED and target not in RESTRICTED[me]:
            problems.append(f"{me} must not import {target}")
            continue
        if RANK[target] > RANK[me]:
            if nested and (me, target) in ALLOWED_LAZY_UPWARD:
                continue
            problems.append(f"{me} (rank {RANK[me]}) imports {target} (rank {RANK[target]})")
    assert not problems, problems


def test_every_module_is_checked() -> None:
    groups = {_group(p) for p in FILES}
    assert groups <= set(RANK), groups - set(RANK)
