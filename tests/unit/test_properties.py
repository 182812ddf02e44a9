"""Property tests: the scheduler against brute force computed from SPEC §2.2-2.5.

Everything expected here is recomputed with plain integer loops from the spec's rules
(enumeration, fit, levels, read/write overlap), never through bellis' geometry code.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, assume, given, settings, strategies as st

import bellis as daisy
from bellis._block import cantor_number
from bellis.errors import ConfigurationError

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

Box = tuple[tuple[int, int], ...]  # per axis [begin, end)


@dataclass(frozen=True)
class Spec:
    total_off: tuple[int, ...]
    total_shape: tuple[int, ...]
    write: tuple[int, ...]
    ul: tuple[int, ...]
    lr: tuple[int, ...]
    fit: str
    conflict: bool

    def task(self, task_id: str, **kw: Any) -> daisy.Task:
        return daisy.Task(
            task_id,
            daisy.Roi(self.total_off, self.total_shape),
            daisy.Roi(tuple(-u for u in self.ul), tuple(w + u + v for w, u, v in self.specs())),
            daisy.Roi((0,) * len(self.write), self.write),
            process_function=lambda b: None,
            read_write_conflict=self.conflict,
            fit=self.fit,
            **kw,
        )

    def specs(self) -> list[tuple[int, int, int]]:
        return list(zip(self.write, self.ul, self.lr, strict=True))


@st.composite
def specs(draw: Any, dims: int | None = None) -> Spec:
    if dims is None:
        dims = draw(st.integers(1, 3))
    max_blocks = 6 if dims < 3 else 4
    write, ul, lr, off, shape = [], [], [], [], []
    for _ in range(dims):
        w = draw(st.integers(1, 5))
        u = draw(st.integers(0, 2 * w))
        v = draw(st.integers(0, 2 * w))
        write.append(w)
        ul.append(u)
        lr.append(v)
        off.append(draw(st.integers(-7, 7)))
        shape.append(draw(st.integers(0, u + v + max_blocks * w + w - 1)))
    return Spec(
        tuple(off),
        tuple(shape),
        tuple(write),
        tuple(ul),
        tuple(lr),
        draw(st.sampled_from(["valid", "overhang", "shrink"])),
        draw(st.booleans()),
    )


# -- brute force from the spec ---------------------------------------------------------------


@dataclass(frozen=True)
class BF:
    sid: int
    index: tuple[int, ...]  # grid index (offset / write shape)
    read: Box
    write: Box


def enumerate_blocks(spec: Spec) -> dict[int, BF]:
    """SPEC §2.2: step the read ROI over the total by the write shape, keep what the fit keeps."""
    per_axis: list[list[tuple[int, tuple[int, int], tuple[int, int]]]] = []
    for i, (w, u, v) in enumerate(spec.specs()):
        t0 = spec.total_off[i]
        t1 = t0 + spec.total_shape[i]
        tw0, tw1 = t0 + u, t1 - v
        axis = []
        o = 0
        while True:
            rb, re_ = t0 + o, t0 + o + w + u + v
            wb, we = rb + u, rb + u + w
            if wb >= tw1:
                break
            if spec.fit == "valid":
                keep = we <= tw1
            else:
                keep = tw0 <= wb < tw1
            if keep:
                if spec.fit == "shrink":
                    we = min(we, tw1)
                    re_ = min(re_, t1)
                axis.append(((wb - t0) // w, (rb, re_), (wb, we)))
            o += w
        per_axis.append(axis)
    out = {}
    for combo in itertools.product(*per_axis):
        index = tuple(c[0] for c in combo)
        sid = cantor_number(list(index))
        out[sid] = BF(sid, index, tuple(c[1] for c in combo), tuple(c[2] for c in combo))
    return out


def intersects(a: Box, b: Box) -> bool:
    return all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(a, b, strict=True))


def grid_shape(spec: Spec, blocks: dict[int, BF]) -> list[int]:
    return [len({b.index[i] for b in blocks.values()}) for i in range(len(spec.write))]


def level_of(spec: Spec, blocks: dict[int, BF]) -> dict[int, int]:
    """SPEC §2.4: per-axis stride, offsets product reversed, a block's level by residue."""
    grid = grid_shape(spec, blocks)
    first = [min((b.index[i] for b in blocks.values()), default=0) for i in range(len(grid))]
    strides = []
    for i, (w, u, v) in enumerate(spec.specs()):
        s = -(-(max(u, v) + w) // w)
        strides.append(max(1, min(s, grid[i])))
    offsets = list(itertools.product(*(range(s) for s in strides)))
    offsets.reverse()
    rank = {off: lvl for lvl, off in enumerate(offsets)}
    return (
        {
            sid: rank[tuple((b.index[i] - first[i]) % strides[i] for i in range(len(grid)))]
            for sid, b in blocks.items()
        },
        strides,
        first,
    )


def same_task_upstream(spec: Spec, blocks: dict[int, BF]) -> dict[int, set[int]]:
    """Level L blocks wait for level L-1 blocks less than a stride away on every axis."""
    if not spec.conflict:
        return {sid: set() for sid in blocks}
    levels, strides, _ = level_of(spec, blocks)
    out: dict[int, set[int]] = {}
    for sid, b in blocks.items():
        out[sid] = {
            a.sid
            for a in blocks.values()
            if levels[a.sid] == levels[sid] - 1
            and all(abs(x - y) < s for x, y, s in zip(a.index, b.index, strides, strict=True))
        }
    return out


# -- drivers ----------------------------------------------------------------------------------


def roi_box(roi: daisy.Roi) -> Box:
    return tuple((int(o), int(o) + int(s)) for o, s in zip(roi.offset, roi.shape, strict=True))


@given(specs())
@SETTINGS
def test_blocks_equal_brute_force_enumeration(spec: Spec) -> None:
    expected = enumerate_blocks(spec)
    task = spec.task("t")
    if expected:
        assert task.block_grid_shape == grid_shape(spec, expected)
    else:
        assert 0 in task.block_grid_shape
    scheduler = daisy.Scheduler(task)
    got = {}
    while (block := scheduler.acquire_block("t")) is not None:
        assert block.block_id[1] not in got
        got[block.block_id[1]] = (roi_box(block.read_roi), roi_box(block.write_roi))
        block.status = daisy.BlockStatus.SUCCESS
        scheduler.release_block(block)
    assert got == {sid: (b.read, b.write) for sid, b in expected.items()}
    assert scheduler.task_states["t"].total_block_count == len(expected)
    assert scheduler.is_done()


@st.composite
def pipelines(draw: Any) -> tuple[list[Spec], list[tuple[int, int]]]:
    dims = draw(st.integers(1, 3))
    n = draw(st.integers(1, 3))
    tasks = [draw(specs(dims)) for _ in range(n)]
    shape = draw(st.sampled_from(["chain", "fan"]))
    if n == 1:
        edges: list[tuple[int, int]] = []
    elif shape == "chain":
        edges = [(i, i + 1) for i in range(n - 1)]
    else:
        edges = [(0, i) for i in range(1, n)]
    return tasks, edges


def build(tasks: list[Spec], edges: list[tuple[int, int]], **kw: Any) -> tuple[Any, list[str]]:
    names = [f"t{i}" for i in range(len(tasks))]
    objs = [spec.task(name, **kw) for spec, name in zip(tasks, names, strict=True)]
    pipeline = daisy.Pipeline(objs, [(objs[a], objs[b]) for a, b in edges])
    try:
        scheduler = daisy.Scheduler(pipeline)
    except ConfigurationError as exc:
        assert "read nothing their upstream task" in str(exc)
        assume(False)
    return scheduler, names


def upstream_sets(
    tasks: list[Spec], edges: list[tuple[int, int]]
) -> tuple[dict[tuple[str, int], BF], dict[tuple[str, int], set[tuple[str, int]]], Any]:
    blocks = {}
    ups: dict[tuple[str, int], set[tuple[str, int]]] = {}
    inter: dict[tuple[str, int], set[tuple[str, int]]] = {}
    enum = [enumerate_blocks(s) for s in tasks]
    for i, (spec, bl) in enumerate(zip(tasks, enum, strict=True)):
        same = same_task_upstream(spec, bl)
        for sid, b in bl.items():
            blocks[(f"t{i}", sid)] = b
            ups[(f"t{i}", sid)] = {(f"t{i}", u) for u in same[sid]}
            inter[(f"t{i}", sid)] = set()
    for up, down in edges:
        for sid, b in enum[down].items():
            for usid, a in enum[up].items():
                if intersects(a.write, b.read):
                    ups[(f"t{down}", sid)].add((f"t{up}", usid))
                    inter[(f"t{down}", sid)].add((f"t{up}", usid))
    return blocks, ups, inter


@given(pipelines(), st.integers(0, 2**32 - 1))
@SETTINGS
def test_random_interleaving_respects_dependencies(
    pipe: tuple[list[Spec], list[tuple[int, int]]], seed: int
) -> None:
    tasks, edges = pipe
    scheduler, names = build(tasks, edges)
    blocks, ups, inter = upstream_sets(tasks, edges)
    rng = random.Random(seed)
    held: list[daisy.Block] = []
    done: set[tuple[str, int]] = set()
    handed: list[tuple[str, int]] = []
    while True:
        acquired = None
        if rng.random() < 0.6 or not held:
            order = names[:]
            rng.shuffle(order)
            for name in order:
                acquired = scheduler.acquire_block(name)
                if acquired is not None:
                    break
        if acquired is not None:
            key = acquired.block_id
            handed.append(key)
            assert key in blocks
            # every upstream-task block whose write ROI meets its read ROI has succeeded,
            # and so have its same-task predecessors of the previous level
            assert inter[key] <= done, (key, inter[key] - done)
            assert ups[key] <= done, (key, ups[key] - done)
            # no two blocks of a conflict task out at once read what the other writes
            mine = blocks[key]
            conflict = tasks[names.index(acquired.task_id)].conflict
            for other in held:
                if other.task_id != acquired.task_id or not conflict:
                    continue
                theirs = blocks[other.block_id]
                assert not intersects(mine.read, theirs.write), (key, other.block_id)
                assert not intersects(theirs.read, mine.write), (key, other.block_id)
            held.append(acquired)
            continue
        if not held:
            break
        block = held.pop(rng.randrange(len(held)))
        block.status = daisy.BlockStatus.SUCCESS
        scheduler.release_block(block)
        done.add(block.block_id)
    assert sorted(handed) == sorted(blocks)
    assert len(handed) == len(set(handed))
    assert scheduler.is_done()
    for st_ in scheduler.task_states.values():
        assert st_.completed_count == st_.total_block_count


@given(pipelines(), st.integers(0, 2**32 - 1))
@SETTINGS
def test_permanent_failure_orphans_exactly_transitive_downstream(
    pipe: tuple[list[Spec], list[tuple[int, int]]], seed: int
) -> None:
    tasks, edges = pipe
    blocks, ups, _ = upstream_sets(tasks, edges)
    assume(blocks)
    rng = random.Random(seed)
    failing = rng.choice(sorted(blocks))
    downs: dict[tuple[str, int], set[tuple[str, int]]] = {k: set() for k in blocks}
    for k, us in ups.items():
        for u in us:
            downs[u].add(k)
    expected: set[tuple[str, int]] = set()
    todo = [failing]
    while todo:
        for d in downs[todo.pop()]:
            if d not in expected:
                expected.add(d)
                todo.append(d)
    scheduler, names = build(tasks, edges, max_retries=0)
    handed = set()
    while True:
        progressed = False
        for name in names:
            block = scheduler.acquire_block(name)
            if block is None:
                continue
            progressed = True
            handed.add(block.block_id)
            failed = block.block_id == failing
            block.status = daisy.BlockStatus.FAILED if failed else daisy.BlockStatus.SUCCESS
            scheduler.release_block(block)
        if not progressed:
            break
    assert handed == set(blocks) - expected
    states = scheduler.task_states
    for name in names:
        mine = {k for k in expected if k[0] == name}
        assert states[name].orphaned_count == len(mine)
        assert states[name].failed_count == (1 if failing[0] == name else 0)
    assert scheduler.is_done()
