"""Text for people: sizes, tables, a model's recorded rows, its tensors and its module tree (the CLI's output)."""

import json
import re

SEARCH_COLUMNS = ("name", "params", "bytes", "task", "arch")


# C0 and C1 controls (ESC starts a terminal escape; 0x9b is CSI on its own), line separators, bidi overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text) -> str:
    """Text for a terminal: each control character written as its escape (\\x1b), so that a name or a
    recorded error can never move the cursor, retitle the window or clear the screen."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), str(text))


def human(n: int | None, unit: str = "") -> str:
    if n is None:
        return "-"
    if unit == "B":
        for suffix, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= size:
                return f"{n / size:.1f} {suffix}"
        return f"{n} B"
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def si(n: int | None, unit: str) -> str:
    """1.82e9, "FLOPs" -> "1.82 GFLOPs" (powers of 1000)."""
    if n is None:
        return "-"
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {prefix}{unit}"
    return f"{n} {unit}"


def analysis_rows(info) -> list[tuple[str, str]]:
    if info.scan_status is None:
        return [("analysis", "- (not analysed: indexed before zoo recorded analysis; re-index it)")]
    if info.scan_status != "ok":
        return [("analysis", info.scan_status + (f": {info.scan_error}" if info.scan_error else ""))]
    outputs = ", ".join(
        f"{p + ': ' if p else ''}{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
        for p, shape, dtype in (info.output_shapes or [])[:8]
    )
    more = len(info.output_shapes or []) - 8
    rows = [
        ("flops", f"{si(info.flops, 'FLOPs')} ({si(info.macs, 'MACs')}), batch 1 at the input size"),
        (
            "activations",
            f"{human(info.peak_activation_bytes, 'B')} peak in inference, "
            f"{human(info.train_activation_bytes, 'B')} saved for backward in training",
        ),
        ("output", outputs + (f", ... ({more} more)" if more > 0 else "")),
    ]
    if info.flops_per_token:
        rows.insert(
            1,
            (
                "flops per token",
                f"{si(info.flops_per_token, 'FLOPs')} (prefill, "
                f"{'x'.join(map(str, info.inputs[0]['shape']))} token ids)",
            ),
        )
    if info.scan_error:
        rows.append(("analysis note", info.scan_error))
    return rows + llm_rows(info)


def llm_rows(info) -> list[tuple[str, str]]:
    """The language-model fields of an hf row (none for other families)."""
    if info.active_params is None:
        return []
    kv = human(info.kv_bytes_per_token, "B") + " per token" if info.kv_bytes_per_token else "- (no cache: an encoder)"
    moe = f", {info.experts} experts, {info.experts_per_token} per token" if info.experts else ""
    return [
        ("active params", f"{info.active_params:,} ({human(info.active_params)}){moe}"),
        (
            "shape",
            f"{info.layers} layers, hidden {info.hidden_size}, {info.heads} heads, {info.kv_heads} KV heads, "
            f"vocab {info.vocab_size}",
        ),
        ("KV cache", kv + (f" (sliding window {info.sliding_window})" if info.sliding_window else "")),
        ("context", f"{info.context_length:,} tokens" if info.context_length else "-"),
    ]


def field_rows() -> list[list[str]]:
    """Every searchable field: name, type, unit and meaning, from its one declaration (zoo.columns)."""
    from zoo.columns import COLUMNS
    from zoo.throughput import measured, roofline

    return (
        [[c.name, c.search_type, c.unit or "-", c.doc] for c in COLUMNS if c.searchable]
        + [[f, "number", measured.UNIT, measured.doc(f)] for f in measured.MEASURED]
        + [[f, "number", roofline.UNIT, roofline.doc(f)] for f in roofline.PREDICTED]
    )


def named_numbers(expression, sort: str | None = None) -> list[str]:
    """Every number field the search or its sort names (a published metric such as top1 or box_map, a predicted
    or measured throughput, any other number), in the grammar's order; field names ignore case. The CLI's table
    and the web's show each as a column."""
    from zoo.query import COMPARED

    words = _words(expression, sort)
    return [f for f, kind in COMPARED.items() if kind == "number" and f in words]


def _words(expression, sort: str | None) -> set[str]:
    return set(re.findall(r"[a-z_0-9]+", f"{expression if isinstance(expression, str) else ''} {sort or ''}".lower()))


def search_columns(expression, sort: str | None = None) -> tuple[str, ...]:
    """The table's columns: the default ones, plus every stored or predicted number the search or its sort
    names, after the name (`zoo search "top1>85"` shows top1; measured ones come from
    zoo.cli.bench.measured_columns)."""
    from zoo.throughput.measured import MEASURED

    named = [f for f in named_numbers(expression, sort) if f not in MEASURED and f not in SEARCH_COLUMNS]
    if "variant" in _words(expression, sort) and "top1" not in named:  # kind=variant: the headline metric
        named.insert(0, "top1")
    return ("name", *named, *SEARCH_COLUMNS[1:])


def cell(info, column: str) -> str:
    """A field of a ModelInfo, or of a search's dict of fields (a predicted one computed there), as text."""
    from zoo.throughput.roofline import PREDICTED, predicted

    if isinstance(info, dict):
        value = info[column]
    else:  # a predicted field is computed from the row, as the search computes it
        value = predicted(info, column) if column in PREDICTED else getattr(info, column)
    if column in PREDICTED:
        return "-" if value is None else f"{value:.0f} (predicted)"
    if column in ("params", "trainable", "active_params", "hub_params"):
        return human(value)
    if column in ("bytes", "param_bytes", "buffer_bytes", "weights_bytes"):
        return human(value, "B")
    if column in ("flops", "macs") and value is not None:
        return si(value, column.upper().replace("FLOPS", "FLOPs").replace("MACS", "MACs"))
    if column == "input_size" and value:
        return "x".join(map(str, value))
    return "-" if value is None else str(value)


def table(rows: list[list[str]]) -> str:
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _input_size_text(info) -> str:
    """The row's input size; for a model indexed with its inputs (`zoo index builder --input`), those inputs, the
    batch first, as they were given."""
    if info.input_size:
        return "x".join(map(str, info.input_size))
    if info.inputs:
        return (
            ", ".join(
                f"{'x'.join(map(str, i['shape']))} {i.get('dtype') or 'float32'}"
                + (f" ({i['name']})" if i.get("name") else "")
                for i in info.inputs
            )
            + " (given when indexed)"
        )
    return "-"


def info_rows(info) -> list[tuple[str, str]]:
    """What `zoo show` prints of a model: one (label, text) row each."""
    rows = [
        ("name", info.name),
        ("family", info.family),
        ("builder", info.builder),
        ("kwargs", json.dumps(info.kwargs)),
        ("arch", info.arch or "-"),
        ("task", info.task or "-"),
        ("input size", _input_size_text(info)),
        ("params", f"{info.params:,} ({human(info.params)})" if info.params is not None else "-"),
        ("trainable", f"{info.trainable:,}" if info.trainable is not None else "-"),
        ("buffers", f"{info.buffers:,} elements" if info.buffers is not None else "-"),
        ("tensors", str(info.tensors) if info.tensors is not None else "-"),
        (
            "bytes",
            f"{human(info.bytes, 'B')} ({human(info.param_bytes, 'B')} params + "
            f"{human(info.buffer_bytes, 'B')} buffers, {info.dtype})"
            if info.bytes is not None
            else "-",
        ),
        ("status", info.status + (f": {info.error}" if info.error else "")),
        *(analysis_rows(info) if info.status == "ok" else []),
        *published_rows(info),
        ("versions", ", ".join(f"{k} {v}" for k, v in info.versions.items()) or "-"),
        ("indexed", info.indexed_at.isoformat(timespec="seconds")),
    ]
    if info.kind == "variant":
        rows[1:1] = variant_rows(info)
    rows += [
        (f"weights {w['tag']}", f"{w['path']} ({human(w['bytes'], 'B')}, sha256 {w['sha256'][:12]}...)")
        for w in info.weights or []
    ]
    return rows


def variant_rows(info) -> list[tuple[str, str]]:
    """A pretrained variant's published facts: its architecture, source, license, preprocessing, metrics."""

    def compact(d: dict) -> str:
        return ", ".join(
            f"{k} {'x'.join(map(str, v)) if k.endswith('size') and isinstance(v, list) else v}"
            for k, v in d.items()
            if v is not None
        )

    rows = [
        ("kind", f"pretrained variant of {info.arch_name}, tag {info.tag}"),
        ("license", info.license or "-"),
        ("dataset", info.dataset or "-"),
        ("classes", "-" if info.num_classes is None else str(info.num_classes)),
        ("source", compact(info.weights_source or {}) or "-"),
        ("weights file", human(info.weights_bytes, "B") if info.weights_bytes else "-"),
        ("preprocess", compact(info.preprocess or {}) or "-"),
    ]
    for dataset, values in (info.metrics or {}).items():
        shown = (
            {k: v for k, v in values.items() if not k.endswith(("_err", "_diff")) and k not in ("param_count",)}
            if isinstance(values, dict)
            else {"": values}
        )
        rows.append((f"metrics {dataset}", compact(shown)))
    rows += [(f"card {k}", str(v)) for k, v in (info.card or {}).items()]
    return rows


def published_rows(info) -> list[tuple[str, str]]:
    """Published numbers with the size each is at: top1 and the throughput at the row's input size, the test-size
    result and its FLOPs at test_input_size; and the predicted throughput (zoo.throughput.roofline), named a
    prediction."""
    from zoo.columns import THROUGHPUT

    def px(size) -> str:
        if not size and info.inputs:  # a model indexed with its inputs: the first one's, without the batch
            size = info.inputs[0]["shape"][1:]
        return "x".join(map(str, size[-2:])) if size else "?"

    rows = []
    if info.top1 is not None:
        rows.append(("top1", f"{info.top1}% at {px(info.input_size)} (input size; flops are at it too)"))
    if info.test_top1 is not None:
        cost = f", {si(info.test_flops, 'FLOPs')}" if info.test_flops is not None else ""
        rows.append(("test_top1", f"{info.test_top1}% at {px(info.test_input_size)} (test size{cost})"))
    rows += [
        (
            column,
            f"{_speed(getattr(info, column))} samples/s at {px(info.input_size)}, batch "
            f"{getattr(info, column + '_batch')} (timm's published benchmark)",
        )
        for column in THROUGHPUT
        if getattr(info, column) is not None
    ]
    from zoo.throughput.roofline import PREDICTED, predicted

    rows += [
        (
            field,
            f"{_speed(value)} samples/s at {px(info.input_size)}, batch {PREDICTED[field].batch} "
            f"(PREDICTED: the roofline upper bound, not a measurement)",
        )
        for field in PREDICTED
        if (value := predicted(info, field)) is not None
    ]
    if info.pretrain:
        rows.append(("pretrain", info.pretrain))
    return rows


def _speed(n: float) -> str:
    return f"{n:,.0f}" if n >= 100 else f"{n:.3g}"  # a CPU's 3.8 samples/s keeps its digits


def variant_table(arch: str, variants, tags) -> list[list[str]]:
    """`zoo weights list`: a header and a row per pretrained variant, then the weights tags recorded for the
    architecture itself (zoo weights add)."""
    rows = [["name", "tag", "top1", "params", "flops", "input", "license", "dataset", "status", "file"]]
    rows += [
        [
            v.name,
            v.tag or "-",
            cell(v, "top1"),
            cell(v, "params"),
            cell(v, "flops"),
            cell(v, "input_size"),
            v.license or "-",
            v.dataset or "-",
            v.status,
            "-",
        ]
        for v in variants
    ]
    rows += [[arch, f"{w['tag']} (recorded)", "-", "-", "-", "-", "-", "-", "-", w["path"]] for w in tags]
    return rows


def tensor_rows(tensor_table) -> list[list[str]]:
    """A header and one row per tensor name (aliases marked as ties)."""
    header = ["tensor", "kind", "shape", "dtype", "bytes", "note"]
    return [header] + [
        [
            t.name,
            t.kind,
            "x".join(map(str, t.shape)) or "scalar",
            t.dtype,
            human(t.bytes, "B"),
            ("tied to " + t.tied_to if t.tied_to else "") + ("" if t.persistent else "non-persistent"),
        ]
        for t in tensor_table
    ]


def module_tree(name: str, modules):
    """A rich Tree of zoo.analysis.ModuleScan rows: params, bytes and output shapes per module."""
    from rich.markup import escape
    from rich.tree import Tree

    def label(m) -> str:
        shapes = "; ".join(
            f"{p + ' ' if p else ''}{'x'.join(map(str, shape)) or 'scalar'}"
            + ("" if dtype == "float32" else f" {dtype}")
            for p, shape, dtype in m.outputs[:4]
        )
        if len(m.outputs) > 4:
            shapes += f"; ... {len(m.outputs) - 4} more"
        calls = f" x{m.calls}" if m.calls > 1 else ""
        if m.calls:
            out = f"-> {shapes}{calls}" if m.outputs else f"-> (no tensor output){calls}"
        else:
            out = "[red](stopped inside)[/red]" if m.entered else "[dim](not called)[/dim]"
        leaf = m.name.rsplit(".", 1)[-1] or name
        return printable(
            f"[bold]{escape(leaf)}[/bold] [cyan]{escape(m.type)}[/cyan]  {human(m.params)} params, "
            f"{human(m.bytes, 'B')}  {escape(out) if m.calls else out}"
        )

    nodes = {}
    root = None
    for m in modules:
        if m.name == "":
            root = nodes[""] = Tree(label(m))
            continue
        parent = m.name.rsplit(".", 1)[0] if "." in m.name else ""
        nodes[m.name] = nodes[parent].add(label(m))
    return root
