"""The report's Failures section, and the block details the page shows on a click.

Read from each store's ``errors.jsonl`` (:mod:`bellis._stats._errorlog`), every run of it:

* the section: per task, its errors grouped by type and innermost frame (the raising
  line; ``_errorlog.group_key``), each with its messages, its failed attempts, its blocks
  (links that show a block's details, named by id and coordinate) and its first traceback;
* the details: per block, its recorded attempts (when, kind, worker, host, pid, job, the
  traceback, and a few lines of the worker's log files read at the recorded offsets),
  embedded as one JSON document (``<script id="bellis-failures">``) that the page's script
  shows when a cell of the failure map, a red or orange bar of the timeline or a block
  link is clicked.

Bounded twice: the records file keeps full records for the first attempts of each
distinct error only (counts after), and the page embeds at most :data:`PAGE_ATTEMPTS`
attempts and :data:`PAGE_BYTES` of them (a note says how many were left out, and the
details of such a block say where to find them), each traceback cut to its last
:data:`PAGE_TRACEBACK_BYTES` and each log excerpt to a few lines. Everything from a run
is escaped: the section with :func:`html.escape`, the JSON with ``<``, ``>`` and ``&`` as
``\\u`` escapes (the script writes it into the page as text, never as markup).
"""

from __future__ import annotations

import datetime
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .._stats._errorlog import (
    ERRORS_FILE,
    ErrorGroupRecord,
    ErrorRecord,
    LogReader,
    cap_text,
    format_messages,
    group_errors,
    read_errors,
)
from ._data import StoreData

__all__ = [
    "PAGE_ATTEMPTS",
    "PAGE_BYTES",
    "StoreFailures",
    "coord_key",
    "failure_payload",
    "failures_of",
    "failures_section",
]

#: attempts embedded in the page, over all stores
PAGE_ATTEMPTS: Final = 2000
#: bytes of embedded attempts (their JSON), over all stores
PAGE_BYTES: Final = 4 * 1024 * 1024
#: an embedded traceback keeps its last this many bytes
PAGE_TRACEBACK_BYTES: Final = 16 * 1024
#: the first traceback the section shows per distinct error
SECTION_TRACEBACK_BYTES: Final = 8 * 1024
#: a message keeps this many characters
MESSAGE_CHARS: Final = 2000
#: lines of the worker's .err file from the attempt's offset, and of .out before its end
ERR_LINES: Final = 20
OUT_LINES: Final = 10
LOG_BYTES: Final = 4096
#: block links per distinct error in the section
LISTED_BLOCKS: Final = 20
#: distinct errors listed per task (the rest are counted in a line)
LISTED_ERRORS: Final = 100


def coord_key(coord: tuple[int, ...] | list[int]) -> str:
    """A block's grid coordinate as the page's key: ``"1,2"``."""
    return ",".join(str(int(x)) for x in coord)


@dataclass
class StoreFailures:
    """One store's error records: its distinct errors, over every run of the file."""

    index: int
    task_id: str
    path: Path | str | None
    has_file: bool
    #: failed attempts the store's ``failures`` array counts
    counted: int = 0
    groups: list[ErrorGroupRecord] = field(default_factory=list)
    runs: int = 0

    @property
    def attempts(self) -> int:
        return sum(g.count for g in self.groups)


def _errors_place(path: Path | str | None) -> str:
    """Where a store's error records are: its ``errors.jsonl``, or a URL's per-run
    ``errors/`` objects."""
    if path is None:
        return ERRORS_FILE
    if isinstance(path, str):
        return f"{path}/errors/"
    return str(path / ERRORS_FILE)


def failures_of(stores: list[StoreData]) -> list[StoreFailures]:
    """Each store's error records, in the stores' order (a store without a folder, or
    without ``errors.jsonl``, has none: ``has_file`` says which)."""
    out: list[StoreFailures] = []
    for i, s in enumerate(stores):
        counted = s.counts[2]
        if s.error_lines is not None:  # a store at a URL: read when it was loaded
            lines = s.error_lines
        else:
            file = None if not isinstance(s.path, Path) else s.path / ERRORS_FILE
            if file is None or not file.is_file():
                out.append(StoreFailures(i, s.task_id, s.path, False, counted))
                continue
            lines = read_errors(file)
        runs = {d.get("run") for d in lines if d.get("run") is not None}
        groups = group_errors(lines)
        out.append(StoreFailures(i, s.task_id, s.path, True, counted, groups, len(runs)))
    return out


def _when(t: Any) -> str | None:
    if not isinstance(t, int | float) or not t:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _attempt(r: ErrorRecord, group: int, reader: LogReader) -> dict[str, Any]:
    """One attempt as the page's script shows it, with its log excerpt."""
    logs = reader.logs(r, err_lines=ERR_LINES, out_lines=OUT_LINES, max_bytes=LOG_BYTES)
    return {
        "attempt": r.attempt,
        "run": _when(r.run),
        "time": _when(r.time),
        "kind": r.kind,
        "type": r.type,
        "message": r.message[:MESSAGE_CHARS],
        "where": r.where,
        "group": group,
        "worker": r.worker_id,
        "host": r.host,
        "pid": r.pid,
        "job": r.job_id,
        "traceback": cap_text(r.traceback, PAGE_TRACEBACK_BYTES),
        "log": r.log,
        "out_log": r.out_log,
        **logs,
    }


def _order(found: list[StoreFailures]) -> list[tuple[int, int, ErrorRecord]]:
    """Every full record as (store, group, record), in the order they are embedded: one
    of each distinct error in turn (so a bound leaves every error some attempts), the
    newest run's first."""
    queues = [
        (f.index, gi, sorted(g.records, key=lambda r: -(r.run or 0.0)))
        for f in found
        for gi, g in enumerate(f.groups)
    ]
    out: list[tuple[int, int, ErrorRecord]] = []
    depth = 0
    while queues:
        queues = [q for q in queues if depth < len(q[2])]
        out += [(si, gi, recs[depth]) for si, gi, recs in queues]
        depth += 1
    return out


def failure_payload(
    found: list[StoreFailures],
    *,
    max_attempts: int = PAGE_ATTEMPTS,
    max_bytes: int = PAGE_BYTES,
) -> dict[str, Any]:
    """What the page's script needs to show a block's failed attempts: per store, its
    blocks' attempts (keyed by :func:`coord_key`), within the bounds."""
    stores: dict[str, Any] = {}
    for f in found:
        stores[str(f.index)] = {
            "task": f.task_id,
            "path": None if f.path is None else str(f.path),
            "file": f.has_file,
            "blocks": {},
            "counted": {},
        }
        for g in f.groups:  # blocks whose attempts were only counted (no full record)
            for b in g.blocks:
                stores[str(f.index)]["counted"][coord_key(b)] = True
    embedded = omitted = used = 0
    order = _order(found)
    reader = LogReader(r for _si, _gi, r in order)  # each log file read once, not per attempt
    for si, gi, r in order:
        if embedded >= max_attempts or used >= max_bytes:
            omitted += 1
            continue
        a = _attempt(r, gi, reader)
        size = len(json.dumps(a))
        if used + size > max_bytes:
            omitted += 1
            continue
        used += size
        embedded += 1
        stores[str(si)]["blocks"].setdefault(coord_key(r.coord), []).append(a)
    for s in stores.values():
        for attempts in s["blocks"].values():
            attempts.sort(key=lambda a: (a["run"] or "", a["attempt"], a["time"] or ""))
    return {
        "stores": stores,
        "embedded": embedded,
        "omitted": omitted,
        "bound": {"attempts": max_attempts, "bytes": max_bytes},
    }


def payload_json(payload: dict[str, Any]) -> str:
    """The payload as JSON safe inside ``<script>``: no ``<``, ``>`` or ``&`` at all."""
    text = json.dumps(payload, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ----------------------------------------------------------------------- the section


def _esc(v: Any) -> str:
    return html.escape(str(v))


def _coord_text(c: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(x) for x in c) + ")"


def _block_text(c: tuple[int, ...], block_id: int | None) -> str:
    return _coord_text(c) if block_id is None else f"{block_id} {_coord_text(c)}"


def _block_links(f: StoreFailures, g: ErrorGroupRecord) -> str:
    blocks = list(dict.fromkeys([r.coord for r in g.records] + list(g.blocks)))
    ids = {r.coord: r.block_id for r in reversed(g.records) if r.block_id >= 0}
    # the block id (as the summary names blocks) and the coordinate (as bellis status
    # --block and the maps take it): both, so that either can be copied
    links = [
        f'<a href="#" class="blk" data-store="{f.index}" data-block="{_esc(coord_key(c))}">'
        f"{_esc(_block_text(c, ids.get(c)))}</a>"
        for c in blocks[:LISTED_BLOCKS]
    ]
    text = ", ".join(links)
    more = len(blocks) - LISTED_BLOCKS
    if more > 0:
        text += f" and {more} more"
    if g.count > len(g.records):
        text += " (further attempts were only counted: not every block is known)"
    return text


def _group_row(f: StoreFailures, g: ErrorGroupRecord) -> str:
    where = g.key[2]
    title = g.title[:300]
    tb = "" if g.first is None else g.first.traceback
    shown = cap_text(tb, SECTION_TRACEBACK_BYTES).rstrip("\n")
    known = len({r.coord for r in g.records} | set(g.blocks))
    blocks = f"at least {known}" if g.count > len(g.records) else str(known)
    trace = (
        f"<details><summary>first traceback ({len(shown.splitlines())} lines)</summary>"
        f"<pre>{_esc(shown)}</pre></details>"
        if shown
        else '<span class="empty">none (no exception)</span>'
    )
    return (
        f'<tr class="error-row" data-task="{_esc(f.task_id)}" data-count="{g.count}">'
        f"<td class=l>{_esc(g.kind)}</td><td class=l><b>{_esc(title)}</b>"
        + (f"<br><small>at {_esc(where)}</small>" if where else "")
        + (
            f"<br><small>messages: {_esc(format_messages(g.messages))}</small>"
            if len(g.messages) > 1
            else ""
        )
        + f"</td><td>{g.count}</td><td>{blocks}</td>"
        f'<td class="l blocks">{_block_links(f, g)}</td><td class=l>{trace}</td></tr>'
    )


def failures_section(found: list[StoreFailures], payload: dict[str, Any]) -> str:
    """The body of the Failures section."""
    parts: list[str] = []
    quiet: list[str] = []
    head = "<tr><th class=l>kind</th><th class=l>error</th><th>attempts</th><th>blocks</th>"
    head += "<th class=l>blocks (click for details)</th><th class=l>traceback</th></tr>"
    for f in found:
        if not f.has_file and f.counted:
            quiet.append(
                f"{_esc(f.task_id)}: {f.counted} failed attempt(s) counted, but none recorded: "
                f"the store has no {ERRORS_FILE} (written by daisy 2.0.0 or an older bellis), "
                "so no traceback is known."
            )
            continue
        if not f.has_file:
            where = "no tracking store" if f.path is None else f"no {ERRORS_FILE}"
            quiet.append(f"{_esc(f.task_id)}: no failed attempt was recorded ({where}).")
            continue
        if not f.groups:
            quiet.append(f"{_esc(f.task_id)}: no failed attempt was recorded.")
            continue
        n = len(f.groups)
        runs = f"{f.runs} run{'s' if f.runs != 1 else ''}"
        parts.append(
            f'<h3>{_esc(f.task_id)}</h3><p class="failures-head">{n} distinct error'
            f"{'s' if n != 1 else ''}, {f.attempts} failed attempt"
            f"{'s' if f.attempts != 1 else ''} over {runs} "
            f"(<code>{_esc(_errors_place(f.path))}</code>)</p>"
        )
        rows = "".join(_group_row(f, g) for g in f.groups[:LISTED_ERRORS])
        parts.append(f'<table class="failures">{head}{rows}</table>')
        if n > LISTED_ERRORS:
            parts.append(
                f"<p>and {n - LISTED_ERRORS} more distinct errors: "
                f"<code>bellis status {_esc(f.path)} --failed</code> lists them all.</p>"
            )
    if payload["omitted"]:
        b = payload["bound"]
        parts.append(
            f'<div class="note">{payload["omitted"]} recorded attempt(s) are not embedded in '
            f"this page (it holds at most {b['attempts']} attempts and "
            f"{b['bytes'] // (1024 * 1024)} MiB of them, one of each distinct error in turn): "
            "<code>bellis status PATH --block COORD</code> shows any block's attempts.</div>"
        )
    if parts:
        parts.append('<div class="detail" id="failures-detail"></div>')
    body = "".join(parts) + "".join(f'<p class="empty">{q}</p>' for q in quiet)
    return body
