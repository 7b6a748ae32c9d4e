"""The admin CLI `zoo`: index, search, show, estimate, plan, bench, rm, db; serve and catalog (the web catalog).

Here the parser and main alone. What a command does lives in zoo.cli.commands (and index, bench), imported when
it runs: `zoo search`, `zoo show`, `--help` and `--version` import neither torch nor SQLAlchemy, nor the load,
build or analysis modules (a process's imports were most of a small search's 150-230 ms)."""

import argparse
import json
import sys

from zoo.cli.bench import add_parser as add_bench_parser
from zoo.cli.index import add_parser as add_index_parser
from zoo.cli.plan import add_parser as add_plan_parser
from zoo.errors import ZooError
from zoo.render import printable


def _whole(minimum: int, what: str):
    """An argparse type: a whole number from `minimum` up (and below 2**63, what a database can take)."""

    def parse(text: str) -> int:
        if not text.strip().isdigit() or not minimum <= int(text) < 2**63:
            raise argparse.ArgumentTypeError(f"{what} is a whole number >= {minimum}, not {text!r}")
        return int(text)

    return parse


# The API arguments whose flag is not --NAME, for InvalidArgument.argument.
_ARGUMENT_FLAGS = {"inputs": "--input"}


def _as_flags(e: Exception) -> str:
    """The message as the CLI says it: an InvalidArgument names the API argument (batch); here, its flag (--batch)."""
    argument = getattr(e, "argument", None)
    message = str(e)
    if argument and message.startswith(argument):
        return _ARGUMENT_FLAGS.get(argument, "--" + argument.replace("_", "-")) + message[len(argument) :]
    return message


class _Version(argparse._VersionAction):
    """--version, read from the package's metadata when asked: importlib.metadata costs every other command 15 ms."""

    def __call__(self, parser, namespace, values, option_string=None):
        import zoo

        print(f"zoo {zoo.__version__}")
        parser.exit()


def _command(name: str):
    """The function of zoo.cli.commands that runs a command, imported when the command runs."""

    def run(zoo, args) -> int:
        from zoo.cli import commands

        return getattr(commands, name)(zoo, args)

    return run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zoo", description="A model zoo registry built on the meta device.")
    registry_help = "SQLAlchemy URL or SQLite path (default: $ZOO_REGISTRY or the shipped registry.db)"
    p.add_argument("--registry", help=registry_help)
    p.add_argument("--version", action=_Version)
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
    s.add_argument(
        "--fits",
        metavar="SPEC",
        help="only models whose plan fits, with their max_batch: the hardware, train or infer, then key=value of "
        "batch, seq, devices, fsdp, tp, dtype, optimizer, e.g. 'H100 train batch=8 seq=4096 fsdp=8 devices=8'",
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=_command("cmd_search"))

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
    s.set_defaults(run=_command("cmd_show"))

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
    s.set_defaults(run=_command("cmd_estimate"))

    index_sources = add_index_parser(sub, common, _whole)
    add_bench_parser(sub, common, NAME_HELP)
    add_plan_parser(sub, common, NAME_HELP, _whole)

    s = sub.add_parser("check", parents=[common], help="how a weights file fits a model, from metadata alone")
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("weights", help="a .safetensors file, shard index or directory, a .pt/.pth/.bin, or a tag")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=_command("cmd_check"))

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
    s.set_defaults(run=_command("cmd_weights"))

    s = sub.add_parser("rm", parents=[common], help="remove a model from the registry")
    s.add_argument("name", help=NAME_HELP)
    s.set_defaults(run=_command("cmd_rm"))

    s = sub.add_parser("serve", parents=[common], help="the read-only web catalog: search, plot, model pages, JSON API")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    s.set_defaults(run=_command("cmd_serve"))

    s = sub.add_parser("catalog", parents=[common], help="write the web catalog as static files (HTML + JSON + assets)")
    s.add_argument("--out", required=True, help="directory to write into")
    s.add_argument("--trees", action="store_true", help="also export every module tree (a meta forward per model)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.set_defaults(run=_command("cmd_catalog"))

    s = sub.add_parser("db", parents=[common], help="registry schema: upgrade, compact, revision; copy SRC DST")
    s.add_argument("action", choices=["upgrade", "compact", "revision", "copy"], help="what to do to the registry")
    s.add_argument("source", nargs="?", metavar="SRC", help="copy: the registry to copy from (URL or path)")
    s.add_argument("target", nargs="?", metavar="DST", help="copy: the registry to copy into (URL or path)")
    s.add_argument("--revision", default="head", help="target revision for upgrade")
    s.add_argument("--replace", action="store_true", help="copy: drop the models DST holds first")
    s.set_defaults(run=_command("cmd_db"))
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
