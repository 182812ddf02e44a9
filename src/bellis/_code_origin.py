"""Where the code of functions shipped to workers by value came from.

cloudpickle sends a function defined in ``__main__`` (a script, a notebook cell) by value
and, since 3.1, renames its code's file ``<dynamic-code>``, so a worker's traceback would
say ``File "<dynamic-code>", line 6`` with no source line. The driver records, for every
such code object reachable from the process function, ``(name, first line) -> file``
(:func:`collect`); the worker gives the unpickled functions their file names back
(:func:`restore`), so tracebacks, ``linecache`` source lines and warnings name the user's
file (or ``[notebook cell N]``) again.

What "reachable" means is :class:`Reach`'s, which the code fingerprint (``_fingerprint``)
walks too: through partials, bound methods and their objects, closures, the attributes of
the objects they hold (a library's task object holding the user's function, such as
volara's ``LambdaTask.lambda_func``) and the globals and classes that by-value code names.

:func:`function_arity` says how a process function is called: with a block, or with
nothing (a worker function); the driver and ``bellis worker`` apply the same rule.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from itertools import islice
from types import (
    CodeType,
    FunctionType,
    GetSetDescriptorType,
    MemberDescriptorType,
    MethodType,
    ModuleType,
)
from typing import Any

__all__ = [
    "DYNAMIC",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_OBJECTS",
    "Reach",
    "class_dict",
    "collect",
    "function_arity",
    "is_code",
    "module_name",
    "restore",
]

#: cloudpickle's file name for code it ships by value
DYNAMIC = "<dynamic-code>"

#: how many levels of objects' attributes and containers' items a walk goes down from the
#: code that holds them (``self.config.fn`` from a bound method: 2)
MAX_DEPTH = 4
#: the most objects one walk visits: a guard, not a limit any script reaches
MAX_OBJECTS = 10_000
#: the most items of one container (or attributes of one object) a walk looks at
MAX_ITEMS = 1_000

# what never holds code: not followed, not counted
_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray, range})
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_DESCRIPTORS = (GetSetDescriptorType, MemberDescriptorType)


def _codes(code: CodeType) -> list[CodeType]:
    """``code`` and every code object nested in it (inner functions, lambdas, classes)."""
    out = [code]
    for const in code.co_consts:
        if isinstance(const, CodeType):
            out.extend(_codes(const))
    return out


def class_dict(klass: type) -> Any:
    """``vars(klass)``, read without a metaclass's help."""
    return _TYPE_DICT.__get__(klass, type(klass))


def _layout(cls: type) -> tuple[Any, tuple[Any, ...]]:
    """Where a class's instances keep their attributes: its ``__dict__`` descriptor
    (None when it has none, or one of its own making) and its slots' descriptors."""
    found: Any = None
    has_dict = False
    slots: list[Any] = []
    for klass in _TYPE_MRO.__get__(cls, type(cls)):
        for name, value in class_dict(klass).items():
            if name == "__dict__":
                if not has_dict:
                    has_dict = True
                    found = value if type(value) in _DESCRIPTORS else None
            elif type(value) is MemberDescriptorType:  # a slot
                slots.append(value)
    return found, tuple(slots)


def _attributes(obj: Any, cls: type, layout: tuple[Any, tuple[Any, ...]]) -> list[Any]:
    """The values of ``obj``'s attributes, its ``__dict__`` and its slots, read from the
    instance: no property, ``__getattr__`` or ``__getattribute__`` of its class runs (a
    pydantic model's fields, a dataclass's, a proxy's own state)."""
    out: list[Any] = []
    dict_descriptor, slots = layout
    for slot in slots:
        try:
            out.append(slot.__get__(obj, cls))
        except AttributeError:  # an empty slot
            continue
    if dict_descriptor is not None:
        d = dict_descriptor.__get__(obj, cls)
        if type(d) is dict:
            out.extend(islice(dict.values(d), MAX_ITEMS))
    return out[:MAX_ITEMS]


def _items(obj: Any, cls: type) -> list[Any]:
    """The items of a container (a dict's values), read by the built-in types' own
    methods, never by a subclass's; a set's in an order that is the same in every
    process."""
    if issubclass(cls, dict):
        return list(islice(dict.values(obj), MAX_ITEMS))
    if issubclass(cls, list):
        return list(islice(list.__iter__(obj), MAX_ITEMS))
    if issubclass(cls, tuple):
        return list(islice(tuple.__iter__(obj), MAX_ITEMS))
    if issubclass(cls, set):
        return sorted(islice(set.__iter__(obj), MAX_ITEMS), key=_stable_key)
    if issubclass(cls, frozenset):
        return sorted(islice(frozenset.__iter__(obj), MAX_ITEMS), key=_stable_key)
    return []


def _stable_key(obj: Any) -> str:
    """A sort key that is the same in every process (no ``id``, no address)."""
    cls = type(obj)
    name = obj.__qualname__ if cls is FunctionType else ""
    return f"{cls.__module__}.{cls.__qualname__}:{name}"


class Reach:
    """A bounded walk over the objects that a process function reaches, in search of code.

    Iterating yields each object once, as ``(object, depth, named)``, and follows what it
    holds before the next: at the same depth, a partial's function, arguments and keywords,
    a bound method's function and object (``__self__``), a static or class method's
    function, a property's accessors and a function's closure cells; one level down, up to
    :data:`MAX_DEPTH`, an object's attributes (``__dict__`` and slots, as stored: no
    property or ``__getattr__`` runs) and a container's items (:data:`MAX_ITEMS` at most).
    Classes, modules and functions' globals are the caller's to follow (:meth:`push`).
    ``depth``: the levels of attributes or items passed through; ``named``: pushed as a
    global that by-value code names. Plain values are never visited, each object is
    visited once (cycles end), and the walk stops after :data:`MAX_OBJECTS` objects. An
    object that cannot be read holds nothing. The order is the same in every process: a
    depth-first walk over attributes and items in their stored order (a set's sorted).
    """

    def __init__(self, *roots: Any) -> None:
        self.stack: list[tuple[Any, int, bool]] = []
        #: id -> object of those visited: kept alive, so that no id is reused meanwhile
        self.seen: dict[int, Any] = {}
        self.layouts: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        for root in reversed(roots):
            self.push(root)

    def push(self, obj: Any, depth: int = 0, named: bool = False) -> None:
        if type(obj) not in _LEAVES:
            self.stack.append((obj, depth, named))

    def __iter__(self) -> Iterator[tuple[Any, int, bool]]:
        while self.stack and len(self.seen) < MAX_OBJECTS:
            obj, depth, named = self.stack.pop()
            if id(obj) in self.seen:
                continue
            self.seen[id(obj)] = obj
            try:
                held, down = self._holds(obj, depth)
            except Exception:  # an exotic object that cannot be read: it holds nothing
                held, down = [], False
            for child in reversed(held):
                self.push(child, depth + down)
            yield obj, depth, named

    def _holds(self, obj: Any, depth: int) -> tuple[list[Any], bool]:
        """What ``obj`` holds, and whether that is one level down."""
        cls = type(obj)
        if cls is FunctionType:
            cells = []
            for cell in obj.__closure__ or ():
                try:
                    cells.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    continue
            return cells, False
        if cls is MethodType:
            return [obj.__func__, obj.__self__], False
        if issubclass(cls, functools.partial):
            return [obj.func, *obj.args, *dict.values(obj.keywords)], False
        if issubclass(cls, staticmethod | classmethod):
            return [obj.__func__], False
        if issubclass(cls, property):
            return [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None], False
        if issubclass(cls, type | ModuleType) or depth >= MAX_DEPTH:
            return [], False
        layout = self.layouts.get(id(cls))
        if layout is None:
            layout = self.layouts[id(cls)] = _layout(cls)
        return _items(obj, cls) + _attributes(obj, cls, layout), True


def is_code(value: Any) -> bool:
    """Whether a class attribute is code: a function, a static or class method, a property."""
    return isinstance(value, FunctionType | staticmethod | classmethod | property)


def module_name(klass: Any) -> str | None:
    """The name of the module that defined class or function ``klass``, or None."""
    try:
        name = klass.__module__
    except Exception:  # an exotic metaclass
        return None
    return name if isinstance(name, str) else None


def _reachable(fn: Any, by_value: Any) -> list[FunctionType]:
    """Functions reachable from ``fn`` (:class:`Reach`, and the globals and classes the
    code of each function ``by_value`` names) for which ``by_value(f)``."""
    found: list[FunctionType] = []
    walk = Reach(fn)
    for obj, depth, _named in walk:
        cls = type(obj)
        if issubclass(cls, type):
            if module_name(obj) == "__main__":
                for v in class_dict(obj).values():
                    if is_code(v):
                        walk.push(v, depth)
            continue
        if cls is not FunctionType:
            if module_name(cls) == "__main__":
                walk.push(cls, depth)  # an instance of a class of the script: its methods
            continue
        if not by_value(obj):
            continue
        found.append(obj)
        names = {name for code in _codes(obj.__code__) for name in code.co_names}
        g = obj.__globals__
        for n in sorted(names):
            if n in g:
                walk.push(g[n], 0, True)
    return found


def collect(fn: Any) -> list[tuple[str, int, str]]:
    """``(name, first line, file)`` of the code cloudpickle will ship by value with ``fn``
    (the driver side; functions defined in ``__main__``)."""
    out: list[tuple[str, int, str]] = []
    for f in _reachable(fn, lambda f: f.__module__ == "__main__"):
        out.extend((c.co_name, c.co_firstlineno, c.co_filename) for c in _codes(f.__code__))
    return out


def _with_origin(code: CodeType, origins: dict[tuple[str, int], str]) -> CodeType:
    consts = tuple(
        _with_origin(c, origins) if isinstance(c, CodeType) else c for c in code.co_consts
    )
    filename = code.co_filename
    if filename == DYNAMIC:
        filename = origins.get((code.co_name, code.co_firstlineno), filename)
    return code.replace(co_filename=filename, co_consts=consts)


def restore(fn: Any, origins: list[Any]) -> None:
    """Give the by-value functions reachable from ``fn`` their files back (the worker
    side, right after unpickling). Code with no recorded origin keeps its name."""
    table = {(str(name), int(line)): str(file) for name, line, file in origins}
    if not table:
        return
    for f in _reachable(fn, lambda f: f.__code__.co_filename == DYNAMIC):
        f.__code__ = _with_origin(f.__code__, table)


def function_arity(fn: Callable[..., Any]) -> int:
    """Positional parameters of ``fn`` (minus ``self``); 0 for non-introspectable callables."""
    try:
        spec = inspect.getfullargspec(fn)
    except TypeError:
        return 0
    n = len(spec.args)
    if inspect.ismethod(fn) or (
        spec.args and spec.args[0] == "self" and not inspect.isfunction(fn)
    ):
        n -= 1
    if n == 0 and spec.varargs is not None:
        return 1
    return max(0, n)
