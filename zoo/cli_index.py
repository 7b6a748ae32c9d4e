"""`zoo index`: the command's handler (families, hf configs or the hub's listing, builders, checkpoints) and
the progress bar it and `zoo catalog` show on stderr."""

import json
import os
import sys

from zoo.render import human, printable


def progress_reporter(quiet: bool, doing: str = "indexing"):
    if quiet:
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(doing), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   TextColumn("{task.description}"), console=Console(stderr=True))
    task = bar.add_task("", total=None)

    def report(name, done, total):
        bar.update(task, completed=done, total=total, description=name)

    return bar, report


def cmd_index(zoo, args) -> int:
    fresh = not zoo.exists()
    try:
        return _index(zoo, args)
    finally:
        if fresh and zoo.exists():
            print(f"created a new registry at {zoo}", file=sys.stderr)


def _index(zoo, args) -> int:
    if args.source == "builder":
        return _index_single(args, lambda: zoo.index_builder(args.target, args.name, json.loads(args.kwargs),
                                                             force=args.force, inputs=args.input))
    if args.source == "checkpoint":
        return _index_single(args, lambda: zoo.index_checkpoint(args.target, args.name, force=args.force))
    workers = min(args.jobs, os.cpu_count() or 1)
    if workers < args.jobs and args.source != "hf":
        print(f"-j {args.jobs}: using {workers} worker processes, the CPU count", file=sys.stderr)
    bar, report = progress_reporter(args.quiet)  # on stderr: --json output stays clean
    try:
        if bar:
            bar.start()
        outcome = (zoo.index_hub(args.author, args.search, args.filter, args.limit, args.local_cache, force=args.force,
                                 progress=report) if hub_listing(args) else
                   zoo.index(args.source, args.targets, jobs=args.jobs, force=args.force, name=args.name,
                             revision=args.revision, progress=report, pretrained=args.pretrained,
                             results=args.results))
    except KeyboardInterrupt:
        print("\ninterrupted: every model finished so far is committed; run the same command to continue",
              file=sys.stderr)
        return 130
    finally:
        if bar:
            bar.stop()
    if args.json:
        print(json.dumps(outcome.as_dict(), indent=1))
    else:
        print(f"{args.source}: {len(outcome.indexed)} indexed, {len(outcome.unchanged)} unchanged, "
              f"{len(outcome.failed)} failed")
        for name, error in sorted(outcome.failed.items()):
            print(printable(f"  failed {name}: {error}"))
    return 1 if args.source == "hf" and outcome.failed else 0


def hub_listing(args) -> bool:  # the hub's listing or the local cache, not SOURCEs
    return bool(args.author or args.search or args.filter or args.limit or args.local_cache)


def _index_single(args, run) -> int:
    record = run()
    if args.json:
        print(json.dumps({k: record[k] for k in ("name", "status", "error", "params", "bytes")}, indent=1))
    elif record["status"] == "ok":
        print(f"indexed {record['name']}: {human(record['params'])} params, {human(record['bytes'], 'B')}")
    else:
        print(printable(f"recorded {record['name']} as failed: {record['error']}"))
    return 0 if record["status"] == "ok" else 1
