"""Forced-meta builds: explicit devices, real(), skipped init, values read while building."""

import pytest
import torch
from torch import nn

from tests.builders import TiedNet, reads_values
from zoo.meta import force_meta, real, value_of


def test_explicit_cpu_device_inside_a_builder_lands_on_meta():
    with force_meta():
        net = TiedNet()
        moved = torch.ones(3).to("cpu", torch.float16)
        on_cpu = torch.zeros(2).cpu()
    tensors = [*net.parameters(), *net.buffers(), moved, on_cpu]
    assert all(t.is_meta for t in tensors)
    assert moved.dtype == torch.float16  # the dtype part of .to() still applies


def test_plain_meta_device_context_is_not_enough():
    """The reason forced meta exists: torch.device("meta") yields to an explicit device."""
    with torch.device("meta"):
        positions = torch.arange(4, device="cpu")
    assert not positions.is_meta


def test_real_suspends_forced_meta_and_nests():
    with force_meta():
        with real():
            table = torch.arange(4)
            with force_meta():
                inner = torch.arange(4)
            again = torch.arange(4)
        after = torch.arange(4)
    assert not table.is_meta and not again.is_meta
    assert inner.is_meta and after.is_meta
    assert table.tolist() == [0, 1, 2, 3]


def test_real_outside_forced_meta_is_harmless():
    with real():
        assert not torch.ones(1).is_meta


def test_init_is_skipped_and_the_rng_is_untouched():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with force_meta():
        layer = nn.Linear(512, 512)
        nn.init.trunc_normal_(layer.weight, std=0.02)
        nn.init.orthogonal_(layer.weight)
        layer.weight.data.normal_()
    assert torch.equal(before, torch.get_rng_state())
    assert layer.weight.is_meta and layer.weight.requires_grad


def test_values_read_during_a_build_come_from_shadows():
    with force_meta():
        net = reads_values()
    assert net.rates.is_meta
    assert torch.allclose(value_of(net.rates), torch.linspace(0, 0.1, 4))


def test_constructed_buffer_values_are_kept_for_non_persistent_buffers():
    with force_meta():
        net = TiedNet(vocab=5)
    assert net.positions.is_meta
    assert value_of(net.positions).tolist() == [0, 1, 2, 3, 4]
    assert value_of(net.embed.weight) is None  # random values are never shadowed


def test_data_dependent_shapes_are_answered_from_shadows():
    with force_meta():
        values = torch.tensor([3, 1, 3, 2])
        unique = torch.unique(values)
    assert unique.is_meta and unique.shape == (3,)


def test_metadata_changing_inplace_ops_still_run():
    with force_meta():
        t = torch.empty(2, 3)
        t.unsqueeze_(0)
        p = nn.Parameter(torch.empty(4))
        p.requires_grad_(False)
    assert t.shape == (1, 2, 3)
    assert not p.requires_grad


def test_a_build_never_downloads():
    import os

    from zoo.build import build_meta
    from zoo.errors import DownloadBlocked
    from zoo.recipe import Recipe

    with pytest.raises(DownloadBlocked, match="127.0.0.1:9"):
        build_meta(Recipe("user", "tests.builders:downloads"), trusted={"tests"})
    offline_before = os.environ.get("HF_HUB_OFFLINE")
    assert build_meta(Recipe("user", "tests.builders:hub_status"), trusted={"tests"}).hub_offline
    assert os.environ.get("HF_HUB_OFFLINE") == offline_before  # restored after the build


def test_torchvision_builds_turn_backbone_weights_off():
    from zoo.build import build_meta
    from zoo.recipe import Recipe

    m = build_meta(Recipe("torchvision", "fasterrcnn_mobilenet_v3_large_fpn"))
    assert all(p.is_meta for p in m.parameters())


VALUE_SIZED = [  # ops whose output size the values of their inputs decide: inputs of <= 6 elements, outputs of more
    lambda: torch.repeat_interleave(torch.arange(3), torch.tensor([2, 0, 5])),
    lambda: torch.arange(6).view(2, 3).repeat_interleave(torch.tensor([1, 4, 2]), dim=1),
    lambda: torch.arange(6).view(2, 3).repeat_interleave(torch.tensor([3]), dim=-2),
    lambda: torch.arange(4).repeat_interleave(torch.tensor(2)),
    lambda: torch.repeat_interleave(torch.tensor([2, 5], dtype=torch.int32)),
    lambda: nn.functional.one_hot(torch.tensor([[0, 5], [2, 1]])),
    lambda: nn.functional.one_hot(torch.tensor([1, 2]), num_classes=9),
    lambda: torch.bincount(torch.tensor([0, 7, 7])),
    lambda: torch.bincount(torch.tensor([0, 7]), weights=torch.tensor([0.5, 1.0]), minlength=11),
    lambda: torch.bincount(torch.tensor([9]), weights=torch.tensor([2])),
]


@pytest.mark.parametrize("op", VALUE_SIZED)
def test_an_op_sized_by_values_over_the_shadow_limit_gets_eagers_shape_without_running(op):
    eager = op()
    with force_meta(shadow_limit=6):  # the inputs get values, every output is over the limit
        forced = op()
    assert forced.is_meta and value_of(forced) is None
    assert (forced.shape, forced.dtype) == (eager.shape, eager.dtype)


def test_a_huge_repeat_count_in_a_build_allocates_nothing_real():
    """A constructor's repeat_interleave of 2**30 positions (8 GiB as int64) ran for real beside the meta op."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with force_meta():
        positions = torch.repeat_interleave(torch.arange(4), torch.full((4,), 2**28))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert positions.is_meta and positions.shape == (2**30,) and grown < 2**28, grown
