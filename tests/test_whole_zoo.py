"""Every timm and torchvision model, built through zoo on meta, against its row and a plain build (slow)."""

import pytest
import torch

import zoo
from tests.conftest import ROOT
from zoo.families import family
from zoo.inspection import inspect_module


def eager_build(family_name: str, builder: str):
    """The model as its library builds it, for real, without zoo (torchvision: no weights of any kind)."""
    if family_name == "timm":
        import timm

        return timm.create_model(builder)
    from torchvision.models import get_model

    return get_model(builder, weights=None, **_no_backbone(builder))


def plain_build(family_name: str, builder: str):
    """The model built without zoo: on torch's meta device, or for real where meta alone cannot build it."""
    try:
        with torch.device("meta"):
            return eager_build(family_name, builder)
    except (NotImplementedError, RuntimeError):  # e.g. RegNet's torch.unique has no meta kernel
        return eager_build(family_name, builder)


def _no_backbone(builder: str) -> dict:
    import inspect

    from torchvision.models import get_model_builder

    return {"weights_backbone": None} if "weights_backbone" in inspect.signature(get_model_builder(builder)).parameters else {}


def _table(module) -> list:
    return [(t.name, t.kind, t.persistent, t.shape, t.dtype, t.tied_to) for t in inspect_module(module).tensor_table]


@pytest.mark.slow
@pytest.mark.parametrize("family_name", ["timm", "torchvision"])
def test_every_model_builds_through_zoo_and_matches_its_row(family_name):
    shipped = zoo.connect(str(ROOT / "registry.db"))
    failures: dict[str, str] = {}
    builders = family(family_name).available()
    for builder in builders:
        name = f"{family_name}/{builder}"
        try:
            info = shipped.info(name, tensors=True)
            if info.status != "ok":
                failures[name] = f"recorded as failed: {info.error}"
                continue
            built = shipped.get(name)  # a zoo build on meta, checked against the row's tensor table
            assert all(t.is_meta for t in [*built.parameters(), *built.buffers()])
            reference = plain_build(family_name, builder)
            expected = inspect_module(reference)
            recorded = [(t.name, t.kind, t.persistent, t.shape, t.dtype, t.tied_to) for t in info.tensor_table]
            assert recorded == _table(reference) == _table(built)
            assert (info.params, info.trainable, info.buffers, info.tensors, info.bytes) == (
                expected.params, expected.trainable, expected.buffers, expected.tensors, expected.bytes)
            assert info.params == sum(p.numel() for p in reference.parameters())
        except Exception as e:  # collected: the test lists every failure, it skips none
            failures[name] = f"{type(e).__name__}: {str(e)[:300]}"
    assert not failures, f"{len(failures)} of {len(builders)} {family_name} models failed:\n" + "\n".join(
        f"  {n}: {e}" for n, e in sorted(failures.items()))


@pytest.mark.slow
@pytest.mark.parametrize("family_name", ["timm", "torchvision"])
def test_every_pretrained_variant_matches_its_plain_build(family_name):
    """Every variant row of the shipped registry: timm's against a plain timm.create_model(tag), torchvision's
    params against the weights' published num_params (quantized weights: the float model's, as torchvision's)."""
    from zoo.indexer import wanted_variants

    shipped = zoo.connect(str(ROOT / "registry.db"))
    failures: dict[str, str] = {}
    variants = wanted_variants(family_name)
    for name, (recipe, variant) in variants.items():
        try:
            info = shipped.info(name, tensors=True)
            if family_name == "torchvision":
                from torchvision.models import get_model_weights

                meta = get_model_weights(recipe.builder)[variant["tag"]].meta
                assert info.status == "ok", info.error  # quantized: the float model's count, as published
                assert info.params == meta["num_params"]
                continue
            if info.status != "ok":
                failures[name] = f"recorded as failed: {info.error}"
                continue
            reference = plain_build("timm", recipe.builder)
            assert [(t.name, t.shape, t.dtype) for t in info.tensor_table] == \
                [(t[0], t[3], t[4]) for t in _table(reference)]
            assert info.params == sum(p.numel() for p in reference.parameters())
        except Exception as e:  # collected: the test lists every failure, it skips none
            failures[name] = f"{type(e).__name__}: {str(e)[:300]}"
    assert not failures, f"{len(failures)} of {len(variants)} {family_name} variants failed:\n" + "\n".join(
        f"  {n}: {e}" for n, e in sorted(failures.items()))
