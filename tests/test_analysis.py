"""Analysis without weights (zoo.analysis): FLOPs against torchvision's published figures, scan and estimate
against real CPU runs, search by flops, the module tree, and forwards that cannot run on meta."""

import contextlib
import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import ROOT, cli_json, run_cli
from zoo.analysis import LiveBytes, SavedBytes, analyze, loss_of, make_optimizer, measure_step, scan
from zoo.recipe import Recipe

# ---------------------------------------------------------------------------------------------
# torchvision agreement: every model whose DEFAULT weights publish _ops (GFLOPS as torchvision counts
# them: multiply-accumulates, at the size its weights document) and num_params.

MAC_TOLERANCE = 0.01  # relative
ROUNDING = 0.0005e9  # _ops is published with 3 decimals (GMACs): half a unit in its last place

# Where the recorded model differs from the one torchvision measured, for a reason each test below checks.
# The registry builds every model with weights=None; torchvision measured the model its weights build.
SEGMENTATION_AUX = {  # weights build the auxiliary FCN head (aux_loss=True); weights=None does not
    "deeplabv3_mobilenet_v3_large",
    "deeplabv3_resnet50",
    "deeplabv3_resnet101",
    "fcn_resnet50",
    "fcn_resnet101",
}
GOOGLENET_AUX = {  # weights=None keeps the builder's aux_logits=True; the weights' model drops both aux heads
    "googlenet",
    "quantized_googlenet",  # (training-only: eval FLOPs agree, parameters do not)
}
VIT_IMAGE_SIZE = {"vit_h_14"}  # its weights set image_size=518; weights=None builds the 224 model
# Detection: weights make the backbone's norms FrozenBatchNorm2d (weight and bias as buffers);
# weights=None gives BatchNorm2d, whose weight and bias are parameters. And its forward cannot run
# on meta (data-dependent post-processing), so no FLOPs are recorded: the row says why.
DETECTION_FROZEN_NORMS = {
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_resnet50_fpn",
    "fcos_resnet50_fpn",
    "keypointrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
    "retinanet_resnet50_fpn",
}
DETECTION = DETECTION_FROZEN_NORMS | {  # the v2 models and SSD use BatchNorm2d either way: parameters agree
    "fasterrcnn_resnet50_fpn_v2",
    "maskrcnn_resnet50_fpn_v2",
    "retinanet_resnet50_fpn_v2",
    "ssd300_vgg16",
    "ssdlite320_mobilenet_v3_large",
}


def _torchvision_models() -> list[str]:
    from torchvision.models import list_models

    return list_models()


def _published(builder: str) -> dict:
    from torchvision.models import get_model_weights

    return get_model_weights(builder).DEFAULT.meta


def _record(builder: str, **kwargs) -> dict:
    """The registry row the indexer makes (build on meta, inspect, analyze), with recipe kwargs."""
    from zoo.indexing.indexer import record_of

    record, _ = record_of(f"torchvision/{builder}", Recipe("torchvision", builder, kwargs))
    assert record["status"] == "ok", record["error"]
    return record


def _macs_agree(macs: int, ops: float) -> bool:
    return abs(macs - ops * 1e9) <= max(MAC_TOLERANCE * ops * 1e9, ROUNDING)


def test_every_torchvision_model_publishes_ops_and_the_exceptions_are_real_models():
    names = set(_torchvision_models())
    assert len(names) == 121
    assert all("_ops" in _published(b) and "num_params" in _published(b) for b in names)
    assert (SEGMENTATION_AUX | GOOGLENET_AUX | VIT_IMAGE_SIZE | DETECTION) <= names


@pytest.mark.slow
@pytest.mark.parametrize("builder", _torchvision_models())
def test_recorded_macs_and_params_agree_with_torchvision(builder):
    meta = _published(builder)
    record = _record(builder)
    ops, num_params = meta["_ops"], meta["num_params"]
    if builder in DETECTION:
        # No FLOPs: the forward stops at data-dependent post-processing, and the row says so.
        assert record["scan_status"] == "error" and record["flops"] is None and record["macs"] is None
        assert "nonzero" in record["scan_error"] or "data-dependent" in record["scan_error"], record["scan_error"]
        if builder not in DETECTION_FROZEN_NORMS:
            assert record["params"] == num_params
            return
        # Parameters: torchvision's count has the backbone's norms frozen (buffers); ours has them trainable.
        from zoo.build import build_meta

        module = build_meta(Recipe("torchvision", builder))
        bn_affine = sum(
            p.numel()
            for m in module.backbone.modules()
            if isinstance(m, nn.BatchNorm2d)
            for p in (m.weight, m.bias)
            if p is not None
        )
        assert record["params"] - num_params == bn_affine != 0
        return
    assert record["scan_status"] == "ok", record["scan_error"]
    assert record["macs"] * 2 == record["flops"]
    if builder in SEGMENTATION_AUX:
        assert record["params"] < num_params
        record = _record(builder, aux_loss=True)  # the model torchvision measured agrees exactly
    elif builder in VIT_IMAGE_SIZE:
        assert record["params"] < num_params
        record = _record(builder, image_size=518)
        assert json.loads(record["input_size"]) == [3, 518, 518]
    elif builder in GOOGLENET_AUX:
        assert _macs_agree(record["macs"], ops)  # the aux heads run only in training
        record = _record(builder, aux_logits=False)
    assert record["params"] == num_params
    assert _macs_agree(record["macs"], ops), f"{builder}: {record['macs'] / 1e9:.3f} GMACs recorded, {ops} published"


# ---------------------------------------------------------------------------------------------
# The registry: searchable, shown, readable through zoo.info


def test_info_has_flops_macs_and_activations(zoo_at):
    info = zoo_at.info("timm/resnet18")
    assert info.scan_status == "ok" and info.scan_error is None
    assert info.macs == 1_814_073_344 and info.flops == 2 * info.macs  # torchvision's resnet18: 1.814 GMACs
    assert info.output_shapes == [["", [1, 1000], "float32"]]
    assert 0 < info.peak_activation_bytes < info.train_activation_bytes
    tv = zoo_at.info("torchvision/mobilenet_v3_small")
    assert abs(tv.macs / 1e9 - 0.057) < 0.0005


def test_search_by_flops(zoo_at):
    everything = zoo_at.search(None, limit=None)
    expected = {i.name for i in everything if i.flops is not None and i.flops < 5e9 and i.params < 30e6}
    found = {i.name for i in zoo_at.search("flops<5G and params<30M", limit=None)}
    assert found == expected and "timm/resnet18" in found and "timm/vit_tiny_patch16_224" in found
    assert "timm/swin_tiny_patch4_window7_224" not in found  # 8.9 GFLOPs
    assert {i.name for i in zoo_at.search(zoo_at.F.macs >= 1e9, limit=None)} == {
        i.name for i in everything if i.macs is not None and i.macs >= 1e9
    }
    ordered = [i.flops for i in zoo_at.search("flops>0", order_by="-flops", limit=None)]
    assert ordered == sorted(ordered, reverse=True) and len(ordered) >= 6
    small = zoo_at.search("peak_activation_bytes<10MB and train_activation_bytes>1MB", limit=None)
    assert small and all(i.peak_activation_bytes < 10e6 for i in small)


def test_a_forward_that_cannot_run_on_meta_is_recorded_with_its_reason(zoo_at):
    det = zoo_at.info("torchvision/fasterrcnn_mobilenet_v3_large_fpn")
    assert det.status == "ok" and det.params > 0  # the model itself is indexed
    assert det.scan_status == "error" and det.flops is None and det.macs is None
    assert "nonzero" in det.scan_error and "torchvision/" in det.scan_error  # what failed, and where
    assert [i.name for i in zoo_at.search("scan_status=error", limit=None)] == [det.name]
    # A family with no input spec (user builders) is not guessed at.
    tied = zoo_at.info("user/tied")
    assert tied.scan_status == "no-input" and tied.flops is None
    # Not in a search on flops: a comparison on a missing value is false.
    assert det.name not in {i.name for i in zoo_at.search("flops>=0", limit=None)}


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x[x > 0].reshape(-1, 4))  # boolean masking: nonzero on meta


class _ReadsValue(nn.Module):
    def forward(self, x):
        return x * 2 if x.sum().item() > 0 else x


def test_analyze_reports_data_dependent_ops_and_never_fakes_them():
    with torch.device("meta"):
        modules = [_DataDependent(), _ReadsValue()]
    for module in modules:
        result = analyze(module, {"args": [[4]]})
        assert result.status == "error" and result.flops is None and result.output_shapes is None
        assert result.error.split(":")[0] in ("NotImplementedError", "RuntimeError"), result.error
    assert "nonzero" in analyze(modules[0], {"args": [[4]]}).error
    assert analyze(modules[0], None).status == "no-input"


def test_analyze_leaves_the_module_as_it_was():
    from zoo.build import build_meta
    from zoo.inspection import inspect_module

    module = build_meta(Recipe("timm", "resnet18"))
    module.train()
    module.fc.eval()  # a mixed state survives
    before = inspect_module(module).tensor_table
    result = analyze(module, {"args": [[3, 224, 224]]})
    assert result.status == "ok"
    assert module.training and not module.fc.training and module.layer1.training
    assert inspect_module(module).tensor_table == before


def test_analyze_keeps_nothing_of_the_module_alive():
    """The training forward's saved tensors go with its graph: a module analysed and dropped is freed, weights
    and all (a pack hook that kept each saved tensor itself tied every graph into a loop no collector sees, and
    an index run's workers kept every model they had analysed)."""
    import gc
    import weakref

    from zoo.build import build_meta

    module = build_meta(Recipe("timm", "resnet18"))
    weight = weakref.ref(module.conv1.weight)
    assert analyze(module, {"args": [[3, 224, 224]]}).train_activation_bytes > 0
    del module
    gc.collect()
    assert weight() is None


class _OpsBelow(TorchDispatchMode):
    """Records the ops that reach the layers under the meters (the kernel cache, the meta kernels)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("family_name", "builder"), [("torchvision", "resnet18"), ("timm", "vit_tiny_patch16_224")])
def test_live_bytes_counts_the_flops_flop_counter_mode_counts(family_name, builder, monkeypatch):
    """LiveBytes(flops=True), the index-time analysis's one meter, against PyTorch's FlopCounterMode under it: the
    same FLOPs (convolutions; attention by the custom formula for CPU's flash kernel), the same peak, and the same
    ops below, batch norm decomposed as FlopCounterMode decomposes it. With the kernel cache on, repeats are answered
    from it (FLOPs, and a decomposed op's outputs): the same FLOPs and peak, cold and warm."""
    from zoo.analysis import flop_counter, kernel_cache
    from zoo.analysis.forward import device_context, train_mode
    from zoo.analysis.inputs import make_inputs
    from zoo.build import build_meta
    from zoo.families import family

    module = build_meta(Recipe(family_name, builder))
    spec = family(family_name).describe(builder, module)["input"]
    runs = []
    kernel_cache.clear()
    for together, cache in ((False, "0"), (True, "0"), (True, "1"), (True, "1")):
        monkeypatch.setenv("ZOO_KERNEL_CACHE", cache)
        args, kwargs = make_inputs(spec, batch=1)
        with device_context(module), train_mode(module, False), torch.no_grad(), _OpsBelow() as below:
            counter, live = (None, LiveBytes(flops=True)) if together else (flop_counter(), LiveBytes())
            with counter or contextlib.nullcontext(), live:
                module(*args, **kwargs)
        runs.append((live.flops.total if together else counter.get_total_flops(), live.peak, below.seen))
    assert runs[0] == runs[1]
    assert runs[1][0] > 0 and "aten.native_batch_norm.default" not in runs[1][2]
    assert runs[2][:2] == runs[3][:2] == runs[0][:2]
    if family_name == "torchvision":  # its batch norms: decomposed in the first run, answered in the second
        part = "aten._native_batch_norm_legit_no_training.default"
        assert part in runs[1][2] and part in runs[2][2] and part not in runs[3][2]


class _ReplacesItsBuffer(nn.Module):
    """Replaces a buffer in its forward, as timm's ConViT does its position indices."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1000), persistent=False)

    def forward(self, x):
        self.cache = torch.zeros(1000)  # 4000 bytes, held by the module; the old buffer is freed
        doubled = x * 2  # 4000 bytes, made where the old buffer was freed
        return doubled + self.cache  # 4000 bytes


def test_a_buffer_replaced_in_the_forward_does_not_hide_the_next_allocation():
    """The meters leave out the storages that existed before the forward by address; the replaced buffer's must
    not pass to the next allocation (ConViT's peak took 4 values over 4 fresh builds)."""
    peaks = {analyze(_ReplacesItsBuffer().to("meta"), {"args": [[1000]]}).peak_activation_bytes for _ in range(5)}
    assert peaks == {3 * 4000}
    from zoo.analysis.forward import device_context
    from zoo.analysis.meters import known_storages

    inline = set()  # the meter holds the storages itself: nobody else need keep known_storages' result
    for _ in range(5):
        module, x = _ReplacesItsBuffer().to("meta"), torch.empty(1, 1000, device="meta")
        with device_context(module), torch.no_grad(), LiveBytes(known_storages(module, x)) as live:
            module(x)
        inline.add(live.peak)
    assert inline == {3 * 4000}


def test_saved_bytes_forgets_a_dropped_branch_and_backward_still_runs():
    x = torch.randn(1000, requires_grad=True)
    with SavedBytes() as saved:
        dropped = x.exp()  # exp saves its own output: 4000 bytes while `dropped` lives
        assert saved.bytes == 4000
        kept = x.exp() * 3  # exp's output is saved again (4000 bytes), the product saves nothing
        assert saved.bytes == 8000
        del dropped
        assert saved.bytes == 4000
        kept.sum().backward()
    assert torch.allclose(x.grad, 3 * x.detach().exp())


def test_analyze_records_training_bytes_apart_when_batch_one_cannot_train():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("meta")
    result = analyze(net, {"args": [[3, 2, 2]]})
    assert result.status == "ok" and result.flops == 2 * (12 * 8 + 8 * 2)
    assert result.train_activation_bytes is None
    assert result.error.startswith("training forward: ValueError: Expected more than 1 value per channel")


def test_activation_bytes_of_a_small_net_are_exact():
    # Linear(64->256) -> ReLU -> Linear(256->10), batch 1, float32, on meta.
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to("meta")
    result = analyze(net, {"args": [[64]]})
    assert result.flops == 2 * (64 * 256 + 256 * 10) and result.macs == 64 * 256 + 256 * 10
    # Inference: the first output (1 KiB) and the ReLU's (1 KiB) are live together, then the last (40 B)
    # is made while the ReLU output is held.
    assert result.peak_activation_bytes == 256 * 4 * 2
    # Training: the second Linear saves the ReLU output (1 KiB), ReLU saves its output (the same
    # storage), the first Linear saves the input (not an activation): 1 KiB.
    assert result.train_activation_bytes == 256 * 4
    assert result.output_shapes == [["", [1, 10], "float32"]]


class _TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 16)
        self.head = nn.Linear(16, 100)

    def forward(self, input_ids):
        return self.head(self.embed(input_ids))


def test_token_inputs_take_a_sequence_length():
    from zoo.analysis import make_inputs

    spec = {"kwargs": {"input_ids": {"shape": ["seq"], "dtype": "int64"}}, "seq_len": 32}
    result = analyze(_TokenModel().to("meta"), spec)
    assert result.output_shapes == [["", [1, 32, 100], "float32"]] and result.macs == 32 * 16 * 100
    args, kwargs = make_inputs(spec, batch=4, seq_len=8, dtype=torch.bfloat16)
    assert args == [] and kwargs["input_ids"].shape == (4, 8) and kwargs["input_ids"].dtype == torch.int64
    parts = measure_step(_TokenModel().to("meta"), args, kwargs, training=True, optimizer="sgd")
    assert parts["inputs"] == 4 * 8 * 8 and parts["optimizer_states"] == parts["gradients"] == parts["weights"]


# ---------------------------------------------------------------------------------------------
# scan: per-module shapes, against a real forward


def _real_shapes(module: nn.Module, *inputs) -> dict[str, list]:
    from zoo.analysis import outputs_of

    shapes, names = {}, {id(m): n for n, m in module.named_modules()}

    def record(mod, _inputs, output):  # returns None: the output is left as it is
        shapes.setdefault(names[id(mod)], outputs_of(output))

    hooks = [m.register_forward_hook(record) for m in module.modules()]
    module.eval()
    with torch.no_grad():
        module(*inputs)
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.parametrize("name", ["timm/resnet18", "timm/vit_tiny_patch16_224", "torchvision/mobilenet_v3_small"])
def test_scan_matches_a_real_forward(zoo_at, name):
    from zoo.build import build_real

    family, builder = name.split("/")
    real = build_real(Recipe(family, builder), "cpu")
    expected = _real_shapes(real, torch.rand(2, 3, 224, 224))
    by_name = zoo_at.scan(name, (2, 3, 224, 224))  # a shape: a meta float32 tensor
    by_module = zoo_at.scan(zoo_at.get(name), torch.empty(2, 3, 224, 224))  # a CPU tensor: moved to meta
    for result in (by_name, by_module):
        got = {m.name: m.outputs for m in result.modules if m.calls}
        assert got == expected
        assert result.outputs == expected[""]
    default = zoo_at.scan(name)  # the recorded input, batch 1
    assert default.outputs == [["", [1, 1000], "float32"]]
    assert zoo_at.scan(zoo_at.get(name)).outputs == default.outputs  # a gotten module knows its input too
    assert default[""].params == zoo_at.info(name).params


def test_scan_takes_any_meta_module_and_names_every_module():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Sequential(nn.Flatten(), nn.Linear(8 * 16, 4)))
    net = net.to("meta")
    result = scan(net, (5, 3, 4, 4))
    assert [m.name for m in result.modules] == ["", "0", "1", "2", "2.0", "2.1"]
    assert result["0"].outputs == [["", [5, 8, 4, 4], "float32"]] and result["2.1"].outputs == [["", [5, 4], "float32"]]
    assert result["2"].params == 8 * 16 * 4 + 4 and result["2"].depth == 1 and result["2.1"].depth == 2
    assert result["0"].param_bytes == (3 * 8 * 9 + 8) * 4
    half = scan(net.to(torch.bfloat16), torch.empty(1, 3, 4, 4, dtype=torch.bfloat16))
    assert half.outputs == [["", [1, 4], "bfloat16"]]
    with pytest.raises(ValueError, match="no recorded input"):
        scan(net)


# ---------------------------------------------------------------------------------------------
# estimate: against the real peak of the same step on CPU


def _real_peak_memtracker(module: nn.Module, inputs: list, training: bool, optimizer: str | None) -> int:
    """The peak of live tensor bytes in one real step on CPU, by PyTorch's own MemTracker
    (torch.distributed._tools.mem_tracker: parameters, gradients, optimizer states, activations,
    temporaries), plus the input batch, which it does not count. Steady state: optimizer states exist."""
    from torch.distributed._tools.mem_tracker import MemTracker

    opt = make_optimizer(optimizer, module.parameters()) if training else None
    module.train(training)
    if opt is not None:
        for p in module.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(*[x for x in (module, opt) if x is not None])
    with warnings.catch_warnings(), tracker:
        warnings.simplefilter("ignore")
        if training:
            loss = loss_of(module(*inputs))
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                module(*inputs)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return peak + sum(x.numel() * x.element_size() for x in inputs)


ESTIMATED = [("timm/resnet18", 4), ("timm/vit_tiny_patch16_224", 4), ("torchvision/mobilenet_v3_small", 8)]


@pytest.mark.parametrize("name,batch", ESTIMATED)
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.slow  # real training steps: 15 s, 2 minutes on a busy machine
def test_estimate_is_within_15_percent_of_the_real_cpu_peak(zoo_at, name, batch, training):
    from zoo.build import build_real

    torch.manual_seed(0)
    got = zoo_at.estimate(name, batch=batch, dtype="fp32", training=training, optimizer="adamw")
    family, builder = name.split("/")
    real = build_real(Recipe(family, builder), "cpu")
    inputs = [torch.rand(batch, 3, 224, 224)]
    reference = _real_peak_memtracker(real, inputs, training, "adamw")
    assert abs(got.total - reference) <= 0.15 * reference, (got, reference)
    # The same step on real tensors through zoo's own tracker: meta allocates as the CPU does.
    real_parts = measure_step(
        build_real(Recipe(family, builder), "cpu"), inputs, {}, training, "adamw" if training else None
    )
    assert abs(got.total - real_parts["total"]) <= 0.05 * real_parts["total"]
    assert got.weights == real_parts["weights"] and got.optimizer_states == real_parts["optimizer_states"]
    assert got.total <= got.upper_bound


def test_estimate_parts(zoo_at):
    info = zoo_at.info("timm/resnet18")
    fp32 = zoo_at.estimate("timm/resnet18", batch=2, dtype="fp32", training=True, optimizer="adamw")
    assert fp32.weights == info.bytes and fp32.gradients == info.param_bytes
    assert fp32.optimizer_states == 2 * info.param_bytes + 4 * len(list(zoo_at.get("timm/resnet18").parameters()))
    assert fp32.inputs == 2 * 3 * 224 * 224 * 4
    bf16 = zoo_at.estimate("timm/resnet18", batch=2, dtype="bf16", training=True, optimizer="adamw")
    assert bf16.gradients * 2 == fp32.gradients and bf16.inputs * 2 == fp32.inputs
    sgd = zoo_at.estimate("timm/resnet18", batch=2, dtype="fp32", training=True, optimizer="sgd")
    assert sgd.optimizer_states == info.param_bytes
    none = zoo_at.estimate("timm/resnet18", batch=2, dtype="fp32", training=True, optimizer="none")
    assert none.optimizer_states == 0
    infer = zoo_at.estimate("timm/resnet18", batch=2, dtype="fp32")
    assert infer.gradients == infer.optimizer_states == 0 and infer.total == infer.upper_bound
    # Measured at the batch asked for: the batch-8 forward runs at batch 8.
    big = zoo_at.estimate("timm/resnet18", batch=8, dtype="fp32")
    assert 3.5 * infer.activations < big.activations < 4.5 * infer.activations
    with pytest.raises(zoo_at.ZooError, match="dtype"):
        zoo_at.estimate("timm/resnet18", dtype="int3")
    with pytest.raises(zoo_at.ZooError, match="no recorded input spec"):
        zoo_at.estimate("user/tied")
    with pytest.raises(zoo_at.ZooError, match="cannot run on meta, so nothing is estimated: .*nonzero"):
        zoo_at.estimate("torchvision/fasterrcnn_mobilenet_v3_large_fpn")
    # A module handed in comes back in its own dtype.
    module = zoo_at.get("timm/resnet18")
    zoo_at.estimate(module, batch=1, dtype="bf16")
    assert {p.dtype for p in module.parameters()} == {torch.float32}


def test_live_bytes_counts_views_once_and_frees_on_death():
    with LiveBytes() as live:
        a = torch.empty(1000, device="meta")  # 4000 bytes
        b = a.view(10, 100)  # a view: nothing new
        c = torch.empty(500, device="meta")  # 2000 more: peak 6000
        del a, b, c
        d = torch.empty(250, device="meta")  # after the frees: 1000
    assert live.peak == 6000 and live.current == 1000
    del d


# ---------------------------------------------------------------------------------------------
# CLI


def test_show_prints_the_analysis_without_importing_torch(small_registry):
    code = (
        "import sys, zoo.cli; zoo.cli.main(['show', 'timm/resnet18']); "
        "assert 'torch' not in sys.modules, 'show imported torch'"
    )
    env_registry = small_registry.removeprefix("sqlite:///")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**__import__("os").environ, "ZOO_REGISTRY": env_registry, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert "3.63 GFLOPs (1.81 GMACs)" in out.stdout and "saved for backward" in out.stdout
    shown = cli_json("show", "timm/resnet18", registry=small_registry)
    assert shown["macs"] == 1_814_073_344 and shown["scan_status"] == "ok"
    det = run_cli("show", "torchvision/fasterrcnn_mobilenet_v3_large_fpn", registry=small_registry).stdout
    assert "analysis" in det and "error: NotImplementedError" in det and "nonzero" in det


def test_show_tree(small_registry):
    out = run_cli("show", "timm/resnet18", "--tree", "--depth", "1", registry=small_registry).stdout
    lines = out.splitlines()
    assert lines[0].startswith("timm/resnet18 ResNet  11.69M params, 44.6 MiB  -> 1x1000")
    layer1 = next(line for line in lines if " layer1 " in line)
    assert "Sequential" in layer1 and "147.97K params" in layer1 and "-> 1x64x56x56" in layer1
    assert not any(" conv1 " in line and "│" in line.split("conv1")[0] for line in lines)  # depth 1 only
    assert len(lines) == 1 + 10  # the root and its 10 children
    full = cli_json("show", "timm/resnet18", "--tree", registry=small_registry)
    assert full["error"] is None and full["outputs"] == [["", [1, 1000], "float32"]]
    conv = next(m for m in full["modules"] if m["name"] == "layer2.0.conv1")
    assert conv["outputs"] == [["", [1, 128, 28, 28], "float32"]] and conv["params"] == 64 * 128 * 9
    assert conv["bytes"] == conv["params"] * 4 and conv["depth"] == 3
    assert (
        max(
            m["depth"]
            for m in cli_json("show", "timm/resnet18", "--tree", "--depth", "2", registry=small_registry)["modules"]
        )
        == 2
    )
    det = run_cli(
        "show", "torchvision/fasterrcnn_mobilenet_v3_large_fpn", "--tree", "--depth", "1", registry=small_registry
    ).stdout
    assert "backbone BackboneWithFPN" in det and "(stopped inside)" in det and "(not called)" in det
    assert "the forward stopped on meta: NotImplementedError" in det
    tied = run_cli("show", "user/tied", "--tree", registry=small_registry).stdout  # no input spec: sizes only
    assert (
        "embed Embedding  256 params, 1.0 KiB  (not called)" in tied
        and "no forward: this module has no recorded input" in tied
    )


def test_estimate_cli(small_registry):
    got = cli_json(
        "estimate",
        "timm/vit_tiny_patch16_224",
        "--batch",
        "2",
        "--dtype",
        "bf16",
        "--training",
        "--optimizer",
        "adamw",
        registry=small_registry,
    )
    assert got["batch"] == 2 and got["dtype"] == "bfloat16" and got["training"] and got["optimizer"] == "adamw"
    assert got["total"] <= got["upper_bound"]
    assert got["total"] >= got["weights"] + got["optimizer_states"] + got["activations"]
    text = run_cli("estimate", "timm/vit_tiny_patch16_224", "--batch", "2", registry=small_registry).stdout
    assert "bfloat16, inference" in text and "activations (peak, measured on meta)" in text
    bad = run_cli("estimate", "user/tied", registry=small_registry, check=False)
    assert bad.returncode == 1 and "no recorded input spec" in bad.stderr
