"""``_tracking`` is the only owner of the done markers: no other folder memory-maps a
store's arrays, names their metadata file, or reaches for the old per-array views."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "bellis"

#: what only ``_tracking`` may use: the mapping call, the metadata file a store is told by
_OWNED_CALLS = {"memmap", "map_readonly", "map_array", "done_view", "code_view"}
_OWNED_NAMES = {"zarr.json"}


def _uses(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _OWNED_CALLS:
                found.append(f"{name}() at line {node.lineno}")
        elif isinstance(node, ast.Constant) and node.value in _OWNED_NAMES:
            found.append(f"{node.value!r} at line {node.lineno}")
    return found


def test_only_tracking_opens_the_done_markers() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "_tracking":
            continue
        problems += [f"{path.relative_to(SRC)}: {u}" for u in _uses(path.read_text())]
    assert not problems, problems


def test_the_check_sees_a_planted_reader() -> None:
    planted = 'import numpy as np\nnp.memmap(root / "done" / "c" / "0")\nx = root / "zarr.json"\n'
    assert len(_uses(planted)) == 2
