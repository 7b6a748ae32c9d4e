"""A build's outermost construction (zoo.construction): a timm variant whose construction equals its architecture's
is known to be that module without a build of its own; these tests hold the claim against full builds."""

import threading
from collections import defaultdict

import pytest
from torch import nn

from zoo.build import build_meta
from zoo.construction import watch
from zoo.recipe import Recipe
from zoo.structure import structure_digest


class Net(nn.Module):
    def __init__(self, width: int, depth: int = 2, **extra):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))


def test_watch_notes_the_outermost_construction_with_every_argument_and_stops_at_an_equal_one():
    with watch() as seen:
        net = Net(8, head="x")
    assert seen.first is net  # the outer module, not the Linear layers built inside it
    with watch() as other:
        Net(8, depth=2, head="x")  # the same arguments, given another way (the default spelled out)
    assert other.call == seen.call
    for changed in ((9,), (8, 3), (8, 2, "y")):
        with watch() as different:
            Net(*changed[:2], **({"head": changed[2]} if len(changed) > 2 else {"head": "x"}))
        assert different.call != seen.call
    made = []
    with watch(stop_at=seen.call) as stopped:
        made.append(Net(8, head="x"))
        made.append("after")  # never reached: the block ends at the construction
    assert stopped.stopped and made == []
    with watch(stop_at=seen.call) as other:
        made.append(Net(8, head="z"))  # not equal: built as usual
    assert not other.stopped and isinstance(made[0], Net)


def test_an_argument_without_a_stable_description_matches_nothing():
    marker = object()  # an arbitrary object: only its address tells it apart
    with watch() as seen:
        Net(8, head=marker)
    assert seen.call is None and seen.first is None


def test_a_config_dataclass_is_described_by_its_class_and_fields():
    """timm's ByoModelCfg, MaxxVitCfg and their kind reach a constructor as dataclasses: equal fields, equal calls."""
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        depths: tuple = (2, 2)
        act: str = "relu"

    calls = []
    for cfg in (Cfg(), Cfg(), Cfg(depths=(2, 3)), Cfg(act="gelu")):
        with watch() as seen:
            Net(8, cfg=cfg)
        calls.append(seen.call)
    assert calls[0] == calls[1] is not None and len(set(calls)) == 3


def test_another_threads_construction_is_neither_noted_nor_stopped():
    with watch() as reference:
        Net(4)
    made = []
    with watch(stop_at=reference.call) as seen:
        worker = threading.Thread(target=lambda: made.append(Net(4)))
        worker.start()
        worker.join()
    assert len(made) == 1 and seen.call is None


def _variants_by_module() -> dict[str, list[str]]:
    """One architecture with pretrained tags per timm model module (its first, in timm's order), with those tags."""
    import timm

    by_arch = defaultdict(list)
    for full in timm.list_pretrained():
        by_arch[full.split(".", 1)[0]].append(full)
    first = {}
    for arch, tags in by_arch.items():
        first.setdefault(timm.models.model_entrypoint(arch).__module__, (arch, tags))
    return dict(first.values())


# tags that timm builds differently from their architecture, by its published cfgs: a head of another size
# (in21k: 21843 classes; in12k: 11821), none (fcmae: num_classes 0), and one that its entrypoint reads itself (the
# Qwen3-VL vision towers: the merger's output width is the language model's, one per tag)
TAG_CHANGES = {
    "convnextv2_atto.fcmae",
    "vit_base_patch16_224.augreg_in21k",
    "convnext_tiny.in12k",
    "qwen3_vit_416m_merge.qwen3_vl_8b",
}


@pytest.mark.slow  # 18 s
def test_a_timm_variant_stops_at_its_architectures_construction_exactly_when_it_builds_the_same_module():
    """For two tags of every timm module, and for tags known to change what timm builds: a build stopped at the
    architecture's construction (no build of its own) is one whose full build has the architecture's structure."""
    cases = _variants_by_module()
    for full in TAG_CHANGES:
        cases.setdefault(full.split(".", 1)[0], []).append(full)
    assert len(cases) > 100  # timm 1.0 has pretrained tags in about 140 modules
    stopped = built = 0
    for arch, tags in cases.items():
        with watch() as seen:
            module = build_meta(Recipe("timm", arch))
        if seen.first is not module:
            continue
        digest = structure_digest(module, None)
        for full in tags[:2] + [t for t in tags[2:] if t in TAG_CHANGES]:
            with watch(stop_at=seen.call) as variant:
                build_meta(Recipe("timm", full))
            same = variant.stopped
            full_build = build_meta(Recipe("timm", full))
            assert same == (structure_digest(full_build, None) == digest), full
            if full in TAG_CHANGES:
                assert not same, full
            stopped += same
            built += not same
    assert stopped > 100 and built >= len(TAG_CHANGES)
