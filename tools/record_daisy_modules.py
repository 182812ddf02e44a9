"""Record the modules of the released daisy 2.0.0 for bellis' module-path test.

Run it with an interpreter that has the daisy 2.0.0 wheel from PyPI installed (the test
environment after ``.ci/install_anchors.sh``)::

    .venv/bin/python tools/record_daisy_modules.py

It writes ``tests/compat/daisy_modules.json``: every module of the wheel's file list
(``importlib.metadata.files("daisy")``: its ``.py`` files and compiled extensions; caches
and type stubs left out), whether it is a package, a source module or an extension, and
the names each module defines at its top level (imported modules left out). bellis keeps
each of these module paths (``daisy._runner``...) as a module of its own or a thin alias
(``tests/compat/test_daisy_modules.py``). The output is sorted and deterministic.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import inspect
import json
import sys
import types
from pathlib import Path, PurePosixPath
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "compat" / "daisy_modules.json"
EXPECTED_VERSION = "2.0.0"


def wheel_modules() -> dict[str, str]:
    """``{module name: kind}`` from the installed daisy wheel's file list."""
    files = importlib.metadata.files("daisy") or []
    modules: dict[str, str] = {}
    for file in files:
        path = PurePosixPath(str(file))
        if not path.parts or path.parts[0] != "daisy" or "__pycache__" in path.parts:
            continue
        name = path.name
        if name.endswith(".py"):
            stem, kind = name[: -len(".py")], "source"
        else:
            suffix = next(
                (s for s in importlib.machinery.EXTENSION_SUFFIXES if name.endswith(s)), None
            )
            if suffix is None:
                continue  # .pyi stubs, py.typed, data
            stem, kind = name[: -len(suffix)], "extension"
        parts = list(path.parts[:-1])
        if stem == "__init__":
            kind = "package"
        else:
            parts.append(stem)
        modules[".".join(parts)] = kind
    return dict(sorted(modules.items()))


def _is_daisys(value: Any) -> bool:
    """Whether ``value`` is daisy's own: a class or function defined in daisy, or a plain
    value (a constant); not a module, nor something daisy imported from elsewhere
    (``Path``, ``cast``, a ``logging.Logger``)."""
    if isinstance(value, types.ModuleType):
        return False
    if inspect.isclass(value) or callable(value):
        return str(getattr(value, "__module__", "")).split(".")[0] == "daisy"
    return type(value).__module__ == "builtins"


def defined_names(module_name: str) -> list[str]:
    """The names of daisy's own objects that ``module_name`` binds at its top level."""
    module = importlib.import_module(module_name)
    return sorted(
        name
        for name, value in vars(module).items()
        if not (name.startswith("__") and name.endswith("__")) and _is_daisys(value)
    )


def record() -> dict[str, Any]:
    version = importlib.metadata.version("daisy")
    return {
        "daisy_version": version,
        "python": sys.version.split()[0],
        "modules": {
            name: {"kind": kind, "names": defined_names(name)}
            for name, kind in wheel_modules().items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    parser.add_argument(
        "--any-version",
        action="store_true",
        help=f"record a daisy other than {EXPECTED_VERSION} (the test expects {EXPECTED_VERSION})",
    )
    args = parser.parse_args(argv)
    try:
        data = record()
    except importlib.metadata.PackageNotFoundError:
        print(
            f"record_daisy_modules: no daisy in this interpreter ({sys.executable}); install "
            f"daisy=={EXPECTED_VERSION} from PyPI (.ci/install_anchors.sh)",
            file=sys.stderr,
        )
        return 2
    if data["daisy_version"] != EXPECTED_VERSION and not args.any_version:
        print(
            f"record_daisy_modules: this interpreter has daisy {data['daisy_version']}, not "
            f"{EXPECTED_VERSION}; install daisy=={EXPECTED_VERSION} from PyPI, or pass "
            "--any-version",
            file=sys.stderr,
        )
        return 2
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} (daisy {data['daisy_version']}: {len(data['modules'])} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
