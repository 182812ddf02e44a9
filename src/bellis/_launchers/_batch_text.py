"""The text every batch system reads and writes, for the batch launchers (``_batch``):
job names, array indices, time limits, memory sizes, the job scripts' shared lines and
private files (scripts, payloads). No process is started here; each system's own
spellings live with its dialect."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from .._payload import payload_frame
from .._protocol import (
    JOB_STARTED_ENV,
    JOB_TIME_LIMIT_ENV,
    WALLTIME_MARGIN_ENV,
)
from ..errors import ConfigurationError

__all__ = [
    "array_ranges",
    "default_margin",
    "file_size",
    "hms",
    "longest_run",
    "parse_walltime",
    "redirect_line",
    "sanitize",
    "walltime_lines",
    "write_new_private",
    "write_payload",
    "write_private",
]


def sanitize(text: str) -> str:
    """``text`` restricted to ``[A-Za-z0-9_.-]`` (what every batch system takes in a name)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def default_margin(limit_seconds: int) -> float:
    """5% of the limit, at least 10 s and at most 60 s."""
    return float(min(60.0, max(10.0, 0.05 * limit_seconds)))


def array_ranges(indices: Sequence[int]) -> str:
    """Array indices as ranges: ``0-3,7,9-10``."""
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


def longest_run(numbers: Sequence[int]) -> list[int]:
    """The longest run of consecutive numbers among ``numbers``, in order."""
    best: list[int] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        run = [*run, n] if run and n == run[-1] + 1 else [n]
        if len(run) > len(best):
            best = run
    return best


def parse_walltime(value: int | float | str, parameter: str = "time_limit") -> int:
    """Seconds of a job time limit given as minutes (a number) or ``[D-]HH:MM[:SS]``."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int | float):
        if value < 1:
            raise ConfigurationError(
                f"{parameter}={value!r}: a time limit is at least 1 minute; pass minutes "
                "(an int) or 'HH:MM:SS'",
                parameter=parameter,
            )
        return int(value) * 60
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+)(?::(\d+))?", value.strip())
    if m is None:
        raise ConfigurationError(
            f"{parameter}={value!r} is not a time limit: pass minutes (an int) or "
            "'HH:MM:SS' (or 'D-HH:MM:SS')",
            parameter=parameter,
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total < 1:
        raise ConfigurationError(
            f"{parameter}={value!r}: a time limit must be positive", parameter=parameter
        )
    return total


def hms(seconds: int) -> str:
    """``HH:MM:SS`` (hours may exceed 24)."""
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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


def write_new_private(directory: Path, stem: str, suffix: str, data: bytes) -> Path:
    """Write ``data`` to a new private file ``<directory>/<stem>.<n>.<suffix>``, ``n`` the
    first number whose file does not exist yet (created exclusively, so two writers never
    share one); its path."""
    n = 1
    while True:
        path = directory / f"{stem}.{n}.{suffix}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            n += 1
            continue
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return path


def write_payload(path: Path, payload: bytes) -> Path:
    """Write a worker's payload frame (``_payload.payload_frame``) to ``path``, privately and
    atomically; ``path``."""
    tmp = path.with_suffix(".payload.tmp")
    write_private(tmp, payload_frame(payload))
    tmp.replace(path)
    return path


def redirect_line(out: Path | None, err: Path | None) -> str:
    """The job script's line that sends its output to a worker's logs (None: nowhere)."""
    out_text = "/dev/null" if out is None else str(out)
    err_text = "/dev/null" if err is None else str(err)
    return f"exec >>{shlex.quote(out_text)} 2>>{shlex.quote(err_text)}"


def walltime_lines(seconds: int | None, margin: float) -> list[str]:
    """The job script's first commands when workers watch the time limit (``seconds``;
    None: they do not): the job's start (epoch seconds), the limit and the margin (see
    ``bellis._worker._walltime``)."""
    if seconds is None:
        return []
    return [
        f"{JOB_STARTED_ENV}=$(date +%s)",
        f"export {JOB_STARTED_ENV} {JOB_TIME_LIMIT_ENV}={seconds} {WALLTIME_MARGIN_ENV}={margin:g}",
    ]
