"""run_blockwise's options are declared once (``bellis._run._options.RunOptions``): every
public way into a run keeps daisy's signature, and each of its run options has the name
and the default declared there."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import bellis
from bellis._entrypoints import _run_serial
from bellis._run._options import RunOptions

DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunOptions)}

#: entry point -> its parameters that are not run options
NOT_OPTIONS: dict[str, set[str]] = {
    "run_blockwise": {"pipeline"},
    "Server.run_blockwise": {"self", "pipeline"},
    "SerialServer.run_blockwise": {"self", "tasks"},
    "_run_serial": {"pipeline"},
    "plan": {"pipeline", "sample", "cost_hint", "seed", "show"},
}


def _entry_points() -> dict[str, Callable[..., Any]]:
    return {
        "run_blockwise": bellis.run_blockwise,
        "Server.run_blockwise": bellis.Server.run_blockwise,
        "SerialServer.run_blockwise": bellis.SerialServer.run_blockwise,
        "_run_serial": _run_serial,
        "plan": bellis.plan,
    }


@pytest.mark.parametrize("name", sorted(NOT_OPTIONS))
def test_each_entry_points_options_are_the_declared_ones(name: str) -> None:
    params = inspect.signature(_entry_points()[name]).parameters
    for p in params.values():
        if p.name in NOT_OPTIONS[name]:
            continue
        assert p.name in DEFAULTS, f"{name}({p.name}=...) is not a RunOptions field"
        assert p.default == DEFAULTS[p.name], (
            f"{name}({p.name}={p.default!r}): RunOptions declares {DEFAULTS[p.name]!r}"
        )


def test_run_blockwise_takes_every_option_in_daisys_order() -> None:
    """SPEC §3: run_blockwise(pipeline, multiprocessing, resources, progress, ...)."""
    names = list(inspect.signature(bellis.run_blockwise).parameters)
    assert names == ["pipeline", *DEFAULTS]


def test_the_options_are_frozen() -> None:
    options = RunOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.multiprocessing = False  # type: ignore[misc]
