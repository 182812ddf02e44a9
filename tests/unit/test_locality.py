"""Locality-aware dispatch (issue 38 item 2): each connection gets a spatially coherent
stream of ready blocks, within the scheduler's rules. Scripted against the dispatcher and
the scheduler with a fake clock: no process, socket or sleep."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bellis
from bellis._protocol import SEND, SHUTDOWN, FrameDecoder
from bellis._scheduling._dispatch import SEND_FRAME
from bellis._scheduling._locality import (
    FOLD_BLOCKS,
    MAX_LOCALITY_BLOCKS,
    Coherence,
    Stream,
    morton_order,
)
from bellis._scheduling._records import Peer
from bellis._scheduling._scheduler import Scheduler
from bellis._scheduling._task_run import FINISHED
from bellis._tracking import StoreLayout, TrackingStore
from kit.dispatch import OK, Script, send_of

GRID = 8  # 8 x 8 x 8 = 512 blocks


def cube(task_id: str = "t", *, conflict: bool = False, **kw: Any) -> bellis.Task:
    """A task of 8 x 8 x 8 blocks of 10^3 (read context 2 with ``conflict``)."""
    ctx = 2 if conflict else 0
    kw.setdefault("process_function", lambda b: None)
    return bellis.Task(
        task_id,
        bellis.Roi((0, 0, 0), (GRID * 10 + 2 * ctx,) * 3),
        bellis.Roi((0, 0, 0), (10 + 2 * ctx,) * 3),
        bellis.Roi((ctx,) * 3, (10,) * 3),
        read_write_conflict=conflict,
        **kw,
    )


def steps_of(seq: list[int], grid: tuple[int, ...]) -> list[int]:
    """The grid (Chebyshev) distance between consecutive blocks of ``seq``."""
    coords = [np.unravel_index(k, grid) for k in seq]
    return [
        max(abs(int(a) - int(b)) for a, b in zip(p, q, strict=True))
        for p, q in itertools.pairwise(coords)
    ]


def local_share(seq: list[int], grid: tuple[int, ...]) -> float:
    """Of a worker's blocks after its first, the share next to its previous block."""
    steps = steps_of(seq, grid)
    return sum(1 for s in steps if s <= 1) / len(steps)


class Drive:
    """Workers on connections of a scripted dispatcher: each returns its blocks (done) and
    asks for more, in turn; records who got which block, and when each was released."""

    def __init__(self, sc: Script, peers: list[Peer], busy: float = 1.0) -> None:
        self.sc = sc
        self.peers = peers
        self.busy = busy
        self.held: dict[int, list[int]] = {}
        self.got: dict[int, list[tuple[str, int]]] = {id(p): [] for p in peers}
        self.events: list[tuple[str, str, int]] = []  # ("send" | "done", task, k)
        self.stopped: set[int] = set()

    def _take(self, out: list[tuple[Any, ...]]) -> None:
        for instr in out:
            if instr[0] != SEND_FRAME:
                continue
            peer = instr[1]
            for msg in FrameDecoder().feed(instr[2]):
                if msg[0] == SEND:
                    ks = msg[1:]
                    self.held[id(peer)] = ks
                    tid = peer.run.task_id
                    self.got[id(peer)] += [(tid, k) for k in ks]
                    self.events += [("send", tid, k) for k in ks]
                elif msg[0] == SHUTDOWN:
                    self.stopped.add(id(peer))

    def run(self) -> None:
        for p in self.peers:
            self._take(self.sc.acquire(p))
        turn = 0
        while len(self.stopped) < len(self.peers):
            busy = [p for p in self.peers if self.held.get(id(p))]
            assert busy, "every connection waits, and none holds a block: a deadlock"
            p = busy[turn % len(busy)]
            turn += 1
            ks = self.held.pop(id(p))
            assert p.run is not None
            self.events += [("done", p.run.task_id, k) for k in ks]
            self.sc.now += 0.01
            self._take(self.sc.acquire(p, *((k, OK, -1, None) for k in ks), busy=self.busy))

    def order_violations(self, scheduler: Scheduler) -> list[str]:
        """Blocks sent before one of the blocks they wait for (conflicts, upstream tasks)
        was done, and blocks sent twice."""
        out = []
        done: set[tuple[str, int]] = set()
        sent: set[tuple[str, int]] = set()
        graph = scheduler.dependency_graph
        for kind, tid, k in self.events:
            if kind == "done":
                done.add((tid, k))
                continue
            if (tid, k) in sent:
                out.append(f"{tid}/{k} sent twice")
            sent.add((tid, k))
            block = scheduler.by_id[tid].geom.block(k)
            for up in graph.upstream(block):
                key = (up.task_id, scheduler.by_id[up.task_id].geom.index_of_block(up))
                if key not in done:
                    out.append(f"{tid}/{k} sent before {key} was done")
        return out


def fifo_streams(scheduler: Scheduler, task_id: str, workers: int = 2) -> list[list[int]]:
    """The FIFO order's streams: ``workers`` take one block in turn from a scheduler in
    FIFO order (no locality) and return it done when they come back."""
    run = scheduler.by_id[task_id]
    streams: list[list[int]] = [[] for _ in range(workers)]
    held: list[int] = [-1] * workers
    while run.status != FINISHED:
        for w in range(workers):
            if held[w] >= 0:
                scheduler.release_index(run, held[w], True)
            held[w] = scheduler.acquire_index(run)
            if held[w] >= 0:
                streams[w].append(held[w])
    return streams


# -- the order ----------------------------------------------------------------------------


def test_the_morton_order_walks_the_grid_cell_by_cell() -> None:
    assert morton_order((2, 2)).tolist() == [0, 1, 2, 3]
    order = morton_order((4, 4)).tolist()
    assert sorted(order[:4]) == [0, 1, 4, 5]  # the top-left 2 x 2 cell first
    assert sorted(order[4:8]) == [2, 3, 6, 7]
    for grid in [(3, 5), (1, 7), (5, 1, 3), (8, 8, 8)]:
        assert sorted(morton_order(grid).tolist()) == list(range(int(np.prod(grid))))
    assert morton_order((0, 3)).size == 0


def _key(coords: tuple[int, ...], nbits: list[int]) -> int:
    """The Morton key, bit by bit: level by level, the last axis first."""
    key = out = 0
    for j in range(max(nbits)):
        for i in range(len(coords) - 1, -1, -1):
            if j < nbits[i]:
                key |= ((coords[i] >> j) & 1) << out
                out += 1
    return key


@pytest.mark.parametrize("grid", [(3, 5), (8, 8, 8), (5, 1, 9), (100, 37), (2, 300), (17, 17, 17)])
def test_the_morton_order_is_the_order_of_the_keys(grid: tuple[int, ...]) -> None:
    nbits = [(g - 1).bit_length() for g in grid]
    cells = list(itertools.product(*(range(g) for g in grid)))  # C order: k = index
    expected = sorted(range(len(cells)), key=lambda k: _key(cells[k], nbits))
    assert morton_order(grid).tolist() == expected


def test_the_coherence_counts_each_connections_steps() -> None:
    c = Coherence((4, 4))
    one, two = c.trail(), c.trail()
    c.note(one, [0, 1])
    c.note(two, [15])
    c.note(one, [2, 6])  # (0,2) -> (1,2): a neighbour
    c.note(two, [0])  # (3,3) -> (0,0): three blocks away
    assert c.counts() == (4, 3, 6)
    c.note(one, [6])  # the same block again (a retry on its worker): local, no step
    assert c.counts() == (5, 4, 6)
    c.note(two, [1])
    c.retire(two)  # its connection ended: counted, and gone
    c.note(one, list(range(16)) * (FOLD_BLOCKS // 16 + 1))  # folded as it grows
    assert len(one) == 1 and c.counts()[0] == 6 + 16 * (FOLD_BLOCKS // 16 + 1)


@pytest.mark.parametrize("busy", [1.0, 0.001], ids=["one-at-a-time", "batches"])
def test_two_workers_over_512_blocks_get_coherent_streams(busy: float) -> None:
    sc = Script(cube(max_workers=2))
    peers = [sc.connect(), sc.connect()]
    drive = Drive(sc, peers, busy)
    drive.run()
    grid = (GRID,) * 3
    seqs = [[k for _t, k in drive.got[id(p)]] for p in peers]
    assert sorted(seqs[0] + seqs[1]) == list(range(GRID**3))  # each block once
    assert drive.order_violations(sc.scheduler) == []
    fifo = fifo_streams(Scheduler(cube()), "t")
    for seq, base in zip(seqs, fifo, strict=True):
        assert len(seq) >= 64  # both workers worked
        # a neighbour after nearly every block; taking turns in the FIFO order, never
        assert local_share(seq, grid) >= 0.85, local_share(seq, grid)
        assert local_share(base, grid) <= 0.1, local_share(base, grid)
    # the run's own figure says the same
    blocks, local, steps = sc.run().coherence.counts()
    mine = [s for seq in seqs for s in steps_of(seq, grid)]
    assert (blocks, local, steps) == (len(mine), sum(s <= 1 for s in mine), sum(mine))
    assert sc.scheduler.task_states["t"].locality_local == local


def test_conflicts_and_dependencies_hold_in_a_pipeline_ordered_by_locality() -> None:
    up = cube("up", conflict=True, max_workers=2)
    down = cube("down", conflict=True, max_workers=2)
    sc = Script(bellis.Pipeline([up, down], [(up, down)]))
    peers = [sc.connect("up"), sc.connect("up"), sc.connect("down"), sc.connect("down")]
    drive = Drive(sc, peers)
    drive.run()
    assert drive.order_violations(sc.scheduler) == []
    for tid in ("up", "down"):
        assert sc.scheduler.task_states[tid].completed_count == GRID**3
    grid = (GRID,) * 3
    fifo = fifo_streams(Scheduler(cube(conflict=True)), "t")
    base = [s for seq in fifo for s in steps_of(seq, grid)]
    for p in peers[:2]:
        seq = [k for _t, k in drive.got[id(p)]]
        steps = steps_of(seq, grid)
        # conflict levels keep a worker's blocks of one level two apart, and still: more
        # than half of its blocks follow a neighbour (FIFO: none) and its steps are
        # less than half as long as taking turns in the FIFO order
        assert local_share(seq, grid) >= 0.5, local_share(seq, grid)
        assert sum(steps) / len(steps) < 0.5 * sum(base) / len(base)
    assert max(local_share(seq, grid) for seq in fifo) <= 0.1


# -- stealing and ended streams ------------------------------------------------------------


def test_a_worker_that_runs_dry_takes_the_far_half_of_the_largest_region() -> None:
    sc = Script(cube(max_workers=2))
    a, b = sc.connect(), sc.connect()
    (first,) = send_of(sc.acquire(a), a)  # a holds its block (a slow one)
    (k,) = send_of(sc.acquire(b), b)
    local = sc.run().local
    pos = local.pos_of
    assert pos[first] == 0 and pos[k] == 256  # b starts in the middle
    seq = [k]
    while True:  # b does its whole half while a's block runs
        (k,) = send_of(sc.acquire(b, (k, OK, -1, None), busy=1.0), b)
        seq.append(k)
        if pos[k] < 256:
            break
    assert [pos[x] for x in seq[:-1]] == list(range(256, 512))
    # then it takes the far half of what a has left: a keeps [1, 128), b goes on at 128
    assert pos[seq[-1]] == 128
    (nxt,) = send_of(sc.acquire(a, (first, OK, -1, None), busy=1.0), a)
    assert pos[nxt] == 1


def test_a_closed_connection_leaves_its_region_to_the_next_one() -> None:
    sc = Script(cube(max_workers=2))
    a, b = sc.connect(), sc.connect()
    pos = None
    k = send_of(sc.acquire(a), a)[0]
    send_of(sc.acquire(b), b)
    for _ in range(10):
        (k,) = send_of(sc.acquire(a, (k, OK, -1, None), busy=1.0), a)
    sc.acquire(a, (k, OK, -1, None), busy=1.0)
    sc.dispatcher.close(a, sc.now)
    c = sc.connect()
    (k,) = send_of(sc.acquire(c), c)
    pos = sc.run().local.pos_of
    assert pos[k] == 12  # where a left off


def test_a_resume_runs_blocks_that_failed_before_last_in_locality_order(tmp_path: Path) -> None:
    n = 64
    layout = StoreLayout((0,), (n,), (0,), (1,), (0,), (1,), "valid")
    with TrackingStore.open(tmp_path / "s", layout, resource_tracking=False) as store:
        for cell in (0, 5, 40):
            store.record_failure(cell, 0, 0.0, 0.0)
        store.flush()
    one = bellis.Roi((0,), (1,))
    task = bellis.Task(
        "t", bellis.Roi((0,), (n,)), one, one, process_function=lambda b: None, max_retries=0
    )
    with TrackingStore.open(tmp_path / "s", layout, resource_tracking=False) as store:
        s = Scheduler(task, _stores={"t": store})
        run = s.runs[0]
        assert s.order_by_locality(run)
        streams = [Stream(), Stream()]
        order = []
        while True:
            got = [s.acquire_index(run, st) for st in streams]
            for k in got:
                if k >= 0:
                    order.append(k)
                    s.release_index(run, k, True)
            if max(got) < 0:
                break
    assert sorted(order) == list(range(n))
    assert sorted(order[-3:]) == [0, 5, 40]  # the blocks that failed before go last


def test_retries_wait_for_the_ready_blocks_as_in_fifo_order() -> None:
    sc = Script(cube(max_workers=1, max_retries=1))
    a = sc.connect()
    (k,) = send_of(sc.acquire(a), a)
    failed = k
    (k,) = send_of(sc.acquire(a, (k, 3, -1, "ValueError: x"), busy=1.0), a)
    seen = [k]
    while True:
        ks = send_of(sc.acquire(a, (k, OK, -1, None), busy=1.0), a)
        k = ks[0]
        seen.append(k)
        if k == failed:
            break
    assert len(seen) == GRID**3  # every other block first, then the retry


def test_a_shuffled_order_or_a_task_too_large_keeps_the_fifo_order() -> None:
    s = Scheduler(cube())
    s.runs[0].order_fixed = True  # what a plan's sample run does (``shuffle_roots``)
    assert not s.order_by_locality(s.runs[0]) and s.runs[0].local is None
    one = bellis.Roi((0,), (1,))
    big = bellis.Task(
        "big",
        bellis.Roi((0,), (MAX_LOCALITY_BLOCKS + 1,)),
        one,
        one,
        process_function=lambda b: None,
    )
    s = Scheduler(big)
    assert not s.order_by_locality(s.runs[0])
    assert s.acquire_index(s.runs[0], Stream()) == 0  # FIFO: the first block first


# -- every rule, under random events ----------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_random_returns_failures_and_lost_connections_keep_every_rule(seed: int) -> None:
    """Three connections per task of a pipeline with conflicts; in a random order they
    return their blocks done, return one failed, or lose their connection (a new one
    comes in its place). No block is sent while it is out or before what it waits for is
    done, and every block ends done."""
    rng = random.Random(seed)
    up = cube("up", conflict=True, max_workers=3, max_retries=10)
    down = cube("down", conflict=True, max_workers=3, max_retries=10)
    sc = Script(bellis.Pipeline([up, down], [(up, down)]))
    graph = sc.scheduler.dependency_graph
    done: set[tuple[str, int]] = set()
    out_now: set[tuple[str, int]] = set()
    held: dict[int, list[int]] = {}
    peers: list[Peer] = []
    violations: list[str] = []

    def take(instrs: list[tuple[Any, ...]]) -> None:
        for instr in instrs:
            if instr[0] != SEND_FRAME:
                continue
            for msg in FrameDecoder().feed(instr[2]):
                if msg[0] != SEND:
                    continue
                peer = instr[1]
                tid = peer.run.task_id
                held[id(peer)] = msg[1:]
                for k in msg[1:]:
                    if (tid, k) in out_now or (tid, k) in done:
                        violations.append(f"{tid}/{k} sent while out or done")
                    out_now.add((tid, k))
                    block = sc.scheduler.by_id[tid].geom.block(k)
                    for u in graph.upstream(block):
                        key = (u.task_id, sc.scheduler.by_id[u.task_id].geom.index_of_block(u))
                        if key not in done:
                            violations.append(f"{tid}/{k} sent before {key} was done")

    def connect(tid: str) -> None:
        p = sc.connect(tid)
        peers.append(p)
        take(sc.acquire(p))

    for tid in ("up", "down"):
        for _ in range(3):
            connect(tid)
    while any(r.status != FINISHED for r in sc.scheduler.runs):
        busy = [p for p in peers if held.get(id(p))]
        assert busy, "every connection waits, and none holds a block: a deadlock"
        p = rng.choice(busy)
        assert p.run is not None
        tid = p.run.task_id
        ks = held.pop(id(p))
        sc.now += 0.01
        roll = rng.random()
        if roll < 0.05:  # the connection is lost with its blocks; another one comes
            for k in ks:
                out_now.discard((tid, k))
            sc.dispatcher.close(p, sc.now)
            peers.remove(p)
            take(sc.take())
            connect(tid)
            continue
        returns = []
        for i, k in enumerate(ks):
            ok = not (roll < 0.15 and i == 0)
            out_now.discard((tid, k))
            if ok:
                done.add((tid, k))
            returns.append((k, OK if ok else 3, -1, None if ok else "ValueError: x"))
        take(sc.acquire(p, *returns, busy=rng.choice([1.0, 0.001])))
    assert violations == []
    for tid in ("up", "down"):
        assert sc.scheduler.task_states[tid].completed_count == GRID**3
    assert len(done) == 2 * GRID**3
