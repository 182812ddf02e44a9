"""Which code made a block: the fingerprint of a task's code and declared version.

The driver computes one :class:`Fingerprint` per task at run start (:func:`fingerprint`);
the tracking store keeps a table of the fingerprints it has seen and, per done block, the
index of the one that made it (``_tracking/_codever.py``). Hashed:

- the code shipped by value with the process function (functions of the script or
  notebook, their closures and the helpers and class methods they name): bytecode (each
  constant by its place among those the code loads, so a docstring is never part of it),
  constants (recursively), names, argument layout and defaults, and the plain values
  (numbers, strings, tuples of them ...) of the module globals the code names, so
  editing ``THRESHOLD = 0.5`` is a change. Where the module's source file is known, only
  globals that it assigns a literal, and only literals, count (``OUT = sys.argv[1]`` is
  an input of the run, not code: a rerun with other arguments is no code change); a
  notebook's globals count by their plain values. Line numbers, comments and docstrings
  are not hashed: moving a function or editing a comment or docstring changes nothing;
- the user's code that the process function holds rather than names (:class:`_Walk`
  over ``_code_origin.Reach``): a bound method's object and its attributes, a partial's
  parts, closure cells, library functions' too (volara's task object holding the user's
  ``lambda_func``). Only the user's code counts; data on those objects does not;
- the source of the user's own modules the code uses (files outside ``site-packages`` and
  the standard library, followed through the modules they import in turn), as a syntax
  tree without docstrings, comments or line numbers;
- the code of ``Task(setup=...)``, walked as the process function's (the same walk, so
  code both reach counts once);
- ``Task(version=...)``: a string or a JSON-able dict the user declares.

Recorded beside it, not hashed: the versions of the third-party distributions those
modules import. Pure apart from reading the user's module files.
"""

from __future__ import annotations

import ast
import dis
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import CodeType, FunctionType, MethodType, ModuleType
from typing import Any

from ._code_origin import Reach, _codes, class_dict, is_code, module_name
from .errors import ConfigurationError

__all__ = [
    "CODE_ARRAY_NAME",
    "CODE_TABLE_NAME",
    "ON_CODE_CHANGE",
    "RECORD_KEYS",
    "Fingerprint",
    "check_code_options",
    "differences",
    "fingerprint",
    "hash_code",
    "resolve",
    "version_counts",
]

#: what a resume does with done blocks that other code made
ON_CODE_CHANGE = ("warn", "rerun", "error")

#: in a tracking store: the table of the code versions seen, and the per-block array of
#: the index that made each done block (``_tracking/_codever.py`` writes both)
CODE_TABLE_NAME = "code_versions.json"
CODE_ARRAY_NAME = "code_version"
#: what a table entry says about its fingerprint (an entry with ``same_as`` omits them)
RECORD_KEYS = ("functions", "files", "version", "packages", "scheme")
#: how fingerprints are computed; a record without one is of scheme 1 (bellis before
#: issue 35: constants hashed by their place, user modules by their bytes, no held code)
SCHEME = 2

_MAX_VALUE = 4096  # the most items of a global container hashed by value
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_CONST_OPS = frozenset(dis.hasconst)
_NAME_OPS = frozenset(dis.hasname)
_EXTENDED_ARG = dis.EXTENDED_ARG
# Python 3.14 flags a docstring instead of keeping co_consts[0] for it
_HAS_DOCSTRING = 0x4000000


def check_code_options(version: Any, on_code_change: Any) -> tuple[Any, str]:
    """``Task(version=..., on_code_change=...)`` validated: ``(version, policy)``."""
    if on_code_change not in ON_CODE_CHANGE:
        raise ConfigurationError(
            f"on_code_change={on_code_change!r}: use 'warn', 'rerun' or 'error'",
            parameter="on_code_change",
        )
    if version is None or isinstance(version, str):
        return version, on_code_change
    if not isinstance(version, dict) or not all(isinstance(k, str) for k in version):
        raise ConfigurationError(
            f"version must be a string or a dict with string keys (got {type(version).__name__})",
            parameter="version",
        )
    try:
        return json.loads(json.dumps(version, sort_keys=True, allow_nan=False)), on_code_change
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"version must be JSON-able: {exc}", parameter="version") from exc


@dataclass(frozen=True)
class Fingerprint:
    """A task's code and declared version, hashed, with what it covered."""

    hash: str
    #: qualified name -> hash of each function hashed by value
    functions: dict[str, str] = field(default_factory=dict)
    #: path -> hash of each user module's source
    files: dict[str, str] = field(default_factory=dict)
    version: Any = None
    #: distribution -> version, recorded only
    packages: dict[str, str] = field(default_factory=dict)
    scheme: int = SCHEME

    def record(self) -> dict[str, Any]:
        return {
            "hash": self.hash,
            "functions": dict(self.functions),
            "files": dict(self.files),
            "version": self.version,
            "packages": dict(self.packages),
            "scheme": self.scheme,
        }


def differences(old: dict[str, Any], new: Fingerprint) -> list[str]:
    """What differs between a stored fingerprint record and ``new``, in words:
    ``function f``, ``file helpers.py``, ``version key model`` ...; or, for a record
    that another scheme computed (an older bellis), only ``fingerprint of an older
    bellis``: its parts cannot be compared."""
    scheme = old.get("scheme", 1)
    if scheme != new.scheme:
        older = isinstance(scheme, int) and scheme < new.scheme
        return ["fingerprint of an older bellis" if older else "fingerprint of another bellis"]
    out: list[str] = []
    old_fns = old.get("functions") or {}
    for name in sorted(set(old_fns) | set(new.functions)):
        if old_fns.get(name) != new.functions.get(name):
            out.append(f"function {name}")
    old_files = old.get("files") or {}
    for path in sorted(set(old_files) | set(new.files)):
        if old_files.get(path) != new.files.get(path):
            out.append(f"file {os.path.basename(path)}")
    a, b = old.get("version"), new.version
    if a != b:
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.extend(f"version key {k}" for k in keys)
        else:
            out.append("version")
    return out


# -- the store's table of code versions, read ----------------------------------------------


def resolve(table: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The table by index, every entry with its fingerprint's record (``same_as`` filled
    in from the entry it names)."""
    by_index = {int(e["index"]): e for e in table}
    out: dict[int, dict[str, Any]] = {}
    for i, e in by_index.items():
        full = dict(e)
        source = by_index.get(int(e["same_as"])) if isinstance(e.get("same_as"), int) else None
        if source is not None:
            full.update((k, source.get(k)) for k in RECORD_KEYS)
        out[i] = full
    return out


def version_counts(table: list[dict[str, Any]], counts: dict[int, int]) -> list[dict[str, Any]]:
    """Done blocks per code version (one per fingerprint hash, in the order first seen),
    from :func:`code_counts`'s ``counts``: each ``{"version": n (1, 2, ...), "hash",
    "first_seen", "indices", "blocks", "functions", "files", "version_value"}``, and last,
    when any, ``{"version": None, "hash": None, "blocks": n}`` for blocks of unknown code."""
    full = resolve(table)
    by_hash: dict[str, dict[str, Any]] = {}
    for i in sorted(full):
        e = full[i]
        h = str(e.get("hash"))
        row = by_hash.get(h)
        if row is None:
            row = by_hash[h] = {
                "version": len(by_hash) + 1,
                "hash": h,
                "first_seen": e.get("first_seen"),
                "indices": [],
                "blocks": 0,
                "functions": sorted(e.get("functions") or {}),
                "files": sorted(e.get("files") or {}),
                "version_value": e.get("version"),
            }
        row["indices"].append(i)
        row["blocks"] += counts.get(i, 0)
    rows = list(by_hash.values())
    unknown = sum(n for i, n in counts.items() if i not in full)
    if unknown:
        rows.append({"version": None, "hash": None, "blocks": unknown})
    return rows


# -- hashing code ---------------------------------------------------------------------------


def _feed_value(h: Any, value: Any, depth: int = 0) -> bool:
    """Feed a plain value (numbers, strings, containers of them) to ``h``; False (and
    nothing fed) for anything else."""
    if isinstance(value, _PLAIN):
        h.update(f"{type(value).__name__}:{value!r};".encode())
        return True
    if depth > 8 or not isinstance(value, tuple | list | frozenset | set | dict):
        return False
    if len(value) > _MAX_VALUE:
        return False
    items: list[Any]
    if isinstance(value, dict):
        items = [x for kv in value.items() for x in kv]
    elif isinstance(value, set | frozenset):
        try:
            items = sorted(value)
        except TypeError:
            return False
    else:
        items = list(value)
    sub = hashlib.blake2b(digest_size=16)
    for x in items:
        if not _feed_value(sub, x, depth + 1):
            return False
    h.update(f"{type(value).__name__}[{len(items)}]".encode() + sub.digest())
    return True


def _normalized(code: CodeType) -> tuple[bytes, list[Any], tuple[str, ...]]:
    """``code``'s instructions, each as its opcode and argument, the constants they load
    and its names. A constant's argument is its place among the constants the code
    loads, in the order first loaded: a constant that the code never loads (a function's
    docstring) is not part of it, and adding or removing a docstring, which moves every
    other constant one place in ``co_consts``, changes nothing. A class body's
    docstring (``__doc__ = "..."``) is left out too, and there names count by name."""
    if _is_class_body(code):
        return _normalized_class_body(code)
    raw = code.co_code
    places: dict[int, int] = {}
    out = bytearray()
    extended = 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | extended
        if op == _EXTENDED_ARG:
            extended = arg << 8
            continue
        extended = 0
        if op in _CONST_OPS:
            arg = places.setdefault(arg, len(places))
        out += op.to_bytes(1, "little") + arg.to_bytes(4, "little")
    consts = code.co_consts
    return bytes(out), [consts[i] for i in places if i < len(consts)], code.co_names


def _is_class_body(code: CodeType) -> bool:
    return "__qualname__" in code.co_names and "__module__" in code.co_names


def _normalized_class_body(code: CodeType) -> tuple[bytes, list[Any], tuple[str, ...]]:
    """:func:`_normalized` of a class body, without its ``__doc__ = "..."``: names by
    name (leaving ``__doc__`` out moves the others in ``co_names``)."""
    steps: list[tuple[int, Any]] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_NAME" and ins.argval == "__doc__" and steps:
            if steps[-1][0] in _CONST_OPS:
                steps.pop()
                continue
        if ins.opcode in _CONST_OPS:
            steps.append((ins.opcode, ("c", ins.arg)))
        elif ins.opcode in _NAME_OPS:
            steps.append((ins.opcode, ("n", ins.argval)))
        else:
            steps.append((ins.opcode, ins.arg))
    places: dict[Any, int] = {}
    out: list[tuple[int, Any]] = []
    for op, arg in steps:
        if op in _CONST_OPS:
            arg = places.setdefault(arg[1], len(places))
        out.append((op, arg))
    consts = code.co_consts
    names = tuple(n for n in code.co_names if n != "__doc__")
    return repr(out).encode(), [consts[i] for i in places if i < len(consts)], names


def _feed_code(h: Any, code: CodeType) -> None:
    instructions, consts, names = _normalized(code)
    h.update(instructions)
    for c in consts:
        if isinstance(c, CodeType):
            h.update(b"code{")
            _feed_code(h, c)
            h.update(b"}")
        elif not _feed_value(h, c):
            h.update(f"{type(c).__name__};".encode())
    h.update(
        repr(
            (
                code.co_name,
                names,
                code.co_varnames,
                code.co_freevars,
                code.co_cellvars,
                code.co_argcount,
                code.co_posonlyargcount,
                code.co_kwonlyargcount,
                code.co_flags & ~_HAS_DOCSTRING,
            )
        ).encode()
    )


def hash_code(fn: FunctionType) -> str:
    """The hash of one function: its code (nested code included), defaults and the plain
    values of its closure cells and of the globals it names; no line numbers, comments or
    docstrings."""
    h = hashlib.blake2b(digest_size=16)
    _feed_code(h, fn.__code__)
    for tag, values in (("d", fn.__defaults__ or ()), ("k", fn.__kwdefaults__ or {})):
        h.update(tag.encode())
        if not _feed_value(h, values):
            h.update(repr([type(v).__name__ for v in values]).encode())
    for cell_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _feed_value(hashlib.blake2b(), value):
            h.update(f"c:{cell_name}=".encode())
            _feed_value(h, value)
    names = sorted({n for c in _codes(fn.__code__) for n in c.co_names})
    literal = _literal_globals_of(fn.__globals__.get("__file__"))
    for name in names:
        if literal is not None and name not in literal:
            continue  # computed at run time (an argument, a path): an input, not code
        value = fn.__globals__.get(name, _MISSING)
        if value is not _MISSING and _feed_value(hashlib.blake2b(), value):
            h.update(f"g:{name}=".encode())
            _feed_value(h, value)
    return h.hexdigest()


_MISSING = object()


def _literal_globals_of(path: Any) -> frozenset[str] | None:
    """The module-level names that the source at ``path`` only ever assigns literals
    (``THRESHOLD = 0.5``, ``SIZES = (32, 64)``); None when there is no readable source
    (a notebook, an interactive session)."""
    if not isinstance(path, str):
        return None
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return None
    return _literal_globals(path, stamp)


@functools.lru_cache(maxsize=64)
def _literal_globals(path: str, stamp: int) -> frozenset[str] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    literal: set[str] = set()
    computed: set[str] = set()
    for node in _module_level(tree.body):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            try:
                ast.literal_eval(node.value)  # `A, B = 1, 2` too: a tuple of literals
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                computed |= names
            else:
                literal |= names
        else:
            # bound any other way (`X += 1`, `for X in`, `with ... as X`, `import X`,
            # `(X := ...)`, a def or a class): not a literal constant
            computed |= _bound_names(node)
    return frozenset(literal - computed)


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run at module level: the body, and the bodies of its ``if``
    (``if __name__ == "__main__":``), ``try`` and ``with`` blocks, not of functions."""
    for node in body:
        if isinstance(node, ast.If | ast.Try | ast.With):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))
            if isinstance(node, ast.Try):
                yield from _module_level(node.finalbody)
                for handler in node.handlers:
                    yield from _module_level(handler.body)
            yield from (w for w in [node] if isinstance(w, ast.With))  # its `as` names
        else:
            yield node


def _bound_names(node: ast.stmt) -> set[str]:
    """The module-level names statement ``node`` binds (not those its functions bind)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            found.add(sub.id)
    return found


# -- the user's modules ---------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Where the standard library and installed packages live: the standard library's
    folder (that of ``os``) and each prefix's ``lib`` folders, which hold the
    ``site-packages`` of a virtual environment or an installation (any path through a
    ``site-packages`` or ``dist-packages`` folder counts as installed too). Not
    ``sysconfig.get_paths()``: its first call builds the whole install scheme, a
    millisecond of every run's start."""
    roots = {os.path.realpath(os.path.dirname(os.__file__))}
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for lib in {"lib", getattr(sys, "platlibdir", "lib")}:
            roots.add(os.path.realpath(os.path.join(prefix, lib)))
    bellis_root = os.path.dirname(os.path.realpath(__file__))
    roots.add(bellis_root)
    return tuple(sorted(roots))


def _user_file(module: ModuleType, roots: tuple[str, ...]) -> str | None:
    """The source file of ``module`` when it is the user's own, else None."""
    if module.__name__ == "__main__":
        return None
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file.endswith(".py"):
        return None
    real = os.path.realpath(file)
    parts = real.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return None
    if any(real == r or real.startswith(r + os.sep) for r in roots):
        return None
    return real


def _package_version(top: str) -> str | None:
    module = sys.modules.get(top)
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(top)
    except (PackageNotFoundError, ValueError):  # a module that no distribution installed
        return None


@functools.lru_cache(maxsize=256)
def _source_hash(path: str, stamp: tuple[int, int]) -> str:
    """The hash of a user's module as Python reads it: its syntax tree without line
    numbers, comments or docstrings (of the module, its classes and functions), so that
    the module's functions are fingerprinted as those of the script are. A file Python
    cannot parse counts by its bytes."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return hashlib.blake2b(data, digest_size=16).hexdigest()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    text = ast.dump(tree, annotate_fields=False, include_attributes=False)
    return hashlib.blake2b(b"ast:" + text.encode(), digest_size=16).hexdigest()


class _Walk:
    """What the code of a process function covers: the walk (``_code_origin.Reach``) over
    what it reaches, and what each reached thing adds:

    - a function of the script or notebook (``__main__``): its hash (:func:`hash_code`);
      the globals its code names and its defaults are walked in turn;
    - a function of a user's module: the module's source (:func:`_source_hash`) and,
      unless by-value code names it as a global (its name is then in that code), which
      function it is, by reference: held by an object, a partial or a closure, swapping
      ``steps.seg_v1`` for ``steps.seg_v2`` is a change;
    - an object of a class of the script: the class's code (of a user's module: the
      module's source);
    - an installed library's function or class, named by the code or held by the process
      function itself (not deep in an object): its distribution's version, recorded only.

    Nothing else is hashed: the data on the objects walked (numbers, strings, arrays)
    stays out, and so does the code of installed libraries."""

    def __init__(self) -> None:
        self.roots = _library_roots()
        #: (qualified name, hash) of each function hashed by value
        self.hashed: list[tuple[str, str]] = []
        #: module.qualname -> "by reference"
        self.functions: dict[str, str] = {}
        self.files: dict[str, str] = {}
        self.packages: dict[str, str] = {}
        self.modules: set[int] = set()
        #: module name -> the module when it is the script or a user's (memo)
        self.users: dict[str | None, ModuleType | None] = {}

    def user_module(self, name: str | None) -> ModuleType | None:
        """The module ``name`` when it is the script or a user's module (a file outside
        the installed packages), else None."""
        if name in self.users:
            return self.users[name]
        module = sys.modules.get(name) if name is not None else None
        if module is not None and name != "__main__" and _user_file(module, self.roots) is None:
            module = None
        self.users[name] = module
        return module

    def note_module(self, module: ModuleType | None) -> None:
        """A module the code uses: the user's (hash its source, follow its imports) or a
        third-party one (record its distribution's version)."""
        if module is None or id(module) in self.modules:
            return
        self.modules.add(id(module))
        path = _user_file(module, self.roots)
        if path is not None:
            try:
                st = os.stat(path)
                self.files[path] = _source_hash(path, (st.st_mtime_ns, st.st_size))
            except OSError:
                self.files[path] = "unreadable"
            for value in list(vars(module).values()):
                if isinstance(value, ModuleType):
                    self.note_module(value)
                elif isinstance(value, type | FunctionType):
                    self.note_module(sys.modules.get(module_name(value) or ""))
            return
        top = module.__name__.partition(".")[0]
        if module.__name__ == "__main__" or top in sys.stdlib_module_names or top == "bellis":
            return
        if top not in self.packages:
            version = _package_version(top)
            if version is not None:
                self.packages[top] = version

    def run(self, *roots: Any) -> None:
        walk = Reach(*roots)
        for obj, depth, named in walk:
            cls = type(obj)
            if cls is FunctionType:
                self.function(walk, obj, depth, named)
            elif issubclass(cls, ModuleType):
                self.note_module(obj)
            elif issubclass(cls, type):
                name = module_name(obj)
                if name == "__main__":
                    for value in class_dict(obj).values():
                        if is_code(value):
                            walk.push(value, depth)
                elif depth == 0 or self.user_module(name) is not None:
                    self.note_module(sys.modules.get(name or ""))
            elif not issubclass(cls, MethodType | functools.partial):
                # an object: its class's code when the class is the user's (or when the
                # object is the process function's own, a library's callable object)
                if depth == 0 or self.user_module(module_name(cls)) is not None:
                    walk.push(cls, depth)

    def function(self, walk: Reach, f: FunctionType, depth: int, named: bool) -> None:
        name = module_name(f)
        if name == "__main__":
            self.hashed.append((f.__qualname__, hash_code(f)))
            names = {n for c in _codes(f.__code__) for n in c.co_names}
            g = f.__globals__
            for n in sorted(names):
                if n in g:
                    walk.push(g[n], 0, True)
            for value in (*(f.__defaults__ or ()), *(f.__kwdefaults__ or {}).values()):
                walk.push(value, depth)
            return
        module = self.user_module(name)
        if module is not None:
            self.note_module(module)
            if not named:
                self.functions[f"{name}.{f.__qualname__}"] = "by reference"
        elif depth == 0:
            self.note_module(sys.modules.get(name or ""))

    def all_functions(self) -> dict[str, str]:
        """Every function covered, by name: those hashed by value under their qualified
        names, several of one name told apart by ``#2``, ``#3`` ... in the order of their
        hashes (not of the walk), and those by reference."""
        out = dict(self.functions)
        by_name: dict[str, list[str]] = {}
        for qualname, digest in self.hashed:
            by_name.setdefault(qualname, []).append(digest)
        for qualname in sorted(by_name):
            for n, digest in enumerate(sorted(by_name[qualname]), start=1):
                name = qualname if n == 1 else f"{qualname}#{n}"
                while name in out:
                    name += "'"
                out[name] = digest
        return dict(sorted(out.items()))


def _entry(walk: _Walk, fn: Any) -> None:
    """A process function imported from a module is pickled by reference, so its module's
    source (a user's module: hashed as a file) stands for its code; but which of the
    module's functions it is counts too (``process_function=segment_v2`` instead of
    ``segment_v1`` is a change): recorded by module and qualified name."""
    while isinstance(fn, functools.partial | MethodType):
        fn = fn.func if isinstance(fn, functools.partial) else fn.__func__
    if isinstance(fn, FunctionType) and fn.__module__ != "__main__":
        walk.functions[f"{fn.__module__}.{fn.__qualname__}"] = "by reference"


def fingerprint(fn: Any, version: Any = None, setup: Any = None) -> Fingerprint:
    """The fingerprint of process function ``fn`` (None: a task without one), the task's
    ``setup`` (``Task(setup=...)``, None: none; its code counts as the function's does)
    and its declared ``version``. Without a setup, the hash is what it was before setups."""
    walk = _Walk()
    roots = [r for r in (fn, setup) if r is not None]
    for r in roots:
        _entry(walk, r)
    if roots:
        walk.run(*roots)
    functions = walk.all_functions()
    h = hashlib.blake2b(digest_size=16)
    h.update(b"bellis-code:v2\n")
    h.update(json.dumps([sorted(functions.items())]).encode())
    h.update(json.dumps(sorted((os.path.basename(p), v) for p, v in walk.files.items())).encode())
    h.update(json.dumps(version, sort_keys=True).encode())
    return Fingerprint(
        h.hexdigest(),
        functions,
        dict(sorted(walk.files.items())),
        version,
        dict(sorted(walk.packages.items())),
    )
