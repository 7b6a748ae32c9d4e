"""timm's own model checks, run on zoo's models side by side with timm's.

timm tests every architecture it ships for: a forward pass; a backward pass in train mode that reaches
every parameter; its default cfg (classifier and first conv names, `forward_features` unpooled at the
cfg's pool size, `forward_head` with and without `pre_logits`, `reset_classifier`, a headless rebuild);
`features_only` feature extraction (the default wrapper, the `forward_intermediates` getter and the fx
graph extractor of timm.models._features_fx); `forward_intermediates`; and torch.fx tracing of the whole
model with timm's own leaf modules and autowrapped functions, forward and backward.
These are the same kinds of check, written for zoo, where "create_model" is answered by zoo:

    eager = timm.create_model(name, **kw)                       # under a fixed seed, saved to a file
    ours  = registry.get("timm/" + name, **kw).materialize(weights=that_file)

Every check runs on both. Where timm's own model fails a check, the test is skipped with timm's failure
as its message (zoo cannot be asked for more than timm does). Where timm's passes, zoo's must pass too,
and everything it produced must equal timm's: outputs, gradients and buffers after a training step,
intermediates, feature maps and feature_info, traced graphs. The two sides run the same ops in the same
order on the same values, so the comparisons are bitwise. `test_a_changed_weight_fails_the_check` shows
each comparison failing when zoo's model is materialized from a file with one weight changed.

Inputs are reduced as timm's tests reduce them (to 96 pixels here) for models without a fixed input size;
the unpooled shape expected from the cfg's pool_size is scaled to the input. One architecture per timm
module family, its smallest variant (timm's `test_*` models where it ships one); ViT-B BEiT, the smallest
BEiT there is, is built with depth=3 on both sides (a create_model kwarg, so it also covers overrides).
"""

import copy
import functools
import json
import math
from itertools import chain

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from tests.conftest import ROOT

REGISTRY = zoo.connect(str(ROOT / "registry.db"))

# One per timm module family, the smallest variant: (name, create_model kwargs used on both sides).
ARCHS = [
    # convolutional, BatchNorm
    ("test_resnet", {}),  # resnet
    ("resnetv2_18", {}),  # resnetv2 (pre-activation)
    ("test_efficientnet", {}),  # efficientnet
    ("mobilenetv3_small_050", {}),  # mobilenetv3
    ("mobilenetv4_conv_small_035", {}),  # mobilenetv4 (MobileNetV3 class, UIR blocks)
    ("regnetx_002", {}),  # regnet
    ("densenet121", {}),  # densenet
    ("dla46x_c", {}),  # dla
    ("ghostnet_050", {}),  # ghostnet
    ("rexnet_100", {}),  # rexnet
    ("hrnet_w18_small", {}),  # hrnet
    ("tresnet_m", {}),  # tresnet (in-place activated BN)
    ("test_byobnet", {}),  # byobnet
    ("fastvit_t8", {}),  # fastvit (reparameterizable)
    ("convmixer_1024_20_ks9_p14", {}),  # convmixer
    # convolutional, LayerNorm / norm-free
    ("test_convnext", {}),  # convnext
    ("convnextv2_atto", {}),  # convnextv2 (GRN)
    ("test_nfnet", {}),  # nfnet (weight-standardized, norm-free)
    ("test_mambaout", {}),  # mambaout
    ("poolformerv2_s12", {}),  # metaformer
    ("edgenext_xx_small", {}),  # edgenext
    # transformers and MLPs
    ("test_vit", {}),  # vision_transformer
    ("test_vit_relpos", {}),  # vision_transformer_relpos
    ("deit_tiny_distilled_patch16_224", {}),  # deit (distilled: two heads)
    ("beit_base_patch16_224", {"depth": 3}),  # beit: ViT-B is the smallest, depth=3 keeps it quick
    ("eva02_tiny_patch14_224", {}),  # eva (RoPE: non-persistent buffers)
    ("swin_tiny_patch4_window7_224", {}),  # swin_transformer
    ("swinv2_cr_tiny_224", {}),  # swin_transformer_v2_cr
    ("test_maxvit", {}),  # maxxvit: maxvit
    ("test_coatnet", {}),  # maxxvit: coatnet
    ("levit_128s", {}),  # levit (distilled)
    ("cait_xxs24_224", {}),  # cait
    ("xcit_nano_12_p16_224", {}),  # xcit
    ("pvt_v2_b0", {}),  # pvt_v2
    ("efficientformer_l1", {}),  # efficientformer
    ("gmlp_ti16_224", {}),  # mlp_mixer
]

SEED = 0  # the eager build
BATCH = 2
TARGET = 96  # input side for models without a fixed input size (timm's feature tests use 96 too)
# timm's default-cfg test does not expect these to return num_features channels from forward_features:
# their conv_head comes after the global pool.
CONV_HEAD_AFTER_POOL = ("MobileNetV3", "GhostNet", "RepGhostNet", "VGG")


# --- both sides ---------------------------------------------------------------------------------------


class Side:
    """One architecture: timm's eager builds (one per kwargs, under SEED), each saved once, and fresh
    pairs of (timm's model, zoo's model) for a test to run its check on."""

    def __init__(self, name: str, kwargs: dict, root):
        self.name, self.kwargs, self.root = name, kwargs, root
        self._built: dict[str, tuple[torch.nn.Module, str]] = {}
        cfg = self._eager({})[0].pretrained_cfg
        self.cfg = cfg
        self.size = tuple(cfg["input_size"]) if cfg.get("fixed_input_size") else reduced(cfg)

    def _eager(self, kwargs: dict):
        import timm

        key = json.dumps(kwargs, sort_keys=True)
        if key not in self._built:
            torch.manual_seed(SEED)
            try:
                model = timm.create_model(self.name, **self.kwargs, **kwargs)
            except Exception as e:
                timm_fails(f"create_model({self.name!r}, **{kwargs})", e)
            path = self.root / f"{len(self._built)}.safetensors"
            save_state(model, path)
            self._built[key] = model, str(path)
        return self._built[key]

    def pair(self, **kwargs):
        """A fresh copy of timm's model and zoo's, materialized from the file timm's was saved to."""
        eager, path = self._eager(kwargs)
        ours = self.ours(path, **kwargs)
        assert type(ours) is type(eager), f"zoo gives a {type(ours).__name__}, timm a {type(eager).__name__}"
        return copy.deepcopy(eager), ours

    def ours(self, path: str, **kwargs):
        meta = REGISTRY.get(f"timm/{self.name}", **self.kwargs, **kwargs)
        real = [n for n, t in chain(meta.named_parameters(), meta.named_buffers()) if not t.is_meta]
        assert not real, f"zoo.get gives tensors that are not on meta: {real[:4]} ({len(real)} in all)"
        model = meta.materialize(weights=path)
        assert model is meta
        return model

    @functools.cached_property
    def spatial(self) -> bool:
        """Whether forward_features gives feature maps (timm's "standard" models, of which its tests expect
        an unpooled output at the cfg's pool size) rather than tokens."""
        model = self._eager({})[0]
        was = model.training
        with torch.no_grad():
            feats = model.eval().forward_features(self.input())
        model.train(was)
        return isinstance(feats, torch.Tensor) and feats.ndim == 4

    def weights(self, **kwargs) -> str:
        return self._eager(kwargs)[1]

    def input(self) -> torch.Tensor:
        return torch.randn(BATCH, *self.size, generator=torch.Generator().manual_seed(1))


def save_state(model, path):
    """model's state dict as a safetensors file: a tensor with two names (a tie: one tensor object) is stored
    once, under its first name, as save_pretrained does; every other tensor as a contiguous copy of its own
    (an fx graph's constants may be strided views of another buffer, which safetensors refuses)."""
    state, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        state[name] = t.detach().clone(memory_format=torch.contiguous_format)
    save_file(state, str(path))


def reduced(cfg) -> tuple:
    """The cfg's input size, each side at most TARGET, at least its min_input_size (as timm's tests do)."""
    size = tuple(min(s, TARGET) for s in cfg["input_size"])
    low = cfg.get("min_input_size")
    return tuple(max(s, m) for s, m in zip(size, low)) if low else size


# make test (CI) runs the checks on all of ARCHS (552 checks in under 5 min on 2 cores); make test-fast only on
# this sample of module families.
CI_SAMPLE = {
    "test_resnet",
    "test_efficientnet",
    "mobilenetv3_small_050",
    "test_byobnet",
    "test_convnext",
    "test_nfnet",
    "test_vit",
    "eva02_tiny_patch14_224",
    "test_maxvit",
    "levit_128s",
}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(arch, id=arch[0], marks=() if arch[0] in CI_SAMPLE else pytest.mark.timm_checks) for arch in ARCHS
    ],
)
def arch(request, tmp_path_factory) -> Side:
    """Module-scoped and parametrized: pytest runs every check of one architecture before the next,
    so each eager build is made (and saved) once and dropped after."""
    name, kwargs = request.param
    return Side(name, kwargs, tmp_path_factory.mktemp(name))


def timm_fails(what: str, error: BaseException):
    lines = str(error).strip().splitlines() or [""]
    pytest.skip(f"timm's own model fails {what}: {type(error).__name__}: {lines[0][:300]}")


def both(arch: Side, what: str, check, eager, ours):
    """check(model) on timm's model, then on zoo's. timm's failing skips the test, naming timm's failure;
    zoo's failing fails it. The check's results are returned, zoo's first."""
    try:
        want = check(eager)
    except Exception as e:
        timm_fails(f"{what} ({arch.name})", e)
    got = check(ours)
    return got, want


def assert_same(got, want, what: str = "output"):
    """Equal structure, and every tensor equal bit for bit (same dtype and shape)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__}, timm gives a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"{what}: {got.dtype}{list(got.shape)}, timm gives {want.dtype}{list(want.shape)}"
        )
        if not torch.equal(got, want):
            diff = (got.double() - want.double()).abs().max().item() if got.is_floating_point() else "?"
            raise AssertionError(f"{what} differs from timm's (max abs difference {diff})")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{what}: keys {list(got)[:5]} != {list(want)[:5]}"
        for k in want:
            assert_same(got[k], want[k], f"{what}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{what}: {len(got)} items, timm gives {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{what}[{i}]")
    else:
        assert got == want, f"{what}: {got!r}, timm gives {want!r}"


def no_nan(*tensors):
    for t in tensors:
        assert not torch.isnan(t).any(), "output has NaNs"


def fmt_dims(model, default: str = "NCHW"):
    from timm.layers import get_channel_dim, get_spatial_dim

    fmt = getattr(model, "output_fmt", default)
    return get_channel_dim(fmt), get_spatial_dim(fmt)


def unpooled_size(arch: Side):
    """The cfg's pool_size scaled to this test's input (the cfg's input size gives its pool size)."""
    pool = arch.cfg.get("pool_size")
    if not pool:
        return None
    full = arch.cfg["input_size"][1:]
    if any(p * s % f for p, s, f in zip(pool, arch.size[1:], full)):
        return None
    return tuple(p * s // f for p, s, f in zip(pool, arch.size[1:], full))


# --- forward, default cfg ------------------------------------------------------------------------------


def test_forward(arch):
    eager, ours = arch.pair()
    x = arch.input()

    def forward(model):
        model.eval()
        with torch.no_grad():
            out = model(x.clone())
        assert out.shape[0] == BATCH
        no_nan(out)
        return out

    got, want = both(arch, "forward", forward, eager, ours)
    assert_same(got, want)


def test_default_cfg(arch):
    """The cfg names the classifier and first conv(s) in the state dict; zoo's model has timm's cfg, features
    and head sizes."""
    eager, ours = arch.pair()

    def cfg_names(model):
        cfg, keys = model.pretrained_cfg, model.state_dict().keys()
        if cfg.get("num_classes"):
            for c in as_tuple(cfg["classifier"]):
                assert f"{c}.weight" in keys, f"classifier {c} not in the state dict"
        for c in as_tuple(cfg["first_conv"]):
            assert f"{c}.weight" in keys, f"first conv {c} not in the state dict"
        return dict(
            cfg=dict(model.pretrained_cfg),
            default_cfg=dict(model.default_cfg),
            keys=list(keys),
            feature_info=copy.deepcopy(getattr(model, "feature_info", None)),
            sizes=[getattr(model, a, None) for a in ("num_classes", "num_features", "head_hidden_size")],
        )

    got, want = both(arch, "the default cfg's names", cfg_names, eager, ours)
    assert_same(got, want, "cfg")


def as_tuple(names):
    return tuple(names) if isinstance(names, (tuple, list)) else (names,)


def test_backward(arch):
    """Train mode, 42 classes: every parameter gets a gradient, and zoo's gradients, outputs and buffers
    (BatchNorm statistics) after the step are timm's."""
    eager, ours = arch.pair(num_classes=42)
    x = arch.input()

    def backward(model):
        model.train()
        torch.manual_seed(2)
        out = model(x.clone())
        if isinstance(out, tuple):
            out = torch.cat(out)
        out.mean().backward()
        no_grad = [n for n, p in model.named_parameters() if p.grad is None]
        assert not no_grad, f"no gradient for {no_grad[:5]}"
        if model.num_classes == 0:  # an encoder without a classifier
            assert out.shape[fmt_dims(model)[0]] == model.num_features
        else:
            assert out.shape[-1] == 42
        no_nan(out)
        return dict(
            out=out.detach(),
            grads={n: p.grad for n, p in model.named_parameters()},
            buffers=dict(model.named_buffers()),
        )

    got, want = both(arch, "backward in train mode", backward, eager, ours)
    assert_same(got, want, "train step")


def features_claims(arch: Side, model, feats: torch.Tensor):
    """What timm's default-cfg tests expect of forward_features: unpooled at the cfg's pool size with
    num_features channels, or (tokens) num_features wide."""
    if feats.ndim == 4:
        channel, spatial = fmt_dims(model)
        pool = unpooled_size(arch)
        if pool:
            assert tuple(feats.shape[d] for d in spatial) == pool, f"unpooled {list(feats.shape)}, cfg pool {pool}"
        if type(model).__name__ not in CONV_HEAD_AFTER_POOL:
            assert feats.shape[channel] == model.num_features
    else:
        dim = getattr(model, "feature_dim", None) or (-1 if feats.ndim == 3 else 1)
        assert feats.shape[dim] == model.num_features


def test_forward_features(arch):
    eager, ours = arch.pair()
    x = arch.input()

    def forward_features(model):
        model.eval()
        with torch.no_grad():
            feats = model.forward_features(x.clone())
        if isinstance(feats, (tuple, list)):  # timm cannot check a multi-tensor output either
            return feats
        features_claims(arch, model, feats)
        return feats

    got, want = both(arch, "forward_features", forward_features, eager, ours)
    assert_same(got, want, "forward_features")


def test_forward_head(arch):
    """forward_head(forward_features(x)) is forward(x); pre_logits=True gives head_hidden_size features."""
    eager, ours = arch.pair()
    x = arch.input()

    def forward_head(model):
        model.eval()
        with torch.no_grad():
            feats = model.forward_features(x.clone())
            logits, pre = model.forward_head(feats), model.forward_head(feats, pre_logits=True)
            full = model(x.clone())
        assert torch.allclose(logits, full), "forward_head(forward_features(x)) != forward(x)"
        assert pre.ndim == 2 and pre.shape == (BATCH, model.head_hidden_size), (
            f"pre_logits {list(pre.shape)}, head_hidden_size {model.head_hidden_size}"
        )
        return dict(logits=logits, pre_logits=pre)

    got, want = both(arch, "forward_head", forward_head, eager, ours)
    assert_same(got, want, "forward_head")


def test_reset_classifier(arch):
    """reset_classifier(0) leaves pooled head_hidden_size features; a new 7-class head (same seed on both
    sides) is made on the materialized model's device and gives timm's logits."""
    eager, ours = arch.pair()
    x = arch.input()

    def reset(model):
        model.eval()
        model.reset_classifier(0)
        with torch.no_grad():
            pooled = model(x.clone())
        pooled = pooled[0] if isinstance(pooled, (tuple, list)) else pooled
        assert pooled.ndim == 2 and pooled.shape[1] == model.head_hidden_size, (
            f"pooled {list(pooled.shape)}, head_hidden_size {model.head_hidden_size}"
        )
        torch.manual_seed(3)
        model.reset_classifier(7)
        with torch.no_grad():
            logits = model(x.clone())
        assert logits.shape == (BATCH, 7)
        return dict(pooled=pooled, logits=logits, state=model.state_dict())

    got, want = both(arch, "reset_classifier", reset, eager, ours)
    assert_same(got, want, "reset_classifier")


def test_reset_classifier_unpooled(arch):
    """reset_classifier(0, '') disables the global pool too: the output is unpooled."""
    eager, ours = arch.pair()
    x = arch.input()

    def reset(model):
        model.eval()
        model.reset_classifier(0, "")
        with torch.no_grad():
            out = model(x.clone())
        unpooled_claims(arch, model, out)
        return out

    got, want = both(arch, "reset_classifier(0, '')", reset, eager, ours)
    assert_same(got, want, "unpooled")


def unpooled_claims(arch: Side, model, out):
    """Without the global pool, a model with feature maps gives them, at the cfg's pool size. timm claims
    nothing of token models (ViTs and the like) here: theirs are compared with zoo's only."""
    if not arch.spatial:
        return
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.ndim == 4, f"still pooled: {list(out.shape)}"
    pool = unpooled_size(arch)
    if pool and type(model).__name__ not in CONV_HEAD_AFTER_POOL:
        spatial = fmt_dims(model)[1]
        assert tuple(out.shape[d] for d in spatial) == pool, f"unpooled {list(out.shape)}, cfg pool {pool}"


@pytest.mark.parametrize(
    "kwargs",
    [{"num_classes": 0}, {"num_classes": 0, "global_pool": ""}],
    ids=["num_classes=0", "num_classes=0,global_pool=''"],
)
def test_headless(arch, kwargs):
    """Built without a classifier (and without the global pool): zoo.get(name, **kwargs) as create_model."""
    eager, ours = arch.pair(**kwargs)
    x = arch.input()

    def headless(model):
        model.eval()
        assert model.num_classes == 0
        with torch.no_grad():
            out = model(x.clone())
        if "global_pool" in kwargs:
            unpooled_claims(arch, model, out)
        else:
            pooled = out[0] if isinstance(out, (tuple, list)) else out
            assert pooled.ndim == 2 and pooled.shape[1] == model.head_hidden_size
        return dict(out=out, keys=list(model.state_dict()))

    got, want = both(arch, f"create_model(**{kwargs})", headless, eager, ours)
    assert_same(got, want, "headless")


# --- feature extraction --------------------------------------------------------------------------------


@pytest.mark.parametrize("feature_cls", [None, "getter", "fx"], ids=["default", "getter", "fx"])
def test_features_only(arch, feature_cls):
    """features_only=True, with timm's default wrapper for the model, the forward_intermediates getter and
    the torch.fx graph extractor (timm.models._features_fx.FeatureGraphNet): each feature map has
    feature_info's channels, and at most its reduction's spatial size (+1 for padding)."""
    kwargs = {"features_only": True} | ({"feature_cls": feature_cls} if feature_cls else {})
    eager, ours = arch.pair(**kwargs)
    x = arch.input()

    def features(model):
        model.eval()
        info = model.feature_info
        channels, reductions = info.channels(), info.reduction()
        with torch.no_grad():
            maps = model(x.clone())
        assert len(maps) == len(channels), f"{len(maps)} maps, feature_info has {len(channels)}"
        channel, spatial = fmt_dims(model)
        for c, r, m in zip(channels, reductions, maps):
            assert m.shape[0] == BATCH, list(m.shape)
            if m.ndim == 3:  # tokens (the fx extractor of a ViT returns its blocks' outputs as they are)
                assert m.shape[-1] == c, f"{list(m.shape)}: expected {c} wide tokens"
            else:
                assert m.shape[channel] == c, f"{list(m.shape)}: expected {c} channels"
                for d, s in zip(spatial, x.shape[2:]):
                    assert m.shape[d] <= math.ceil(s / r) + 1, f"{list(m.shape)} for reduction {r}"
            no_nan(m)
        return dict(maps=maps, info=info.get_dicts(), out_indices=tuple(info.out_indices))

    got, want = both(arch, f"create_model(**{kwargs})", features, eager, ours)
    assert_same(got, want, "features")


def test_forward_intermediates(arch):
    """forward_intermediates: one NCHW map per feature_info entry, and a final output equal to
    forward_features; also the last two alone (indices=2, intermediates_only)."""
    eager, ours = arch.pair()
    x = arch.input()

    def intermediates(model):
        from timm.models import FeatureInfo

        model.eval()
        info = FeatureInfo(copy.deepcopy(model.feature_info), len(model.feature_info))
        channels, reductions = info.channels(), info.reduction()
        assert len(channels) >= 3
        with torch.no_grad():
            final, maps = model.forward_intermediates(x.clone(), output_fmt="NCHW")
            last_two = model.forward_intermediates(x.clone(), indices=2, intermediates_only=True)
            feats = model.forward_features(x.clone())
        assert len(maps) == len(channels), f"{len(maps)} intermediates, feature_info has {len(channels)}"
        for c, r, m in zip(channels, reductions, maps):
            assert m.shape[0] == BATCH and m.shape[1] == c, f"{list(m.shape)}: expected {c} channels"
            for d, s in zip((2, 3), x.shape[2:]):
                assert m.shape[d] <= math.ceil(s / r) + 1, f"{list(m.shape)} for reduction {r}"
            no_nan(m)
        assert torch.allclose(final, feats), "forward_intermediates' output != forward_features"
        assert len(last_two) == 2
        return dict(final=final, maps=maps, last_two=last_two)

    got, want = both(arch, "forward_intermediates", intermediates, eager, ours)
    assert_same(got, want, "forward_intermediates")


# --- torch.fx --------------------------------------------------------------------------------------------


def fx_extractor(model):
    """The whole model as an fx GraphModule, traced with timm's leaf modules and autowrapped functions
    (what timm.models._features_fx uses), returning its last node in train and in eval mode."""
    from timm.layers import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    tracer = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer)
    graph = create_feature_extractor(
        model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer
    )
    return graph, dict(train=train_nodes, eval=eval_nodes)


def test_fx_forward(arch):
    """Traced, the model gives its own eager output; zoo's traces to timm's graph and output."""
    eager, ours = arch.pair()
    x = arch.input()

    def fx_forward(model):
        model.eval()
        graph, nodes = fx_extractor(model)
        graph.eval()
        with torch.inference_mode():
            out = model(x.clone())
            traced = graph(x.clone())
        traced = torch.cat(tuple(traced.values()))
        out = torch.cat(out) if isinstance(out, tuple) else out
        assert torch.equal(traced, out), "the traced model's output != the model's"
        no_nan(out)
        return dict(nodes=nodes, out=traced)

    got, want = both(arch, "fx tracing (eval)", fx_forward, eager, ours)
    assert_same(got, want, "fx")


def test_fx_backward(arch):
    """Traced in train mode with 42 classes: the graph's backward reaches every parameter, and zoo's
    gradients are timm's."""
    eager, ours = arch.pair(num_classes=42)
    x = arch.input()

    def fx_backward(model):
        count = sum(p.numel() for p in model.parameters())
        model.train()
        graph, nodes = fx_extractor(model)
        graph.train()
        torch.manual_seed(2)
        out = torch.cat(tuple(graph(x.clone()).values()))
        out.mean().backward()
        no_grad = [n for n, p in graph.named_parameters() if p.grad is None]
        assert not no_grad, f"no gradient for {no_grad[:5]}"
        assert sum(p.grad.numel() for p in graph.parameters()) == count, "some parameters have no gradient"
        assert out.shape[-1] == 42
        no_nan(out)
        return dict(nodes=nodes, out=out.detach(), grads={n: p.grad for n, p in graph.named_parameters()})

    got, want = both(arch, "fx tracing (train) and backward", fx_backward, eager, ours)
    assert_same(got, want, "fx train step")


# --- the checks can fail --------------------------------------------------------------------------------

CHECKS = {  # name: (the test, run on an architecture; the create_model kwargs of the file it loads)
    "forward": (test_forward, {}),
    "backward": (test_backward, {"num_classes": 42}),
    "forward_features": (test_forward_features, {}),
    "forward_head": (test_forward_head, {}),
    "reset_classifier": (test_reset_classifier, {}),
    "unpooled": (test_reset_classifier_unpooled, {}),
    "headless": (lambda arch: test_headless(arch, {"num_classes": 0}), {"num_classes": 0}),
    **{
        f"features_only[{cls}]": (
            lambda arch, cls=cls: test_features_only(arch, cls),
            {"features_only": True} | ({"feature_cls": cls} if cls else {}),
        )
        for cls in (None, "getter", "fx")
    },
    "forward_intermediates": (test_forward_intermediates, {}),
    "fx_forward": (test_fx_forward, {}),
    "fx_backward": (test_fx_backward, {"num_classes": 42}),
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_a_changed_weight_fails_the_check(tmp_path_factory, check):
    """Each check, with zoo's model materialized from the file with one weight of the first layer changed
    (a ViT: no BatchNorm, so the train-mode checks get as far as comparing gradients): it fails."""
    arch = Side("test_vit", {}, tmp_path_factory.mktemp("changed"))
    test, kwargs = CHECKS[check]
    state = load_file(arch.weights(**kwargs))
    key = next(k for k in state if k.endswith("patch_embed.proj.weight"))
    state[key] = state[key].clone()
    state[key].view(-1)[0] += 1e-3
    changed = str(arch.root / "changed.safetensors")
    save_file(state, changed)
    arch.ours = lambda path, changed=changed, ours=arch.ours, **kw: ours(changed, **kw)
    with pytest.raises(AssertionError, match="differs from timm's"):
        test(arch)


def one_storage(model):
    """Every tensor of model moved into one allocation, each a view of it: the views share one autograd
    version counter (what a materialize that hands out slices of one buffer would give)."""
    state = model.state_dict()
    buf = torch.empty(sum(v.numel() * v.element_size() + 64 for v in state.values()), dtype=torch.uint8)
    views, at = {}, 0
    for k, v in state.items():
        n = v.numel() * v.element_size()
        views[k] = buf[at : at + n].view(v.dtype).view(v.shape).copy_(v)
        at = (at + n + 63) // 64 * 64
    model.load_state_dict(views, assign=True)


def test_backward_fails_when_tensors_share_one_storage(tmp_path_factory):
    """The backward check catches a zoo model whose tensors share one storage: BatchNorm's in-place
    num_batches_tracked += 1 then bumps the version every saved weight is checked against."""
    arch = Side("test_resnet", {}, tmp_path_factory.mktemp("shared"))

    def shared(path, ours=arch.ours, **kwargs):
        model = ours(path, **kwargs)
        one_storage(model)
        return model

    arch.ours = shared
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        test_backward(arch)
