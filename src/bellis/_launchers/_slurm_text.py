"""The text SLURM reads and writes, for the SLURM launcher: time limits, memory sizes,
exit statuses, ``scontrol`` fields and filename patterns (the helpers every batch system
shares come from ``_batch_text``). No process is started here."""

from __future__ import annotations

import re
from pathlib import Path

from ._batch_text import array_ranges, default_margin, file_size, sanitize, write_private

__all__ = [
    "array_ranges",
    "default_margin",
    "exit_status",
    "file_size",
    "format_mem",
    "format_time_limit",
    "parse_fields",
    "sanitize",
    "slurm_pattern",
    "time_limit_seconds",
    "write_private",
]


def format_time_limit(value: int | float | str) -> str:
    if isinstance(value, str):
        if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
            raise ValueError(f"time_limit={value!r} is not minutes or 'HH:MM:SS'")
        return value
    minutes = int(value)
    if minutes < 1:
        raise ValueError(f"time_limit must be at least 1 minute (got {value!r})")
    return str(minutes)


def time_limit_seconds(text: str) -> int:
    """Seconds of a SLURM ``--time``: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = [int(p) for p in rest.split(":")]
    if dash:
        parts += [0] * (3 - len(parts))  # D-H, D-H:M
        hours, minutes, seconds = parts
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts
    return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


def exit_status(text: str) -> str:
    """squeue's ``exit_code`` (a raw wait status, or ``code:signal`` in some versions) as
    ``scontrol``'s ``ExitCode=code:signal``; empty when there is none."""
    text = text.strip()
    if not text or ":" in text:
        return text
    try:
        raw = int(text)
    except ValueError:
        return ""
    return f"{(raw >> 8) & 0xFF}:{raw & 0x7F}"


def format_mem(value: int | str) -> str:
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"mem must be positive (got {value!r})")
        return f"{value}M"
    if not re.fullmatch(r"\d+[KMGT]?", value.strip().upper()):
        raise ValueError(f"mem={value!r} is not a SLURM memory size such as '4G' or '500M'")
    return value.strip().upper()


def parse_fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in line.split():
        key, sep, value = item.partition("=")
        if sep:
            fields[key] = value
    return fields


def slurm_pattern(path: Path | str) -> str:
    """``path`` for an ``#SBATCH --output``/``--error`` line: SLURM reads ``%`` as the start
    of a replacement symbol there (task directories can hold ``%25``-style escapes)."""
    return str(path).replace("%", "%%")
