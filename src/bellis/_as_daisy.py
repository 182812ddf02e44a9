"""``bellis as-daisy``: make ``import daisy`` resolve to bellis in one environment.

Theory of operation
-------------------
``install`` writes one file, :data:`PTH_NAME`, into the environment's site-packages
(``sysconfig.get_paths()["purelib"]`` of the running interpreter). Python's ``site`` module
runs its single ``import`` line at the start of every process of that environment (unless
it runs with ``-S``): the driver, local workers, SLURM jobs and Dask workers alike. The
line only puts a small finder first on ``sys.meta_path``; it imports nothing, so a process
that never imports daisy pays nothing. On the first ``import daisy`` or ``import daisy.X``
the finder imports this module and calls :func:`find_spec`:

* ``daisy`` becomes a module of its own that hands out bellis's public names
  (``daisy.Task is bellis.Task``) and whose ``__version__`` is :func:`daisy_version`,
  ``"2.0.0+bellis.<bellis version>"``: a valid PEP 440 version whose release is daisy's
  (bellis offers the daisy 2.0 API) and whose local label says that it is bellis;
* ``daisy.X`` (``daisy.cl_monitor``, ``daisy.logging``, ``daisy._runner``...) is the very
  module ``bellis.X``, registered under both names; :data:`RENAMED_PATHS` names the
  exceptions, daisy paths whose bellis module of the same name is bellis's own (every
  module of the daisy 2.0.0 wheel has a path here: ``tests/compat/daisy_modules.json``).

``uninstall`` removes the file; ``status`` says whether it is there. Nothing is written
outside that one site-packages directory. ``install`` refuses while a real daisy
distribution is installed in the environment: two packages would then claim one name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import sys
import sysconfig
import tempfile
import types
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.abc import Loader
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "PTH_NAME",
    "HookStatus",
    "daisy_version",
    "find_spec",
    "hook_status",
    "install_hook",
    "uninstall_hook",
]

#: the file ``install`` writes into site-packages
PTH_NAME = "bellis_as_daisy.pth"
#: the class name of the finder the .pth line puts on ``sys.meta_path``
FINDER_NAME = "BellisAsDaisyFinder"
#: the daisy release whose API bellis offers, the public part of ``daisy.__version__``
DAISY_API_VERSION = "2.0.0"

#: daisy module paths served by a bellis module of another name: ``bellis._task`` is
#: bellis's own, and daisy's ``_task`` also handed out the client and the model classes
RENAMED_PATHS: dict[str, str] = {"daisy._task": "bellis._daisy_task"}

# One line, run by `site` at start-up: a finder that imports bellis only for daisy names.
_PTH_LINE = (
    "import sys; sys.meta_path.insert(0, type('" + FINDER_NAME + "', (), {'find_spec': "
    "staticmethod(lambda name, path=None, target=None: "
    "__import__('bellis._as_daisy', fromlist=['find_spec']).find_spec(name, path, target) "
    "if name == 'daisy' or name.startswith('daisy.') else None)})())"
)
_PTH_TEXT = (
    "# written by `bellis as-daisy install`: `import daisy` gives bellis in this environment.\n"
    "# Remove with `bellis as-daisy uninstall`.\n" + _PTH_LINE + "\n"
)


def daisy_version() -> str:
    """``daisy.__version__`` under the hook: ``"2.0.0+bellis.<bellis version>"``."""
    from ._version import __version__

    local = re.sub(r"[^0-9A-Za-z]+", ".", __version__).strip(".") or "unknown"
    return f"{DAISY_API_VERSION}+bellis.{local}"


# --------------------------------------------------------------------------------------------
# the import side: what the finder returns


class _DaisyLoader(Loader):
    """Loads the top-level ``daisy``: a module that hands out bellis's public names."""

    def create_module(self, spec: Any) -> types.ModuleType | None:
        return None  # the default: a fresh module named "daisy"

    def exec_module(self, module: types.ModuleType) -> None:
        bellis = importlib.import_module("bellis")

        def __getattr__(name: str) -> Any:
            return getattr(bellis, name)

        def __dir__() -> list[str]:
            return sorted(set(dir(bellis)) | {"__version__"})

        module.__doc__ = (
            "daisy, served by bellis (`bellis as-daisy install`): every name is bellis's."
        )
        module.__dict__.update(
            __getattr__=__getattr__,
            __dir__=__dir__,
            __all__=list(bellis.__all__),
            __version__=daisy_version(),
        )


class _AliasLoader(Loader):
    """Loads ``daisy.X`` as the module ``bellis.X`` itself."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec: Any) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system stamped the daisy spec on bellis's module: give its own back
        module.__spec__ = self._spec


def find_spec(name: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
    """The finder's work for ``daisy`` and ``daisy.*`` names (None for any other name)."""
    from importlib.machinery import ModuleSpec

    if name == "daisy":
        # origin (no location, so no __file__) names what serves it: <module 'daisy' (bellis)>
        return ModuleSpec("daisy", _DaisyLoader(), origin="bellis", is_package=True)
    if not name.startswith("daisy."):
        return None
    bellis_name = RENAMED_PATHS.get(name) or "bellis" + name[len("daisy") :]
    try:
        module = importlib.import_module(bellis_name)
    except ModuleNotFoundError as exc:
        if exc.name == bellis_name:
            return None  # "No module named 'daisy.X'", as without the hook
        raise
    return ModuleSpec(
        name,
        _AliasLoader(module),
        origin=getattr(module, "__file__", None),
        is_package=hasattr(module, "__path__"),
    )


# --------------------------------------------------------------------------------------------
# the command side: install, uninstall, status


@dataclass(frozen=True)
class HookStatus:
    """Where the hook lives in this environment and what else is there."""

    site_packages: Path
    pth_path: Path
    is_installed: bool
    #: the hook's finder is on ``sys.meta_path`` of this process
    is_active: bool
    #: "daisy <version> at <location>" when a real daisy distribution is installed
    real_daisy: str | None


def site_packages() -> Path:
    """The running environment's site-packages (where pip puts pure-Python packages)."""
    return Path(sysconfig.get_paths()["purelib"])


def real_daisy() -> str | None:
    """``"daisy <version> at <location>"`` when a daisy distribution is installed, else None."""
    try:
        dist = importlib.metadata.distribution("daisy")
    except importlib.metadata.PackageNotFoundError:
        return None
    location = dist.locate_file("")
    return f"daisy {dist.version} at {location}"


def hook_status(directory: Path | None = None) -> HookStatus:
    """The hook's state in ``directory`` (default: this environment's site-packages)."""
    where = directory if directory is not None else site_packages()
    pth = where / PTH_NAME
    active = any(type(f).__name__ == FINDER_NAME for f in sys.meta_path)
    return HookStatus(where, pth, pth.is_file(), active, real_daisy())


def install_hook(directory: Path | None = None) -> Path:
    """Write the hook into ``directory`` (default: this environment's site-packages).

    Raises :class:`ConfigurationError` when a real daisy is installed or the directory is
    not writable. Installing again rewrites the file (an upgrade of bellis's hook line).
    """
    status = hook_status(directory)
    if status.real_daisy is not None:
        raise ConfigurationError(
            f"a real daisy is installed in this environment ({status.real_daisy}); with it, "
            "`import daisy` would be ambiguous. Run `pip uninstall daisy` first, or install "
            f"the hook in another environment (this one is {sys.prefix})",
            parameter="daisy",
        )
    target = status.pth_path
    if not status.site_packages.is_dir():
        raise ConfigurationError(
            f"site-packages directory {status.site_packages} does not exist; run "
            "`bellis as-daisy install` with the environment's own python",
            parameter="site_packages",
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=".bellis_as_daisy.", dir=status.site_packages)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_PTH_TEXT)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except PermissionError as exc:
        raise ConfigurationError(
            f"cannot write {target}: {exc.strerror}; install the hook with the permissions "
            "that installed packages into this environment, or use a virtual environment",
            parameter="site_packages",
        ) from exc
    return target


def uninstall_hook(directory: Path | None = None) -> Path | None:
    """Remove the hook; return the removed file's path, or None when it was not there."""
    target = hook_status(directory).pth_path
    try:
        target.unlink()
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise ConfigurationError(
            f"cannot remove {target}: {exc.strerror}; remove it with the permissions that "
            "installed it",
            parameter="site_packages",
        ) from exc
    return target
