"""The text SLURM reads and writes, for the SLURM launcher: names, sizes, time limits,
exit statuses, array indices and private files. No process is started here."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

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


def sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


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


def default_margin(limit_seconds: int) -> float:
    """5% of the limit, at least 10 s and at most 60 s."""
    return float(min(60.0, max(10.0, 0.05 * limit_seconds)))


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


def array_ranges(indices: Sequence[int]) -> str:
    """``--array`` indices as ranges: ``0-3,7,9-10``."""
    out: list[str] = []
    ordered = sorted(indices)
    start = prev = ordered[0]
    for i in [*ordered[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


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


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read: job scripts hold the run's secret, and the
    payload is the pickled function the worker will run."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)
