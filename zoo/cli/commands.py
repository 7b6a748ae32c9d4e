"""What each `zoo` command does (search, show, estimate, check, weights, rm, db, serve, catalog): imported by
zoo.cli.main when one runs, not with the parser, so that `zoo --help` and `--version` load none of it."""

import contextlib
import json
import re
import sys

from zoo import render
from zoo.cli.bench import measured_columns, measurement_rows
from zoo.cli.index import progress_reporter
from zoo.errors import AnalysisError, InvalidArgument
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
    limit = None if args.limit == 0 else args.limit
    if args.fits is not None:
        return _search_fits(zoo, args, limit)
    if args.json:
        found = zoo.search(args.expression, order_by=args.sort, limit=limit)
        print(json.dumps([i.as_dict() for i in found], indent=1))
        return 0
    columns = render.search_columns(args.expression, args.sort)
    # the columns shown and no others: decoding every field of 100 rows took longer than the search
    rows = zoo.search(args.expression, order_by=args.sort, limit=limit, fields=columns)
    if not rows:
        print("no models match", file=sys.stderr)
        return 0
    names = [r["name"] for r in rows]
    measured, cells = measured_columns(zoo, args.expression, names, args.sort)  # bench_cpu, ...: best samples/s
    print(table([[*columns, *measured]] + [[*(render.cell(r, c) for c in columns), *m] for r, m in zip(rows, cells)]))
    if args.limit and len(rows) == args.limit:
        print(f"(first {args.limit}; --limit 0 for all)", file=sys.stderr)
    return 0


def _search_fits(zoo, args, limit) -> int:
    """search --fits: the models whose plan fits, with the max_batch of each (zoo.fitting)."""
    columns = render.search_columns(args.expression, args.sort)
    fields = None if args.json else (*columns, "max_batch")
    found, unplanned = zoo._search_fits(args.expression, args.sort, limit, fields, args.fits)
    if args.json:
        print(json.dumps([{**info.as_dict(), "max_batch": p.max_batch} for info, p in found], indent=1))
    elif found:
        cells = [[*(render.cell(r, c) for c in columns), str(r["max_batch"])] for r, _ in found]
        print(table([[*columns, "max_batch"], *cells]))
    else:
        print("no models fit", file=sys.stderr)
    if unplanned:
        print(
            f"({len(unplanned)} matching models record no plan for this run, such as {unplanned[0]}: "
            "zoo plan NAME measures one on meta)",
            file=sys.stderr,
        )
    if args.limit and len(found) == args.limit:
        print(f"(first {args.limit}; --limit 0 for all)", file=sys.stderr)
    return 0


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
