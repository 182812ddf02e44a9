"""Imports run one way (STYLE.md): geometry -> block/task -> graph -> scheduler -> protocol
-> server/client -> runner. The tracking store, the profiler and the report modules see
only the block types, the errors and themselves. No two modules import each other, not even
through ``TYPE_CHECKING`` or inside a function, except the lazy edges named below."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "bellis"

# a module may import (at module level) only modules of the same or a lower rank
RANK = {
    "errors": 0,
    "_state": 0,
    "_streams": 0,
    "_version": 0,
    "_names": 0,
    "_gpu": 0,
    "_code_origin": 0,
    "_walltime": 0,
    "_memory": 1,
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
    "_report_load": 3,
    "_task": 3,
    "_stall": 3,
    "_trace": 3,
    "_scheduler": 4,
    "_task_run": 4,
    "_serial": 5,
    "_protocol": 5,
    "_client": 6,
    "_summary": 2,
    "_progress": 6,
    "_workers": 6,
    "_run_state": 6,
    "_batching": 5,
    "_deadlines": 6,
    "_backups": 6,
    "_staffing": 6,
    "_dispatch": 6,
    "_signals": 0,
    "_server": 7,
    "_transport": 7,
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
    "_profiling": {"errors", "_block", "_gpu"},
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
    ("_task", "_runner"),  # Pipeline.run_blockwise (daisy's API; Task.run_blockwise calls it)
    ("_task", "_tracking"),  # Task.reset / Task.failed_blocks
    ("_workers", "_worker"),  # the fork server (_zygote) preloads the worker's entry point
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


# -- the deciding modules do no I/O --------------------------------------------------------
#: modules that decide without I/O: time comes in as an argument, and what they touch
#: (a store, a launcher, a log) is an object handed in. None of them imports, anywhere in
#: the file, a module that reads a clock, a socket, a process or a file
SANS_IO = {
    "_backups",
    "_batching",
    "_deadlines",
    "_dispatch",
    "_memory",
    "_run_state",
    "_scheduler",
    "_staffing",
    "_task_run",
}
_IO_STDLIB = {
    "asyncio",
    "datetime",
    "io",
    "multiprocessing",
    "os",
    "pathlib",
    "select",
    "selectors",
    "shutil",
    "socket",
    "socketserver",
    "subprocess",
    "sys",
    "tempfile",
    "threading",
    "time",
}
_IO_BELLIS = {
    "_client",
    "_progress",
    "_runner",
    "_serial",
    "_server",
    "_streams",
    "_tracking",
    "_transport",
    "_worker",
    "_workers",
    "logging",
}


def _stdlib_imports(source: str) -> set[str]:
    """The top-level names of the modules outside bellis that ``source`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"bellis"}


@pytest.mark.parametrize("name", sorted(SANS_IO))
def test_the_deciding_modules_import_nothing_that_does_io(name: str) -> None:
    path = SRC / f"{name}.py"
    found = _stdlib_imports(path.read_text()) & _IO_STDLIB
    found |= {target for target, _nested in _imports(path)} & _IO_BELLIS
    assert not found, f"{name} must not import {sorted(found)}: it decides, the shell does I/O"


def test_the_io_check_sees_io_imports() -> None:
    source = "import time\nfrom socket import socket\nif x:\n    import os.path\n"
    assert _stdlib_imports(source) & _IO_STDLIB == {"time", "socket", "os"}


def test_every_module_is_checked() -> None:
    groups = {_group(p) for p in FILES}
    assert groups <= set(RANK), groups - set(RANK)


# -- no import cycles, at the level of modules ------------------------------------------
# Every import counts: module level, inside a function, and under ``if TYPE_CHECKING:``.

#: the lazy imports (module, function, imported module) that may close a cycle, and why:
#: an entry point a user calls on a lower-level object, imported when called
ALLOWED_CYCLE_EDGES = {
    (
        "bellis._task",
        "Pipeline.run_blockwise",
        "bellis._run._runner",
    ): "daisy's API runs a pipeline",
    ("bellis._stats._reports", "TaskReport.panel", "bellis._report._panel"): "a report's text view",
    ("bellis._stats._reports", "RunReport.panel", "bellis._report._panel"): "a report's text view",
    (
        "bellis._stats._reports",
        "TaskReport._repr_html_",
        "bellis._report._notebook",
    ): "Jupyter's view",
    ("bellis._stats._reports", "TaskReport.to_html", "bellis._report._html"): "the HTML report",
    ("bellis._stats._reports", "RunReport.to_html", "bellis._report._html"): "the HTML report",
}

#: cycles not broken yet, as (module, imported module): each is an import to remove
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in FILES}


def _module_imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """(imported bellis module, qualified name of the function it is imported in, or None)
    for every import in a file, ``TYPE_CHECKING`` ones included. ``from . import x`` names
    the module ``x`` when there is one, else the package."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]

    def resolve(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            pkg = package.split(".")
            base = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]

    def visit(
        node: ast.AST, where: list[str], in_function: bool
    ) -> Iterator[tuple[str, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in resolve(child):
                    while target not in MODULES and "." in target:
                        target = target.rpartition(".")[0]
                    if target in MODULES and target != me:
                        yield target, ".".join(where) if in_function else None
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = in_function or not isinstance(child, ast.ClassDef)
                yield from visit(child, [*where, child.name], inner)
            else:
                yield from visit(child, where, in_function)

    yield from visit(ast.parse(path.read_text()), [], False)


def _import_graph() -> tuple[dict[str, set[str]], set[tuple[str, str | None, str]]]:
    """The import graph less the allowed and known edges, and every edge seen."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    seen: set[tuple[str, str | None, str]] = set()
    for me, path in MODULES.items():
        for target, where in _module_imports(path):
            seen.add((me, where, target))
            if (me, where, target) in ALLOWED_CYCLE_EDGES or (me, target) in KNOWN_CYCLE_EDGES:
                continue
            graph[me].add(target)
    return graph, seen


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_cycles() -> None:
    graph, _seen = _import_graph()
    cycles = _cycles(graph)
    assert not cycles, [
        f"{' <-> '.join(c)}: "
        + "; ".join(f"{a} imports {b}" for a in c for b in graph[a] if b in c)
        for c in cycles
    ]


def test_every_exception_to_the_cycle_rule_still_applies() -> None:
    """An allowed or known edge that no longer exists is removed from the lists."""
    _graph, seen = _import_graph()
    plain = {(a, b) for a, _where, b in seen}
    assert set(ALLOWED_CYCLE_EDGES) <= seen, set(ALLOWED_CYCLE_EDGES) - seen
    assert set(KNOWN_CYCLE_EDGES) <= plain, set(KNOWN_CYCLE_EDGES) - plain
    # and each one closes a cycle: without it the cycle check would have nothing to excuse
    full: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, _where, b in seen:
        full[a].add(b)
    component = {m: i for i, c in enumerate(_cycles(full)) for m in c}
    for a, _where, b in ALLOWED_CYCLE_EDGES:
        assert a in component and component[a] == component.get(b), (a, b)
    for a, b in KNOWN_CYCLE_EDGES:
        assert a in component and component[a] == component.get(b), (a, b)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
