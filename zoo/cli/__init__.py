"""The admin CLI `zoo`: index, search, show, estimate, plan, bench, rm, db; serve and catalog (the web catalog).

Here the parser and main alone. What a command does lives in zoo.cli.commands (and index, bench), imported when
it runs: `zoo search`, `zoo show`, `--help` and `--version` import neither torch nor SQLAlchemy, nor the load,
build or analysis modules (a process's imports were most of a small search's 150-230 ms)."""

import argparse
import json
import os
import sys

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


def _add_search(sub, common) -> None:
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


def _add_show(sub, common) -> None:
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


def _add_estimate(sub, common) -> None:
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


def _add_index(sub, common) -> None:
    from zoo.cli.index import add_parser

    for source in add_parser(sub, common, _whole).values():  # `zoo index SOURCE`'s own parsers
        source.formatter_class = _DefaultsHelp


def _add_bench(sub, common) -> None:
    from zoo.cli.bench import add_parser

    add_parser(sub, common, NAME_HELP)


def _add_plan(sub, common) -> None:
    from zoo.cli.plan import add_parser

    add_parser(sub, common, NAME_HELP, _whole)


def _add_check(sub, common) -> None:
    s = sub.add_parser("check", parents=[common], help="how a weights file fits a model, from metadata alone")
    s.add_argument("name", help=NAME_HELP)
    s.add_argument("weights", help="a .safetensors file, shard index or directory, a .pt/.pth/.bin, or a tag")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=_command("cmd_check"))


def _add_weights(sub, common) -> None:
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


def _add_rm(sub, common) -> None:
    s = sub.add_parser("rm", parents=[common], help="remove a model from the registry")
    s.add_argument("name", help=NAME_HELP)
    s.set_defaults(run=_command("cmd_rm"))


def _add_serve(sub, common) -> None:
    s = sub.add_parser("serve", parents=[common], help="the read-only web catalog: search, plot, model pages, JSON API")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    s.set_defaults(run=_command("cmd_serve"))


def _add_catalog(sub, common) -> None:
    s = sub.add_parser("catalog", parents=[common], help="write the web catalog as static files (HTML + JSON + assets)")
    s.add_argument("--out", required=True, help="directory to write into")
    s.add_argument("--trees", action="store_true", help="also export every module tree (a meta forward per model)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.set_defaults(run=_command("cmd_catalog"))


def _add_db(sub, common) -> None:
    s = sub.add_parser("db", parents=[common], help="registry schema: upgrade, compact, revision; copy SRC DST")
    s.add_argument("action", choices=["upgrade", "compact", "revision", "copy"], help="what to do to the registry")
    s.add_argument("source", nargs="?", metavar="SRC", help="copy: the registry to copy from (URL or path)")
    s.add_argument("target", nargs="?", metavar="DST", help="copy: the registry to copy into (URL or path)")
    s.add_argument("--revision", default="head", help="target revision for upgrade")
    s.add_argument("--replace", action="store_true", help="copy: drop the models DST holds first")
    s.set_defaults(run=_command("cmd_db"))


# Each command and the function that adds its parser, in the order --help lists them.
COMMANDS = {
    "search": _add_search,
    "show": _add_show,
    "estimate": _add_estimate,
    "index": _add_index,
    "bench": _add_bench,
    "plan": _add_plan,
    "check": _add_check,
    "weights": _add_weights,
    "rm": _add_rm,
    "serve": _add_serve,
    "catalog": _add_catalog,
    "db": _add_db,
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `zoo` parser: every command's, or only `command`'s (what main builds when argv names it).

    Args:
        command: one of COMMANDS, to build that command's subparser alone; None: all of them.

    Returns:
        The parser. Built for one command, it parses that command's argv exactly as the whole one does (its usage
        line names every command too); any other command is an invalid choice.

    Examples:
        >>> parser("search").parse_args(["search", "params<1e8"]).expression
        'params<1e8'
    """
    p = argparse.ArgumentParser(
        prog="zoo", description="A model zoo registry built on the meta device.", formatter_class=_Help
    )
    registry_help = "SQLAlchemy URL or SQLite path (default: $ZOO_REGISTRY or the shipped registry.db)"
    p.add_argument("--registry", help=registry_help)
    p.add_argument("--version", action=_Version)
    # also after the command (`zoo db upgrade --registry new.db`); SUPPRESS keeps one given before it
    common = argparse.ArgumentParser(add_help=False, formatter_class=_Help)
    common.add_argument("--registry", default=argparse.SUPPRESS, help=registry_help)
    # one command's parser alone: the usage line still names all (argparse spells them so from the choices)
    every = None if command is None else "{" + ",".join(COMMANDS) + "}"
    sub = p.add_subparsers(dest="command", required=True, metavar=every, parser_class=_Subparser)
    for name, add in COMMANDS.items():
        if command in (None, name):
            add(sub, common)
    return p


NAME_HELP = "a registered model: family/name (timm/resnet50), or a bare name one family has"


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns, as argparse sizes its help by it, without importing shutil: that import
    (bz2, lzma, ...) was 2 ms of every `zoo` process, and argparse makes a formatter for each argument it adds."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
            columns = 0
    return columns or 80


class _Help(argparse.HelpFormatter):
    """argparse's help, at the width argparse itself would choose (COLUMNS, else the terminal's, else 80)."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        width = _terminal_columns() - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)


class _DefaultsHelp(_Help):
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


class _Subparser(argparse.ArgumentParser):
    """A command's parser: its help shows each option's default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsHelp)
        super().__init__(*args, **kwargs)


def _named_command(argv: list[str]) -> str | None:
    """The command argv runs, where only --registry comes before it; else None (--help, say, lists them all)."""
    i = 0
    while i < len(argv) and (argv[i] == "--registry" or argv[i].startswith("--registry=")):
        i += 1 if "=" in argv[i] else 2
    return argv[i] if i < len(argv) and argv[i] in COMMANDS else None


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
    argv = _glue_negative_sort(sys.argv[1:] if argv is None else list(argv))
    # only the subparser of the command run: building all twelve was 6 ms of a 20 ms search
    p = parser(_named_command(argv))
    args = p.parse_args(argv)
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
