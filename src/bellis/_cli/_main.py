"""The ``bellis`` command: ``demo``, ``worker``, ``status``, ``report``, ``verify``,
``plan``, ``serve``, ``as-daisy``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    ok = run_demo(
        Path(args.workdir).resolve(),
        size=args.size,
        workers=args.workers,
        serial=args.serial,
        fresh=args.fresh,
    )
    return 0 if ok else 1


def _load_function(spec: str, option: str = "--function") -> object:
    if ":" not in spec:
        raise _WorkerUsageError(
            f"{option} must look like module:attribute, e.g. my_module:process_block (got {spec!r})"
        )
    mod_name, attr = spec.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))
    try:
        obj: object = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not mod_name.startswith(exc.name):
            raise  # the module itself imports something missing: its own traceback
        raise _WorkerUsageError(
            f"{option} {spec}: no module named {exc.name!r} (looked in {Path.cwd()} and "
            "on sys.path); run the worker in the folder that holds it, or set PYTHONPATH"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _WorkerUsageError(
                f"{option} {spec}: {getattr(obj, '__name__', mod_name)!s} has no attribute {part!r}"
            ) from None
    if not callable(obj):
        raise _WorkerUsageError(f"{option} {spec} is a {type(obj).__name__}, not a function")
    return obj


class _WorkerUsageError(Exception):
    """A ``bellis worker`` argument that cannot work: rc 2, one line, no traceback."""


#: what a worker's context must hold (the server writes all of them)
_CONTEXT_KEYS = ("hostname", "port", "task_id", "secret")
_CONTEXT_HELP = (
    "pass the context the server exported to its workers with --context, or set "
    "$BELLIS_CONTEXT (or daisy's $DAISY_CONTEXT) to it"
)


def _worker_context(args: argparse.Namespace) -> Any:
    """The worker's context from ``--context`` or the environment, checked."""
    from .._worker._context import ENV_VARIABLES, Context

    if args.context is not None:
        where, text = "--context", args.context
    else:
        found = next(((n, os.environ[n]) for n in ENV_VARIABLES if n in os.environ), None)
        if found is None:
            raise _WorkerUsageError(
                f"no worker context: neither --context nor ${' nor $'.join(ENV_VARIABLES)} "
                f"is set; {_CONTEXT_HELP}"
            )
        where, text = f"${found[0]}", found[1]
    try:
        ctx = Context.from_env_string(text)
    except ValueError as exc:
        raise _WorkerUsageError(
            f"{where} is not a context ({exc}): a context is key=value pairs joined by ':', "
            f"such as hostname=...:port=...:task_id=...:secret=...; {_CONTEXT_HELP}"
        ) from None
    if args.task_id:
        ctx["task_id"] = args.task_id
    missing = [k for k in _CONTEXT_KEYS if k not in ctx]
    if missing:
        raise _WorkerUsageError(
            f"{where} has no {', '.join(repr(k) for k in missing)} (it holds "
            f"{', '.join(repr(k) for k in ctx) or 'nothing'}); {_CONTEXT_HELP}"
        )
    problems = []
    if not ctx["port"].isdigit() or not 0 < int(ctx["port"]) < 65536:
        problems.append(f"port {ctx['port']!r} is not a TCP port")
    try:
        bytes.fromhex(ctx["secret"])
    except ValueError:
        problems.append("secret is not hexadecimal")
    if problems:
        raise _WorkerUsageError(f"{where}: {'; '.join(problems)}; {_CONTEXT_HELP}")
    return ctx


def _cmd_worker(args: argparse.Namespace) -> int:
    """Join a running server as an (unmanaged) worker and run a block function, or a
    worker function (no positional parameters, as in ``Task(process_function=...)``)."""
    from .._code_origin import function_arity
    from .._worker._main import run_block_function_loop, run_worker_function

    try:
        ctx = _worker_context(args)
        fn = _load_function(args.function)
        setup = None if args.setup is None else _load_function(args.setup, "--setup")
    except _WorkerUsageError as exc:
        print(f"bellis worker: {exc}", file=sys.stderr)
        return 2
    # a worker function's own Client() reads it from there
    os.environ["BELLIS_CONTEXT"] = ctx.to_env()
    arity = function_arity(fn)  # type: ignore[arg-type]
    if arity == 0:
        if setup is not None:
            print(
                f"bellis worker: --setup {args.setup} cannot go with a worker function (no "
                "positional parameters, its own Client() loop): open what it needs at its "
                "start, or pass a block function fn(block, ctx)",
                file=sys.stderr,
            )
            return 2
        return run_worker_function(fn, ctx)
    # the task's setup runs as in a spawned worker: --setup, or else the task's own,
    # imported by the name the server gives; fn(block, ctx) gets what it made
    return run_block_function_loop(
        fn, ctx, setup, passes_context=arity >= 2, setup_by_name=_task_setup
    )


def _task_setup(ref: str, task_id: str) -> Any:
    """The setup of task ``task_id`` for this worker started by hand, imported by the name
    its server's WELCOME gave, ``ref`` (``module:qualname``; "" for one that cannot be
    imported by name). When it cannot be imported: a setup that raises
    ``ConfigurationError`` saying why and naming ``--setup``, so that the worker ends as
    after any setup that raised, reported to its log and the server."""
    fix = "pass it by hand: bellis worker --function ... --setup module:attribute"
    if not ref:
        why = (
            f"task '{task_id}' has a setup (Task(setup=...)) that a worker started by hand "
            "cannot import by name: it is defined in the driver's script (__main__), or it "
            f"is a closure, a lambda or a functools.partial; {fix}"
        )
    else:
        try:
            return _load_function(ref, f"the setup of task '{task_id}',")
        except _WorkerUsageError as exc:
            why = f"{exc}; or {fix}"
        except Exception as exc:  # its module raised on import
            why = f"cannot import the setup of task '{task_id}', {ref} ({exc!r}); or {fix}"

    def cannot_import() -> None:
        from ..errors import ConfigurationError

        raise ConfigurationError(why)

    return cannot_import


def _take_ctrl_c() -> None:
    """Make SIGINT end ``--watch`` (as KeyboardInterrupt, exit 130) even where the watch was
    started with SIGINT ignored: a shell starts a script's background jobs (``cmd &``) so,
    every process they start inherits it, and Python keeps an ignored SIGINT ignored. A
    watch of a store without a lock file (daisy's) ends only on SIGINT, so it must take it.
    Done before the watch's imports, so a SIGINT at any time after the first output ends it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _holds_stores(path: Path | str) -> bool:
    """Whether ``path`` is a folder (a prefix, for a URL) that holds stores below it
    rather than a store itself: a tracking basedir."""
    from .._tracking import store_exists

    if isinstance(path, str):  # a URL: a prefix without a store of its own
        return not store_exists(path)
    return path.is_dir() and not store_exists(path)


def _cmd_status(args: argparse.Namespace) -> int:
    from .._donemarks import store_location
    from .._report._data import find_stores
    from .._tracking import format_status, read_status, status_record
    from ..errors import TrackingError

    try:
        if args.failed or args.block is not None:
            from ._errors import format_block, format_failed

            if args.block is not None:
                print(format_block(args.path, args.block, as_json=args.json))
            else:
                print(format_failed(args.path, as_json=args.json))
            return 0
        if args.watch is not None:
            if args.json:
                raise TrackingError(
                    "--json prints one snapshot and --watch redraws; use one of them (a "
                    "script polls `bellis status PATH --json`)"
                )
            _take_ctrl_c()
            from ._watch import watch_status

            path = store_location(args.path)
            if _holds_stores(path):
                try:
                    stores = find_stores([path])  # a basedir: name what it holds
                except TrackingError:
                    stores = []  # an empty folder: wait for a run to make the store
            else:
                stores = []
            if stores:
                raise TrackingError(
                    f"--watch follows one task's store, and {path} holds {len(stores)}: "
                    + ", ".join(_name(s) for s in stores)
                    + f"; watch one of them (bellis status {stores[0]} --watch), or run "
                    f"`bellis status {path}` for all",
                    path=str(path),
                )
            return watch_status(
                path, args.watch, out=sys.stdout, err=sys.stderr, max_width=args.width
            )
        path = store_location(args.path)

        def show(store: Path | str) -> str:
            if args.json:
                return json.dumps(status_record(read_status(store)), indent=1)
            return format_status(store, max_width=args.width)

        if not _holds_stores(path):
            print(show(path))  # one task's store
            return 0
        # a tracking basedir: every task's store under it, in name order; one that cannot
        # be read is named on stderr, and the others are still shown
        texts, code = [], 0
        for store in find_stores([path]):
            try:
                texts.append(show(store))
            except TrackingError as exc:
                print(f"bellis status: {exc}", file=sys.stderr)
                code = 2
        if args.json:  # a basedir: one JSON list, a task's record per store
            print("[" + ",\n".join(texts) + "]")
        else:
            print("\n".join(texts))
        return code
    except TrackingError as exc:
        print(f"bellis status: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _name(store: Path | str) -> str:
    """A store's last part: its folder's name, or its URL's last key part."""
    return store.rstrip("/").rsplit("/", 1)[-1] if isinstance(store, str) else store.name


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number of at least 1, got {text!r}")
    return value


def _watch_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--watch takes seconds, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--watch takes a positive number of seconds, got {text}")
    return value


def _cmd_report(args: argparse.Namespace) -> int:
    """The HTML report (``-o``, the default) and/or the Chrome trace (``--trace``)."""
    from ..errors import TrackingError

    if args.trace is not None:
        from .._report._trace import write_trace

        try:
            summary = write_trace(args.paths, args.trace)
        except (TrackingError, OSError) as exc:
            print(f"bellis report: {exc}", file=sys.stderr)
            return 2
        for store in summary["stores"]:
            if store["missing_arrays"]:
                print(
                    f"bellis report: {store['path']}: no {', '.join(store['missing_arrays'])} "
                    "(a store without resource tracking, or written by daisy 2.0.0): "
                    + (
                        "its blocks have no times in the trace"
                        if not store["block_events"]
                        else "those figures are left out"
                    ),
                    file=sys.stderr,
                )
        print(
            f"wrote {args.trace}: {summary['runs']} runs, {summary['block_events']} blocks, "
            f"{summary['failed_attempt_events']} failed attempts "
            "(open it in https://ui.perfetto.dev or chrome://tracing)"
        )
    out = args.output
    if out is None and args.trace is None:
        out = "report.html"
    if out is None:
        return 0
    from .._report._html import write_report

    try:
        written = write_report(args.paths, out)
    except (TrackingError, OSError) as exc:
        print(f"bellis report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0


def _add_report_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    r: argparse.ArgumentParser = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run from its tracking store(s)",
        description="PATH is a task's tracking store, or a folder that holds several (a "
        "pipeline's tracking basedir). The page works offline (plotly.js is embedded).",
    )
    r.add_argument("paths", nargs="+", metavar="PATH", help="tracking store(s) or basedir(s)")
    r.add_argument(
        "-o",
        "--output",
        default=None,
        help="the HTML file to write (default report.html, unless --trace is given alone)",
    )
    r.add_argument(
        "--trace",
        metavar="TRACE_JSON",
        default=None,
        help="also write the runs in the Chrome Trace Event format (Perfetto, "
        "chrome://tracing): one process per run, one thread per worker, one event per block",
    )
    r.set_defaults(fn=_cmd_report)
    return r


def _cmd_as_daisy(args: argparse.Namespace) -> int:
    """install | uninstall | status of the `import daisy` -> bellis hook (see _as_daisy)."""
    from .. import _as_daisy
    from ..errors import ConfigurationError

    try:
        if args.action == "install":
            path = _as_daisy.install_hook()
            print(f"installed: {path}")
            print(
                f"`import daisy` now gives bellis (daisy.__version__ == "
                f"{_as_daisy.daisy_version()!r}) in every process of {sys.prefix}"
            )
            return 0
        if args.action == "uninstall":
            removed = _as_daisy.uninstall_hook()
            if removed is None:
                print(f"not installed: no {_as_daisy.PTH_NAME} in {_as_daisy.site_packages()}")
            else:
                print(f"uninstalled: removed {removed}")
            return 0
    except ConfigurationError as exc:
        print(f"bellis as-daisy {args.action}: {exc}", file=sys.stderr)
        return 2
    status = _as_daisy.hook_status()
    if status.is_installed:
        print(f"installed: {status.pth_path}")
    else:
        print(f"not installed: no {_as_daisy.PTH_NAME} in {status.site_packages}")
    print(f"environment: {sys.prefix}")
    if status.real_daisy is not None:
        shadow = " (the hook shadows it)" if status.is_installed else ""
        print(f"real daisy: {status.real_daisy}{shadow}")
    return 0 if status.is_installed else 1


_DESCRIPTION = (
    "Blockwise processing of huge n-dimensional volumes: run the demo, join a run as a "
    "worker, show a task's progress from its tracking store, write a run's report, or make "
    "`import daisy` give bellis."
)


def main(argv: list[str] | None = None) -> int:
    from .._version import __version__

    p = argparse.ArgumentParser(prog="bellis", description=_DESCRIPTION)
    p.add_argument("--version", action="version", version=f"bellis {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run a small smoothing + labelling pipeline on a zarr volume")
    d.add_argument(
        "--workdir", default="bellis-demo", help="where to write (default ./bellis-demo)"
    )
    d.add_argument(
        "--size", type=_positive, default=96, help="edge of the cubic volume (default 96)"
    )
    d.add_argument("--workers", type=_positive, default=2, help="workers per task (default 2)")
    d.add_argument("--serial", action="store_true", help="run in the driver process")
    d.add_argument("--fresh", action="store_true", help="start over (new volume, no resume)")
    d.set_defaults(fn=_cmd_demo)

    w = sub.add_parser("worker", help="join a running bellis server as a worker")
    w.add_argument(
        "--function",
        required=True,
        help="block function (or 0-argument worker function) as module:attribute",
    )
    w.add_argument(
        "--setup",
        help="the task's setup as module:attribute (default: the task's Task(setup=...), "
        "imported by name); run once before the first block, fn(block, ctx) gets what it made",
    )
    w.add_argument("--context", help="context string (default: $BELLIS_CONTEXT / $DAISY_CONTEXT)")
    w.add_argument("--task-id", help="override the context's task_id")
    w.set_defaults(fn=_cmd_worker)

    s = sub.add_parser(
        "status",
        help="print a task's progress from its tracking store",
        description="PATH is a task's tracking store, or a folder that holds several (a "
        "pipeline's tracking basedir): then every task under it is shown. With --watch, PATH "
        "is one task's store; the watch waits for a run to create it.",
    )
    s.add_argument("path", help="a task's tracking directory, or a tracking basedir")
    s.add_argument("--width", type=_positive, default=80, help="maximum map width (default 80)")
    s.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=_watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) with a rate and an ETA until the run ends",
    )
    s.add_argument(
        "--failed",
        action="store_true",
        help="the last run's failed attempts (errors.jsonl), grouped by distinct error",
    )
    s.add_argument(
        "--block",
        metavar="COORD",
        help="one block: whether it is done, its failed attempts and their log lines; a "
        "grid coordinate (--block 3,7,2) or a block id as the summary prints them "
        "(--block 40)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the status counts (one object per store; a list for a basedir), "
        "or --failed / --block as JSON",
    )
    s.set_defaults(fn=_cmd_status)

    _add_report_parser(sub)

    from ._verify import add_verify_parser

    add_verify_parser(sub, _positive)

    from ._plan_cmd import add_plan_parser

    add_plan_parser(sub)

    from ._serve import add_serve_parser

    add_serve_parser(sub)

    a = sub.add_parser(
        "as-daisy",
        help="make `import daisy` give bellis in this environment (every process)",
        description="Writes (install) or removes (uninstall) an import hook, a .pth file in "
        "this environment's site-packages, that makes every `import daisy` and `daisy.*` "
        "import resolve to bellis. `status` exits 0 when the hook is installed, 1 when not.",
    )
    a.add_argument("action", choices=("install", "uninstall", "status"))
    a.set_defaults(fn=_cmd_as_daisy)

    args = p.parse_args(argv)
    try:
        return int(args.fn(args))
    except BrokenPipeError:
        # the reader went away (`bellis status --watch PATH | head`): stop quietly, as
        # `cat` does, and keep Python's flush at exit from raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
