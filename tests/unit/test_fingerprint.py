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


# -- docstrings (issue 35, item 5) ------------------------------------------------------------

NO_DOC = """
def process(block):
    total = block + 1
    class Inner:
        size = 2
    return total * Inner.size
"""
WITH_DOC = """
def process(block):
    '''Adds one, then doubles.'''
    total = block + 1
    class Inner:
        '''A class inside the function.'''
        size = 2
    return total * Inner.size
"""


def test_adding_or_removing_a_docstring_changes_nothing() -> None:
    """Adding a docstring moves every other constant one place in ``co_consts`` (and a
    class body's ``__doc__`` one place in ``co_names``): neither is a code change."""
    assert _hash(WITH_DOC) == _hash(NO_DOC)
    assert _hash(WITH_DOC.replace("Adds one", "Add one")) == _hash(NO_DOC)
    assert _hash(NO_DOC.replace("block + 1", "block + 2")) != _hash(NO_DOC)
    assert _hash(NO_DOC.replace("size = 2", "size = 3")) != _hash(NO_DOC)


def _load_module(path: Path, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def test_a_user_modules_docstrings_and_comments_change_nothing(tmp_path: Path) -> None:
    helper_file = tmp_path / "myhelpers2.py"
    source = "def f(x):\n    return x + 1\n"
    source_with_docs = (
        '"""Helpers."""\n\n# a comment\n\ndef f(x):\n    """Add one."""\n\n'
        "    return x + 1  # one\n"
    )
    script = "def process(block):\n    return myhelpers2.f(block)\n"

    def hash_with(text: str) -> str:
        helper_file.write_text(text)
        return fingerprint(_process(script, {"myhelpers2": _load_module(helper_file, "x")})).hash

    plain = hash_with(source)
    assert hash_with(source_with_docs) == plain
    assert hash_with(source.replace("x + 1", "x + 2")) != plain


# -- code held by objects, partials and closures (issue 35, item 7) ---------------------------

HELD = """
import functools
import threading

THRESHOLD = 0.5


class Step:
    def __init__(self, fn, scale):
        self.fn = fn
        self.scale = scale

    def process(self, block):
        return self.fn(block) * self.scale


def apply(fn, block):
    return fn(block)


step = Step(lambda x: x > 0.5, 2.0)
by_partial = functools.partial(apply, lambda x: x > 0.5)
library_object = threading.Thread(target=lambda: 0.5)  # a library's object holding user code
partial_of_library_method = functools.partial(threading.Thread(target=lambda: 0.5).run)
"""


@pytest.mark.parametrize(
    "entry", ["step.process", "by_partial", "library_object.run", "partial_of_library_method"]
)
def test_code_held_by_the_process_functions_objects_counts(entry: str) -> None:
    def fp(source: str) -> Any:
        namespace: dict[str, Any] = {"__name__": "__main__"}
        exec(compile(source, "<script>", "exec"), namespace)
        return fingerprint(eval(entry, namespace))

    before = fp(HELD)
    assert fp(HELD).hash == before.hash
    edited = fp(HELD.replace("0.5", "0.7"))
    assert edited.hash != before.hash
    assert differences(before.record(), edited) == ["function <lambda>"]
    # data on the same objects is not code
    assert fp(HELD.replace("2.0", "3.0")).hash == before.hash


def test_a_library_closure_holding_user_code(tmp_path: Path) -> None:
    """An installed library's function that closes over the user's function (volara's
    serial ``process_func``, closing over its task object, closing over ``lambda_func``)."""
    import sys

    lib = tmp_path / "site-packages" / "steplib35.py"
    lib.parent.mkdir()
    lib.write_text(
        "class Task:\n"
        "    def __init__(self, fn):\n"
        "        self.fn = fn\n"
        "    def build(self):\n"
        "        task = self\n"
        "        def process(block):\n"
        "            return task.fn(block)\n"
        "        return process\n"
    )
    module = _load_module(lib, "steplib35")
    module.__name__ = "steplib35"
    sys.modules["steplib35"] = module
    try:
        script = "process = steplib35.Task(lambda x: x > 0.5).build()\n"
        one = fingerprint(_process(script, {"steplib35": module}))
        assert "<lambda>" in one.functions and one.files == {}
        two = fingerprint(_process(script.replace("0.5", "0.7"), {"steplib35": module}))
        assert two.hash != one.hash
    finally:
        del sys.modules["steplib35"]


def test_a_user_module_function_held_by_an_object_counts_by_name(tmp_path: Path) -> None:
    import sys

    steps_file = tmp_path / "steps35.py"
    steps_file.write_text("def seg_v1(x):\n    return 1\n\ndef seg_v2(x):\n    return 2\n")
    steps = _load_module(steps_file, "steps35")
    steps.__name__ = "steps35"
    sys.modules["steps35"] = steps
    try:
        from types import SimpleNamespace

        def entry(fn: Any) -> Any:
            holder = SimpleNamespace(config=SimpleNamespace(fn=fn))
            return _process(
                "def process(block):\n    return holder.config.fn(block)\n", {"holder": holder}
            )

        one, two = fingerprint(entry(steps.seg_v1)), fingerprint(entry(steps.seg_v2))
        assert one.hash != two.hash
        assert "steps35.seg_v1" in one.functions and "steps35.seg_v2" in two.functions
        assert fingerprint(entry(steps.seg_v1)).hash == one.hash
    finally:
        del sys.modules["steps35"]


def test_a_pydantic_task_object_holding_the_users_function() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Data(pydantic.BaseModel):
        path: str

    class LambdaLike(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        in_data: Data
        fn: Any
        threshold: float = 0.5
        _private: Any = pydantic.PrivateAttr(default=None)

        @property
        def write_roi(self) -> Any:
            raise FileNotFoundError("a property that reads a file is never run")

        def process_blocks(self) -> None:
            self.fn(None)

    def entry(source: str, threshold: float) -> Any:
        fn = _process(source.replace("process", "user_fn") + "\nprocess = user_fn\n")
        task = LambdaLike(in_data=Data(path="/x"), fn=fn, threshold=threshold)
        task._private = {"helper": fn}
        return task.process_blocks

    source = "def process(x):\n    return x > 0.5\n"
    one = fingerprint(entry(source, 0.5))
    assert "user_fn" in one.functions
    assert fingerprint(entry(source, 0.9)).hash == one.hash  # a data field
    assert fingerprint(entry(source.replace("0.5", "0.7"), 0.5)).hash != one.hash


def test_duplicate_names_do_not_depend_on_the_walks_order() -> None:
    a = _process("process = lambda x: x + 1\n")
    b = _process("process = lambda x: x + 2\n")
    calls = "def process(b):\n    return [f(b) for f in FNS]\n"
    one = fingerprint(_process(calls, {"FNS": [a, b]}))
    two = fingerprint(_process(calls, {"FNS": [b, a]}))
    assert set(one.functions) == {"process", "<lambda>", "<lambda>#2"}
    assert one.functions == two.functions


def test_a_record_of_an_older_bellis_is_named_as_such() -> None:
    """Fingerprints of bellis before scheme 2 hashed constants by their place and user
    modules by their bytes: the same code differs, and the report says why."""
    new = fingerprint(_process(SCRIPT))
    assert new.record()["scheme"] == 2
    old = {k: v for k, v in new.record().items() if k != "scheme"}
    old["hash"] = "0" * 32
    assert differences(old, new) == ["fingerprint of an older bellis"]
    assert differences(new.record(), new) == []
