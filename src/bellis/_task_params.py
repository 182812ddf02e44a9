"""Task parameters, read and checked: the validators ``Task.__init__`` calls.

Owns: each parameter's accepted forms and the error that names the parameter, the value
and the fix. May import the plumbing and the model; imported by ``_task`` only.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import warnings
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

import numpy as np

from ._sizes import GPU_SHARES, format_grant, parse_growth, parse_size
from ._state import DEFAULT_TIMEOUT_SECONDS
from .errors import BellisDeprecationWarning, ConfigurationError

#: a keyword argument the caller did not pass (``None`` is a value there)
UNSET: Any = object()

#: ``Task(speculative=True)``: a block is a straggler after this many median blocks
DEFAULT_BACKUP_AFTER: Final = 3.0

#: the default of ``Task(max_consecutive_failures=...)``: a function that fails on every
#: block stops its task after this many blocks (daisy 2.0.0 stops after ``max_workers +
#: max_worker_restarts`` worker deaths, 11 or 12 with its defaults); see
#: ``bellis._scheduling._abandon``
DEFAULT_MAX_CONSECUTIVE_FAILURES: Final = 10


def check_count(name: str, value: Any, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int (got {type(value).__name__} {value!r})")
    value = int(value)
    if value < minimum:
        raise ConfigurationError(
            f"{name} must be at least {minimum} (got {value}); {fix}", parameter=name
        )
    result: int = value
    return result


def parse_max_consecutive_failures(value: Any) -> int | None:
    """``Task(max_consecutive_failures=...)``: a count of at least 1, or None (rule off)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigurationError(
            f"max_consecutive_failures must be an int of at least 1 or None (got "
            f"{type(value).__name__} {value!r}): the task is abandoned as broken when that "
            "many blocks fail in a row with no block done in between; pass a larger number "
            "to tolerate longer runs of bad blocks, or None to never abandon a task for "
            "failing blocks",
            parameter="max_consecutive_failures",
        )
    return int(value)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by this function's caller point at
    the first frame outside bellis (level 1 is the caller itself)."""
    here_frame = inspect.currentframe()
    frame = here_frame.f_back if here_frame is not None else None
    level = 1
    here = os.path.dirname(__file__)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(here):
            return level
        frame = frame.f_back
        level += 1
    return 2


def parse_timeout(timeout: Any) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_SECONDS
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float | np.integer | np.floating) and not isinstance(
        timeout, bool
    ):
        seconds = float(timeout)
    else:
        raise TypeError(
            "timeout must be a float seconds, a timedelta, or None (None means the "
            f"{DEFAULT_TIMEOUT_SECONDS:g}s default)"
        )
    if not seconds > 0:
        raise ConfigurationError(
            "block timeout must be positive; blocks are expected to be fast — raise the "
            "timeout instead of disabling it",
            parameter="timeout",
        )
    return seconds


def parse_stall_timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"stall_timeout={value!r} is not a duration: pass seconds (a positive number), "
            "a timedelta, or None to turn stall detection off",
            parameter="stall_timeout",
        )
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigurationError(
            f"stall_timeout={value!r} must be a positive, finite number of seconds (how long "
            "a block may go without CPU, IO or heartbeat before its worker is replaced); "
            "pass None to turn stall detection off",
            parameter="stall_timeout",
        )
    return seconds


def parse_backup_after(speculative: Any, backup_after: Any) -> float | None:
    if not isinstance(speculative, bool | np.bool_):
        raise ConfigurationError(
            f"speculative={speculative!r} must be True or False (True: back up straggler "
            "blocks after 3x the median block; backup_after=factor sets another factor)",
            parameter="speculative",
        )
    if backup_after is None:
        return DEFAULT_BACKUP_AFTER if speculative else None
    if (
        isinstance(backup_after, bool)
        or not isinstance(backup_after, int | float | np.integer | np.floating)
        or not (1.0 < float(backup_after) < math.inf)
    ):
        raise ConfigurationError(
            f"backup_after={backup_after!r} must be a finite number above 1: a block out "
            "longer than this many times the median block gets a backup copy (e.g. "
            "backup_after=3.0); pass None to turn backups off",
            parameter="backup_after",
        )
    return float(backup_after)


def parse_memory(limit: Any, growth: Any, cap: Any) -> tuple[int | None, float | None, int | None]:
    lim = None if limit is None else parse_size(limit, "memory_limit")
    grow = None if growth is None else parse_growth(growth)
    top = None if cap is None else parse_size(cap, "max_memory")
    if lim is not None and top is not None and top < lim:
        raise ConfigurationError(
            f"max_memory={cap!r} ({format_grant(top)}) is below memory_limit={limit!r} "
            f"({format_grant(lim)}): the largest grant must be at least the first; raise "
            "max_memory",
            parameter="max_memory",
        )
    return lim, grow, top


def parse_tracking_path(done_marker_path: Any, tracking_path: Any) -> str | bool | None:
    if done_marker_path is not UNSET and tracking_path is not UNSET:
        raise TypeError(
            "pass either tracking_path or done_marker_path, not both (done_marker_path is "
            "the deprecated alias)"
        )
    value = tracking_path
    name = "tracking_path"
    if done_marker_path is not UNSET:
        name = "done_marker_path"
        value = done_marker_path
        if value is not None:
            warnings.warn(
                "done_marker_path is deprecated; use tracking_path",
                BellisDeprecationWarning,
                stacklevel=user_stacklevel(),
            )
    if value is UNSET or value is None:
        return None
    if value is True:
        raise TypeError(
            f"{name}=True is not a valid value; use None (auto), False (disabled), or a str/Path"
        )
    if value is False:
        return False
    if isinstance(value, str | os.PathLike):
        raw = os.fspath(value)
        path = raw.decode() if isinstance(raw, bytes) else raw
        check_local_path(name, path)
        return path
    raise TypeError(
        f"{name} must be None (auto), False (disabled), or a str/Path (got "
        f"{type(value).__name__} {value!r})"
    )


#: ``scheme://`` at the start of a path: a URL, not a local path
_URL_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_local_path(name: str, path: str) -> None:
    """A ConfigurationError when ``path`` is a URL that no tracking store supports
    (``gs://``, ``file://``...): tracking stores live on a local (or mounted) filesystem
    or at an ``s3://bucket/prefix`` URL (docs/cloud.md), and another URL taken as a path
    would make a folder named ``gs:`` in the working directory."""
    match = _URL_SCHEME.match(path)
    if match is None:
        return
    scheme = match.group(1)
    if scheme == "s3":
        return
    fix = (
        f"Pass the plain path ({path[len(scheme) + 3 :] or '/'!r})"
        if scheme.lower() == "file"
        else "Pass a local or mounted filesystem path (a mount of the bucket works)"
    )
    raise ConfigurationError(
        f"{name}={path!r}: the URL scheme {scheme + '://'!r} is not supported (yet); block "
        f"tracking stores live on a filesystem or at an s3:// URL. {fix}, or "
        "tracking_path=False to run without a store",
        parameter=name,
    )


_GPU_FRACTIONS: Final = {GPU_SHARES // n: n for n in range(2, 9)}


def parse_requires(requires: Any) -> dict[str, float]:
    if requires is None:
        return {}
    if not isinstance(requires, dict):
        raise TypeError(
            f"requires must be a dict of resource name to int, e.g. {{'gpu': 1}} "
            f"(got {type(requires).__name__})"
        )
    out: dict[str, float] = {}
    for k, v in requires.items():
        if not isinstance(k, str):
            raise TypeError(f"requires keys must be str (got {k!r})")
        if k == "gpu" and isinstance(v, float | np.floating) and not float(v).is_integer():
            out[k] = _gpu_fraction(float(v))
            continue
        if isinstance(v, bool) or not isinstance(v, int | np.integer | float | np.floating):
            raise TypeError(f"requires[{k!r}] must be an int (got {v!r})")
        if isinstance(v, float | np.floating):
            if not float(v).is_integer():
                raise TypeError(
                    f"requires[{k!r}] must be an int (got {v!r}); only 'gpu' may be a "
                    "fraction (0.5: two workers share a GPU)"
                )
            v = int(v)
        if v < 0:
            raise ConfigurationError(
                f"requires[{k!r}]={v} is negative; a task needs 0 or more units of a "
                "resource (leave it out for none)",
                parameter="requires",
            )
        if v > 0:
            out[k] = int(v)
    return out


def _gpu_fraction(v: float) -> float:
    shares = v * GPU_SHARES
    n = _GPU_FRACTIONS.get(round(shares)) if 0 < v < 1 else None
    if n is None or abs(shares - round(shares)) > 1e-6:
        raise ConfigurationError(
            f"requires['gpu']={v!r} is not a share of a GPU bellis can pack: pass a whole "
            "number of GPUs (1, 2, ...) or 1/n of one for n workers on a GPU (0.5, 0.25, "
            "1/3, ... down to 1/8)",
            parameter="requires",
        )
    return 1 / n


def budget_units(amounts: Mapping[str, float]) -> dict[str, int]:
    """``requires`` or ``resources`` in the integer units the run's budget counts in: as
    given, but ``gpu`` in :data:`GPU_SHARES` per GPU."""
    return {k: round(v * GPU_SHARES) if k == "gpu" else int(v) for k, v in amounts.items()}


def parse_setup(setup: Any) -> Any:
    """``Task(setup=...)``: None, or a callable that takes no argument (see
    ``docs/warm_workers.md``: a plain function whose return value is kept, or a context
    manager factory such as a ``@contextlib.contextmanager`` function or a class with
    ``__enter__``/``__exit__``)."""
    if setup is None:
        return None
    # a context manager already made (``setup=open_arrays()``): a ``@contextmanager``
    # one is callable too (as a decorator), but each worker needs one of its own
    made = (
        not isinstance(setup, type) and hasattr(setup, "__enter__") and hasattr(setup, "__exit__")
    )
    if made or not callable(setup):
        fix = (
            "pass the function that makes it, not what it made (setup=open_arrays, not "
            "setup=open_arrays()): each worker calls it once"
            if made
            else "pass a function that takes no argument, or None"
        )
        raise ConfigurationError(
            f"setup={setup!r} is {'a context manager' if made else 'not callable'}; {fix}",
            parameter="setup",
        )
    try:
        inspect.signature(setup).bind()
    except TypeError as exc:
        raise ConfigurationError(
            f"setup={setup!r} cannot be called without arguments ({exc}): each worker calls "
            "setup() once before its first block; bind its arguments first "
            "(functools.partial(open_arrays, path)) or give them defaults",
            parameter="setup",
        ) from exc
    except ValueError:
        pass  # a builtin without a signature: called as it is
    return setup


def check_setup_function(task_id: str, setup: Any, arity: int) -> None:
    """A setup needs a block function: a worker function (no arguments) runs its own
    client loop and opens what it needs itself. ``arity``: the process function's."""
    if setup is not None and arity == 0:
        raise ConfigurationError(
            f'task "{task_id}" has a setup but its process_function takes no argument (a '
            "worker function that runs its own Client loop): setup= runs before a block "
            "function's blocks. Open what the worker function needs at its start instead, "
            "or make it a block function f(block) or f(block, ctx)",
            parameter="setup",
        )
