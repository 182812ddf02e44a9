"""The code fingerprint (issue 26, item 1): what changes it and what does not. Pure:
functions are compiled from source strings into a throwaway ``__main__`` namespace."""

from __future__ import annotations

import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest

from bellis._fingerprint import check_code_options, differences, fingerprint
from bellis.errors import ConfigurationError

SCRIPT = """
THRESHOLD = 0.5

def helper(x):
    '''Compare against the threshold.'''
    return x > THRESHOLD

def process(block):
    # the block function
    return [helper(v) for v in block] + ["label"]
"""


def _process(source: str, extra: dict[str, Any] | None = None) -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__", **(extra or {})}
    exec(compile(textwrap.dedent(source), "<script>", "exec"), namespace)
    return namespace["process"]


def _hash(source: str, version: Any = None, extra: dict[str, Any] | None = None) -> str:
    return fingerprint(_process(source, extra), version).hash


def test_same_code_same_hash_and_the_functions_it_covered() -> None:
    fp = fingerprint(_process(SCRIPT))
    assert fp.hash == _hash(SCRIPT)
    assert set(fp.functions) == {"process", "helper"}
    assert fp.files == {} and fp.version is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("# the block function", "# another comment"),
        lambda s: s.replace("Compare against the threshold.", "Another docstring."),
        lambda s: "\n\n\n# header\n" + s,
        # the helper moved below the function that calls it
        lambda s: (
            s.replace(
                "def helper(x):\n    '''Compare against the threshold.'''\n"
                "    return x > THRESHOLD\n",
                "",
            )
            + "\ndef helper(x):\n    return x > THRESHOLD\n"
        ),
    ],
    ids=["comment", "docstring", "lines-above", "moved-down"],
)
def test_edits_that_change_nothing(edit: Any) -> None:
    assert _hash(edit(SCRIPT)) == _hash(SCRIPT)


@pytest.mark.parametrize(
    ("old", "new", "function"),
    [
        ("THRESHOLD = 0.5", "THRESHOLD = 0.7", "helper"),
        ("x > THRESHOLD", "x >= THRESHOLD", "helper"),
        ('["label"]', '["other"]', "process"),
        ("helper(v) for v", "helper(v + 1) for v", "process"),
    ],
    ids=["global-constant", "operator", "string-constant", "comprehension"],
)
def test_code_changes_are_detected_and_named(old: str, new: str, function: str) -> None:
    before = fingerprint(_process(SCRIPT))
    after = fingerprint(_process(SCRIPT.replace(old, new)))
    assert before.hash != after.hash
    assert differences(before.record(), after) == [f"function {function}"]


def test_defaults_and_closures_count() -> None:
    base = "def process(block, scale=2):\n    return block * scale\n"
    assert _hash(base) != _hash(base.replace("scale=2", "scale=3"))
    closure = "def make(k):\n    def process(b):\n        return b + k\n    return process\n"
    one = _process(closure + "process = make(1)\n")
    two = _process(closure + "process = make(2)\n")
    assert fingerprint(one).hash != fingerprint(two).hash


def test_version_string_and_dict_keys() -> None:
    assert _hash(SCRIPT, "v1") != _hash(SCRIPT, "v2")
    a = fingerprint(_process(SCRIPT), {"model": "v1", "t": 1})
    b = fingerprint(_process(SCRIPT), {"model": "v2", "t": 1})
    assert a.hash != b.hash
    assert differences(a.record(), b) == ["version key model"]
    assert fingerprint(_process(SCRIPT), {"t": 1, "model": "v1"}).hash == a.hash


def test_user_module_source_is_hashed_and_packages_recorded(tmp_path: Path) -> None:
    helper_file = tmp_path / "myhelpers.py"
    helper_file.write_text("import numpy\n\ndef f(x):\n    return x\n")

    def load() -> types.ModuleType:
        module = types.ModuleType("myhelpers")
        module.__file__ = str(helper_file)
        exec(compile(helper_file.read_text(), str(helper_file), "exec"), module.__dict__)
        return module

    source = "def process(block):\n    return myhelpers.f(block)\n"
    first = fingerprint(_process(source, {"myhelpers": load()}))
    assert list(first.files) == [str(helper_file.resolve())]
    assert "numpy" in first.packages
    helper_file.write_text("import numpy\n\ndef f(x):\n    return x + 1\n")
    second = fingerprint(_process(source, {"myhelpers": load()}))
    assert second.hash != first.hash
    assert differences(first.record(), second) == ["file myhelpers.py"]


def test_installed_package_is_not_hashed() -> None:
    import numpy

    fp = fingerprint(_process("def process(b):\n    return numpy.sum(b)\n", {"numpy": numpy}))
    assert fp.files == {}
    assert fp.packages == {"numpy": numpy.__version__}


def test_none_function_and_bound_methods() -> None:
    assert fingerprint(None).hash == fingerprint(None).hash
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("class P:\n    def run(self, b):\n        return b\n", ns)
    fp = fingerprint(ns["P"]().run)
    assert list(fp.functions) == ["P.run"]


def test_options_are_validated() -> None:
    assert check_code_options({"b": 1, "a": [1, 2]}, "rerun") == ({"a": [1, 2], "b": 1}, "rerun")
    with pytest.raises(ConfigurationError, match="on_code_change"):
        check_code_options(None, "ignore")
    with pytest.raises(ConfigurationError, match="JSON"):
        check_code_options({"a": object()}, "warn")
    with pytest.raises(ConfigurationError, match="string"):
        check_code_options(3, "warn")


def test_fifty_functions_in_milliseconds() -> None:
    source = (
        "".join(f"def f{i}(x):\n    return f{i + 1}(x) + {i}\n" for i in range(50))
        + "def f50(x):\n    return x\n\ndef process(b):\n    return f0(b)\n"
    )
    fn = _process(source)
    start = time.perf_counter()
    fp = fingerprint(fn)
    assert len(fp.functions) == 52
    assert time.perf_counter() - start < 0.2  # a few ms; loose on a shared machine


def test_only_globals_the_source_assigns_literals_count(tmp_path: Path) -> None:
    from bellis._fingerprint import _literal_globals

    src = tmp_path / "script.py"
    src.write_text(
        "import os, sys\nA, B = 1, (2, 3)\nC: float = 0.5\nX = 0\nX += 1\nOUT = sys.argv[0]\n"
        "for I in range(3):\n    pass\nif __name__ == '__main__':\n    D = 'four'\n"
        "    E = os.getcwd()\ndef f():\n    G = 1\n"
    )
    assert _literal_globals(str(src), 0) == frozenset({"A", "B", "C", "D"})


def test_which_function_of_an_imported_module_counts(tmp_path: Path) -> None:
    """A process function imported from a module is pickled by reference: its module's
    source is hashed, and which function of it the task runs is part of the fingerprint
    (swapping ``segment_v1`` for ``segment_v2`` of one file is a change)."""
    import sys

    helper_file = tmp_path / "mysteps.py"
    helper_file.write_text("def segment_v1(b):\n    return 1\n\ndef segment_v2(b):\n    return 2\n")
    module = types.ModuleType("mysteps")
    module.__file__ = str(helper_file)
    exec(compile(helper_file.read_text(), str(helper_file), "exec"), module.__dict__)
    sys.modules["mysteps"] = module
    try:
        one, two = fingerprint(module.segment_v1), fingerprint(module.segment_v2)
        assert one.files == two.files and one.hash != two.hash
        assert differences(one.record(), two) == [
            "function mysteps.segment_v1",
            "function mysteps.segment_v2",
        ]
        assert fingerprint(module.segment_v1).hash == one.hash
    finally:
        del sys.modules["mysteps"]
    import json as library

    assert fingerprint(library.dumps).functions == {"json.dumps": "by reference"}
