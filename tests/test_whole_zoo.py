"""Every timm and torchvision model, built through zoo on meta, against its row and a plain build: `make test-zoo`,
which `make registry` runs after a rebuild (the shipped rows change only then, or with the libraries, whose versions
make test checks on a sample: tests/test_shipped_registry.py)."""

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

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

    return (
        {"weights_backbone": None}
        if "weights_backbone" in inspect.signature(get_model_builder(builder)).parameters
        else {}
    )


def _table(module) -> list:
    return [(t.name, t.kind, t.persistent, t.shape, t.dtype, t.tied_to) for t in inspect_module(module).tensor_table]


@functools.cache
def _shipped():
    return zoo.connect(str(ROOT / "registry.db"))


def _failure(check, family_name: str, name: str) -> str | None:
    """What check(family_name, name) raised, if anything: the tests list every failure, they skip none."""
    try:
        check(family_name, name)
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def _failures(check, family_name: str, names: list[str]) -> dict[str, str]:
    """check on every name, in two spawned processes (one would leave one of CI's two cores idle for a quarter
    of an hour): {name: its failure}."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = pool.map(functools.partial(_failure, check, family_name), names, chunksize=8)
        return {name: failure for name, failure in zip(names, results) if failure}


def _check_model(family_name: str, builder: str) -> None:
    info = _shipped().info(f"{family_name}/{builder}", tensors=True)
    assert info.status == "ok", f"recorded as failed: {info.error}"
    built = _shipped().get(f"{family_name}/{builder}")  # a zoo build on meta, checked against the row's table
    assert all(t.is_meta for t in [*built.parameters(), *built.buffers()])
    reference = plain_build(family_name, builder)
    expected = inspect_module(reference)
    recorded = [(t.name, t.kind, t.persistent, t.shape, t.dtype, t.tied_to) for t in info.tensor_table]
    assert recorded == _table(reference) == _table(built)
    assert (info.params, info.trainable, info.buffers, info.tensors, info.bytes) == (
        expected.params,
        expected.trainable,
        expected.buffers,
        expected.tensors,
        expected.bytes,
    )
    assert info.params == sum(p.numel() for p in reference.parameters())


@pytest.mark.whole_zoo
@pytest.mark.timeout(1800)  # every timm model: 11 minutes on a busy 2-core machine, 16 in one CI run
@pytest.mark.parametrize("family_name", ["timm", "torchvision"])
def test_every_model_builds_through_zoo_and_matches_its_row(family_name):
    builders = family(family_name).available()
    failures = _failures(_check_model, family_name, builders)
    assert not failures, f"{len(failures)} of {len(builders)} {family_name} models failed:\n" + "\n".join(
        f"  {n}: {e}" for n, e in sorted(failures.items())
    )


@functools.cache
def _variants(family_name: str) -> dict:
    from zoo.indexing.indexer import wanted_variants

    return wanted_variants(family_name)


def _check_variant(family_name: str, name: str) -> None:
    recipe, variant = _variants(family_name)[name]
    info = _shipped().info(name, tensors=True)
    assert info.status == "ok", f"recorded as failed: {info.error}"
    if family_name == "torchvision":  # quantized weights: the float model's count, as torchvision publishes
        from torchvision.models import get_model_weights

        assert info.params == get_model_weights(recipe.builder)[variant["tag"]].meta["num_params"]
        return
    reference = plain_build("timm", recipe.builder)
    assert [(t.name, t.shape, t.dtype) for t in info.tensor_table] == [(t[0], t[3], t[4]) for t in _table(reference)]
    assert info.params == sum(p.numel() for p in reference.parameters())


@pytest.mark.whole_zoo
@pytest.mark.timeout(1800)  # every timm model: 11 minutes on a busy 2-core machine, 16 in one CI run
@pytest.mark.parametrize("family_name", ["timm", "torchvision"])
def test_every_pretrained_variant_matches_its_plain_build(family_name):
    """Every variant row of the shipped registry: timm's against a plain timm.create_model(tag), torchvision's
    params against the weights' published num_params (quantized weights: the float model's, as torchvision's)."""
    variants = list(_variants(family_name))
    failures = _failures(_check_variant, family_name, variants)
    assert not failures, f"{len(failures)} of {len(variants)} {family_name} variants failed:\n" + "\n".join(
        f"  {n}: {e}" for n, e in sorted(failures.items())
    )
