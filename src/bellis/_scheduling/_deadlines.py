"""When a connection's blocks are due back: a heap of deadlines, so the tick looks only at
the connections whose deadline passed (O(expired + log N)), never at all of them.

Each peer has at most one *live* entry, the one whose time equals ``peer.due``; an entry
pushed earlier for the same peer (its ``due`` has moved since) is stale and skipped when
popped (lazy deletion), and the heap is rebuilt without them when they outnumber the live
ones. A peer's entry may fall due before its current deadline (a later batch with a later
deadline): the caller then watches it again at that deadline.
"""

from __future__ import annotations

from collections.abc import Iterator
from heapq import heapify, heappop, heappush
from itertools import count
from typing import Any, Final

from ._records import Peer

__all__ = ["DeadlineHeap", "watchdog_margin_seconds"]

_INF: Final = float("inf")


def watchdog_margin_seconds(run: Any) -> float:
    """How long past a block's deadline the server waits before it reclaims the block.

    The worker's own watchdog fires at the same deadline (measured from when it received
    the block, so a little later) and polls every ``min(0.5, timeout / 20)`` seconds; it
    exits with code 87 after writing why to the worker's log. The server reclaims (and
    kills) only as the backstop for a worker whose watchdog cannot run; an EOF at or after
    the deadline is accounted as the timeout either way (see ``Dispatcher.close``).
    """
    timeout = run.spec.timeout_secs if run is not None else 0.0
    return min(0.5, max(0.01, timeout / 20)) + 0.25


class DeadlineHeap:
    """Peers by the time their blocks are due back (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Peer]] = []
        self._seq = count()
        #: peers with a live entry
        self._live = 0

    def watch(self, peer: Peer, due: float) -> None:
        """Look at ``peer`` again at ``due``, if that is earlier than its entry so far."""
        if due >= peer.due:
            return
        if peer.due == _INF:
            self._live += 1
        peer.due = due
        heappush(self._heap, (due, next(self._seq), peer))
        if len(self._heap) > 2 * self._live + 64:
            self._heap = [e for e in self._heap if e[0] == e[2].due]
            heapify(self._heap)

    def due(self, now: float) -> Iterator[Peer]:
        """The peers whose entry fell due before ``now``, each taken off the heap (watch
        it again to keep it there)."""
        while self._heap and self._heap[0][0] < now:
            due, _, peer = heappop(self._heap)
            if due != peer.due:
                continue  # stale: the peer has an earlier entry
            peer.due = _INF
            self._live -= 1
            yield peer
