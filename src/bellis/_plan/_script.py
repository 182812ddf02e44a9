"""Planning a whole script: ``bellis plan [--sample N] -- python my_pipeline.py ARGS``.

The command sets :data:`ENV` in the script's environment to a JSON object
(``{"out": path, "sample": N or null}``). While it is set, every ``run_blockwise`` call of
that process plans instead of running: it prints its plan, appends it as one JSON line to
``out``, and returns True, as a completed run would. A later call of the same script is
planned as if the earlier calls had run; its plan names those earlier tasks under
``assumes``. When the script stops (it raised, or exited non-zero), the command appends a
``stopped`` line naming the last call it reached: typically a later step needed outputs
that a dry run did not write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ENV", "ScriptPlanning", "settings"]

#: set by ``bellis plan``: every run_blockwise call of the process plans instead of running
ENV = "BELLIS_PLAN"


@dataclass
class ScriptPlanning:
    """The settings ``bellis plan`` passed, and this process's calls so far."""

    out: Path | None
    #: blocks per task to sample (True: the default size), or None for a dry run
    sample: int | bool | None
    calls: int = 0
    #: task ids of earlier calls that had blocks left (a dry run did not run them)
    not_run: list[str] = field(default_factory=list)

    def record(self, plan_json: dict[str, Any]) -> None:
        if self.out is None:
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"plan": plan_json}, sort_keys=True) + "\n")


_state: ScriptPlanning | None = None


def settings() -> ScriptPlanning | None:
    """This process's script planning, or None when :data:`ENV` is not set."""
    global _state
    raw = os.environ.get(ENV)
    if not raw:
        return None
    if _state is None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        out = data.get("out")
        sample = data.get("sample")
        _state = ScriptPlanning(
            out=Path(out) if isinstance(out, str) and out else None,
            sample=sample if isinstance(sample, int) and (sample is True or sample > 0) else None,
        )
    return _state
