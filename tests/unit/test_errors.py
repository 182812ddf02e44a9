"""The exception hierarchy in ``bellis.errors`` (STYLE.md: one hierarchy, nothing unused)."""

from __future__ import annotations

import ast
from pathlib import Path

import bellis.errors as errors

SRC = Path(__file__).resolve().parents[2] / "src" / "bellis"


def test_every_error_class_is_raised_or_a_base_of_one() -> None:
    """No exception class in ``bellis.errors`` that nothing raises (issue 15 item 8)."""
    raised: set[str] = set()  # raised by name, or built (to be raised) outside errors.py
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                node = node.exc
            elif not isinstance(node, ast.Call):
                continue
            exc = node.func if isinstance(node, ast.Call) else node
            if isinstance(exc, ast.Name | ast.Attribute):
                raised.add(exc.id if isinstance(exc, ast.Name) else exc.attr)
    classes = {name: getattr(errors, name) for name in errors.__all__}
    exceptions = {n: c for n, c in classes.items() if not issubclass(c, Warning)}
    unused = [
        name
        for name, cls in exceptions.items()
        if not any(issubclass(classes[r], cls) for r in raised if r in exceptions)
    ]
    assert not unused, f"bellis.errors defines {unused}, which nothing raises"
