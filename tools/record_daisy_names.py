"""Record the public names of the released daisy 2.0.0 for bellis' surface test.

Run it once with an interpreter that has the daisy 2.0.0 wheel from PyPI installed::

    /path/to/venv-with-daisy/bin/python tools/record_daisy_names.py

It writes ``tests/compat/daisy_names.json``: for each of ``daisy``, ``daisy.v2``,
``daisy.v1_compat`` and ``daisy.logging``, every public name in ``dir()`` of the module (the
names without a leading underscore, plus ``__version__``) with what it is (``"module"``,
``"class"``, ``"function"`` or the type of a value) and the module it comes from, so that a
test can tell daisy's API from a standard-library module daisy happens to import. It also
records the public submodules of the ``daisy`` package (``daisy.cl_monitor``...), which
``dir(daisy)`` lists only once they are imported. The output is sorted and deterministic.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import json
import pkgutil
import sys
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "compat" / "daisy_names.json"
MODULES = ("daisy", "daisy.v2", "daisy.v1_compat", "daisy.logging")
EXPECTED_VERSION = "2.0.0"


def _is_public(name: str) -> bool:
    return not name.startswith("_") or name == "__version__"


def _describe(value: Any) -> dict[str, str]:
    if isinstance(value, types.ModuleType):
        return {"kind": "module", "from": value.__name__}
    if inspect.isclass(value):
        kind = "class"
    elif callable(value):
        kind = "function"
    else:
        kind = type(value).__name__
    origin = getattr(value, "__module__", None) if kind in ("class", "function") else None
    if origin is None:
        origin = type(value).__module__
    return {"kind": kind, "from": str(origin)}


def record() -> dict[str, Any]:
    version = importlib.metadata.version("daisy")
    modules = {name: importlib.import_module(name) for name in MODULES}
    names = {
        module_name: {
            name: _describe(getattr(module, name))
            for name in sorted(dir(module))
            if _is_public(name)
        }
        for module_name, module in modules.items()
    }
    package = modules["daisy"]
    submodules = sorted(
        info.name for info in pkgutil.iter_modules(package.__path__) if _is_public(info.name)
    )
    return {
        "daisy_version": version,
        "python": sys.version.split()[0],
        "modules": names,
        "submodules": submodules,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON file to write")
    parser.add_argument(
        "--any-version",
        action="store_true",
        help=f"record a daisy other than {EXPECTED_VERSION} (the test compares against "
        f"{EXPECTED_VERSION})",
    )
    args = parser.parse_args(argv)
    data = record()
    if data["daisy_version"] != EXPECTED_VERSION and not args.any_version:
        print(
            f"record_daisy_names: this interpreter has daisy {data['daisy_version']}, not "
            f"{EXPECTED_VERSION}; install daisy=={EXPECTED_VERSION} from PyPI, or pass "
            "--any-version",
            file=sys.stderr,
        )
        return 2
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    counts = ", ".join(f"{m}: {len(n)}" for m, n in data["modules"].items())
    print(f"wrote {args.out} (daisy {data['daisy_version']}; {counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
