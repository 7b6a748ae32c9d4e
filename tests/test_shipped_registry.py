"""The shipped registry.db: it holds the whole installed zoo, and the code still builds what it records."""

import random

import pytest

import zoo
from tests.conftest import ROOT
from zoo import indexer
from zoo.families import family
from zoo.recipe import Recipe
from zoo.model_info import decode_tensors

SHIPPED = ROOT / "registry.db"
FAMILIES = ["timm", "torchvision"]
# Always rebuilt: ties, non-persistent buffers, values read while building, detection, video, quantizable.
PINNED = ["timm/resnet50", "timm/swin_tiny_patch4_window7_224", "timm/regnety_040", "timm/vit_base_patch16_224",
          "timm/maxvit_tiny_tf_224", "torchvision/maskrcnn_resnet50_fpn", "torchvision/r3d_18",
          "torchvision/quantized_resnet50", "torchvision/raft_small"]
COMPARED = ("family", "builder", "kwargs", "arch", "task", "input_size", "versions", "dtype", "params", "trainable",
            "buffers", "tensors", "param_bytes", "buffer_bytes", "bytes", "status", "error", "source_hash",
            "flops", "macs", "train_activation_bytes", "peak_activation_bytes", "output_shapes", "scan_status",
            "scan_error")


@pytest.fixture(scope="module")
def shipped():
    if not SHIPPED.exists():
        pytest.fail("registry.db is missing: build it with `make registry`")
    return zoo.connect(str(SHIPPED))


@pytest.mark.parametrize("family_name", FAMILIES)
def test_registry_holds_every_installed_model(shipped, family_name):
    recorded = {i.name for i in shipped.search(f"family={family_name}", limit=None)}
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
