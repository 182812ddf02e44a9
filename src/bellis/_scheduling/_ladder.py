"""A task's memory ladder (:class:`MemoryLadder`): the grants its workers get, smallest
first. Plain data, apart from :mod:`._memory`, which decides with it, so that the task's
record (:mod:`._records`) can name it."""

from __future__ import annotations

from dataclasses import dataclass

from .._sizes import MIB, format_grant

__all__ = ["MemoryLadder"]


@dataclass(frozen=True)
class MemoryLadder:
    """The grants of one task's workers, smallest (the request) first."""

    grants: tuple[int, ...]
    growth: float
    #: how the cap is set, for messages: ``Task(max_memory=...)`` and the like
    cap_parameter: str

    @property
    def top(self) -> int:
        return len(self.grants) - 1

    def text(self, step: int) -> str:
        return format_grant(self.grants[step])

    def megabytes(self, step: int) -> int:
        return -(-self.grants[step] // MIB)
