"""``bellis plan [--sample [N]] [--out FILE] -- python my_pipeline.py ARGS``: run an
unchanged script with planning switched on (``bellis._plan._script``): each
``run_blockwise`` call it reaches prints and saves its plan instead of running, and returns
True."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .._plan._script import ENV as PLAN_ENV

__all__ = ["add_plan_parser"]


def _read_plans(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    plans = []
    for line in out.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("plan"), dict):
            plans.append(entry["plan"])
    return plans


def _stopped_text(code: int, plans: list[dict[str, Any]]) -> str:
    if not plans:
        return (
            f"the script stopped (exit code {code}) before its first run_blockwise call: "
            "nothing was planned. Its own error is above."
        )
    last = plans[-1]
    tasks = [t["task_id"] for t in last.get("tasks", [])]
    not_run = [t for p in plans for t in p.get("tasks", []) if t.get("left")]
    text = (
        f"the script stopped (exit code {code}) after run_blockwise call {last.get('call')} "
        f"(tasks {', '.join(tasks)}), the last one it reached."
    )
    if not_run:
        text += (
            " A dry run writes no outputs, so a later step that reads the outputs of "
            + ", ".join(f"{t['task_id']} ({t['left']} blocks not run)" for t in not_run)
            + " could not go on. Run those steps for real and plan again: "
            "their done blocks are then counted, and the plan goes further."
        )
    return text


def _cmd_plan(args: argparse.Namespace) -> int:
    command = list(args.script)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "bellis plan: give the command to plan after `--`, e.g. "
            "`bellis plan -- python my_pipeline.py ARGS`",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")  # this command's plans only
    settings = {"out": str(out), "sample": args.sample}
    env = {**os.environ, PLAN_ENV: json.dumps(settings)}
    try:
        code = subprocess.run(command, env=env, check=False).returncode
    except FileNotFoundError as exc:
        print(f"bellis plan: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    plans = _read_plans(out)
    if code != 0:
        text = _stopped_text(code, plans)
        with open(out, "a", encoding="utf-8") as f:
            last = plans[-1].get("call") if plans else None
            f.write(json.dumps({"stopped": {"exit_code": code, "after_call": last, "text": text}}))
            f.write("\n")
        print(f"bellis plan: {text}")
        print(f"bellis plan: {len(plans)} plan(s) saved to {out}")
        return code
    print(f"bellis plan: {len(plans)} run_blockwise call(s) planned; saved to {out}")
    return 0


def _sample(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"--sample wants a positive number of blocks per task (got {text!r}); give "
            "--sample alone for the default (2% of the blocks left, at least 20)"
        )
    return n


def add_plan_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="plan every run_blockwise call of a script instead of running it",
        description="Runs COMMAND (e.g. `python my_pipeline.py ARGS`) with planning switched "
        "on: each run_blockwise call prints its plan (blocks done, masked, failed before, "
        "left; levels; workers) and saves it as a JSON line instead of running, then returns "
        "True. Without --sample no block runs and no tracking store is written (stores are only "
        "read); with --sample each call's sample of blocks really runs, is recorded done in "
        "the tracking stores and leaves a forecast.json there for the next real run to "
        "score. See docs/plan.md.",
    )
    p.add_argument(
        "--out",
        default="bellis-plan.jsonl",
        help="where the plans are saved, one JSON line per call (default ./bellis-plan.jsonl)",
    )
    p.add_argument(
        "--sample",
        nargs="?",
        const=True,
        type=_sample,
        metavar="N",
        help="also forecast: run N blocks per task for real (recorded done) and predict the "
        "wall, core-hours and memory; without N, 2%% of the blocks left (at least 20)",
    )
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(fn=_cmd_plan)
