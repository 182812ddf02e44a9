"""Byte sizes, read and written in one place.

Three spellings, each for its reader, none interchangeable:

* :func:`format_grant` writes a memory grant as SLURM and ``Task(memory_limit=...)`` read
  it: ``"4G"``, ``"300M"``, ``"1.5G"``; :func:`parse_size` reads it back.
* :func:`format_iec` writes a byte count for the HTML report and its advice: ``"25.5 MiB"``,
  as the page's scripts write it.
* :func:`format_bytes` writes the Resource Utilization panel's figures: ``"25.5 MiB"``
  (1024 steps, so binary units, named as IEC names them: KiB, MiB, GiB).

And :func:`recommended_memory`, the one rule by which the plan and the report recommend a
memory request from the peak RSS the blocks reached.

And :data:`GPU_SHARES`, a GPU counted in integer shares (``requires={"gpu": 0.5}``).

Pure functions; imports nothing of bellis but the errors.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

from .errors import ConfigurationError

__all__ = [
    "BYTE_UNITS",
    "GPU_SHARES",
    "MIB",
    "format_bytes",
    "format_grant",
    "format_iec",
    "parse_growth",
    "parse_size",
    "recommended_memory",
]

#: a GPU in shares: a worker's ``requires={"gpu": 1/n}`` (n up to 8) is a whole number of
#: them, so that the run's GPU budget and the local GPU book count exactly
GPU_SHARES: Final = 840

MIB: Final = 1 << 20
_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)
#: the report's binary units, largest first
BYTE_UNITS: Final = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
_PANEL_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: a recommended memory request: the largest peak RSS seen, plus this share, ...
MEMORY_HEADROOM: Final = 0.25
#: ... rounded up to a multiple of this
MEMORY_STEP: Final = 64 * MIB


def parse_size(value: Any, parameter: str, *, int_unit: int = 1) -> int:
    """Bytes for ``value``: ``"150M"``, ``"4G"``, ``"1.5G"``, ``"4GB"``, ``"4GiB"`` (K, M, G
    and T are powers of 1024, as SLURM reads them), or a number of ``int_unit`` bytes.
    Raises :class:`ConfigurationError` naming ``parameter``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigurationError(
            f"{parameter}={value!r} is not a memory size: pass a string such as '4G' or "
            "'500M', or a number",
            parameter=parameter,
        )
    if isinstance(value, str):
        m = _SIZE.fullmatch(value.strip())
        if m is None:
            raise ConfigurationError(
                f"{parameter}={value!r} is not a memory size: write it as '4G', '500M', "
                "'1.5G' (K, M, G, T: powers of 1024)",
                parameter=parameter,
            )
        size = float(m.group(1)) * _UNITS[m.group(2).upper()]
    else:
        size = float(value) * int_unit
    if not (math.isfinite(size) and size >= MIB):
        raise ConfigurationError(
            f"{parameter}={value!r} is not a usable memory size: it must be at least 1M",
            parameter=parameter,
        )
    return int(size)


def parse_growth(value: Any, parameter: str = "memory_growth") -> float:
    """``memory_growth``: a number above 1 (how much more each step of the ladder grants)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (math.isfinite(value) and value > 1):
        raise ConfigurationError(
            f"{parameter}={value!r} must be a number above 1: each retry after an "
            "out-of-memory death gets the last grant times this (2 doubles it)",
            parameter=parameter,
        )
    return float(value)


def format_grant(size: int) -> str:
    """``"4G"``, ``"300M"``, ``"1.5G"``: ``size`` bytes as a person reads a grant."""
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", MIB), ("K", 1 << 10)):
        if size >= factor:
            n = size / factor
            text = f"{n:.0f}" if n == int(n) else f"{n:.3g}"
            return text + unit
    return f"{size}B"


def format_iec(n: float) -> str:
    """``25.5 MiB``: a byte count in :data:`BYTE_UNITS`, one decimal (``512 B`` below a
    KiB), as the page's scripts write it; ``-`` for NaN or infinity."""
    if not math.isfinite(n):
        return "-"
    for scale, unit in BYTE_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_bytes(n: float | None) -> str:
    """``25.5 MiB``: 1024 steps, B to PiB, one decimal; ``-`` for None."""
    if n is None or not math.isfinite(n):
        return "-"
    value = float(n)
    i = 0
    while abs(value) >= 1024.0 and i < len(_PANEL_UNITS) - 1:
        value /= 1024.0
        i += 1
    return f"{value:.1f} {_PANEL_UNITS[i]}"


def recommended_memory(peak_bytes: float) -> int:
    """The memory request that covers a block whose peak RSS was ``peak_bytes`` (the
    largest seen): ``peak_bytes`` plus :data:`MEMORY_HEADROOM`, rounded up to a multiple
    of :data:`MEMORY_STEP` (64 MiB). The plan's forecast and the report's advice both
    recommend this, from the blocks each has measured."""
    if not math.isfinite(peak_bytes) or peak_bytes <= 0:
        return MEMORY_STEP
    return int(math.ceil(peak_bytes * (1 + MEMORY_HEADROOM) / MEMORY_STEP) * MEMORY_STEP)
