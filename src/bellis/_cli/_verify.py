"""``bellis verify PATH... [--reset] [--workers N] [--json]``: every done block's outputs
re-read and compared with the checksum its worker recorded (``docs/outputs.md``).

The table and the mismatches go to stdout, progress to stderr. Exit status 0 when every
done block verified, 1 when some did not (missing, changed or unverifiable), 2 when a
store cannot be verified at all, or when there is nothing to verify (no store of a task
that verifies its outputs, or no done block): an empty check is not a success.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._donemarks import StoreLocation

__all__ = ["add_verify_parser"]

#: mismatches listed per task before "... and N more" (``--json`` lists every one)
_LISTED = 200


def _stores(paths: list[str]) -> list[StoreLocation]:
    """Each PATH as a store, or the stores of a tracking basedir whose task verifies its
    outputs (the others are named on stderr: a pipeline's basedir holds tasks with nothing
    to verify). An ``s3://`` URL is a store on S3, or a prefix that holds several."""
    from .._donemarks import is_store_url, store_location
    from .._report._data import find_stores
    from .._tracking import read_outputs_record, store_exists

    out: list[StoreLocation] = []
    for p in paths:
        where = store_location(p)
        below = not store_exists(where) and (is_store_url(where) or Path(where).is_dir())
        if not below:
            out.append(where)
            continue
        for store in find_stores([where]):
            if isinstance(store, str) != is_store_url(where):
                continue  # a URL below a local folder: never
            record = read_outputs_record(store) or {}
            verifies = record.get("verify_outputs") or (
                isinstance(store, Path) and (store / "output_checksum").is_dir()
            )
            if verifies:
                out.append(store)
            else:
                print(
                    f"bellis verify: {store}: its task does not verify outputs, skipped",
                    file=sys.stderr,
                )
    return out


def _render(results: list[Any]) -> str:
    rows = [("task", "done", "verified", "missing", "changed", "unverifiable")]
    for r in results:
        rows.append(
            (
                r.task,
                str(r.done),
                str(r.verified),
                str(len(r.missing)),
                str(len(r.changed)),
                str(len(r.unverifiable)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = enumerate(zip(row, widths, strict=True))
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in cells))
    for r in results:
        if not r.mismatches:
            continue
        lines.append("")
        lines.append(f"{r.task} ({r.path}):")
        for m in r.mismatches[:_LISTED]:
            offset, shape = m.write_roi
            lines.append(
                f"  {m.kind:<12s} block {list(m.block)} write ROI {list(offset)}+{list(shape)}"
                + (f": {m.detail}" if m.detail and m.kind != "unverifiable" else "")
            )
        if len(r.mismatches) > _LISTED:
            lines.append(f"  ... and {len(r.mismatches) - _LISTED} more (--json lists every one)")
        for path, n in r.reset.items():
            lines.append(f"  reset: {n} done marker(s) cleared in {path}")
    return "\n".join(lines)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .._outputs._verify import verify_stores
    from ..errors import ConfigurationError, TrackingError

    try:
        stores = _stores(args.paths)
        if not stores:
            print(
                f"bellis verify: nothing to verify: no store under {', '.join(args.paths)} "
                "belongs to a task that verifies its outputs; run the tasks with "
                "Task(outputs=[...], verify_outputs=True) first",
                file=sys.stderr,
            )
            return 2
        print(f"bellis verify: {len(stores)} store(s)", file=sys.stderr)
        results = verify_stores(stores, workers=args.workers, reset=args.reset)
    except (TrackingError, ConfigurationError, OSError) as exc:
        print(f"bellis verify: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        print(_render(results))
    if args.reset and any(r.reset for r in results):
        print(
            "bellis verify: rerun the pipeline to redo the reset blocks; unverifiable "
            "blocks were left as they are",
            file=sys.stderr,
        )
    if not any(r.done for r in results):
        print(
            "bellis verify: nothing verified: no block of "
            + ("this store" if len(results) == 1 else f"these {len(results)} stores")
            + " is done yet (a verify checks done blocks); run the task first",
            file=sys.stderr,
        )
        return 2
    return 0 if all(r.ok for r in results) else 1


def add_verify_parser(sub: Any, positive: Any) -> None:
    v = sub.add_parser(
        "verify",
        help="re-read every done block's outputs and compare them with their checksums",
        description="PATH is a task's tracking store, or a folder that holds several. Each "
        "done block with a recorded checksum (Task(verify_outputs=True)) has its outputs "
        "read again, in parallel processes; every block that does not match is listed as "
        "missing (chunks absent or fill value), changed (checksum differs) or unverifiable "
        "(no checksum recorded). Exit status 0 only if every done block matches; 2 when "
        "nothing can be verified (no store verifies its outputs, or no block is done).",
    )
    v.add_argument("paths", nargs="+", metavar="PATH", help="tracking store(s) or basedir(s)")
    v.add_argument(
        "--reset",
        action="store_true",
        help="clear the done markers of the missing and changed blocks and of the downstream "
        "blocks that read them, so the next run redoes exactly those",
    )
    v.add_argument(
        "--workers",
        type=positive,
        default=None,
        metavar="N",
        help="processes reading in parallel (default: the cores this process may use)",
    )
    v.add_argument("--json", action="store_true", help="every mismatch as JSON")
    v.set_defaults(fn=_cmd_verify)
