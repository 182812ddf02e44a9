"""Where the code of functions shipped to workers by value came from.

cloudpickle sends a function defined in ``__main__`` (a script, a notebook cell) by value
and, since 3.1, renames its code's file ``<dynamic-code>``, so a worker's traceback would
say ``File "<dynamic-code>", line 6`` with no source line. The driver records, for every
such code object reachable from the process function, ``(name, first line) -> file``
(:func:`collect`); the worker gives the unpickled functions their file names back
(:func:`restore`), so tracebacks, ``linecache`` source lines and warnings name the user's
file (or ``[notebook cell N]``) again.

:func:`function_arity` says how a process function is called: with a block, or with
nothing (a worker function); the driver and ``bellis worker`` apply the same rule.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import CodeType, FunctionType, MethodType
from typing import Any

__all__ = ["DYNAMIC", "collect", "function_arity", "restore"]

#: cloudpickle's file name for code it ships by value
DYNAMIC = "<dynamic-code>"

#: the most functions either walk visits: a guard, not a limit any script reaches
_MAX_FUNCTIONS = 10_000


def _codes(code: CodeType) -> list[CodeType]:
    """``code`` and every code object nested in it (inner functions, lambdas, classes)."""
    out = [code]
    for const in code.co_consts:
        if isinstance(const, CodeType):
            out.extend(_codes(const))
    return out


def _reachable(fn: Any, by_value: Any) -> list[FunctionType]:
    """Functions reachable from ``fn`` (through partials, bound methods, closures, the
    globals their code names and the classes among those) for which ``by_value(f)``."""
    found: list[FunctionType] = []
    seen: set[int] = set()
    stack = [fn]
    while stack and len(seen) < _MAX_FUNCTIONS:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            stack.append(obj.func)
            stack.extend(obj.args)
            stack.extend(obj.keywords.values())
            continue
        if isinstance(obj, MethodType):
            stack.append(obj.__func__)
            continue
        if isinstance(obj, type):
            if obj.__module__ == "__main__":
                stack.extend(v for v in vars(obj).values() if isinstance(v, FunctionType))
            continue
        if not isinstance(obj, FunctionType) or not by_value(obj):
            continue
        found.append(obj)
        names = {name for code in _codes(obj.__code__) for name in code.co_names}
        stack.extend(obj.__globals__[n] for n in names if n in obj.__globals__)
        for cell in obj.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
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
