"""A discrete-event simulation of a run's schedule: pure, no clock, no I/O.

Theory of operation
-------------------
Blocks are numbered ``0..n-1`` across the run; each has a cost in seconds, a *group* (its
task: a task's workers run only its blocks) and the blocks it waits for (conflict levels
within a task, read/write overlap between tasks). A group has ``workers[g]`` workers. They
are asked for when the group first has a ready block, as bellis's staffing does, and are
ready ``start_delay`` seconds later, or each after its own delay (``arrivals``: the worker
starts the sample measured; on a cluster they are spread out). An idle worker
takes the ready block that became ready first (ties: the lower number), holds it for its
cost plus ``overhead`` (the per-block dispatch cost the sample measured), and when it
finishes, the blocks waiting for it may become ready.

Time only moves from event to event (a heap of worker arrivals and block ends), so the
result is exact for the model and deterministic: the tests check it against schedules
worked out by hand.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SimResult", "simulate"]

_ARRIVE, _END = 0, 1


@dataclass(frozen=True)
class SimResult:
    #: when the last block ends (the run's wall, from its start)
    wall: float
    #: seconds workers spent on blocks (costs plus overheads), all groups
    busy: float
    #: per group: when its workers were ready, and when its last block ended
    started: tuple[float, ...]
    finished: tuple[float, ...]
    #: per group: the most blocks that ran at once
    peak_parallel: tuple[int, ...]

    def worker_seconds(self, workers: Sequence[int]) -> float:
        """Seconds the groups' workers were held (from ready to their group's last block)."""
        return sum(
            max(0.0, f - s) * w
            for s, f, w in zip(self.started, self.finished, workers, strict=True)
        )


def simulate(
    costs: Sequence[float],
    deps: Sequence[Sequence[int]],
    group: Sequence[int],
    workers: Sequence[int],
    *,
    start_delay: float = 0.0,
    overhead: float = 0.0,
    arrivals: Sequence[Sequence[float]] | None = None,
) -> SimResult:
    """Simulate the run of blocks with ``costs`` waiting for ``deps``, run by the
    ``workers`` of their ``group``; see the module docstring. ``arrivals`` gives, per
    group, each worker's own start delay (a group with fewer entries than workers repeats
    its last; an empty one uses ``start_delay``): workers on a cluster do not all start
    at once. Raises ValueError for a block that can never run (a dependency cycle or a
    group without workers)."""
    n = len(costs)
    if len(deps) != n or len(group) != n:
        raise ValueError("costs, deps and group must have one entry per block")
    n_groups = len(workers)
    waiting = [len(d) for d in deps]
    dependants: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for d in ds:
            dependants[d].append(i)
    ready: list[list[tuple[float, int]]] = [[] for _ in range(n_groups)]
    idle = [0] * n_groups
    asked = [False] * n_groups
    started = [0.0] * n_groups
    finished = [0.0] * n_groups
    running = [0] * n_groups
    peak = [0] * n_groups
    events: list[tuple[float, int, int]] = []

    def make_ready(i: int, t: float) -> None:
        g = group[i]
        heapq.heappush(ready[g], (t, i))
        if not asked[g]:
            asked[g] = True
            mine = list(arrivals[g]) if arrivals is not None and g < len(arrivals) else []
            delays = [
                mine[min(j, len(mine) - 1)] if mine else start_delay for j in range(workers[g])
            ]
            started[g] = t + min(delays, default=start_delay)
            for d in delays:
                heapq.heappush(events, (t + d, _ARRIVE, g))

    for i in range(n):
        if not waiting[i]:
            make_ready(i, 0.0)
    done = 0
    busy = 0.0
    wall = 0.0
    while events:
        t, kind, x = heapq.heappop(events)
        if kind == _ARRIVE:
            g = x
            idle[g] += 1
        else:
            g = group[x]
            idle[g] += 1
            running[g] -= 1
            done += 1
            wall = max(wall, t)
            finished[g] = max(finished[g], t)
            for d in dependants[x]:
                waiting[d] -= 1
                if not waiting[d]:
                    make_ready(d, t)
        # hand out: only groups whose workers are here and have work
        for h in range(n_groups):
            while idle[h] and ready[h]:
                _, i = heapq.heappop(ready[h])
                idle[h] -= 1
                running[h] += 1
                peak[h] = max(peak[h], running[h])
                held = costs[i] + overhead
                busy += held
                heapq.heappush(events, (t + held, _END, i))
    if done != n:
        raise ValueError(
            f"{n - done} of {n} blocks never ran: a dependency cycle, or a group without workers"
        )
    return SimResult(wall, busy, tuple(started), tuple(finished), tuple(peak))
