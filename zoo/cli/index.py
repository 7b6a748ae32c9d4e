"""`zoo index SOURCE`: a subparser per source with only the flags that apply to it, the command's handler
(families, hf configs or the hub's listing, builders, checkpoints) and the progress bar it and `zoo catalog`
show on stderr. Rules argparse cannot say (hf: SOURCEs or a hub listing, not both) are Zoo.index's."""

import argparse
import json
import os
import sys

from zoo.render import human, printable

# Zoo.index's keywords that a source's flags fill (under the same names); a flag a source lacks keeps its default
_INDEX_OPTIONS = (
    "jobs",
    "name",
    "revision",
    "pretrained",
    "results",
    "author",
    "search",
    "filter",
    "limit",
    "local_cache",
)


class _Intermixed(argparse.ArgumentParser):
    """A source's parser: patterns may follow options (`zoo index timm -j 2 'vit_*'`), which plain argparse
    leaves unparsed (it fills a list positional before the first option only), and a flag of another source
    is refused here, under this source's usage."""

    _inside = False  # parse_known_intermixed_args calls parse_known_args itself: those calls are argparse's own

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, []


def add_parser(sub, common, whole) -> dict:
    """`zoo index` and a subparser per source; returns the sources' parsers by name. A flag several sources
    take is declared once, in a parent parser they share."""
    s = sub.add_parser(
        "index",
        parents=[common],
        help="build models on meta and record them",
        description="Build models on meta and record them, from one SOURCE; "
        "`zoo index SOURCE --help` lists the flags it takes.",
    )
    sources = s.add_subparsers(dest="source", required=True, metavar="SOURCE", parser_class=_Intermixed)

    def source(name: str, text: str, *parents):
        p = sources.add_parser(name, parents=list(parents), help=text, description=text)
        p.set_defaults(run=cmd_index)
        return p

    every = argparse.ArgumentParser(add_help=False, parents=[common])
    every.add_argument(
        "--force",
        action="store_true",
        help="rebuild models even if unchanged; replace a model of another family or builder",
    )
    every.add_argument("--json", action="store_true", help="print JSON instead of text")
    bar = argparse.ArgumentParser(add_help=False)  # the sources that show a progress bar
    bar.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    family = argparse.ArgumentParser(add_help=False, parents=[every, bar])  # an installed library's models
    family.add_argument("targets", nargs="*", metavar="PATTERN", help="glob patterns of model names (none: all)")
    family.add_argument(
        "--jobs",
        "-j",
        type=whole(1, "a number of workers"),
        default=1,
        help="worker processes (at most the CPU count are used)",
    )
    pretrained = argparse.ArgumentParser(add_help=False)
    pretrained.add_argument(
        "--pretrained",
        action="store_true",
        help="a row per pretrained variant (resnet50.a1_in1k), with its published metadata "
        "and metrics, instead of the architectures",
    )
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument(
        "--results",
        help="the folder of timm's published results-*.csv, for its pretrained "
        "variants (timm: with --pretrained; default: catalog/timm-results)",
    )
    named = argparse.ArgumentParser(add_help=False)
    named.add_argument(
        "--name", help="registry name (checkpoint: default checkpoint/FILE's stem; hf: one SOURCE, default hf/ORG/NAME)"
    )

    source("timm", "timm's models: index timm [PATTERN...] [--pretrained]", family, pretrained, results)
    source("torchvision", "torchvision's models: index torchvision [PATTERN...] [--pretrained]", family, pretrained)
    source("installed", "timm and torchvision, architectures and pretrained variants, in one run", family, results)
    b = source("builder", "a model your MODULE:FUNCTION builds: index builder MODULE:FUNCTION --name NAME", every)
    b.add_argument("builder", metavar="MODULE:FUNCTION", help="the function that builds the model")
    # builder's own --name: required here, where checkpoint's and hf's default to a name of their own
    b.add_argument("--name", required=True, help="registry name (user/NAME without a family)")
    b.add_argument("--kwargs", default="{}", help="JSON keyword arguments for the builder")
    b.add_argument(
        "--input",
        default=None,
        help="the builder's input, the batch first: 1,3,224,224, or JSON for several inputs and dtypes: "
        '[{"shape": [1, 16], "dtype": "int64", "name": "input_ids"}] (gives it FLOPs, scan, estimate)',
    )
    c = source("checkpoint", "a weights file's tensors, no module: index checkpoint FILE [--name NAME]", every, named)
    c.add_argument("path", metavar="FILE", help="a .safetensors file, shard index or directory, or a .pt/.pth/.bin")
    h = source(
        "hf",
        "Hugging Face models from config.json alone: index hf SOURCE... [--name NAME] [--revision REV], "
        "or the hub's listing: index hf --author|--search|--filter|--limit|--local-cache",
        every,
        bar,
        named,
    )
    h.add_argument(
        "targets", nargs="*", metavar="SOURCE", help="a config.json, a directory holding one, or a hub repo id ORG/NAME"
    )
    h.add_argument("--revision", help="hub branch, tag or commit of a repo id (default main)")
    h.add_argument("--author", help="instead of SOURCEs: the hub's repos of this user or organization")
    h.add_argument("--search", help="instead of SOURCEs: the hub's repos whose name contains TEXT")
    h.add_argument("--filter", help="instead of SOURCEs: the hub's repos with this task or tag (e.g. text-generation)")
    h.add_argument("--limit", type=whole(1, "a number of repos"), help="at most N repos from the hub's listing")
    h.add_argument(
        "--local-cache", action="store_true", help="instead of SOURCEs: every model in the local hub cache, offline"
    )
    return sources.choices


def progress_reporter(quiet: bool, doing: str = "indexing"):
    if quiet:
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(doing),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
    )
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
        return _index_single(
            args,
            lambda: zoo.index_builder(
                args.builder, args.name, json.loads(args.kwargs), force=args.force, inputs=args.input
            ),
        )
    if args.source == "checkpoint":
        return _index_single(args, lambda: zoo.index_checkpoint(args.path, args.name, force=args.force))
    options = {k: getattr(args, k) for k in _INDEX_OPTIONS if k in args}
    jobs = options.get("jobs", 1)
    workers = min(jobs, os.cpu_count() or 1)
    if workers < jobs:
        print(f"-j {jobs}: using {workers} worker processes, the CPU count", file=sys.stderr)
    bar, report = progress_reporter(args.quiet)  # on stderr: --json output stays clean
    try:
        if bar:
            bar.start()
        outcome = zoo.index(args.source, args.targets, force=args.force, progress=report, **options)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: every model finished so far is committed; run the same command to continue", file=sys.stderr
        )
        return 130
    finally:
        if bar:
            bar.stop()
    if args.json:
        print(json.dumps(outcome.as_dict(), indent=1))
    else:
        print(
            f"{args.source}: {len(outcome.indexed)} indexed, {len(outcome.unchanged)} unchanged, "
            f"{len(outcome.failed)} failed"
        )
        for name, error in sorted(outcome.failed.items()):
            print(printable(f"  failed {name}: {error}"))
    return 1 if args.source == "hf" and outcome.failed else 0


def _index_single(args, run) -> int:
    record = run()
    if args.json:
        print(json.dumps({k: record[k] for k in ("name", "status", "error", "params", "bytes")}, indent=1))
    elif record["status"] == "ok":
        print(f"indexed {record['name']}: {human(record['params'])} params, {human(record['bytes'], 'B')}")
    else:
        print(printable(f"recorded {record['name']} as failed: {record['error']}"))
    return 0 if record["status"] == "ok" else 1
