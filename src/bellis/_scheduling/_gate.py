"""A task's start gate: its first blocks wait until its workers are all there.

Theory of operation
-------------------
A plan's sample run (``bellis.plan(tasks, sample=N)``) measures what a block costs while
the run is in its steady state: every worker busy with blocks. Ungated, the first worker to
connect takes most of a small sample while the others are still starting, and on a machine
with few cores their imports slow its blocks down (a 60-block sample measured 30% slower
than the same blocks in the run: ``benchmarks/RESULTS.md``, "Forecast accuracy"). So a
gated task parks every request until:

* each worker booked for it has connected (or ended), and no more will be booked
  (``more_coming`` is the dispatcher's word for that: the staffing would start another); or
* ``wait`` seconds have passed since its first request was parked (a cluster job that
  stays queued does not hold the sample for longer).

Only a plan's sample run has a gate (``RunSettings.start_gate``); the dispatcher asks it only
while it is closed, and drops it once it opens, so an ordinary run pays one ``is None``
test per request.

A sample run also hands its blocks out in a random order (:func:`shuffle_roots`): in grid
order a worker's first blocks (those that pay for its warm-up) would all come from the
grid's first rows, and a cost that grows along the first axis would pass for warm-up, or
hide it (``_plan._costs.warm_up``).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["StartGate", "shuffle_roots"]


class StartGate:
    """One task's gate (see the module docstring). ``wait``: the most seconds it stays
    closed after its first request."""

    __slots__ = ("deadline", "wait")

    def __init__(self, wait: float) -> None:
        if not wait >= 0:
            raise ValueError(f"a start gate's wait must be >= 0 seconds, not {wait!r}")
        self.wait = float(wait)
        self.deadline: float | None = None

    def holds(self, workers: Any, alive: int, more_coming: bool, now: float) -> bool:
        """Whether a request for the gated task waits at ``now``: its ``workers`` (the
        task's ``ManagedWorker`` records), ``alive`` of them booked and not yet ended, and
        ``more_coming`` when the staffing would book another."""
        if self.deadline is None:
            self.deadline = now + self.wait
        if now >= self.deadline:
            return False
        if more_coming:
            return True
        here = sum(1 for w in workers if w.conn is not None and w.exit is None)
        return here < alive


def shuffle_roots(runs: Any, seed: int) -> None:
    """Hand out each task's initially ready blocks in a random order (``seed``): every one
    of them is ready, so any order is a valid one. Lists them all at once (a sample: a
    few percent of the blocks)."""
    rng = random.Random(seed)
    for run in runs:
        run.order_fixed = True  # no locality order (``Scheduler.order_by_locality``)
        if run.roots is not None:
            order = list(run.roots)
            rng.shuffle(order)
            run.roots = iter(order)
