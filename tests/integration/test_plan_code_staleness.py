"""Review finding 4: a dry run counts what the real run would do after a code change.

A user script runs a two-task pipeline (``b`` reads ``a`` with context), then changes
``a``'s ``Task(version=...)`` and plans before running again. With
``on_code_change="rerun"`` the real run redoes every block of ``a`` (other code) and of
``b`` (they read blocks of ``a`` redone after them): the plan must count them as left, not
done. With ``"error"`` the real run raises ``CodeChangedError``: the plan must say so,
naming the task and the count. Planning writes nothing either way: the tracking stores'
bytes are the same before and after, and no block runs.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from kit.user_script import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import bellis
    from bellis import Roi

    action, mode, version, policy = sys.argv[1:5]
    base = os.getcwd()

    def mark(kind, block):
        d = os.path.join(base, "ran", kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, str(block.block_id[1])), "a") as f:
            f.write("x")

    def up(block):
        mark("a", block)

    def down(block):
        mark("b", block)

    a = bellis.Task("a", Roi((0,), (100,)), Roi((0,), (10,)), Roi((0,), (10,)),
                    process_function=up, max_workers=2, version=version,
                    on_code_change=policy)
    b = bellis.Task("b", Roi((0,), (100,)), Roi((0,), (30,)), Roi((10,), (10,)),
                    process_function=down, max_workers=2, read_write_conflict=False,
                    on_code_change=policy)
    bellis.set_tracking_basedir(os.path.join(base, "tracking"))
    distributed = mode == "distributed"
    if action == "plan":
        plan = bellis.plan(a + b, multiprocessing=distributed)
        print("@@" + json.dumps(plan.to_json()))
    else:
        ok = bellis.run_blockwise(a + b, multiprocessing=distributed, progress=False)
        print("@@" + json.dumps({"ok": ok}))
    """
)


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _ran(tmp_path: Path, kind: str) -> int:
    folder = tmp_path / "ran" / kind
    return sum(len(p.read_text()) for p in folder.iterdir()) if folder.exists() else 0


def _result(proc: object) -> dict[str, object]:
    stdout = proc.stdout  # type: ignore[attr-defined]
    line = next(x for x in stdout.splitlines() if x.startswith("@@"))
    out: dict[str, object] = json.loads(line[2:])
    return out


@pytest.mark.parametrize("mode", ["serial", "distributed"])
def test_a_plan_counts_the_blocks_a_rerun_after_a_code_change_redoes(
    tmp_path: Path, mode: str
) -> None:
    first = run_script(tmp_path, SCRIPT, "run", mode, "1", "rerun")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (_ran(tmp_path, "a"), _ran(tmp_path, "b")) == (10, 8)
    stores = _digest(tmp_path / "tracking")

    proc = run_script(tmp_path, SCRIPT, "plan", mode, "2", "rerun")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = _result(proc)
    a, b = plan["tasks"]  # type: ignore[index]
    # a: other code made its 10 blocks; b: its 8 blocks read blocks of a redone after them
    assert (a["done"], a["left"]) == (0, 10), a
    assert (b["done"], b["left"]) == (0, 8), b
    assert any("10 block(s) made by other code" in n for n in a["notes"]), a["notes"]
    assert any("8 block(s) reading blocks of a" in n for n in b["notes"]), b["notes"]
    assert "a real run: 10 block(s) made by other code" in proc.stdout
    # nothing ran and nothing was written
    assert (_ran(tmp_path, "a"), _ran(tmp_path, "b")) == (10, 8)
    assert _digest(tmp_path / "tracking") == stores

    # the real run does what the plan said
    real = run_script(tmp_path, SCRIPT, "run", mode, "2", "rerun")
    assert real.returncode == 0, real.stdout + real.stderr
    assert (_ran(tmp_path, "a"), _ran(tmp_path, "b")) == (20, 16)


def test_a_plan_says_that_the_real_run_would_raise_code_changed_error(tmp_path: Path) -> None:
    first = run_script(tmp_path, SCRIPT, "run", "serial", "1", "error")
    assert first.returncode == 0, first.stdout + first.stderr
    stores = _digest(tmp_path / "tracking")

    proc = run_script(tmp_path, SCRIPT, "plan", "serial", "2", "error")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = _result(proc)
    (warning,) = plan["warnings"]  # type: ignore[misc]
    assert "a real run would raise CodeChangedError" in warning
    assert "task 'a'" in warning and "10 stale done block(s)" in warning
    assert "warning: a real run would raise CodeChangedError" in proc.stdout
    a = plan["tasks"][0]  # type: ignore[index]
    assert any("raises CodeChangedError" in n for n in a["notes"]), a["notes"]
    assert _digest(tmp_path / "tracking") == stores
    assert _ran(tmp_path, "a") == 10

    real = run_script(tmp_path, SCRIPT, "run", "serial", "2", "error")
    assert real.returncode != 0
    assert "CodeChangedError" in real.stderr and 'task "a": 10 done block(s)' in real.stderr
    assert _ran(tmp_path, "a") == 10
