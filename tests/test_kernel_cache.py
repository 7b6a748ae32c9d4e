"""The kernel cache (zoo.analysis.kernel_cache) changes how fast the meta forwards run, never what they measure:
every figure equals the one PyTorch's own meta kernels give with the cache off (ZOO_KERNEL_CACHE=0), and the
ops it must not answer (views that hide in their schema, in-place ops that change shapes) still run."""

import pytest
import torch

from zoo.analysis import analyze, estimate, kernel_cache, scan
from zoo.analysis.forward import device_context
from zoo.analysis.meters import LiveBytes
from zoo.build import build_meta
from zoo.families import family
from zoo.recipe import Recipe
from zoo.state import ZooState, set_state

# In-place activations and norms (resnet, efficientnet, mobilenet), attention and views (vit, swin, coat with
# ties), LSTMs (sequencer), data-dependent shapes that stop on meta (detection), a training step with AdamW.
MODELS = [
    ("timm", "resnet18"),
    ("timm", "efficientnet_b0"),
    ("timm", "vit_tiny_patch16_224"),
    ("timm", "swin_tiny_patch4_window7_224"),
    ("timm", "coat_lite_tiny"),
    ("timm", "levit_128s"),
    ("timm", "convnext_atto"),
    ("timm", "mixer_s32_224"),
    ("timm", "sequencer2d_s"),
    ("torchvision", "mobilenet_v3_small"),
    ("torchvision", "googlenet"),
    ("torchvision", "fasterrcnn_mobilenet_v3_large_320_fpn"),
]


def _module(fam: str, builder: str):
    module = build_meta(Recipe(fam, builder))
    return module, family(fam).describe(builder, module).get("input")


@pytest.fixture
def cache_off(monkeypatch):
    def off(enabled: bool = False):
        monkeypatch.setenv("ZOO_KERNEL_CACHE", "1" if enabled else "0")

    return off


@pytest.mark.parametrize(
    "fam,builder",
    # sequencer2d_s (LSTMs) takes 12 s: slow
    [pytest.param(f, b, id=b, marks=pytest.mark.slow if b == "sequencer2d_s" else ()) for f, b in MODELS],
)
def test_analysis_is_the_same_with_and_without_the_cache(fam, builder, cache_off):
    module, spec = _module(fam, builder)
    cache_off()
    plain = analyze(module, spec)
    cache_off(enabled=True)
    kernel_cache.clear()
    cold = analyze(module, spec)  # the first run fills the cache, the second is answered from it
    warm = analyze(module, spec)
    assert cold == plain and warm == plain
    if fam == "torchvision" and builder.startswith("fasterrcnn"):
        assert plain.status == "error"  # detection post-processing reads values: the reason is the same either way
    else:
        assert plain.status == "ok" and plain.flops > 0 and plain.peak_activation_bytes > 0


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_estimate_and_scan_are_the_same_with_and_without_the_cache(training, cache_off):
    module, _ = _module("timm", "efficientnet_b0")
    set_state(
        module, ZooState(Recipe("timm", "efficientnet_b0"))
    )  # as zoo.get leaves it: estimate reads its input spec
    cache_off()
    plain = (
        estimate(module, batch=4, dtype="fp32", training=training),
        scan(module, (2, 3, 224, 224), train=training).as_dict(),
    )
    cache_off(enabled=True)
    kernel_cache.clear()
    for _ in range(2):
        assert (
            estimate(module, batch=4, dtype="fp32", training=training),
            scan(module, (2, 3, 224, 224), train=training).as_dict(),
        ) == plain


def _twice(op):
    """An op run twice under the cache on fresh meta inputs: the second answer may come from the cache."""
    kernel_cache.clear()
    with kernel_cache.KernelCache():
        return [op() for _ in range(2)]


def test_a_repeated_op_gets_a_fresh_storage_of_its_own():
    x = torch.empty(4, 8, device="meta")
    with LiveBytes() as live, kernel_cache.KernelCache():
        a, b = torch.mul(x, 2), torch.mul(x, 2)
        assert live.current == 2 * a.nbytes  # the meters above see both allocations
    assert a.untyped_storage()._cdata != b.untyped_storage()._cdata
    assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


def test_strides_are_part_of_the_question():
    base = torch.empty(8, 4, device="meta")
    kernel_cache.clear()
    with kernel_cache.KernelCache():
        contiguous = torch.ops.aten.clone.default(base.t().contiguous())
        transposed = torch.ops.aten.clone.default(base.t())  # clone keeps a dense input's strides
    assert contiguous.stride() == (8, 1) and transposed.stride() == (1, 4)


def test_a_number_is_described_with_its_type():
    # 1 == 1.0 == True in Python, and they hash alike; the results' dtypes differ
    kernel_cache.clear()
    with kernel_cache.KernelCache():
        made = [torch.ops.aten.full.default([2], value, device="meta") for value in (1, 1.0, True, 1, 1.0, True)]
    assert [t.dtype for t in made] == [torch.int64, torch.float32, torch.bool] * 2


def test_a_view_that_its_schema_does_not_declare_is_never_answered_fresh():
    # aten._unsafe_view returns a view of its input, yet its schema has no alias annotation
    sources = []

    def view():
        sources.append(torch.empty(2, 6, device="meta"))
        return torch.ops.aten._unsafe_view.default(sources[-1], [3, 4])

    first, second = _twice(view)
    for out, src in zip((first, second), sources):
        assert out.untyped_storage()._cdata == src.untyped_storage()._cdata


@pytest.mark.parametrize(
    "op", [lambda t: t.resize_(5, 3), lambda t: t.unsqueeze_(0), lambda t: t.t_()], ids=["resize_", "unsqueeze_", "t_"]
)
def test_an_in_place_op_that_changes_shapes_runs_every_time(op):
    made = []

    def run():
        made.append(torch.empty(2, 3, device="meta"))
        return op(made[-1])

    first, second = _twice(run)
    assert first is made[0] and second is made[1]
    assert (first.shape, first.stride()) == (second.shape, second.stride()) != ((2, 3), (3, 1))


def test_an_in_place_op_that_keeps_shapes_returns_its_own_argument():
    made = []

    def run():
        made.append(torch.empty(2, 3, device="meta"))
        return made[-1].add_(1)

    first, second = _twice(run)
    assert first is made[0] and second is made[1]


def test_a_real_tensor_argument_is_never_answered_from_metadata():
    kernel_cache.clear()
    with kernel_cache.KernelCache():
        for n in (1, 3):
            out = torch.ops.aten.repeat_interleave.Tensor(torch.tensor([n, n]))  # the values give the shape
            assert out.shape == (2 * n,)
    assert not kernel_cache._TABLE


def test_an_op_outside_pytorch_always_runs():
    # a library's op may give shapes from a setting of its own: only aten and prims ops are answered
    setting = {"width": 2}

    @torch.library.custom_op("zoo_test::widen", mutates_args=())
    def widen(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], setting["width"])

    @widen.register_fake
    def _(x):
        return x.new_empty(x.shape[0], setting["width"])

    x = torch.empty(3, device="meta")
    kernel_cache.clear()
    with kernel_cache.KernelCache():
        first = widen(x)
        setting["width"] = 5
        second = widen(x)
    assert (first.shape, second.shape) == ((3, 2), (3, 5))


def test_the_analysis_forward_runs_under_the_cache_unless_turned_off(cache_off):
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    module = torch.nn.Linear(2, 2, device="meta")
    with device_context(module):
        assert any(isinstance(m, kernel_cache.KernelCache) for m in _get_current_dispatch_mode_stack())
    cache_off()
    with device_context(module):
        assert not any(isinstance(m, kernel_cache.KernelCache) for m in _get_current_dispatch_mode_stack())
