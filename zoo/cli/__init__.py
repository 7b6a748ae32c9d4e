"""The admin CLI `zoo`: index, search, show, estimate, plan, bench, rm, db; serve and catalog (the web catalog)."""

import argparse
import contextlib
import json
import re
import sys

from zoo import render
from zoo.cli.bench import add_parser as add_bench_parser
from zoo.cli.bench import measured_columns, measurement_rows
from zoo.cli.index import add_parser as add_index_parser
from zoo.cli.index import progress_reporter
from zoo.cli.plan import add_parser as add_plan_parser
from zoo.errors import AnalysisError, InvalidArgument, ZooError
from zoo.render import human, printable, table


def cmd_search(zoo, args) -> int:
    if args.fields:
        rows = render.field_rows()
        print(
            json.dumps([dict(zip(("field", "type", "unit", "meaning"), r)) for r in rows], indent=1)
            if args.json
            else table([["field", "type", "unit", "meaning"], *rows])
        )
        return 0
    found = zoo.search(args.expression, order_by=args.sort, limit=None if args.limit == 0 else args.limit)
    if args.json:
        print(json.dumps([i.as_dict() for i in found], indent=1))
        return 0
    if not found:
        print("no models match", file=sys.stderr)
        return 0
    columns = render.search_columns(args.expression, args.sort)
    measured, cells = measured_columns(zoo, args.expression, found, args.sort)  # bench_cpu, ...: best samples/s
    print(table([[*columns, *measured]] + [[*(render.cell(i, c) for c in columns), *m] for i, m in zip(found, cells)]))
    if args.limit and len(found) == args.limit:
        print(f"(first {args.limit}; --limit 0 for all)", file=sys.stderr)
    return 0


def _whole(minimum: int, what: str):
    """An argparse type: a whole number from `minimum` up (and below 2**63, what a database can take)."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or not minimum <= int(text) < 2**63:
            raise argparse.ArgumentTypeError(f"{what} is a whole number >= {minimum}, not {text!r}")
        return int(text)

    return parse


def _show_tree(zoo, info, args) -> int:
    """The module tree: parameters, bytes and output shapes per module, from zoo.get + a meta forward."""
    result = zoo.scan(info.name, strict=False)
    modules = [m for m in result.modules if args.depth is None or m.depth <= args.depth]
    if args.json:
        print(
            json.dumps(
                {
                    "name": info.name,
                    "error": result.error,
                    "outputs": result.outputs,
                    "modules": [
                        m for m in result.as_dict()["modules"] if args.depth is None or m["depth"] <= args.depth
                    ],
                },
                indent=1,
            )
        )
        return 0
    from rich.console import Console
    from rich.markup import escape

    console = Console(width=None if sys.stdout.isatty() else 100_000)  # piped: whole lines, no cropping
    console.print(render.module_tree(info.name, modules))
    if result.error:
        stopped = (
            "no forward: "
            if result.error.startswith("this module has no recorded input")
            else "the forward stopped on meta: "
        )
        console.print(f"[yellow]{stopped}[/yellow]{printable(escape(result.error))}")
    return 0


def cmd_show(zoo, args) -> int:
    info = zoo.info(args.name, tensors=args.tensors)
    if args.tree:
        return _show_tree(zoo, info, args)
    from zoo.throughput.benchmark import recorded_runs

    runs = recorded_runs(zoo, info.name)  # zoo bench's measurements, with who, when and versions
    if args.json:
        print(json.dumps({**info.as_dict(), "measurements": runs}, indent=1, default=str))
        return 0
    print(table([[k, v] for k, v in render.info_rows(info)]))
    if runs:
        print()
        print(table(measurement_rows(runs)))
    if args.tensors and info.tensor_table:
        print()
        print(table(render.tensor_rows(info.tensor_table)))
    return 0


# Zoo.estimate's arguments as `zoo estimate` spells them, for its errors
_FLAGS = {
    "weights_dtype": "--weights-dtype",
    "kv_dtype": "--kv-dtype",
    "seq_len": "--seq-len",
    "group_size": "--group-size",
    "training=True": "--training",
}


def cmd_estimate(zoo, args) -> int:
    try:
        result = zoo.estimate(
            args.name,
            batch=args.batch,
            dtype=args.dtype,
            training=args.training,
            optimizer=args.optimizer,
            seq_len=args.seq_len,
            kv_dtype=args.kv_dtype,
            weights_dtype=args.weights_dtype,
            group_size=args.group_size,
            checkpointing=args.checkpointing,
        )
    except AnalysisError as e:
        raise AnalysisError(
            re.sub("|".join(rf"\b{re.escape(a)}(?![\w-])" for a in _FLAGS), lambda m: _FLAGS[m.group()], str(e))
        ) from None
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
        return 0
    mode = f"training, {result.optimizer}" if result.training else "inference"
    seq = f", seq_len {result.seq_len}" if result.seq_len else ""
    if result.checkpointing:
        mode += ", activation checkpointing"
    quantized = (
        f" ({result.weights_dtype}" + (f", group {result.group_size})" if result.group_size else ")")
        if result.weights_dtype
        else ""
    )
    rows = [
        [f"{args.name}: batch {result.batch}, {result.dtype}, {mode}{seq}", ""],
        [f"weights{quantized}", human(result.weights, "B")],
    ]
    if result.kv_cache:
        rows.append([f"KV cache ({result.kv_dtype})", human(result.kv_cache, "B")])
    if result.training:
        rows += [["gradients", human(result.gradients, "B")], ["optimizer states", human(result.optimizer_states, "B")]]
    rows += [
        ["inputs", human(result.inputs, "B")],
        ["activations (peak, measured on meta)", human(result.activations, "B")],
        ["total (measured peak)", human(result.total, "B")],
    ]
    if result.upper_bound != result.total:
        rows.append(["sum of the parts (upper bound)", human(result.upper_bound, "B")])
    print(table(rows))
    for note in result.notes:
        print(f"note: {printable(note)}")
    return 0


def cmd_check(zoo, args) -> int:
    result = zoo.check(args.name, args.weights)
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
    else:
        entry = f" (its {result.state_key!r} entry)" if result.state_key else ""  # a training script's checkpoint
        print(printable(f"{args.weights}{entry}: {fit_summary(result, args.name)}"))
        for label, items in (
            ("missing", result.missing),
            ("unexpected", result.unexpected),
            ("misshaped", [f"{k}: file {list(f)}, model {list(m)}" for k, f, m in result.misshaped]),
            ("dtype differs", [f"{k}: file {f}, model {m}" for k, f, m in result.dtype_mismatched]),
        ):
            for item in items:
                print(f"  {label}: {printable(item)}")
    return 0 if result.loads else 1


def fit_summary(result, name: str) -> str:
    """One line a reader can act on: whether the file loads into `name`, then every count (the matched ones alone
    would read as success for a file that does not fit)."""
    fitting = len(result.matched) - len(result.misshaped)  # a misshaped key has a tensor to go to, of another shape
    counts = (
        f"{fitting} fit, {len(result.misshaped)} misshaped, {len(result.missing)} missing, "
        f"{len(result.unexpected)} unexpected"
    )
    if result.exact:
        return f"fits {name} exactly ({fitting} tensors)"
    if result.loads:
        return f"fits {name} with {len(result.dtype_mismatched)} tensors cast to the model's dtype ({counts})"
    return f"does not fit {name} ({counts})"


def cmd_weights(zoo, args) -> int:
    if args.action == "list":
        return _weights_list(zoo, args)
    if args.path is None:
        raise InvalidArgument("zoo weights add NAME PATH: give the weights file to record")
    sha256 = zoo.add_weights(args.name, args.path, tag=args.tag, strict=not args.allow_partial)
    print(
        json.dumps({"name": args.name, "tag": args.tag, "sha256": sha256})
        if args.json
        else f"recorded {args.path} as {args.name} weights {args.tag!r} (sha256 {sha256[:16]}...)"
    )
    return 0


def _weights_list(zoo, args) -> int:
    if args.path is not None:
        raise InvalidArgument(f"zoo weights list NAME takes no file (got {args.path!r})")
    from zoo.query import F

    arch, variants = zoo.variants(args.name)
    # zoo weights add: files recorded for the architecture itself, where its own row is (else only its variants)
    tags = zoo.info(arch).weights if zoo.search(F.name == arch, fields=("name",)) else []
    if args.json:
        print(json.dumps({"architecture": arch, "variants": [v.as_dict() for v in variants], "tags": tags}, indent=1))
        return 0
    if not variants and not tags:
        print(f"{arch}: no pretrained variants or weights tags recorded", file=sys.stderr)
        return 0
    print(table(render.variant_table(arch, variants, tags)))
    return 0


def cmd_rm(zoo, args) -> int:
    print(f"removed {printable(zoo.remove(args.name))}")
    return 0


def cmd_db(zoo, args) -> int:
    from zoo.api import Zoo

    if args.action == "upgrade":
        fresh = not zoo.exists()
        print(f"{zoo}: {'created, ' if fresh else ''}schema at {zoo.upgrade(args.revision)}")
    elif args.action == "compact":
        print(f"{zoo}: {zoo.compact()}")
    elif args.action == "copy":
        source = Zoo(args.source)
        counts = source.copy_to(args.target, replace=args.replace)
        print(
            f"copied {counts['models']} models, {counts['model_tensors']} tensor tables and {counts['weights']} "
            f"weights tags from {source} to {Zoo(args.target)}"
        )
    else:
        print(zoo.revision() or "empty")
    return 0


def cmd_serve(zoo, args) -> int:
    from zoo.web.app import serve

    serve(zoo.url, host=args.host, port=args.port)
    return 0


def cmd_catalog(zoo, args) -> int:
    from zoo.web.export import export_catalog

    bar, report = progress_reporter(args.quiet, "exporting")
    with bar or contextlib.nullcontext():
        done = export_catalog(args.out, zoo.url, trees=args.trees, progress=report)
    print(
        f"wrote {done['models']} models to {done['out']}; serve it with any static server, e.g. "
        f"python -m http.server -d {done['out']}"
    )
    return 0


# The API arguments whose flag is not --NAME, for InvalidArgument.argument.
_ARGUMENT_FLAGS = {"inputs": "--input"}


def _as_flags(e: Exception) -> str:
    """The message as the CLI says it: an InvalidArgument names the API argument (batch); here, its flag (--batch)."""
    argument = getattr(e, "argument", None)
    message = str(e)
    if argument and message.startswith(argument):
        return _ARGUMENT_FLAGS.get(argument, "--" + argument.replace("_", "-")) + message[len(argument) :]
    return message


def _version() -> str:
    import zoo

    return zoo.__version__


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo", description="A model zoo registry built on the meta device.")
    registry_help = "SQLAlchemy URL or SQLite path (default: $ZOO_REGISTRY or the shipped registry.db)"
    p.add_argument("--registry", help=registry_help)
    p.add_argument("--version", action="version", version=f"zoo {_version()}")
    # also after the command (`zoo db upgrade --registry new.db`); SUPPRESS keeps one given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--registry", default=argparse.SUPPRESS, help=registry_help)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("search", parents=[common], help="search the registry: 'params<1e8 and name~*vit*'")
    s.add_argument(
        "expression",
        nargs="?",
        default=None,
        help="a search: FIELD OP VALUE joined by and/or/not, e.g. 'params<1e8 and name~vit_*' (none: all)",
    )
    s.add_argument("--sort", help="field to sort by; -field for descending")
    s.add_argument("--limit", type=_whole(0, "a limit"), default=100, help="at most N rows (0: all)")
    s.add_argument("--fields", action="store_true", help="list the fields a search can use, with units")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_search)

    s = sub.add_parser("show", parents=[common], help="a model's recorded metadata")
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("--tensors", action="store_true", help="list every tensor")
    s.add_argument(
        "--tree", action="store_true", help="module tree: params, bytes, output shapes (runs a meta forward)"
    )
    s.add_argument(
        "--depth", type=_whole(0, "a depth"), default=None, help="with --tree: modules at most N levels deep"
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_show)

    s = sub.add_parser(
        "estimate", parents=[common], help="memory for a batch: weights, gradients, optimizer states, activations"
    )
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("--batch", type=_whole(1, "a batch"), default=1, help="inputs per step")
    s.add_argument("--dtype", default="bf16", help="fp32, bf16, fp16 or fp64 (or float32, bfloat16, half, ...)")
    s.add_argument("--training", action="store_true", help="a training step (forward, backward, optimizer step)")
    s.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adamw", "adam", "sgd", "none"],
        help="with --training: the optimizer whose states the step holds",
    )
    s.add_argument(
        "--seq-len",
        type=_whole(1, "a sequence length"),
        default=None,
        help="sequence length, for models with token inputs",
    )
    s.add_argument("--kv-dtype", default=None, help="KV cache dtype: fp8, int8, bf16, fp16, fp32 (default: --dtype)")
    s.add_argument(
        "--weights-dtype",
        default=None,
        choices=["int8", "int4", "fp8"],
        help="weight-only quantization of the weights term (inference)",
    )
    s.add_argument(
        "--group-size", type=_whole(1, "a group size"), default=128, help="int8/int4: elements per fp16 scale"
    )
    s.add_argument("--checkpointing", action="store_true", help="with --training: activation checkpointing")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_estimate)

    index_sources = add_index_parser(sub, common, _whole)
    add_bench_parser(sub, common, NAME_HELP)
    add_plan_parser(sub, common, NAME_HELP, _whole)

    s = sub.add_parser("check", parents=[common], help="how a weights file fits a model, from metadata alone")
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("weights", help="a .safetensors file, shard index or directory, a .pt/.pth/.bin, or a tag")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_check)

    s = sub.add_parser(
        "weights",
        parents=[common],
        help="add: record a weights file for a model under a tag (sha256 checked on load); "
        "list: every pretrained variant of an architecture and its recorded tags",
    )
    s.add_argument("action", choices=["add", "list"], help="add a file under a tag, or list variants and tags")
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("path", nargs="?", help="add: the weights file")
    s.add_argument("--tag", default="default", help="add: the name to load it by, zoo.get(NAME, weights=TAG)")
    s.add_argument("--allow-partial", action="store_true", help="record even with missing or unexpected keys")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_weights)

    s = sub.add_parser("rm", parents=[common], help="remove a model from the registry")
    s.add_argument("name", help=NAME_HELP)
    s.set_defaults(run=cmd_rm)

    s = sub.add_parser("serve", parents=[common], help="the read-only web catalog: search, plot, model pages, JSON API")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    s.set_defaults(run=cmd_serve)

    s = sub.add_parser("catalog", parents=[common], help="write the web catalog as static files (HTML + JSON + assets)")
    s.add_argument("--out", required=True, help="directory to write into")
    s.add_argument("--trees", action="store_true", help="also export every module tree (a meta forward per model)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.set_defaults(run=cmd_catalog)

    s = sub.add_parser("db", parents=[common], help="registry schema: upgrade, compact, revision; copy SRC DST")
    s.add_argument("action", choices=["upgrade", "compact", "revision", "copy"], help="what to do to the registry")
    s.add_argument("source", nargs="?", metavar="SRC", help="copy: the registry to copy from (URL or path)")
    s.add_argument("target", nargs="?", metavar="DST", help="copy: the registry to copy into (URL or path)")
    s.add_argument("--revision", default="head", help="target revision for upgrade")
    s.add_argument("--replace", action="store_true", help="copy: drop the models DST holds first")
    s.set_defaults(run=cmd_db)
    for s in [*sub.choices.values(), *index_sources.values()]:
        s.formatter_class = _DefaultsHelp
    return p


NAME_HELP = "a registered model: family/name (timm/resnet50), or a bare name one family has"


class _DefaultsHelp(argparse.HelpFormatter):
    """Help that ends each option's text with its default, where it has one (not None, False or 0)."""

    def _get_help_string(self, action) -> str:
        shown = action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
        return (action.help or "") + (
            " (default: %(default)s)" if shown and "default" not in (action.help or "") else ""
        )

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):  # an epilog of command lines, one a line, not rewrapped
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _glue_negative_sort(argv: list[str]) -> list[str]:
    """Let `--sort -params` mean descending: argparse would take -params for an option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--sort" and arg.startswith("-"):
            out[-1] = f"--sort={arg}"
        else:
            out.append(arg)
    return out


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(_glue_negative_sort(sys.argv[1:] if argv is None else list(argv)))
    if args.command == "db" and ((args.source, args.target).count(None) != (0 if args.action == "copy" else 2)):
        p.error("db copy takes SRC and DST (registry URLs or paths); the other db actions take --registry")
    from zoo.api import Zoo

    try:
        return args.run(Zoo(args.registry), args)
    except (ZooError, json.JSONDecodeError) as e:
        # line by line: a search error's caret sits on the line under the expression
        lines = _as_flags(e).split("\n")
        print("zoo: error: " + "\n".join(printable(line) for line in lines), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
