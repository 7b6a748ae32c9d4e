"""Pretrained variants: a row per timm tag and torchvision weights enum, built with the kwargs its
weights need, with its published metadata and metrics; search over them; the CLI. Expected values come from
the libraries' own metadata (torchvision's Weights.meta, timm's pretrained cfgs) and timm's published CSVs,
read here independently of zoo."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, cli_json, run_cli
from zoo.errors import InvalidArgument

RESULTS = ROOT / "catalog" / "timm-results"
# Heads of every kind (1k, 21k = 21843/21841, 11k = 11821/11221, 512-d CLIP, 0 = features), fixed-size ViTs
# (384, DINOv2 at 518), squash crops, a tag without a hub repo (URL only), one timm publishes no results for.
SAMPLE_TIMM = [
    "resnet18.a1_in1k",
    "resnet18.tv_in1k",
    "resnet50.a1_in1k",
    "efficientnet_b0.ra_in1k",
    "mobilenetv3_small_100.lamb_in1k",
    "vit_tiny_patch16_224.augreg_in21k",
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "vit_tiny_patch16_384.augreg_in21k_ft_in1k",
    "convnext_nano.in12k",
    "mobilenetv3_large_100.miil_in21k",
    "tiny_vit_5m_224.dist_in22k",
    "convnextv2_femto.fcmae",
    "vit_small_patch14_dinov2.lvd142m",
    "convnext_tiny.in12k_ft_in1k_384",
    "legacy_seresnet18.in1k",
    "deit_tiny_patch16_224.fb_in1k",
    "vit_xsmall_patch16_clip_224.tinyclip_yfcc15m",
    "cpubone_nano.r224_in1k",
]
SAMPLE_TORCHVISION = [
    "resnet18.*",
    "mobilenet_v3_small.*",
    "googlenet.*",
    "quantized_mobilenet_v2.*",
    "fasterrcnn_mobilenet_v3_large_320_fpn.*",
    "lraspp_mobilenet_v3_large.*",
    "r3d_18.*",
    "vgg16.IMAGENET1K_FEATURES",
]


@pytest.fixture(scope="module")
def variants_url(tmp_path_factory) -> str:
    """A registry of the sample variants and two architectures; treat it as read-only."""
    from zoo.indexing import indexer

    url = f"sqlite:///{tmp_path_factory.mktemp('variants') / 'variants.db'}"
    timm_outcome = indexer.index_family(url, "timm", SAMPLE_TIMM, pretrained=True)
    assert not timm_outcome.failed and len(timm_outcome.indexed) == len(SAMPLE_TIMM)
    tv_outcome = indexer.index_family(url, "torchvision", SAMPLE_TORCHVISION, pretrained=True)
    assert not tv_outcome.failed
    indexer.index_family(url, "timm", ["resnet18"])
    indexer.index_family(url, "torchvision", ["resnet18"])
    return url


@pytest.fixture(scope="module")
def registry(variants_url):
    import zoo

    return zoo.connect(variants_url)


def _weights(builder: str, tag: str):
    from torchvision.models import get_model_weights

    return get_model_weights(builder)[tag]


def _all_torchvision_weights() -> list[str]:
    from torchvision.models import get_model_weights, list_models

    return [f"{m}.{w.name}" for m in list_models() for w in get_model_weights(m)]


# ---------------------------------------------------------------------------------------------
# torchvision: the variant is the model torchvision measured for its weights


def test_there_are_166_torchvision_weights_and_1826_timm_tags():
    import timm

    assert len(_all_torchvision_weights()) == 166
    assert len(timm.list_pretrained()) == 1826
    assert set(SAMPLE_TIMM) <= set(timm.list_pretrained())


@pytest.mark.slow
@pytest.mark.parametrize("full", _all_torchvision_weights())
def test_every_torchvision_weights_has_its_published_params_and_ops(full):
    """num_params exactly, _ops (GMACs) within 1% for classification at the weights' own resolution.
    Quantized weights: num_params and _ops are the float model's (the int8 model holds no parameters), and so
    is the row (see zoo.families.torchvision.weights_kwargs)."""
    from zoo.families import torchvision as tv
    from zoo.indexing.indexer import record_of
    from zoo.recipe import Recipe

    (variant,) = [v for v in tv.variants([full])]
    meta = _weights(variant["builder"], variant["tag"]).meta
    record, _ = record_of(
        f"torchvision/{full}", Recipe("torchvision", variant["builder"], variant["kwargs"]), variant=variant
    )
    assert record["status"] == "ok", record["error"]
    assert record["params"] == meta["num_params"]
    if variant["task"] == "image-classification":
        ops = meta["_ops"] * 1e9
        assert abs(record["macs"] - ops) <= max(0.01 * ops, 0.0005e9), (record["macs"], meta["_ops"])
        crop = _weights(variant["builder"], variant["tag"]).transforms().crop_size
        assert json.loads(record["input_size"])[-2:] == (list(crop) * 2)[:2]


@pytest.mark.parametrize(
    "full",
    [
        "googlenet.IMAGENET1K_V1",
        "deeplabv3_mobilenet_v3_large.COCO_WITH_VOC_LABELS_V1",
        "fasterrcnn_mobilenet_v3_large_320_fpn.COCO_V1",
    ],
)
def test_torchvision_loads_its_weights_into_exactly_the_variants_tensors(full, tmp_path, monkeypatch):
    """A checkpoint with the variant's tensor names and shapes, placed where torch hub caches the weights'
    file: torchvision's own builder with weights=W loads it strictly, and builds the same module classes
    (frozen norms, dropped aux heads, aux classifier)."""
    from torchvision.models import get_model

    from zoo.build import build_meta
    from zoo.families import torchvision as tv
    from zoo.recipe import Recipe

    (variant,) = tv.variants([full])
    ours = build_meta(Recipe("torchvision", variant["builder"], variant["kwargs"]))
    weights = _weights(variant["builder"], variant["tag"])
    ignored = variant["weights_source"].get("ignore_prefixes")
    # googlenet's file also holds the aux heads: torchvision loads it with them, then drops them
    in_file = (
        build_meta(Recipe("torchvision", variant["builder"], {**variant["kwargs"], "aux_logits": True}))
        if ignored
        else ours
    )
    state = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in in_file.state_dict().items()}
    extra = set(state) - set(ours.state_dict())
    assert bool(extra) == bool(ignored) and all(k.startswith(tuple(ignored or ())) for k in extra)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(state, tmp_path / "hub" / "checkpoints" / variant["weights_source"]["file"])
    theirs = get_model(variant["builder"], weights=weights)  # strict load: raises on any other tensor
    assert [(n, type(m).__name__) for n, m in theirs.named_modules()] == [
        (n, type(m).__name__) for n, m in ours.named_modules()
    ]
    assert sum(p.numel() for p in ours.parameters()) == weights.meta["num_params"]


def test_torchvision_metadata_is_published_metadata(registry):
    for info in registry.search("family=torchvision and kind=variant", limit=None):
        builder, tag = info.builder, info.tag
        assert info.name == f"torchvision/{builder}.{tag}" and info.arch_name == f"torchvision/{builder}"
        weights = _weights(builder, tag)
        published = {
            k: {m: None if v != v else v for m, v in d.items()}  # NaN: not measured
            for k, d in weights.meta["_metrics"].items()
        }
        assert info.metrics == published
        imagenet = published.get("ImageNet-1K", {})
        assert (info.top1, info.top5) == (imagenet.get("acc@1"), imagenet.get("acc@5"))
        assert info.box_map == weights.meta["_metrics"].get("COCO-val2017", {}).get("box_map")
        kinetics = weights.meta["_metrics"].get("Kinetics-400", {})
        assert (info.k400_top1, info.k400_top5) == (kinetics.get("acc@1"), kinetics.get("acc@5"))
        voc = weights.meta["_metrics"].get("COCO-val2017-VOC-labels", {})
        assert (info.miou, info.pixel_acc) == (voc.get("miou"), voc.get("pixel_acc"))
        file = weights.url.rsplit("/", 1)[1]
        assert info.weights_source["url"] == weights.url and info.weights_source["file"] == file
        assert info.weights_source["sha256_prefix"] == (file.rsplit("-", 1)[1].split(".")[0] if "-" in file else None)
        assert abs(info.weights_bytes - weights.meta["_file_size"] * 2**20) <= 0.0005 * 2**20
        categories = weights.meta["categories"]
        assert info.num_classes == (len(categories) if categories is not None else None)
        transforms = weights.transforms()
        for key in ("mean", "std", "resize_size"):
            assert info.preprocess[key] == (list(getattr(transforms, key)) if hasattr(transforms, key) else None)
    r18 = registry.info("torchvision/resnet18.IMAGENET1K_V1")
    assert r18.weights_source["sha256_prefix"] == "f37072fd" and r18.dataset == "ImageNet-1K"
    assert r18.preprocess["input_size"] == [3, 224, 224] and r18.preprocess["interpolation"] == "bilinear"
    features = registry.info("vgg16.IMAGENET1K_FEATURES")  # published NaN accuracy, no categories
    assert features.top1 is None and features.num_classes is None and features.params == 138357544


def test_quantized_weights_are_sized_as_the_float_model_torchvision_publishes(registry):
    from torchvision.models import get_weight

    info = registry.info("torchvision/quantized_mobilenet_v2.IMAGENET1K_QNNPACK_V1")
    meta = get_weight("MobileNet_V2_QuantizedWeights.IMAGENET1K_QNNPACK_V1").meta
    assert info.status == "ok" and info.kind == "variant" and "int8" in info.card["notes"]
    assert info.top1 == meta["_metrics"]["ImageNet-1K"]["acc@1"] and info.params == meta["num_params"]
    assert json.loads(json.dumps(info.weights_source))["file"] == "mobilenet_v2_qnnpack_37f702c5.pth"


# ---------------------------------------------------------------------------------------------
# timm: every tag as create_model(tag) builds it, with timm's published results


def _plain_timm(tag: str):
    import timm

    with torch.device("meta"):
        return timm.create_model(tag)


def test_timm_variants_are_what_create_model_builds_for_the_tag(registry):
    from timm.models import get_pretrained_cfg

    for tag in SAMPLE_TIMM:
        info = registry.info(f"timm/{tag}")
        plain = _plain_timm(tag)
        cfg = get_pretrained_cfg(tag)
        arch, _, short = tag.partition(".")
        assert (info.status, info.kind, info.tag, info.arch_name, info.builder) == (
            "ok",
            "variant",
            short,
            f"timm/{arch}",
            tag,
        )
        assert info.params == sum(p.numel() for p in plain.parameters())
        assert info.num_classes == cfg.num_classes == plain.num_classes
        assert list(info.input_size) == list(cfg.input_size)  # the analysis ran at the weights' size
        assert info.flops > 0 and info.scan_status == "ok"
        assert info.license == cfg.license
        assert info.weights_source == {
            "hf_hub_id": cfg.hf_hub_id,
            "hf_hub_filename": cfg.hf_hub_filename,
            "url": cfg.url or None,
        }
        assert info.preprocess["crop_pct"] == cfg.crop_pct and info.preprocess["crop_mode"] == cfg.crop_mode
        assert info.preprocess["mean"] == list(cfg.mean) and info.preprocess["interpolation"] == cfg.interpolation
        assert info.task == ("image-classification" if cfg.num_classes else "image-feature-extraction")
    # the heads differ from the architecture's default where the weights say so
    assert registry.info("timm/vit_tiny_patch16_224.augreg_in21k").num_classes == 21843
    assert registry.info("timm/convnext_nano.in12k").num_classes == 11821
    assert registry.info("timm/vit_small_patch14_dinov2.lvd142m").input_size == (3, 518, 518)
    assert registry.info("timm/legacy_seresnet18.in1k").weights_source["hf_hub_id"] is None


def test_a_timm_variant_is_analysed_at_its_weights_published_size():
    """vitamin_xlarge_336's entrypoint resolves vitamin_xlarge_256's cfg, so the module timm builds for the tag
    says 256; the weights' published cfg (timm's registry entry for the tag) says 336, and so does the row."""
    from timm.models import get_pretrained_cfg

    from zoo.build import build_meta
    from zoo.indexing import indexer

    tag = "vitamin_xlarge_336.datacomp1b_clip"
    ((name, (recipe, variant)),) = indexer.wanted_variants("timm", [tag]).items()
    record, _ = indexer.record_of(name, recipe, variant=variant)
    assert tuple(get_pretrained_cfg(tag).input_size) == (3, 336, 336)
    assert json.loads(record["input_size"]) == [3, 336, 336] and record["scan_status"] == "ok"
    assert json.loads(record["inputs"])[0]["shape"] == [1, 3, 336, 336]
    assert build_meta(recipe).pretrained_cfg["input_size"] == (3, 256, 256)  # what timm's module carries


def _published(file: str) -> dict:
    with open(RESULTS / f"results-{file}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict = {}
    for row in rows:
        out.setdefault(row["model"], []).append(row)
    return out


@pytest.mark.parametrize(
    "file,prefix",
    [
        ("imagenet", ""),
        ("imagenet-real", "real_"),
        ("imagenetv2-matched-frequency", "v2_"),
        ("sketch", "sketch_"),
        ("imagenet-a", "a_"),
        ("imagenet-r", "r_"),
    ],
)
def test_timm_metrics_are_the_published_csv_values(registry, file, prefix):
    """At the tag's input size (where its flops are) where timm evaluated it at several sizes (the other sizes are
    kept too)."""
    from timm.models import get_pretrained_cfg

    published = _published(file)
    checked = 0
    for tag in SAMPLE_TIMM:
        info = registry.info(f"timm/{tag}")
        rows = published.get(tag)
        if not rows:
            assert getattr(info, f"{prefix}top1") is None and file not in (info.metrics or {})
            continue
        row = next(r for r in rows if int(r["img_size"]) == get_pretrained_cfg(tag).input_size[-1])
        assert getattr(info, f"{prefix}top1") == float(row["top1"])
        assert getattr(info, f"{prefix}top5") == float(row["top5"])
        assert info.metrics[file]["top1"] == float(row["top1"]) and info.metrics[file]["img_size"] == int(
            row["img_size"]
        )
        for other in rows:
            if other is not row:
                assert info.metrics[f"{file}@{other['img_size']}"]["top1"] == float(other["top1"])
        checked += 1
    assert checked >= 10
    assert registry.info("timm/resnet50.a1_in1k").metrics.keys() >= {file, f"{file}@288"}  # two sizes published


def test_the_shipped_results_keep_their_provenance():
    readme = (RESULTS / "README.md").read_text()
    assert "huggingface/pytorch-image-models" in readme and "aa4b5850c1543fa488abf260f18390eda46cf85d" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert "index installed --results catalog/timm-results" in makefile  # make registry reads them


# ---------------------------------------------------------------------------------------------
# search, names


EXPRESSIONS = [
    (
        "top1>80 and params<30M",
        lambda i: i.top1 is not None and i.top1 > 80 and i.params is not None and i.params < 30e6,
    ),
    (
        "task=image-classification and flops<5G and license=apache-2.0",
        lambda i: (
            i.task == "image-classification" and i.flops is not None and i.flops < 5e9 and i.license == "apache-2.0"
        ),
    ),
    ("kind=variant and not top1>0", lambda i: i.kind == "variant" and not (i.top1 is not None and i.top1 > 0)),
    ("kind=architecture", lambda i: i.kind == "architecture"),
    (
        "real_top1>=80 or box_map>20 or k400_top1>60",
        lambda i: (
            any(v is not None and v > t for v, t in ((i.box_map, 20), (i.k400_top1, 60)))
            or (i.real_top1 is not None and i.real_top1 >= 80)
        ),
    ),
    ("num_classes>1000 and dataset~'*in2*'", lambda i: (i.num_classes or 0) > 1000 and "in2" in (i.dataset or "")),
    ("arch_name=timm/resnet18", lambda i: i.arch_name == "timm/resnet18"),
]


@pytest.mark.parametrize("expression,keep", EXPRESSIONS, ids=[e for e, _ in EXPRESSIONS])
def test_search_over_variants_agrees_with_a_python_filter(registry, expression, keep):
    everything = registry.search(None, limit=None)
    expected = sorted(i.name for i in everything if keep(i))
    assert sorted(i.name for i in registry.search(expression, limit=None)) == expected
    assert expected  # every expression selects something in the sample


def test_search_orders_by_a_metric(registry):
    found = registry.search("top1>0", order_by="-top1", limit=None)
    assert [i.top1 for i in found] == sorted((i.top1 for i in found), reverse=True) and len(found) >= 10


def test_bare_names_find_variants_and_architectures_keep_theirs(registry):
    assert registry.info("resnet50.a1_in1k").name == "timm/resnet50.a1_in1k"
    assert registry.info("resnet18.IMAGENET1K_V1").name == "torchvision/resnet18.IMAGENET1K_V1"
    resnet = registry.info("timm/resnet18")
    assert resnet.kind == "architecture" and resnet.arch_name == "timm/resnet18" and resnet.tag is None
    arch, variants = registry.variants("resnet18.a1_in1k")
    assert arch == "timm/resnet18" and [v.name for v in variants] == ["timm/resnet18.a1_in1k", "timm/resnet18.tv_in1k"]
    arch, variants = registry.variants("timm/resnet50")  # the architecture itself is not indexed here
    assert arch == "timm/resnet50" and [v.tag for v in variants] == ["a1_in1k"]


def test_index_refuses_bad_variant_requests_before_touching_the_registry(tmp_path):
    import zoo

    z = zoo.connect(str(tmp_path / "r.db"))
    with pytest.raises(InvalidArgument, match="results"):
        z.index("torchvision", ["resnet18.*"], pretrained=True, results=str(RESULTS))
    with pytest.raises(InvalidArgument, match="pretrained"):
        z.index("timm", ["resnet18"], results=str(RESULTS))
    with pytest.raises(InvalidArgument, match="results-imagenet.csv"):
        z.index("timm", ["resnet18.a1_in1k"], pretrained=True, results=str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="no pretrained variants"):
        z.index("user", [], pretrained=True)
    assert not (tmp_path / "r.db").exists()


def test_an_unchanged_variant_is_not_rebuilt(variants_url):
    from zoo.indexing import indexer

    outcome = indexer.index_family(variants_url, "timm", ["resnet18.a1_in1k", "resnet18.tv_in1k"], pretrained=True)
    assert outcome.unchanged == ["timm/resnet18.a1_in1k", "timm/resnet18.tv_in1k"] and not outcome.indexed


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_search_shows_the_metric_it_filters_on(variants_url):
    out = run_cli("search", "top1>80", "--sort", "-top1", registry=variants_url).stdout.splitlines()
    assert out[0].split()[:2] == ["name", "top1"]
    top = [float(line.split()[1]) for line in out[1:]]
    assert top == sorted(top, reverse=True) and min(top) > 80
    found = cli_json("search", "kind=variant and top1>80", registry=variants_url)
    assert {f["name"] for f in found} == {
        i.name for i in __import__("zoo").connect(variants_url).search("kind=variant and top1>80")
    }


def test_cli_show_a_variant(variants_url):
    out = run_cli("show", "timm/resnet50.a1_in1k", registry=variants_url).stdout
    for expected in (
        "pretrained variant of timm/resnet50, tag a1_in1k",
        "apache-2.0",
        "hf_hub_id timm/resnet50.a1_in1k",
        "crop_pct 0.95",
        "interpolation bicubic",
        "metrics imagenet ",
        "top1 81.24",
        "arXiv:2110.00476",
    ):
        assert expected in out, expected
    shown = cli_json("show", "torchvision/resnet18.IMAGENET1K_V1", registry=variants_url)
    assert shown["metrics"] == {"ImageNet-1K": {"acc@1": 69.758, "acc@5": 89.078}}
    assert shown["weights_source"]["sha256_prefix"] == "f37072fd" and shown["kind"] == "variant"


def test_cli_weights_list(variants_url):
    out = run_cli("weights", "list", "timm/resnet18", registry=variants_url).stdout.splitlines()
    assert out[0].split()[:3] == ["name", "tag", "top1"]
    assert [line.split()[0] for line in out[1:]] == ["timm/resnet18.a1_in1k", "timm/resnet18.tv_in1k"]
    listed = cli_json("weights", "list", "resnet18.IMAGENET1K_V1", registry=variants_url)
    assert listed["architecture"] == "torchvision/resnet18"
    assert [v["tag"] for v in listed["variants"]] == ["IMAGENET1K_V1"] and listed["tags"] == []
    missing = run_cli("weights", "list", "nope_net", registry=variants_url, check=False)
    assert missing.returncode == 1 and "no model named 'nope_net'" in missing.stderr


@pytest.mark.parametrize(
    "name",
    [
        "timm/resnet18",
        "resnet18.IMAGENET1K_V1",
        "timm/resnet50",
        "resnet50",
        "efficientnet_b0",
        "torchvision/googlenet",
        "resnet18",
        "nope_net",
        "net50",
    ],
)
def test_listing_variants_reads_sqlite_as_the_sqlalchemy_path_does(variants_url, name):
    """lite.variants (`zoo weights list` without SQLAlchemy) gives store.variants_of's answer, or None where that
    is an error (an ambiguous or unknown name), so the SQLAlchemy path raises it with the close names."""
    from zoo.errors import AmbiguousName, ModelNotFound
    from zoo.registry import db, lite, store

    with db.session(variants_url) as s:
        try:
            expected = store.variants_of(s, name)
        except (AmbiguousName, ModelNotFound):
            expected = None
    assert lite.variants(variants_url, name) == expected
    assert expected is not None or name in ("resnet18", "nope_net", "net50")  # every other name lists variants


def test_weights_list_never_imports_sqlalchemy(variants_url):
    code = (
        "import sys, zoo.cli\n"
        "assert zoo.cli.main(['weights', 'list', 'timm/resnet50']) == 0\n"
        "assert zoo.cli.main(['weights', 'list', 'resnet18.IMAGENET1K_V1', '--json']) == 0\n"
        "assert 'sqlalchemy' not in sys.modules, [m for m in sys.modules if m.startswith('sqlalchemy')]\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        env={"ZOO_REGISTRY": variants_url.removeprefix("sqlite:///"), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "timm/resnet50.a1_in1k" in out and '"architecture": "torchvision/resnet18"' in out


def test_cli_index_pretrained_counts_and_skips_unchanged_variants(tmp_path):
    db = str(tmp_path / "cli.db")
    out = run_cli(
        "--registry",
        db,
        "index",
        "torchvision",
        "--pretrained",
        "quantized_shufflenet_v2_x0_5.*",
        "shufflenet_v2_x0_5.*",
        "-q",
    ).stdout
    assert "torchvision: 2 indexed, 0 unchanged, 0 failed" in out
    again = cli_json("--registry", db, "index", "torchvision", "--pretrained", "shufflenet_v2_x0_5.*")
    assert again == {"indexed": 0, "unchanged": 1, "failed": {}}
    bad = run_cli("--registry", db, "index", "torchvision", "--pretrained", "--results", str(RESULTS), check=False)
    assert bad.returncode == 2 and "unrecognized arguments: --results" in bad.stderr  # timm's results: not its flag
