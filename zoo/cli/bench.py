"""`zoo bench`: measure a model's throughput here (zoo.throughput.benchmark) and record it; a search benches every
match, with a progress bar on stderr, and resumes where a stopped run stopped. Also the measurements table `zoo show`
prints."""

import json
import sys

from zoo.cli.index import progress_reporter
from zoo.columns import NAME_CHARACTERS
from zoo.render import human, printable, table


def add_parser(sub, common, name_help: str) -> None:
    s = sub.add_parser(
        "bench",
        parents=[common],
        help="measure a model's throughput on this machine and record it",
        description="bench NAME measures one model; bench SEARCH ('top1>80 and params<30M') every "
        "match, skipping those measured already in the same mode on this hardware. "
        "Results are searchable: bench_cpu, bench_cuda, bench_train_cpu, bench_train_cuda "
        "(samples/s; zoo search --fields).",
    )
    s.add_argument("target", metavar="NAME_OR_SEARCH", help=f"{name_help}; or a search")
    s.add_argument("--device", default="cpu", help="cpu or cuda")
    s.add_argument("--batch", type=int, default=1, help="samples per step")
    s.add_argument(
        "--dtype",
        default="fp32",
        help="fp32, bf16, fp16 (or any name zoo.dtypes takes: half, bfloat16, ...): the model's and the inputs' dtype",
    )
    s.add_argument("--compile", action="store_true", help="torch.compile the model first")
    s.add_argument("--channels-last", action="store_true", help="channels_last memory format (4-d tensors)")
    s.add_argument("--train", action="store_true", help="time training steps: forward, loss, backward, SGD step")
    s.add_argument("--steps", type=int, default=40, help="timed steps")
    s.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.set_defaults(run=cmd_bench)


def _options(args) -> dict:
    return dict(
        device=args.device,
        batch=args.batch,
        dtype=args.dtype,
        train=args.train,
        steps=args.steps,
        warmup=args.warmup,
        compile=args.compile,
        channels_last=args.channels_last,
    )


def _row(r: dict) -> list[str]:
    if "error" in r:
        return [r["name"], "error", "-", "-", "-"]
    if r["skipped"]:
        return [r["name"], "skipped (measured before)", "-", "-", "-"]
    return [r["name"], "measured", _number(r["samples_per_s"]), _number(r["step_ms"]), human(r["peak_bytes"], "B")]


def _number(value) -> str:
    """None: a stored value that is not a number (zoo.throughput.measured.clean_run); 1.7e308 put in by hand: 5
    characters, not 309."""
    return "-" if value is None else f"{value:.2f}" if abs(value) < 1e15 else f"{value:.3g}"


def cmd_bench(zoo, args) -> int:
    from zoo.throughput import benchmark

    if NAME_CHARACTERS.fullmatch(args.target):
        results = [benchmark.run(zoo, args.target, **_options(args))]
    else:
        bar, report = progress_reporter(args.quiet, "benchmarking")  # on stderr: --json output stays clean
        if bar:
            bar.start()
        try:
            results = benchmark.run_search(
                zoo, args.target, report=report and (lambda n, d, t, r: report(n, d, t)), **_options(args)
            )
        finally:
            if bar:
                bar.stop()
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        print(table([["name", "result", "samples/s", "step ms", "peak memory"], *map(_row, results)]))
        first = next((r for r in results if "hardware" in r), None)
        if first:
            print(
                f"{first['hardware']}, {first['device']}, {first['mode']}, {first['dtype']}, batch {first['batch']}, "
                f"{first['threads']} threads",
                file=sys.stderr,
            )
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"zoo: {r['name']}: {printable(r['error'])}", file=sys.stderr)
    return 1 if failed else 0


def measurement_rows(runs: list[dict]) -> list[list[str]]:
    """`zoo show`'s table of a model's recorded runs."""
    rows = [["measured", "hardware", "mode", "samples/s", "step ms", "peak", "who", "versions"]]
    for r in runs:
        mode = " ".join(
            [
                r["device"],
                r["mode"],
                r["dtype"],
                f"batch {r['batch']}",
                f"{r['threads']} threads",
                *(["compiled"] if r["compiled"] else []),
                *(["channels_last"] if r["channels_last"] else []),
            ]
        )
        libs = " ".join(f"{k} {v}" for k, v in r["versions"].items() if k in ("torch", "timm", "torchvision"))
        rows.append(
            [
                f"{r['measured_at']:%Y-%m-%d %H:%M}",
                r["hardware"],
                mode,
                _number(r["samples_per_s"]),
                _number(r["step_ms"]),
                human(r["peak_bytes"], "B"),
                r["who"],
                libs,
            ]
        )
    return [[printable(str(c)) for c in row] for row in rows]


def measured_columns(zoo, expression, names: list[str], sort: str | None = None) -> tuple[list[str], list[list[str]]]:
    """The search table's extra columns: for each measured field the search or its sort names, each found model's
    best samples/s (the published throughput columns show the same way, through render.search_columns)."""
    from zoo.render import named_numbers
    from zoo.throughput.measured import MEASURED

    fields = [f for f in named_numbers(expression, sort) if f in MEASURED]
    if not fields:  # most searches: no import of the benchmark module
        return [], [[] for _ in names]
    from zoo.throughput.benchmark import fastest

    best = {f: fastest(zoo, names, f) for f in fields}
    return fields, [[_number(best[f].get(name)) for f in fields] for name in names]
