"""Which code made each block, at run start: fingerprint every task, find the done blocks
that are stale, act on them, and have the run record which code made each block.

Theory of operation
-------------------
A done block is **stale** when it was made by another fingerprint than the task's
current one (its code changed), or when it reads (read ROI meets write ROI) a block of
an upstream task that is made after it: one that runs in this run, or one that a later
run made. "Later" compares the ``code_version`` indices of the two blocks: every run
that makes blocks records one entry in its store's table with the time it started
(``_tracking/_codever``), so each done block knows the start of the run that made it,
and a pipeline's runs never overlap on a store. Blocks of unknown code (daisy 2.0.0,
older bellis) count as made before every known run.

:func:`check_code` runs before the scheduler reads the done markers. It walks the tasks
in dependency order; per task with a store it computes

- ``own``: done blocks whose code index names another fingerprint (never the unknown 0,
  nor a fingerprint of another scheme: an older bellis's, which cannot be compared);
- ``reads``: other done blocks that read an upstream block which runs in this run (not
  done now, not masked) or was made in a later run (:func:`~bellis._bulk.downstream_readers`
  over whole grids, once per distinct run among the task's done blocks, and only when an
  upstream run is later than the task's earliest);

and applies the task's ``on_code_change``: ``"warn"`` (default) keeps them, with one
WARNING and one summary line; ``"rerun"`` clears their done markers
(``BlockStore.clear_done``), so they run again in this run after what they read, and
count in turn as "runs in this run" for the tasks below; ``"error"`` raises
:class:`~bellis.errors.CodeChangedError` before anything is written. Tasks without a
store are never stale and make nothing stale (nothing records when their blocks ran), and
neither do blocks that a ``check_function`` may skip.

A ``check_function`` says that a block's output exists, not which code made it. With
``"rerun"`` the blocks cleared as stale are not passed to it (``CodeCheck.unchecked``,
the scheduler's ``_unchecked``): they run, and count as "runs in this run" below. The
blocks not done whose ``code_version`` names a run (a rerun cleared them and was stopped
before they ran again) count as made for such a task (:meth:`_TaskCode.made`), so the
next ``"rerun"`` finds them stale too. A check skip keeps the block's ``code_version``
(``BlockStore.record_skip``). :func:`finish_code` counts, after the run, the cleared
blocks that ran, for the summary.

:func:`record_code` then (after the scheduler, and in a distributed run while the
workers start) registers the run's entry in the store of each task with blocks to do and
points the scheduler's per-block store of the index at it: the only per-block cost is
that one uint16, written before the done byte.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._bulk import block_view, downstream_readers
from .._donemarks import BlockStore
from .._fingerprint import Fingerprint, differences, fingerprint
from .._scheduling._task_run import DONE as _DONE
from .._task import Task, topological_order
from .._task_spec import TaskSpec
from .._tracking._codever import code_counts, made_at, resolve
from ..errors import CodeChangedError

__all__ = ["CodeCheck", "check_code", "code_summary", "finish_code", "record_code"]

logger = logging.getLogger("bellis")

_FIXES = 'pass Task(on_code_change="rerun") to run them again, or call Task.reset() to start over'


@dataclass
class CodeCheck:
    """The outcome of :func:`check_code`: the notes for the summary and what
    :func:`record_code` needs."""

    started: float
    #: task id -> fingerprint, for the tasks with a store whose fingerprint is known yet
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    #: task id -> its summary line (blocks of other code, or that read redone blocks)
    notes: dict[str, str] = field(default_factory=dict)
    #: task id -> ``{"hash", "index"}``: what ``runs.jsonl`` records per run (index None:
    #: the run made no block of the task)
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: task id -> the largest code index its store's done blocks hold (``register``)
    floors: dict[str, int] = field(default_factory=dict)
    #: task id -> the blocks over its grid whose check_function is not called: cleared
    #: by ``"rerun"`` as made by other code (or reading redone blocks), they run
    unchecked: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    #: task id -> what ``"rerun"`` cleared: (what, blocks over the grid) for the blocks
    #: of other code and those reading redone blocks; :func:`finish_code` counts those
    #: that ran for the summary
    redone: dict[str, list[tuple[str, np.ndarray[Any, Any]]]] = field(default_factory=dict)


class _TaskCode:
    """What :func:`check_code` found for one task with a store. Its block-grid masks
    are made when first asked for (one byte per block each): a task that no task below
    it reads, with nothing stale, costs one scan of its code indices."""

    def __init__(self, task: TaskSpec, store: BlockStore) -> None:
        self.task = task
        self.store = store
        #: "rerun" with a check_function: blocks made by other code whose done markers an
        #: earlier run cleared count as made too (the check would skip them as done)
        self.recheck = task.check_function is not None and task.on_code_change == "rerun"
        self.fp: Fingerprint | None = None
        #: per code index, when the run that made such a block started (-inf: unknown)
        self.times: np.ndarray[Any, Any] = np.full(1, -np.inf)
        #: the code indices among the done blocks (0: unknown)
        self.present: list[int] = []
        #: the ``code_version`` cells over the block grid, and the slices they cover
        self.codes: Any = None
        self.own = 0
        self.what: list[str] = []
        self.reads = 0
        self.read_from: list[str] = []
        #: the done blocks this run runs again (``"rerun"``), or warns about
        self.stale: np.ndarray[Any, Any] | None = None
        #: the blocks of ``stale`` made by other code (the rest read redone blocks)
        self.own_stale: np.ndarray[Any, Any] | None = None
        self._done: np.ndarray[Any, Any] | None = None
        self._made: np.ndarray[Any, Any] | None = None
        self._runs: np.ndarray[Any, Any] | None = None
        self._runs_known = False

    def block_cells(self, array: Any) -> tuple[Any, tuple[slice, ...]]:
        return block_view(self.task.geom, array.reshape(self.store.grid_shape))

    def stale_cells(self) -> np.ndarray[Any, Any]:
        """The flat cells of the :attr:`stale` blocks in the store's tracking grid."""
        assert self.stale is not None
        grid = self.store.grid_shape
        _view, dst = self.block_cells(self.store.done)
        hit = np.nonzero(self.stale[dst])
        shift = self.task.geom.sid_shift
        coords = tuple(c.astype(np.intp) + s for c, s in zip(hit, shift, strict=True))
        return np.ravel_multi_index(coords, grid).astype(np.intp)

    def done(self) -> np.ndarray[Any, Any]:
        """The done blocks, as the scheduler will find them (after a rerun's clears)."""
        if self._done is None:
            done = np.zeros(self.task.geom.grid, dtype=bool)
            if not self.store.created:
                view, dst = self.block_cells(self.store.done)
                np.not_equal(view, 0, out=done[dst])
            self._done = done
        return self._done

    def made(self) -> np.ndarray[Any, Any]:
        """The blocks a run made whose output this run would keep: the done blocks, and
        (``recheck``) the blocks not done whose ``code_version`` names a run: a rerun
        cleared them and was stopped before they ran again, and the check_function would
        skip them. Asked for before this run's clears."""
        if self._made is None:
            made = self.done()
            if self.recheck and self.codes is not None:
                view, dst = self.codes
                prior = np.zeros(self.task.geom.grid, dtype=bool)
                np.not_equal(view, 0, out=prior[dst])
                if self.task.skip_mask is not None:
                    prior &= np.equal(self.task.skip_mask, 0)
                made = made | prior
            self._made = made
        return self._made

    def made_when(self, when: float, newer: bool, made: bool = False) -> np.ndarray[Any, Any]:
        """Done blocks (``made``: :meth:`made` blocks) made by a run that started after
        ``when`` (``newer``) or at it."""
        among = self.made() if made else self.done()
        out = np.zeros(self.task.geom.grid, dtype=bool)
        if self.codes is None:
            return out if newer or when != -np.inf else among.copy()
        hit = self.times > when if newer else self.times == when
        view, dst = self.codes
        out[dst] = np.isin(view, np.flatnonzero(hit).astype(np.uint16))
        out &= among
        return out

    def runs(self) -> np.ndarray[Any, Any] | None:
        """The blocks that run in this run (not done, addressable, not masked). With a
        ``check_function``, only those it is not asked about (``"rerun"`` cleared them);
        None when there are none."""
        if not self._runs_known:
            self._runs_known = True
            t = self.task
            if t.check_function is not None:
                self._runs = self.stale if self.recheck else None
            else:
                runs = np.zeros(t.geom.grid, dtype=bool)
                _view, dst = self.block_cells(self.store.done)
                runs[dst] = True
                runs &= ~self.done()
                if t.skip_mask is not None:
                    runs &= np.equal(t.skip_mask, 0)
                self._runs = runs
        return self._runs


def _own_state(info: _TaskCode) -> None:
    """Fingerprint a task whose store may hold done blocks; find those of other code."""
    t, store = info.task, info.store
    info.fp = fp = fingerprint(t.process_function, t.version, t.setup)
    codes = store.code_versions()
    if codes is None:
        info.present = [0] if store.done.any() else []
        return
    table = store.code_table()
    full = resolve(table)
    info.times = made_at(table)
    info.codes = info.block_cells(codes)
    counts = code_counts(store.done, codes)
    view, dst = info.codes
    made = info.made()
    if made is not info.done():  # recheck: the indices of the cleared blocks too
        for index in np.unique(view[made[dst]]).tolist():
            counts.setdefault(int(index), 0)
    info.present = sorted(counts)
    current = {i for i, e in full.items() if e.get("hash") == fp.hash}
    # a fingerprint of another scheme (an older bellis) cannot be compared: its blocks
    # count as of unknown code, as daisy's do, not as changed
    foreign = {i for i, e in full.items() if e.get("scheme", 1) != fp.scheme}
    other = [i for i in counts if i not in current and i != 0 and i not in foreign]
    if not other:
        return
    own = np.zeros(t.geom.grid, dtype=bool)
    own[dst] = np.isin(view, np.asarray(other, dtype=np.uint16))
    own &= made
    info.own = int(np.count_nonzero(own))
    info.stale = info.own_stale = own
    for i in sorted(other):
        found = differences(full[i], fp) if i in full else ["code the table does not record"]
        for item in found:
            if item not in info.what:
                info.what.append(item)


def _when(info: _TaskCode, index: int) -> float:
    return float(info.times[index]) if index < len(info.times) else -np.inf


def _read_state(info: _TaskCode, ups: list[_TaskCode]) -> None:
    """Find the done blocks (not stale already) that read an upstream block which runs
    in this run or was made in a later run than they were."""
    if not info.present or not ups:
        return
    g = info.task.geom
    fresh = info.made() if info.stale is None else info.made() & ~info.stale
    if not fresh.any():
        return
    stale = np.zeros(g.grid, dtype=bool)
    mine = sorted({_when(info, i) for i in info.present})
    for up in ups:
        ug = up.task.geom
        found = np.zeros(g.grid, dtype=bool)
        runs = up.runs()
        if runs is not None and runs.any():
            found |= downstream_readers(ug, g, runs)
        latest = max((_when(up, i) for i in up.present), default=-np.inf)
        for when in (w for w in mine if w < latest):
            readers = downstream_readers(ug, g, up.made_when(when, newer=True))
            found |= readers & info.made_when(when, newer=False, made=True)
        found &= fresh
        if found.any():
            stale |= found
            info.read_from.append(up.task.task_id)
    info.reads = int(np.count_nonzero(stale))
    if info.reads:
        info.stale = stale if info.stale is None else info.stale | stale


def _error(info: _TaskCode) -> CodeChangedError:
    t = info.task
    shown = ", ".join(info.what) or "unrecorded differences"
    parts = []
    if info.own:
        parts.append(f"{info.own} done block(s) were made by other code ({shown})")
    if info.reads:
        parts.append(
            f"{info.reads} done block(s) read blocks of upstream task(s) "
            f"{', '.join(info.read_from)} redone after them"
        )
    what = list(info.what) + [f"upstream {u}" for u in info.read_from]
    return CodeChangedError(
        f'task "{t.task_id}": {" and ".join(parts)}; nothing ran. Pass '
        'Task(on_code_change="rerun") to run them again, on_code_change="warn" to keep '
        "them, or Task.reset() to start over",
        path=str(info.store.path),
        task_id=t.task_id,
        count=info.own + info.reads,
        differences=tuple(what),
    )


def _note(info: _TaskCode) -> str:
    """The summary line of a task with stale blocks (and its log line)."""
    t = info.task
    shown = ", ".join(info.what) or "unrecorded differences"
    ups = ", ".join(info.read_from)
    parts = []
    if t.on_code_change == "rerun":
        if info.own:
            parts.append(f"{info.own} block(s) made by other code ({shown})")
        if info.reads:
            parts.append(f"{info.reads} block(s) reading blocks of {ups} redone after them")
        unasked = " (their check_function is not called)" if t.check_function else ""
        logger.info("%s: %s are cleared to run again%s", t.task_id, " and ".join(parts), unasked)
        return f"{t.task_id}: " + " and ".join(parts) + " are cleared to run again"
    if info.own:
        parts.append(f"{info.own} done block(s) were made by other code ({shown})")
    if info.reads:
        parts.append(f"{info.reads} done block(s) read blocks of {ups} redone after them")
    logger.warning(
        'task "%s": %s and are skipped as done; %s', t.task_id, " and ".join(parts), _FIXES
    )
    short = [p.replace(" done block(s) were", " block(s) skipped as done were") for p in parts]
    short = [p.replace(" done block(s) read", " block(s) skipped as done read") for p in short]
    return (
        f"{t.task_id}: {' and '.join(short)}; to redo them: "
        'Task(on_code_change="rerun") or Task.reset()'
    )


def check_code(
    tasks: list[Task],
    edges: list[tuple[Task, Task]],
    stores: Mapping[str, BlockStore],
    started: float,
    specs: Mapping[str, TaskSpec],
) -> CodeCheck:
    """Find the stale done blocks of every task with a store and apply each task's
    ``on_code_change`` (see the module docstring). ``started``: the run's start, UNIX
    seconds; ``specs``: each task's settings, by task id (``RunSettings.specs``). Nothing
    is written before every task is checked."""
    plan = CodeCheck(started)
    infos: dict[int, _TaskCode] = {}
    ups: dict[int, list[Task]] = {}
    for a, b in edges:
        ups.setdefault(id(b), []).append(a)
    for t in topological_order(tasks, edges):
        store = stores.get(t.task_id)
        if store is None:
            continue
        spec = specs[t.task_id]
        info = infos[id(t)] = _TaskCode(spec, store)
        if store.created:
            continue  # nothing done: nothing stale, and the fingerprint can wait
        _own_state(info)
        assert info.fp is not None
        plan.fingerprints[t.task_id] = info.fp
        plan.floors[t.task_id] = max(info.present, default=0)
        _read_state(info, [infos[id(u)] for u in ups.get(id(t), []) if id(u) in infos])
        if (info.own or info.reads) and spec.on_code_change == "error":
            raise _error(info)
        if info.stale is not None and spec.on_code_change == "rerun":
            info.done()[info.stale] = False
            own = info.own_stale if info.own_stale is not None else np.zeros_like(info.stale)
            plan.redone[t.task_id] = [
                (f"made by other code ({', '.join(info.what) or 'unrecorded differences'})", own),
                (
                    f"reading blocks of {', '.join(info.read_from)} redone after them",
                    info.stale & ~own,
                ),
            ]
            if info.recheck:
                plan.unchecked[t.task_id] = info.stale
    for info in infos.values():
        if not (info.own or info.reads):
            continue
        if info.task.on_code_change == "rerun" and info.stale is not None:
            info.store.clear_done(info.stale_cells())
        plan.notes[info.task.task_id] = _note(info)
    return plan


def record_code(plan: CodeCheck, runs: list[Any]) -> None:
    """For every task run with a store and blocks to do: register this run's entry in
    the store's code-version table and have its blocks recorded with its index."""
    for run in runs:
        store = run.store
        if store is None or not store.is_writable:
            continue
        t = run.spec
        fp = plan.fingerprints.get(run.task_id)
        if run.remaining == 0:
            if fp is not None:
                plan.recorded[run.task_id] = {"hash": fp.hash, "index": None}
            continue
        if fp is None:
            fp = plan.fingerprints[run.task_id] = fingerprint(
                t.process_function, t.version, t.setup
            )
        floor = plan.floors.get(run.task_id, 0)
        index = store.use_code(fp.record(), plan.started, floor)
        run.take_writer()
        plan.recorded[run.task_id] = {"hash": fp.hash, "index": index}


def finish_code(plan: CodeCheck, runs: list[Any]) -> None:
    """After the run: the summary line of each task whose stale blocks ``"rerun"``
    cleared says how many of them ran again (the scheduler's block states: a cleared
    block is never skipped by a check_function, so one that is done ran)."""
    for run in runs:
        cleared = plan.redone.get(run.task_id)
        if cleared is None:
            continue
        done = np.equal(run.state, _DONE).reshape(cleared[0][1].shape)
        if run.spec.skip_mask is not None:  # masked: skipped, never ran
            done &= np.equal(run.spec.skip_mask, 0)
        parts = []
        for what, blocks in cleared:
            total = int(np.count_nonzero(blocks))
            if not total:
                continue
            ran = int(np.count_nonzero(blocks & done))
            if ran == total:
                parts.append(f"{total} block(s) {what} ran again")
            else:
                parts.append(
                    f"{ran} of {total} block(s) {what} ran again ({total - ran} not done: "
                    "a next run redoes them)"
                )
        plan.notes[run.task_id] = f"{run.task_id}: " + "; ".join(parts)


def code_summary(notes: dict[str, str], order: list[str]) -> str:
    """The summary's lines about stale blocks, one per task, in task order."""
    return "".join(f"\ncode changed: {notes[t]}" for t in order if t in notes)
