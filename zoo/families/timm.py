"""timm family: every name in timm.list_models(), built with pretrained=False; and every pretrained tag
(timm.list_pretrained(), "resnet50.a1_in1k") as a variant row with its published metadata and results."""

from zoo.errors import InvalidArgument, UntrustedBuilder
from zoo.families import torch_version

NAME = "timm"


def available(patterns=()) -> list[str]:
    import timm

    return timm.list_models(list(patterns) or "")


def check(builder: str, kwargs: dict) -> None:
    import timm

    if not timm.is_model(builder) or ("." in builder and builder not in _pretrained_tags()):
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed timm {timm.__version__}")


def _pretrained_tags() -> frozenset:
    import timm

    global _TAGS
    if _TAGS is None:
        _TAGS = frozenset(timm.list_pretrained())
    return _TAGS


_TAGS = None


# timm constructs a model's class once (build_model_with_cfg), with the arguments its tag resolves to (num_classes,
# in_chans, img_size, ...); what it does to the model afterwards (features_only, pruned) reads the architecture, never
# the tag (timm 1.0.31). So a variant whose construction equals its architecture's is that module (zoo.construction);
# tests/test_construction.py checks two tags of every timm module against their own full builds.
CONSTRUCTION_DECIDES = True


def build(builder: str, kwargs: dict):
    import timm

    return timm.create_model(builder, **{**kwargs, "pretrained": False})


def describe(builder: str, module, tag: str | None = None) -> dict:
    """A variant's size ("resnet50.a1_in1k") is its weights' published one, timm's cfg of the tag; an architecture's,
    the pretrained cfg its module was built with. The two agree, except where an entrypoint resolves another model's
    cfg (vitamin_xlarge_336 builds with vitamin_xlarge_256's)."""
    if "." in builder:
        from timm.models import get_pretrained_cfg

        cfg = get_pretrained_cfg(builder).to_dict()
    else:
        cfg = getattr(module, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    return {"task": "image-classification", "input_size": list(size) if size else None,
            "input": {"args": [list(size)]} if size else None}  # zoo.analysis input spec: one image batch


def versions() -> dict:
    import timm

    return {"torch": torch_version(), "timm": timm.__version__}


# --- pretrained variants (issue 11): a row per tag of timm.list_pretrained(), "resnet50.a1_in1k" -----------------

# The published validation sets (catalog/timm-results, see its README): CSV file -> the searchable prefix
# of its top1/top5 columns (zoo.columns).
RESULT_SETS = {
    "imagenet": "", "imagenet-real": "real_", "imagenetv2-matched-frequency": "v2_", "sketch": "sketch_",
    "imagenet-a": "a_", "imagenet-r": "r_",
}
_CARD_KEYS = ("paper_ids", "paper_name", "origin_url", "notes", "description")


def read_results(folder) -> dict:
    """{set: {tag: [row, ...]}} from timm's published results-SET.csv files, numbers as published
    (percent); a tag evaluated at several sizes has a row per size."""
    import csv
    from pathlib import Path

    out = {}
    for name in RESULT_SETS:
        path = Path(folder) / f"results-{name}.csv"
        if not path.is_file():
            raise InvalidArgument(f"{path} is missing: the results folder holds timm's published results-*.csv "
                                  f"({', '.join(RESULT_SETS)}), as catalog/timm-results does")
        by_tag: dict[str, list] = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                by_tag.setdefault(row.pop("model"), []).append({k: _number(v) for k, v in row.items()})
        out[name] = by_tag
    return out


def _number(text: str):
    try:
        return int(text) if text.lstrip("+-").isdigit() else float(text)
    except ValueError:
        return text  # "bicubic"


def variants(patterns=(), results: dict | None = None) -> list[dict]:
    """Every pretrained tag matching the patterns: its recipe (the tag itself: timm.create_model(tag) applies
    the tag's num_classes, in_chans and fixed image size) and what it records (zoo.columns)."""
    import timm
    from timm.models import get_pretrained_cfg

    rows = []
    for full in timm.list_pretrained(list(patterns) or ""):
        cfg = get_pretrained_cfg(full).to_dict()
        arch, tag = full.split(".", 1)
        metrics, floats = _metrics(full, cfg, results or {})
        rows.append({
            "builder": full, "kwargs": {}, "kind": "variant", "tag": tag, "arch_name": f"{NAME}/{arch}",
            # timm publishes no dataset field: its tag names the data (in1k, in21k_ft_in1k, laion2b_ft_in12k_in1k)
            "license": cfg.get("license"), "dataset": tag, "num_classes": cfg.get("num_classes"),
            "task": "image-classification" if cfg.get("num_classes") else "image-feature-extraction",
            "weights_bytes": None,  # timm's cfgs do not publish file sizes
            "weights_source": {"hf_hub_id": cfg.get("hf_hub_id"), "hf_hub_filename": cfg.get("hf_hub_filename"),
                               "url": cfg.get("url") or None},
            "preprocess": {k: _plain(cfg.get(k)) for k in PREPROCESS_KEYS},
            "card": {k: cfg[k] for k in _CARD_KEYS if cfg.get(k)},
            "metrics": metrics, **floats,
        })
    return rows


# The keys of a variant's preprocess (the loader builds its transform from them); torchvision's rows use the same
# keys where they mean the same, and add resize_size.
PREPROCESS_KEYS = ("input_size", "test_input_size", "crop_pct", "test_crop_pct", "crop_mode", "interpolation",
                   "mean", "std")


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _metrics(tag: str, cfg: dict, results: dict) -> tuple[dict, dict]:
    """The tag's published results, {set: {metric: value}}, and the searchable floats (top1, real_top1, ...).
    A tag evaluated at several sizes: the row at its test size (else its input size) is `set`, the others
    `set@SIZE`."""
    sizes = [s[-1] for s in (cfg.get("test_input_size"), cfg.get("input_size")) if s]
    metrics, floats = {}, {}
    for name, prefix in RESULT_SETS.items():
        found = results.get(name, {}).get(tag, [])
        if not found:
            continue
        main = next((r for size in sizes for r in found if r.get("img_size") == size), found[0])
        metrics[name] = main
        for other in found:
            if other is not main:
                metrics[f"{name}@{other.get('img_size')}"] = other
        floats[f"{prefix}top1"], floats[f"{prefix}top5"] = main.get("top1"), main.get("top5")
    return metrics, floats
