"""Structure digests (zoo.structure): a build identical to one already analysed reuses that analysis, and
every figure recorded that way equals what its own analysis records."""

import functools

import pytest
import torch
from torch import nn

import zoo
from tests.conftest import cli_json
from zoo.build import build_meta
from zoo.columns import ANALYSIS
from zoo.indexing import indexer
from zoo.recipe import Recipe
from zoo.structure import structure_digest

SPEC = {"shape": [1, 3, 224, 224]}


def _meta(recipe: Recipe) -> nn.Module:
    return build_meta(recipe)


def _analysis(registry, name: str) -> dict:
    row = registry.search(f"name='{name}'", fields=("name", *(c.name for c in ANALYSIS)))[0]
    return {c.name: row[c.name] for c in ANALYSIS}


def test_two_builds_of_one_model_share_a_digest_and_an_input_change_splits_them():
    first, second = _meta(Recipe("timm", "resnet18")), _meta(Recipe("timm", "resnet18"))
    assert structure_digest(first, SPEC) == structure_digest(second, SPEC) is not None
    assert structure_digest(first, SPEC) != structure_digest(first, {"shape": [1, 3, 160, 160]})


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m, "transform_input", True),  # a flag the forward reads, no tensor changes
        lambda m: setattr(m.fc, "weight", nn.Parameter(torch.empty(10, 2048, device="meta"))),  # a shape
        lambda m: setattr(m.fc, "weight", nn.Parameter(torch.empty(1000, 2048, device="meta", dtype=torch.float16))),
        lambda m: setattr(m.Mixed_5b.branch1x1.conv, "stride", (2, 2)),  # a hyperparameter of a submodule
        lambda m: setattr(m, "aux", functools.partial(torch.relu)),
        lambda m: m.fc.register_forward_hook(lambda *a: None),
    ],
)
def test_any_change_the_forward_could_see_changes_the_digest(change):
    base = _meta(Recipe("torchvision", "inception_v3", {"aux_logits": False, "init_weights": False}))
    changed = _meta(Recipe("torchvision", "inception_v3", {"aux_logits": False, "init_weights": False}))
    change(changed)
    assert structure_digest(changed, SPEC) != structure_digest(base, SPEC)


def test_what_the_digest_cannot_describe_makes_the_module_undigestible():
    scale = 3
    closure = _meta(Recipe("timm", "resnet18"))
    closure.act = lambda x: x * scale  # what it computes lives in the closure, not in anything hashed
    real = _meta(Recipe("timm", "resnet18"))
    real.fc.register_buffer("table", torch.zeros(3))  # a real tensor's values are not hashed
    for module in (closure, real):
        assert structure_digest(module, SPEC) is None


def test_a_variant_that_builds_its_architecture_reuses_its_analysis_and_records_the_same(tmp_path):
    """resnet18.a1_in1k and .a2_in1k build resnet18 unchanged at 224: one analysis, three rows; each row
    equals what a registry that analyses every model itself records (force: no reuse from the registry)."""
    reused_url, fresh_url = f"sqlite:///{tmp_path}/reused.db", f"sqlite:///{tmp_path}/fresh.db"
    arch = indexer.index_family(reused_url, "timm", ["resnet18"])
    variants = indexer.index_family(reused_url, "timm", ["resnet18.a1_in1k", "resnet18.a2_in1k"], pretrained=True)
    assert not arch.timings["timm/resnet18"]["analysis_reused"]
    assert all(t["analysis_reused"] for t in variants.timings.values()) and len(variants.timings) == 2
    for name in ("resnet18.a1_in1k", "resnet18.a2_in1k"):
        indexer.index_family(fresh_url, "timm", [name], pretrained=True, force=True)
    assert not any(
        t["analysis_reused"]
        for t in indexer.index_family(
            fresh_url, "timm", ["resnet18.a1_in1k"], pretrained=True, force=True
        ).timings.values()
    )
    reused, fresh = zoo.connect(reused_url), zoo.connect(fresh_url)
    for name in ("timm/resnet18.a1_in1k", "timm/resnet18.a2_in1k"):
        assert _analysis(reused, name) == _analysis(fresh, name)
        assert _analysis(reused, name)["scan_status"] == "ok"


def test_torchvision_weights_that_set_a_flag_get_their_own_analysis(tmp_path):
    """inception_v3's ImageNet weights set transform_input=True: same tensors as the architecture, another
    forward (torchvision re-normalizes the input), so the variant is analysed, not reused."""
    url = f"sqlite:///{tmp_path}/tv.db"
    indexer.index_family(url, "torchvision", ["inception_v3"])
    outcome = indexer.index_family(url, "torchvision", ["inception_v3.IMAGENET1K_V1"], pretrained=True)
    assert not outcome.timings["torchvision/inception_v3.IMAGENET1K_V1"]["analysis_reused"]
    registry = zoo.connect(url)
    arch, variant = (
        _analysis(registry, n) for n in ("torchvision/inception_v3", "torchvision/inception_v3.IMAGENET1K_V1")
    )
    assert arch["peak_activation_bytes"] != variant["peak_activation_bytes"]  # the re-normalization's tensors


def _rows(url: str) -> dict:
    """Every column of every model but when it was indexed, by name."""
    from sqlalchemy import create_engine, text

    with create_engine(url).connect() as c:
        rows = [dict(r._mapping) for r in c.execute(text("select * from models"))]
    return {r["name"]: {k: v for k, v in r.items() if k not in ("id", "indexed_at")} for r in rows}


@pytest.mark.slow  # indexes twice over: 7 s
def test_index_installed_records_what_the_four_family_runs_record(tmp_path):
    """`zoo index installed` (architectures and variants of timm and torchvision in one run, each architecture
    followed by its variants in one worker) gives the same rows as indexing each family and then its variants (each
    variant built for itself), and its variants reuse the build and the analysis their architecture made moments
    before in the same worker."""
    patterns = ["resnet18*", "vit_tiny_patch16_224*", "sequencer2d_s*"]  # sequencer2d_s: no digest (an LSTM's weakrefs)
    one_run, four_runs = f"sqlite:///{tmp_path}/installed.db", f"sqlite:///{tmp_path}/families.db"
    summary = cli_json("index", "installed", *patterns, "-j", "2", registry=one_run)
    for fam in ("timm", "torchvision"):
        indexer.index_family(four_runs, fam, patterns)
        indexer.index_family(four_runs, fam, patterns, pretrained=True)
    rows = _rows(one_run)
    assert rows == _rows(four_runs)
    assert {
        "timm/resnet18",
        "timm/resnet18.a1_in1k",
        "torchvision/resnet18",
        "torchvision/resnet18.IMAGENET1K_V1",
        "timm/vit_tiny_patch16_224.augreg_in21k",
    } <= set(rows) and summary["indexed"] == len(rows)
    assert summary["timings"]["timm/resnet18.a1_in1k"]["analysis_reused"]
    assert not summary["timings"]["timm/resnet18"]["analysis_reused"]
    # the variants timm constructs as their architecture take its build (zoo.construction); a 21k-class head does not
    assert summary["timings"]["timm/resnet18.a1_in1k"]["build_reused"]
    assert not summary["timings"]["timm/vit_tiny_patch16_224.augreg_in21k"]["build_reused"]
    assert not any(t["build_reused"] for n, t in summary["timings"].items() if n.startswith("torchvision/"))
    # its own module at the same input: reused without a digest
    assert structure_digest(_meta(Recipe("timm", "sequencer2d_s")), SPEC) is None
    assert summary["timings"]["timm/sequencer2d_s.in1k"]["analysis_reused"]
    assert cli_json("index", "installed", *patterns, registry=one_run)["unchanged"] == len(rows)
    with pytest.raises(zoo.errors.InvalidArgument, match="no pretrained flag"):
        zoo.connect(one_run).index("installed", patterns, pretrained=True)
