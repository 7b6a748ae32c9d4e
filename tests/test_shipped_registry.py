"""The shipped registry.db: it holds the whole installed zoo, and the code still builds what it records."""

import random

import pytest

import zoo
from tests.conftest import ROOT
from zoo.families import family
from zoo.indexing import indexer
from zoo.model_info import decode_tensors
from zoo.recipe import Recipe

SHIPPED = ROOT / "registry.db"
FAMILIES = ["timm", "torchvision"]
# Always rebuilt: ties, non-persistent buffers, values read while building, detection, video, quantizable.
PINNED = [
    "timm/resnet50",
    "timm/swin_tiny_patch4_window7_224",
    "timm/regnety_040",
    "timm/vit_base_patch16_224",
    "timm/maxvit_tiny_tf_224",
    "torchvision/maskrcnn_resnet50_fpn",
    "torchvision/r3d_18",
    "torchvision/quantized_resnet50",
    "torchvision/raft_small",
]
COMPARED = (
    "family",
    "builder",
    "kwargs",
    "arch",
    "task",
    "input_size",
    "versions",
    "dtype",
    "params",
    "trainable",
    "buffers",
    "tensors",
    "param_bytes",
    "buffer_bytes",
    "bytes",
    "status",
    "error",
    "source_hash",
    "flops",
    "macs",
    "train_activation_bytes",
    "peak_activation_bytes",
    "output_shapes",
    "scan_status",
    "scan_error",
    "plan_shapes",
    "plan_activations",
)


@pytest.fixture(scope="module")
def shipped():
    if not SHIPPED.exists():
        pytest.fail("registry.db is missing: build it with `make registry`")
    return zoo.connect(str(SHIPPED))


@pytest.mark.parametrize("family_name", FAMILIES)
def test_registry_holds_every_installed_model(shipped, family_name):
    recorded = {i.name for i in shipped.search(f"family={family_name} and kind=architecture", limit=None)}
    installed = {f"{family_name}/{b}" for b in family(family_name).available()}
    assert sorted(installed - recorded) == [], "run `make registry`"
    assert sorted(recorded - installed) == []


def _sample() -> list[str]:
    rng = random.Random(20261130)
    names = []
    for family_name in FAMILIES:
        available = family(family_name).available()
        names += [f"{family_name}/{b}" for b in rng.sample(available, 12)]
    return sorted(set(names + PINNED))


@pytest.mark.parametrize("name", _sample())
def test_a_rebuild_matches_the_shipped_row(shipped, name):
    from sqlalchemy import select

    from zoo.registry import db
    from zoo.registry.tables import Model, ModelTensors

    with db.session(shipped.url) as s:
        row = s.scalar(select(Model).where(Model.name == name))
        blob = s.scalar(select(ModelTensors.data).where(ModelTensors.model_id == row.id))
    family_name, builder = name.split("/", 1)
    record, table = indexer.record_of(name, Recipe(family_name, builder))
    assert {k: record[k] for k in COMPARED} == {k: getattr(row, k) for k in COMPARED}
    assert table == decode_tensors(blob)


# ---------------------------------------------------------------------------------------------
# Pretrained variants: every timm tag and torchvision weights enum, as `make registry` records them.


def _variant_names(family_name: str) -> set[str]:
    if family_name == "timm":
        import timm

        return {f"timm/{t}" for t in timm.list_pretrained()}
    from torchvision.models import get_model_weights, list_models

    return {f"torchvision/{m}.{w.name}" for m in list_models() for w in get_model_weights(m)}


@pytest.mark.parametrize("family_name", FAMILIES)
def test_registry_holds_every_pretrained_variant(shipped, family_name):
    rows = shipped.search(
        f"family={family_name} and kind=variant", limit=None, fields=("name", "status", "error", "arch_name")
    )
    assert sorted(_variant_names(family_name) - {r["name"] for r in rows}) == [], "run `make registry`"
    assert sorted({r["name"] for r in rows} - _variant_names(family_name)) == []
    assert all(r["error"] for r in rows if r["status"] != "ok")  # a failure says why
    # every variant names an architecture the registry holds
    architectures = {
        i["name"] for i in shipped.search(f"family={family_name} and kind=architecture", limit=None, fields=("name",))
    }
    assert {r["arch_name"] for r in rows} <= architectures


def _no_nan(metrics: dict) -> dict:
    """torchvision publishes NaN for a metric it did not measure (vgg16's IMAGENET1K_FEATURES): recorded as null."""
    return {k: {m: None if v != v else v for m, v in d.items()} for k, d in metrics.items()}


def test_shipped_torchvision_variants_have_the_published_params_and_metrics(shipped):
    from torchvision.models import get_model_weights

    for row in shipped.search("family=torchvision and kind=variant", limit=None):
        meta = get_model_weights(row.builder)[row.tag].meta
        assert row.metrics == _no_nan(meta["_metrics"]), row.name
        assert row.params == meta["num_params"], row.name  # quantized: the float model's (weights_kwargs)


def test_shipped_timm_variants_have_the_published_results(shipped):
    import csv

    with open(ROOT / "catalog" / "timm-results" / "results-imagenet.csv", newline="") as f:
        published: dict[str, set] = {}
        for r in csv.DictReader(f):
            published.setdefault(r["model"], set()).add(float(r["top1"]))
    rows = {
        r["name"]: r
        for r in shipped.search("family=timm and kind=variant", limit=None, fields=("name", "top1", "metrics"))
    }
    for tag, top1s in published.items():
        row = rows[f"timm/{tag}"]
        assert row["top1"] in top1s and row["metrics"]["imagenet"]["top1"] == row["top1"], tag
    assert all(r["top1"] is None for n, r in rows.items() if n.removeprefix("timm/") not in published)


VARIANT_PINNED = [
    "timm/resnet50.a1_in1k",
    "timm/vit_small_patch14_dinov2.lvd142m",
    "timm/vit_tiny_patch16_224.augreg_in21k",
    "torchvision/vit_h_14.IMAGENET1K_SWAG_E2E_V1",
    "torchvision/fasterrcnn_resnet50_fpn.COCO_V1",
    "torchvision/googlenet.IMAGENET1K_V1",
    "torchvision/deeplabv3_resnet50.COCO_WITH_VOC_LABELS_V1",
]
VARIANT_COMPARED = COMPARED + (
    "kind",
    "arch_name",
    "tag",
    "license",
    "dataset",
    "num_classes",
    "weights_bytes",
    "weights_source",
    "preprocess",
    "card",
    "metrics",
    "top1",
    "top5",
    "box_map",
)


def _variant_sample() -> list[str]:
    rng = random.Random(20261201)
    names = []
    for family_name in FAMILIES:
        names += rng.sample(sorted(_variant_names(family_name)), 12)
    return sorted(set(names + VARIANT_PINNED))


@pytest.mark.parametrize("name", _variant_sample())
def test_a_rebuild_of_a_variant_matches_the_shipped_row(shipped, name):
    from sqlalchemy import select

    from zoo.registry import db
    from zoo.registry.tables import Model, ModelTensors

    family_name, short = name.split("/", 1)
    ((full, (recipe, variant)),) = indexer.wanted_variants(family_name, [short]).items()
    assert full == name
    with db.session(shipped.url) as s:
        row = s.scalar(select(Model).where(Model.name == name))
        blob = s.scalar(select(ModelTensors.data).where(ModelTensors.model_id == row.id))
    record, table = indexer.record_of(name, recipe, variant=variant)
    assert {k: record.get(k) for k in VARIANT_COMPARED} == {k: getattr(row, k) for k in VARIANT_COMPARED}
    assert table == (decode_tensors(blob) if blob is not None else None)
