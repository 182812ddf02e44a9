"""Which code made each block, at run start: fingerprint every task, act on done blocks
that other code made, and have the run record the current fingerprint per block.

For every task with a tracking store, :func:`check_code` computes the task's
fingerprint (``_fingerprint``), looks it up in the store's table (``_tracking._codever``)
and counts the done blocks another fingerprint made (blocks of unknown code, from
daisy 2.0.0 or older bellis, are never counted). What happens to those blocks is the
task's ``on_code_change``:

- ``"warn"`` (the default, daisy-compatible): they are skipped as done, and one WARNING
  now and one summary line after the run say how many, what differs and the two fixes;
- ``"rerun"``: their done markers are cleared before the scheduler reads them, so they
  run again (and a run killed midway still owes them);
- ``"error"``: :class:`~bellis.errors.CodeChangedError` before anything is written or run.

Then the fingerprint is registered in the store's table and the store records its index
for every block marked done from now on.
"""

from __future__ import annotations

import logging
from typing import Any

from .._fingerprint import Fingerprint, differences, fingerprint
from .._task import Task
from .._tracking._codever import clear_cells, code_counts, read_table, register
from ..errors import CodeChangedError

__all__ = ["check_code", "code_summary"]

logger = logging.getLogger("bellis")


def _stale(store: Any, fp: Fingerprint) -> tuple[dict[int, int], list[str]]:
    """Done blocks per other fingerprint index, and what differs from those."""
    codes = None if store.created else store.code_versions()
    if codes is None:
        return {}, []
    table = {int(e["index"]): e for e in read_table(store.path)}
    current = next((i for i, e in table.items() if e.get("hash") == fp.hash), None)
    stale = {i: n for i, n in code_counts(store.done, codes).items() if i not in (0, current)}
    what: list[str] = []
    for i in sorted(stale):
        for item in differences(table.get(i, {}), fp):
            if item not in what:
                what.append(item)
    return stale, what


def check_code(tasks: list[Task], stores: dict[str, Any], now: float) -> dict[str, str]:
    """Fingerprint each task with a store and apply its ``on_code_change`` (see the
    module docstring); returns the summary line of each task with blocks of other code."""
    checked: list[tuple[Task, Any, Fingerprint, int, list[str]]] = []
    for t in tasks:
        store = stores.get(t.task_id)
        if store is None:
            continue
        fp = fingerprint(t.process_function, t._version)
        stale, what = _stale(store, fp)
        count = sum(stale.values())
        shown = ", ".join(what) or "unrecorded differences"
        if count and t._on_code_change == "error":
            raise CodeChangedError(
                f'task "{t.task_id}": {count} done block(s) were made by other code '
                f'({shown}); nothing ran. Pass Task(on_code_change="rerun") to run them '
                'again, on_code_change="warn" to keep them, or Task.reset() to start over',
                path=str(store.path),
                task_id=t.task_id,
                count=count,
                differences=tuple(what),
            )
        checked.append((t, store, fp, count, what))
    notes: dict[str, str] = {}
    for t, store, fp, count, what in checked:
        index, _table = register(store.path, fp.record(), now)
        if count:
            shown = ", ".join(what) or "unrecorded differences"
            if t._on_code_change == "rerun":
                stale, _ = _stale(store, fp)
                cleared = clear_cells(store.done, store.code_versions(), list(stale))
                notes[t.task_id] = (
                    f"{t.task_id}: {cleared} block(s) made by other code ({shown}) run again"
                )
                logger.info("%s", notes[t.task_id])
            else:
                logger.warning(
                    'task "%s": %d done block(s) were made by other code (%s) and are '
                    'skipped as done; pass Task(on_code_change="rerun") to run them again, '
                    "or call Task.reset() to start the task over",
                    t.task_id,
                    count,
                    shown,
                )
                notes[t.task_id] = (
                    f"{t.task_id}: {count} block(s) skipped as done were made by other code "
                    f'({shown}); to redo them: Task(on_code_change="rerun") or Task.reset()'
                )
        store.use_code_version(index)
    return notes


def code_summary(notes: dict[str, str], order: list[str]) -> str:
    """The summary's lines about blocks of other code, one per task, in task order."""
    return "".join(f"\ncode changed: {notes[t]}" for t in order if t in notes)
