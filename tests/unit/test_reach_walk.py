"""The walk over what a process function reaches (``_code_origin.Reach``, issue 35 item 7):
bounded in depth and count, ends on cycles, never runs the objects' own code (properties,
``__getattr__``), and visits in the same order in every process. Pure."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar
from unittest import mock

import pytest

from bellis._code_origin import MAX_DEPTH, MAX_ITEMS, MAX_OBJECTS, Reach, collect
from bellis._fingerprint import fingerprint


def user_fn(x: Any) -> Any:
    return x


def _visited(*roots: Any) -> list[Any]:
    return [obj for obj, _depth, _named in Reach(*roots)]


def _reaches(root: Any, target: Any) -> bool:
    return any(obj is target for obj in _visited(root))


def test_cycles_end_and_each_object_is_visited_once() -> None:
    a = SimpleNamespace()
    b = SimpleNamespace(a=a, fn=user_fn)
    a.b = b
    a.me = a
    loop: list[Any] = [a]
    loop.append(loop)
    seen = _visited(loop)
    assert len(seen) == len({id(x) for x in seen})
    assert any(x is user_fn for x in seen)


def test_depth_is_bounded() -> None:
    def nest(levels: int) -> Any:
        obj: Any = user_fn
        for _ in range(levels):
            obj = SimpleNamespace(inner=obj)
        return obj

    holder = SimpleNamespace(step=nest(MAX_DEPTH - 1))
    assert _reaches(holder, user_fn)  # MAX_DEPTH attribute steps down
    assert not _reaches(SimpleNamespace(step=nest(MAX_DEPTH)), user_fn)
    # code links do not count as levels: method -> object -> closure -> object -> ...
    inner = SimpleNamespace(fn=user_fn)

    def closure() -> Any:
        return inner

    assert _reaches(functools.partial(closure), user_fn)


def test_count_and_container_sizes_are_bounded() -> None:
    wide = [SimpleNamespace(items=[object() for _ in range(30)]) for _ in range(MAX_ITEMS)]
    assert len(_visited(wide)) == MAX_OBJECTS
    late = [object() for _ in range(MAX_ITEMS)] + [user_fn]
    assert not _reaches(late, user_fn)  # past the items looked at
    assert _reaches(late[-MAX_ITEMS + 1 :], user_fn)


def test_partials_bound_methods_closures_and_containers() -> None:
    class Holder:
        def __init__(self) -> None:
            self.table = {"key": [frozenset({user_fn})]}

        def run(self) -> None:
            return None

    assert _reaches(Holder().run, user_fn)
    assert _reaches(functools.partial(print, 1, key=user_fn), user_fn)

    def make() -> Any:
        fn = user_fn

        def inner() -> Any:
            return fn

        return inner

    assert _reaches(make(), user_fn)


class Exotic:
    """Everything that runs code on attribute access raises, and records that it ran."""

    ran: ClassVar[list[str]] = []

    def __init__(self) -> None:
        object.__setattr__(self, "fn", user_fn)

    @property
    def heavy(self) -> Any:
        Exotic.ran.append("property")
        raise FileNotFoundError("a property is never run")

    def __getattr__(self, name: str) -> Any:
        Exotic.ran.append(f"getattr {name}")
        raise RuntimeError(name)

    def __getattribute__(self, name: str) -> Any:
        if name != "__class__":
            Exotic.ran.append(f"getattribute {name}")
        return object.__getattribute__(self, name)


class DictProperty:
    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        raise RuntimeError("a __dict__ property is never run")


class LyingClass:
    @property
    def __class__(self) -> Any:  # type: ignore[override]
        return functools.partial


class RaisingIteration(list[Any]):
    def __iter__(self) -> Any:
        raise RuntimeError("a subclass's iteration is never run")


@dataclass(slots=True)
class Slotted:
    fn: Any
    empty: Any = None


def test_exotic_objects_never_run_their_code_and_never_crash() -> None:
    Exotic.ran.clear()
    holder = SimpleNamespace(
        exotic=Exotic(),
        dict_property=DictProperty(),
        lying=LyingClass(),
        iteration=RaisingIteration([user_fn]),
        mock=mock.MagicMock(),
        slotted=Slotted(user_fn),
    )
    del holder.slotted.empty  # an empty slot
    seen = _visited(holder)
    assert Exotic.ran == []
    assert sum(x is user_fn for x in seen) == 1
    fp = fingerprint(holder.mock)  # a mock makes up any attribute it is asked for
    assert fp.functions == {}
    assert holder.mock.mock_calls == []


def test_pydantic_models_are_read_by_their_fields() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Inner(pydantic.BaseModel):
        fn: Any

    class Model(pydantic.BaseModel):
        inner: Inner
        _private: Any = pydantic.PrivateAttr(default=None)

        @property
        def roi(self) -> Any:
            raise FileNotFoundError("never run")

        def run(self) -> None:
            return None

    model = Model(inner=Inner(fn=user_fn))
    assert _reaches(model.run, user_fn)
    private = Model(inner=Inner(fn=None))
    private._private = user_fn
    assert _reaches(private.run, user_fn)


def test_a_sets_items_are_walked_in_an_order_that_is_not_their_addresses() -> None:
    namespace: dict[str, Any] = {}
    exec("".join(f"def f_{c}():\n    return 0\n" for c in "edcba"), namespace)
    fns = [namespace[f"f_{c}"] for c in "edcba"]
    for items in (set(fns), frozenset(reversed(fns))):
        walked = [x.__name__ for x in _visited(items) if callable(x)]
        assert walked == ["f_a", "f_b", "f_c", "f_d", "f_e"]


def test_collect_finds_script_code_held_by_a_bound_methods_object() -> None:
    """The code origins for tracebacks cover the same reach as the fingerprint: a script's
    lambda in a field of a library object."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile("fn = lambda x: x + 1\n", "/path/script.py", "exec"), namespace)
    holder = SimpleNamespace(config=SimpleNamespace(fn=namespace["fn"]))

    class Task:
        def __init__(self) -> None:
            self.holder = holder

        def run(self) -> None:
            return None

    assert ("<lambda>", 1, "/path/script.py") in collect(Task().run)
