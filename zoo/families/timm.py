"""timm family: every name in timm.list_models(), built with pretrained=False; and every pretrained tag
(timm.list_pretrained(), "resnet50.a1_in1k") as a variant row with its published metadata and results."""

import math

from zoo.caching import register
from zoo.errors import InvalidArgument, UntrustedBuilder
from zoo.families import torch_version

NAME = "timm"
PUBLISHED_RESULTS = True  # catalog/timm-results: validation results, benchmarks, pretraining data
PRETRAINED = "timm-cfg"


def available(patterns=()) -> list[str]:
    import timm

    return timm.list_models(list(patterns) or "")


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    import timm

    if not timm.is_model(builder) or ("." in builder and builder not in _pretrained_tags()):
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed timm {timm.__version__}")


def _pretrained_tags() -> frozenset:
    import timm

    global _TAGS
    if _TAGS is None:
        _TAGS = frozenset(timm.list_pretrained())
    return _TAGS


_TAGS: frozenset[str] | None = None


def _forget_tags() -> None:
    global _TAGS
    _TAGS = None


register("timm pretrained tags", bound=1, clear=_forget_tags, size=lambda: int(_TAGS is not None))


# timm constructs a model's class once (build_model_with_cfg), with the arguments its tag resolves to (num_classes,
# in_chans, img_size, ...); what it does to the model afterwards (features_only, pruned) reads the architecture, never
# the tag (timm 1.0.31). So a variant whose construction equals its architecture's is that module (zoo.construction);
# tests/test_construction.py checks two tags of every timm module against their own full builds.
CONSTRUCTION_DECIDES = True


def build(builder: str, kwargs: dict):
    import timm

    return timm.create_model(builder, **{**kwargs, "pretrained": False})


def load_arguments(builder: str, kwargs: dict) -> dict | None:
    """timm's load_pretrained arguments (zoo.families.timm_loader), for a tag, or an architecture whose default cfg
    names published weights; a second meta build, at index time, that a pretrained load then skips."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(builder)
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        return None
    from zoo.families.timm_loader import record_for_index

    return record_for_index(builder, kwargs)


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
    return {
        "task": "image-classification",
        "input_size": list(size) if size else None,
        "input": {"args": [list(size)]} if size else None,
    }  # zoo.analysis input spec: one image batch


def versions() -> dict:
    import timm

    return {"torch": torch_version(), "timm": timm.__version__}


# --- pretrained variants: a row per tag of timm.list_pretrained(), "resnet50.a1_in1k" ----------------------------


# The published validation sets (catalog/timm-results, see its README): CSV file -> the searchable prefix
# of its top1/top5 columns (zoo.columns).
def results_folder() -> str | None:
    """The project's copy of timm's published data (catalog/timm-results, with its provenance); None where zoo
    runs without the checkout's catalog (installed from a wheel)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "catalog" / "timm-results"
    return str(folder) if folder.is_dir() else None


def variant_name(variant: dict) -> str:
    return variant["builder"]  # a timm tag names itself: "resnet50.a1_in1k"


def preprocess(info) -> dict:
    """The recorded preprocessing, else timm's pretrained cfg of the tag."""
    from timm.models import get_pretrained_cfg

    if isinstance(info.preprocess, dict) and info.preprocess.get("input_size"):
        return dict(info.preprocess)
    cfg = get_pretrained_cfg(info.builder)
    if cfg is None:
        raise InvalidArgument(f"timm has no pretrained cfg for {info.builder!r}")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items() if k in PREPROCESS_KEYS}


RESULT_SETS = {
    "imagenet": "",
    "imagenet-real": "real_",
    "imagenetv2-matched-frequency": "v2_",
    "sketch": "sketch_",
    "imagenet-a": "a_",
    "imagenet-r": "r_",
}
_CARD_KEYS = ("paper_ids", "paper_name", "origin_url", "notes", "description")


def read_results(folder) -> dict:
    """{set: {tag: [row, ...]}} from timm's published results-SET.csv files, numbers as published
    (percent); a tag evaluated at several sizes has a row per size; and "measured" (read_measured)."""
    if folder is None:
        folder = results_folder()
    if folder is None:
        raise InvalidArgument(
            "timm's published results (a checkout's catalog/timm-results) are not here: pass the "
            "folder that holds results-imagenet.csv (zoo index timm --pretrained --results DIR)"
        )
    import csv
    from pathlib import Path

    out = {}
    for name in RESULT_SETS:
        path = Path(folder) / f"results-{name}.csv"
        if not path.is_file():
            raise InvalidArgument(
                f"{path} is missing: the results folder holds timm's published results-*.csv "
                f"({', '.join(RESULT_SETS)}), as catalog/timm-results does"
            )
        by_tag: dict[str, list] = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                model = row.pop("model")
                by_tag.setdefault(model, []).append({k: _number(v, f"{path}: {model}: {k}") for k, v in row.items()})
        out[name] = by_tag
    out["measured"] = read_measured(folder)
    return out


def _number(text: str, where: str):
    try:
        value = int(text) if text.lstrip("+-").isdigit() else float(text)
    except ValueError:
        return text  # "bicubic"
    if not math.isfinite(value):  # float() reads "nan" and "inf": no number to record, search or send as JSON
        raise InvalidArgument(f"{where} is {text!r}, not a finite number: fix that cell, or leave it empty")
    return value


def variants(patterns=(), results: dict | None = None) -> list[dict]:
    """Every pretrained tag matching the patterns: its recipe (the tag itself: timm.create_model(tag) applies
    the tag's num_classes, in_chans and fixed image size) and what it records (zoo.columns)."""
    import timm
    from timm.models import get_pretrained_cfg

    results = results or {}
    rows = []
    for full in timm.list_pretrained(list(patterns) or ""):
        cfg = get_pretrained_cfg(full).to_dict()
        arch, tag = full.split(".", 1)
        metrics, floats = _metrics(full, cfg, results)
        if "measured" in results:  # a results folder with timm's benchmarks and metadata
            floats.update(
                measured(arch, cfg.get("input_size"), results["measured"]),
                pretrain=results["measured"].get("pretrain", {}).get(full),
            )
        rows.append(
            {
                "builder": full,
                "kwargs": {},
                "kind": "variant",
                "tag": tag,
                "arch_name": f"{NAME}/{arch}",
                # timm publishes no dataset field: its tag names the data (in1k, in21k_ft_in1k, laion2b_ft_in12k_in1k)
                "license": cfg.get("license"),
                "dataset": tag,
                "num_classes": cfg.get("num_classes"),
                "task": "image-classification" if cfg.get("num_classes") else "image-feature-extraction",
                "weights_bytes": None,  # timm's cfgs do not publish file sizes
                "weights_source": {
                    "hf_hub_id": cfg.get("hf_hub_id"),
                    "hf_hub_filename": cfg.get("hf_hub_filename"),
                    "url": cfg.get("url") or None,
                },
                "preprocess": {k: _plain(cfg.get(k)) for k in PREPROCESS_KEYS},
                "card": {k: cfg[k] for k in _CARD_KEYS if cfg.get(k)},
                "metrics": metrics,
                **floats,
            }
        )
    return rows


# The keys of a variant's preprocess (the loader builds its transform from them); torchvision's rows use the same
# keys where they mean the same, and add resize_size.
PREPROCESS_KEYS = (
    "input_size",
    "test_input_size",
    "crop_pct",
    "test_crop_pct",
    "crop_mode",
    "interpolation",
    "mean",
    "std",
)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _metrics(tag: str, cfg: dict, results: dict) -> tuple[dict, dict]:
    """The tag's published results, {set: {metric: value}}, and the searchable floats (top1, real_top1, ...), all
    at the tag's input size, so that they pair with its flops; the result at its larger test size is test_top1 and
    test_top5 (ImageNet-1k only) with test_input_size. A tag evaluated at several sizes: the row at its input size
    (else the first published) is `set`, the others `set@SIZE`."""
    size = (cfg.get("input_size") or [None])[-1]
    test = cfg.get("test_input_size") or ()
    metrics, floats = {}, {}
    for name, prefix in RESULT_SETS.items():
        found = results.get(name, {}).get(tag, [])
        if not found:
            continue
        main = next((r for r in found if r.get("img_size") == size), None)
        metrics[name] = main or found[0]
        for other in found:
            if other is not metrics[name]:
                metrics[f"{name}@{other.get('img_size')}"] = other
        if main is not None:  # never a number at another size in a column that says input_size
            floats[f"{prefix}top1"], floats[f"{prefix}top5"] = main.get("top1"), main.get("top5")
        at_test = next((r for r in found if test and r.get("img_size") == test[-1] != size), None)
        if name == "imagenet" and at_test is not None:
            floats.update(test_top1=at_test.get("top1"), test_top5=at_test.get("top5"), test_input_size=list(test))
    return metrics, floats


# timm's published throughput (catalog/timm-results, see its README): column (zoo.columns.THROUGHPUT) -> file.
# Each file measured architectures (not tags) at one or more sizes; a row takes the measurement at its own size.
BENCHMARKS = {
    "infer_4090_amp": "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
    "infer_5090_amp": "benchmark-infer-amp-nchw-pt291-cu130-5090.csv",
    "infer_pro6000_amp": "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
    "infer_i7_12700h_fp32": "benchmark-infer-fp32-nchw-pt240-cpu-i7_12700h-dynamo.csv",
    "train_3090_amp": "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",
}
PRETRAIN_FILE = "model_metadata-in1k.csv"


def read_measured(folder) -> dict:
    """{column: {(architecture, size): (samples/s, batch)}} from the benchmark files the folder holds, and
    {"pretrain": {tag: data}} from its model metadata (named by timm's older model names: an architecture's is its
    default tag's, a deprecated name's the tag timm maps it to)."""
    import csv
    from pathlib import Path

    out: dict[str, dict] = {}
    for column, file in BENCHMARKS.items():
        path, mode = Path(folder) / file, column.split("_", 1)[0]
        if path.is_file():
            with open(path, newline="") as f:
                out[column] = {
                    (r["model"], int(r[f"{mode}_img_size"])): (
                        _speed(r[f"{mode}_samples_per_sec"], f"{path}: {r['model']}"),
                        int(r[f"{mode}_batch_size"]),
                    )
                    for r in csv.DictReader(f)
                }
    path = Path(folder) / PRETRAIN_FILE
    if path.is_file():
        from timm.models._registry import _model_default_cfgs, get_deprecated_models

        renamed = get_deprecated_models()
        out["pretrain"] = {}
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                tag = renamed.get(row["model"], row["model"])
                if "." not in tag and tag in _model_default_cfgs:
                    tag = f"{tag}.{_model_default_cfgs[tag].tags[0]}"
                out["pretrain"][tag] = row["pretrain"]
    return out


def _speed(text: str, where: str) -> float:
    value = _number(text, where)
    if isinstance(value, str) or not value > 0:
        raise InvalidArgument(f"{where}: samples/s is {text!r}, not a positive number: fix that row")
    return float(value)


def architecture_columns(builder: str, input_size, results: dict) -> dict:
    """An architecture row's throughput columns from read_results (see measured)."""
    return measured(builder, input_size, results.get("measured", {}))


def measured(arch: str, input_size, data: dict) -> dict:
    """The throughput columns of a row of architecture `arch` (a timm model name) at its input size: empty
    where nothing was measured at that size, never another size's number."""
    size = input_size[-1] if input_size else None
    out = {}
    for column in BENCHMARKS:
        speed, batch = data.get(column, {}).get((arch, size), (None, None))
        out[column], out[f"{column}_batch"] = speed, batch
    return out
