"""Imports run one way: the folder rules of ``docs/architecture.md``, checked on every
import of every module: at module level, inside functions and under ``TYPE_CHECKING``.

Each module belongs to one *group*: a folder of ``src/bellis`` (``_scheduling``, ``_run``...)
or a named set of top-level modules. :data:`MAY_IMPORT` says, per group, which other groups
its modules may import. The rules form a DAG, so a module that keeps to them cannot close an
import cycle; :func:`test_no_import_cycles` checks the module graph as well. The two calls
that the daisy API forces up the layers go through :mod:`bellis._seams`, which resolves its
targets by name; :func:`test_the_seams_point_up_and_are_the_only_way_up` checks them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from bellis._seams import UPWARD

SRC = Path(__file__).resolve().parents[2] / "src" / "bellis"

#: the top-level modules, by group (a folder is a group of its own)
TOP_LEVEL = {
    # small plumbing that everything may use: it imports nothing of bellis but itself
    "plumbing": {
        "errors",
        "logging",
        "_version",
        "_streams",
        "_signals",
        "_code_origin",
        "_fingerprint",
        "_sizes",
        "_seams",
    },
    # the model: blocks, grids, task states, skip masks
    "model": {"_block", "_graph", "_bulk", "_state", "_skipmask", "_donemarks"},
    "protocol": {"_protocol", "_payload"},
    # a task's configuration; it reads its own store (Task.reset, Task.report)
    "task": {"_task", "_task_params", "_task_spec"},
    # the public face: what users import, and the lazy loader of the public names
    "face": {
        "__init__",
        "v2",
        "v1_compat",
        "cl_monitor",
        "block",
        "_names",
        "_as_daisy",
        # the public ways into a run (run_blockwise, Server, SerialServer, _run_serial)
        # and their routing (run, dry run, plan): the one module above `_run` and `_plan`
        # that calls both
        "_entrypoints",
        # daisy 2.0.0's private module paths, thin aliases (tests/compat/daisy_modules.json)
        "_daisy",
        "_daisy_task",
        "_progress",
        "_runner",
        "_subprocess_worker",
        "_worker_processes",
    },
    # the entry points of `python -m bellis` and `python -m bellis.worker`
    "entry": {"__main__", "worker"},
}

#: group -> the other groups its modules may import
MAY_IMPORT: dict[str, set[str]] = {
    "plumbing": set(),
    "model": {"plumbing"},
    "protocol": {"plumbing", "model"},
    "_tracking": {"plumbing", "model"},
    "_stats": {"plumbing", "model", "_tracking"},
    "_outputs": {"plumbing", "model", "_tracking"},
    "task": {"plumbing", "model", "_tracking", "_stats", "_outputs"},
    "_scheduling": {"plumbing", "model", "protocol", "task", "_stats", "_outputs"},
    "_worker": {"plumbing", "model", "protocol", "_outputs"},
    "_launchers": {"plumbing", "model", "protocol", "_worker"},
    "_report": {"plumbing", "model", "_tracking", "_stats"},
}
_BELOW_RUN = set(MAY_IMPORT) | {"_scheduling", "_worker", "_launchers", "_report"}
MAY_IMPORT["_run"] = _BELOW_RUN
MAY_IMPORT["_plan"] = _BELOW_RUN | {"_run"}
MAY_IMPORT["face"] = _BELOW_RUN | {"_run", "_plan"}
MAY_IMPORT["_cli"] = MAY_IMPORT["face"] | {"face"}
MAY_IMPORT["entry"] = {"plumbing", "_cli"}

#: folders that decide without I/O: time comes in as an argument, and what they touch (a
#: store, a launcher, a log) is an object handed in
SANS_IO = {"_scheduling"}
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
_IO_GROUPS = {"_run", "_worker", "_launchers", "_tracking", "_cli"}
_IO_PLUMBING = {"bellis._streams", "bellis.logging"}

#: modules that may import a module by name (``importlib.import_module``) and why
BY_NAME = {
    "bellis._seams": "the upward calls the daisy API forces",
    "bellis._names": "the public face's lazy loader",
    "bellis": "the public face's lazy loader of submodules",
    "bellis._as_daisy": "maps `daisy.*` to `bellis.*` for `bellis as-daisy`",
    "bellis._cli._main": "loads the user's `--function module:attr`",
}


def group_of(module: str) -> str:
    """``bellis._run._server`` -> ``_run``; ``bellis._task`` -> ``task``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "face"  # bellis/__init__.py
    if len(parts) > 2 or (SRC / parts[1]).is_dir():
        return parts[1]
    for group, members in TOP_LEVEL.items():
        if parts[1] in members:
            return group
    raise AssertionError(f"{module}: give it a group in TOP_LEVEL of this test")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = sorted(SRC.rglob("*.py"))
MODULES = {_module_name(p): p for p in FILES}


def module_imports(me: str, source: str, is_package: bool = False) -> Iterator[tuple[str, str]]:
    """(imported bellis module, where) for every import in ``source``, the module ``me``:
    where is ``module level``, ``TYPE_CHECKING`` or the function it sits in."""
    package = me if is_package else me.rpartition(".")[0]

    def resolve(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            pkg = package.split(".")
            base = ".".join(pkg[: len(pkg) - (node.level - 1)] + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]

    def visit(node: ast.AST, where: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in resolve(child):
                    while target not in MODULES and "." in target:
                        target = target.rpartition(".")[0]
                    if target.startswith("bellis") and target in MODULES and target != me:
                        yield target, where
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, f"in {child.name}()" if where == "module level" else where)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from visit(child, "under TYPE_CHECKING")
            else:
                yield from visit(child, where)

    yield from visit(ast.parse(source), "module level")


def violations(me: str, source: str, is_package: bool = False) -> list[str]:
    """Every import in ``source`` (module ``me``) that breaks the folder rules."""
    mine = group_of(me)
    found = []
    for target, where in module_imports(me, source, is_package):
        theirs = group_of(target)
        if theirs != mine and theirs not in MAY_IMPORT[mine]:
            found.append(f"{me} ({mine}) imports {target} ({theirs}) {where}")
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for me, path in MODULES.items():
        for target, _where in module_imports(me, path.read_text(), path.name == "__init__.py"):
            graph[me].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
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


# -- the rules themselves --------------------------------------------------------------------
def test_the_rules_form_a_dag() -> None:
    rules = {g: {t for t in ts if t != g} for g, ts in MAY_IMPORT.items()}
    assert not cycles(rules), cycles(rules)
    assert set(rules) == set(TOP_LEVEL) | {p.name for p in SRC.iterdir() if p.is_dir()} - {
        "__pycache__"
    }


def test_every_module_has_a_group() -> None:
    for module in MODULES:
        assert group_of(module) in MAY_IMPORT, module


# -- the package keeps them ------------------------------------------------------------------
@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module: str) -> None:
    path = MODULES[module]
    assert not violations(module, path.read_text(), path.name == "__init__.py")


def test_no_import_cycles() -> None:
    graph = _graph()
    found = cycles(graph)
    assert not found, [
        "; ".join(f"{a} imports {b}" for a in c for b in graph[a] if b in c) for c in found
    ]


@pytest.mark.parametrize("folder", sorted(SANS_IO))
def test_the_deciding_folders_do_no_io(folder: str) -> None:
    problems = []
    for module, path in MODULES.items():
        if group_of(module) != folder:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module.split(".")[0]]
            problems += [f"{module} imports {n}" for n in names if n in _IO_STDLIB]
        for target, where in module_imports(module, source):
            if group_of(target) in _IO_GROUPS or target in _IO_PLUMBING:
                problems.append(f"{module} imports {target} {where}")
    assert not problems, f"{folder} decides; the shell does I/O: {problems}"


def test_the_seams_point_up_and_are_the_only_way_up() -> None:
    """Each seam's caller really calls it, and its target lies in a group the caller may
    not import: otherwise the seam is not needed and a plain import is the way."""
    for seam, (caller, target) in UPWARD.items():
        module, _, name = target.partition(":")
        assert module in MODULES, target
        assert f"def {name}(" in MODULES[module].read_text(), target
        assert f"_seams.{seam}(" in MODULES[caller].read_text(), (seam, caller)
        assert group_of(module) not in MAY_IMPORT[group_of(caller)], (seam, "not upward")
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and "import_module" in ast.unparse(node.func)) or (
                isinstance(node, ast.Name) and node.id == "__import__"
            ):
                assert module in BY_NAME, f"{module} imports a module by name"


# -- the checks can fail ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("bellis._scheduling._dispatch", "from .._run._server import RunLoop\n"),
        ("bellis._scheduling._dispatch", "def f():\n    from .._run import _runner\n"),
        (
            "bellis._task",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from ._run._runner import Server\n",
        ),
        ("bellis._stats._reports", "def f():\n    from .._report._html import write_report\n"),
        ("bellis._worker._client", "import bellis._launchers._base\n"),
        ("bellis.errors", "from ._block import Block\n"),
    ],
)
def test_a_planted_upward_import_is_caught(module: str, planted: str) -> None:
    source = MODULES[module].read_text() + "\n" + planted
    assert violations(module, source)


def test_a_planted_cycle_is_caught() -> None:
    graph = _graph()
    graph["bellis._block"].add("bellis._task")
    assert any("bellis._block" in c and "bellis._task" in c for c in cycles(graph))


def test_the_architecture_page_names_every_module_and_every_folder_has_a_header() -> None:
    page = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            if path.parent != SRC:
                header = ast.get_docstring(ast.parse(path.read_text())) or ""
                assert "May import" in header and "Imported by" in header, module
                assert f"**`{path.parent.name}/`**" in page, module
            continue
        assert f"`{path.stem}`" in page, f"docs/architecture.md does not name {module}"


#: the groups from the bottom layer up: the order in which the folder headers list them
LAYER_ORDER = [
    "plumbing",
    "model",
    "protocol",
    "_tracking",
    "_stats",
    "_outputs",
    "task",
    "_scheduling",
    "_worker",
    "_launchers",
    "_report",
    "_run",
    "_plan",
    "face",
    "_cli",
    "entry",
]
FOLDERS = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))


def header_rules(group: str) -> tuple[str, str]:
    """The two lines of a folder's header that state :data:`MAY_IMPORT` for it: what it
    may import, and which groups may import it."""
    may = [g for g in LAYER_ORDER if g in MAY_IMPORT[group]]
    by = [g for g in LAYER_ORDER if group in MAY_IMPORT.get(g, set())]

    def listed(groups: list[str]) -> str:
        return ", ".join(f"``{g}``" for g in groups) if groups else "nothing"

    return f"May import: {listed(may)}.", f"Imported by: {listed(by)}."


def test_the_layer_order_lists_every_group() -> None:
    assert sorted(LAYER_ORDER) == sorted(set(MAY_IMPORT) | set(TOP_LEVEL))


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_folder_headers_state_the_layering_table(folder: str) -> None:
    """Each folder's header says what it may import and who may import it exactly as
    :data:`MAY_IMPORT` does, once: a header cannot drift from the rules."""
    header = ast.get_docstring(ast.parse((SRC / folder / "__init__.py").read_text())) or ""
    text = " ".join(header.split())
    for rule in header_rules(folder):
        assert rule in text, f"the header of bellis.{folder} must say: {rule}"
    assert text.lower().count("may import") == 1, f"bellis.{folder}: one 'May import' line"
    assert text.lower().count("imported by") == 1, f"bellis.{folder}: one 'Imported by' line"
