"""The private names the documentation cites (`` `bellis._pkg._module.name` ``) exist: a
module split or a function moved to another folder must take the docs along."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: a dotted name in backticks that starts with a private bellis module
CITED = re.compile(r"`(bellis\._[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_private_name_the_docs_cite_exists() -> None:
    cited = {
        (m.group(1), page.name)
        for page in sorted(DOCS.glob("*.md"))
        for m in CITED.finditer(page.read_text())
    }
    assert len(cited) >= 5  # the pattern finds what the docs cite
    missing = sorted(f"{page}: {name}" for name, page in cited if not _resolves(name))
    assert not missing, "docs cite names that do not exist:\n" + "\n".join(missing)
