"""A loaded model is the library's model in every use (issue 39), each compared with the library's own behaviour:
a transformers model as from_pretrained leaves it, a lazy module under jit, parametrizations and quantization as
the library's model under the same transform, training scripts' checkpoints as the scripts reload them, and both
keys of a tied pair checked as from_pretrained checks them."""

import argparse
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch import nn

import zoo
from tests.test_materialize import eager_model, example_input, save
from tests.test_training_code import on_meta
from zoo.errors import CheckpointError, WeightsMismatch

R18 = "timm/resnet18"
GPT2 = dict(n_layer=2, n_embd=16, n_head=2, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 (tied embedding and head) indexed from its config alone, and its save_pretrained folder
    with a generation config and config fields of its own, as a fine-tuned checkpoint's: (registry, folder)."""
    root = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    (root / "gpt2").mkdir()
    model.config.save_pretrained(root / "gpt2")  # the registry's row: the architecture's config
    registry = zoo.connect(f"sqlite:///{root / 'r.db'}")
    assert registry.index("hf", [str(root / "gpt2")]).indexed == ["hf/gpt2"]
    model.config.id2label, model.config.label2id = {0: "no", 1: "yes"}, {"no": 0, "yes": 1}
    model.generation_config.max_new_tokens, model.generation_config.repetition_penalty = 13, 1.3
    model.save_pretrained(root / "tuned")
    return registry, root / "tuned"


def observable(model) -> dict:
    """What a user sees of a transformers model right after loading, besides its tensors."""
    return {
        "training": model.training,
        "name_or_path": model.name_or_path,
        "config": model.config.to_dict(),
        "generation_config": model.generation_config.to_dict(),
        "tied": model.lm_head.weight is model.transformer.wte.weight,
        "dtype": model.dtype,
    }


def test_a_transformers_model_is_as_from_pretrained_leaves_it(gpt2):
    """Fails without zoo.families.hf_loaded: train mode (the first forward differs: dropout), name_or_path '',
    the folder's generation config and config fields ignored (generate() ran 26 tokens, not 13)."""
    registry, folder = gpt2
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(3))
    for dispatch in ("now", "lazy"):
        m = registry.get("hf/gpt2", weights=str(folder), dispatch=dispatch)
        assert observable(m) == observable(ref), dispatch
        with torch.no_grad():
            assert torch.equal(m(ids).logits, ref(ids).logits), dispatch
        got, want = m.generate(ids, do_sample=False), ref.generate(ids, do_sample=False)
        assert torch.equal(got, want) and got.shape == (1, 6 + 13), dispatch
        assert observable(m) == observable(ref), dispatch


def test_a_transformers_model_initialized_stays_as_from_config_builds_it(gpt2):
    registry, _ = gpt2
    m = registry.get("hf/gpt2", device="cpu")
    assert m.training and m.name_or_path == "" and m.generation_config.max_new_tokens is None


# --- a lazy module under what users do to it before its first use -----------------------------------------


def lazy(zoo_at, tmp_path):
    eager = eager_model(R18).eval()
    return zoo_at.get(R18, weights=save(tmp_path, eager), dispatch="lazy").eval(), eager


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "transform",
    [
        pytest.param(torch.jit.script, id="jit.script"),
        pytest.param(lambda m: torch.jit.trace(m, example_input(R18)), id="jit.trace"),
        pytest.param(lambda m: (nn.utils.parametrizations.weight_norm(m.fc), m)[1], id="weight_norm"),
        pytest.param(lambda m: torch.ao.quantization.quantize_dynamic(m, {nn.Linear}), id="quantize_dynamic"),
    ],
)
def test_a_lazy_module_transformed_before_its_first_use_gives_the_library_models_result(zoo_at, tmp_path, transform):
    """Each failed before (script: '_BeforeCall' has no __name__; trace: cannot swap in place; weight_norm:
    WeightsMismatch for ever; quantize_dynamic: .item() on meta). eval() alone still loads nothing."""
    x = example_input(R18)
    m, eager = lazy(zoo_at, tmp_path)
    assert on_meta(m)  # eval() sets a mode and reads no value
    got, want = transform(m), transform(eager)
    with torch.no_grad():
        assert torch.equal(got(x), want(x))
    assert got.state_dict().keys() == want.state_dict().keys()
    assert all(same(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values()))


def same(a, b) -> bool:
    """Equal state dict entries: tensors (quantized ones by their integers and scales), or packed tuples and
    dtypes as quantize_dynamic saves them."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and a.is_quantized:
        return torch.equal(a.int_repr(), b.int_repr()) and torch.equal(a.dequantize(), b.dequantize())
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


# --- checkpoints that training scripts write ------------------------------------------------------------------


def _trained(name: str, seed: int):
    """A model, its optimizer after one step, and an EMA copy whose values differ from the model's."""
    model = eager_model(name, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    x = example_input(name)
    model(x).float().mean().backward()
    optimizer.step()
    return model, optimizer


def test_timm_train_checkpoints_load_as_timm_reloads_them(zoo_at, tmp_path):
    """timm's CheckpointSaver writes last.pth.tar and model_best.pth.tar ("unknown format" before; then
    argparse.Namespace refused): zoo reads state_dict, or state_dict_ema with #ema, as load_checkpoint does."""
    from timm.models import load_checkpoint
    from timm.utils import CheckpointSaver, ModelEmaV3

    model, optimizer = _trained(R18, seed=1)
    ema = ModelEmaV3(eager_model(R18, seed=2), decay=0.5)
    ema.update(model)  # half way between: neither the model's values nor the seed's
    args = argparse.Namespace(model="resnet18", lr=0.1, epochs=1, amp=False, betas=None)
    saver = CheckpointSaver(model, optimizer, args=args, model_ema=ema, checkpoint_dir=str(tmp_path))
    saver.save_checkpoint(epoch=0, metric=0.5)
    for file in ("last.pth.tar", "model_best.pth.tar"):
        path = tmp_path / file
        for use_ema, weights, key in ((False, str(path), "state_dict"), (True, f"{path}#ema", "state_dict_ema")):
            want = eager_model(R18, seed=5)
            load_checkpoint(want, str(path), use_ema=use_ema)
            got = zoo_at.get(R18)
            got.materialize(weights=weights)
            assert got.materialize.state_key == key
            assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values()))
            assert zoo_at.check(R18, weights).exact and zoo_at.check(R18, weights).state_key == key
    assert not torch.equal(model.fc.weight, ema.module.fc.weight)


def test_torchvision_reference_checkpoints_load_as_its_train_py_reloads_them(zoo_at, tmp_path):
    """references/classification/train.py saves this dict (args an argparse.Namespace, which a weights-only
    unpickler refused) and resumes with load_state_dict; its EMA is an AveragedModel (module. prefix, n_averaged)."""
    from torch.optim.swa_utils import AveragedModel

    name = "torchvision/resnet18"
    model, optimizer = _trained(name, seed=1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    model_ema = AveragedModel(eager_model(name, seed=2), multi_avg_fn=None, use_buffers=True)
    model_ema.update_parameters(model)
    args = argparse.Namespace(model="resnet18", lr=0.1, epochs=1, output_dir=str(tmp_path), model_ema=True)
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "epoch": 0,
        "args": args,
        "model_ema": model_ema.state_dict(),
    }
    path = tmp_path / "checkpoint.pth"
    torch.save(checkpoint, path)
    saved = torch.load(path, map_location="cpu", weights_only=False)  # as train.py resumes
    want = eager_model(name, seed=5)
    want.load_state_dict(saved["model"])
    want_ema = AveragedModel(eager_model(name, seed=6), use_buffers=True)
    want_ema.load_state_dict(saved["model_ema"])
    for weights, reference, key in ((str(path), want, "model"), (f"{path}#ema", want_ema.module, "model_ema")):
        got = zoo_at.get(name).materialize(weights=weights)
        assert got.materialize.state_key == key
        assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), reference.state_dict().values()))
        assert zoo_at.check(name, weights).exact and zoo_at.check(name, weights).state_key == key


class _Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def test_a_training_checkpoint_carrying_code_is_refused_and_its_code_never_runs(zoo_at, tmp_path):
    marker = tmp_path / "ran"
    state = eager_model(R18).state_dict()
    for i, extra in enumerate(
        ({"args": _Payload(marker)}, {"args": argparse.Namespace(lr=0.1, hook=_Payload(marker))})
    ):
        path = tmp_path / f"evil{i}.pth.tar"
        torch.save({"state_dict": state, **extra}, path)
        m = zoo_at.get(R18)
        with pytest.raises(CheckpointError, match="would run code"):
            m.materialize(weights=str(path))
        with pytest.raises(CheckpointError, match="would run code"):
            zoo_at.check(R18, path)
        assert on_meta(m) and not marker.exists()
    with pytest.raises(CheckpointError, match="no EMA state dict"):
        torch.save(state, tmp_path / "plain.pth")
        zoo_at.get(R18, weights=f"{tmp_path / 'plain.pth'}#ema")


# --- both keys of a tied pair ----------------------------------------------------------------------------------


def _both_keys(folder, dest, embedding, head, head_first: bool) -> str:
    """The tied GPT-2's folder with a checkpoint holding both names of the tie, in this key order (a torch.save
    file keeps its dict's order; safetensors sorts its header): the checkpoint's path."""
    shutil.copytree(folder, dest)
    (dest / "model.safetensors").unlink()
    rest = {k: v for k, v in load_file(folder / "model.safetensors").items() if k != "transformer.wte.weight"}
    pair = {"transformer.wte.weight": embedding, "lm_head.weight": head}
    torch.save({**dict(reversed(pair.items())), **rest} if head_first else {**pair, **rest}, dest / "pytorch_model.bin")
    return str(dest / "pytorch_model.bin")


@pytest.mark.parametrize("head_first", [False, True])
def test_both_keys_of_a_tie_are_checked_as_from_pretrained_checks_them(gpt2, tmp_path, head_first):
    """Before: a misshaped embedding beside a correct head loaded without a word, and of two different tensors
    the file's first key won silently (fit() skipped the second key of a tie unchecked)."""
    registry, folder = gpt2
    good = load_file(folder / "model.safetensors")["transformer.wte.weight"]
    misshaped = _both_keys(folder, tmp_path / "misshaped", torch.randn(120, 16), good, head_first)
    with pytest.raises(RuntimeError, match="mismatch"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "misshaped")
    with pytest.raises(WeightsMismatch, match=r"transformer.wte.weight \(file \[120, 16\], model \[128, 16\]\)"):
        registry.get("hf/gpt2", weights=misshaped)
    assert registry.check("hf/gpt2", misshaped).misshaped == [("transformer.wte.weight", (120, 16), (128, 16))]

    other = torch.randn(128, 16)
    differ = _both_keys(folder, tmp_path / "differ", good, other, head_first)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "differ")  # unties them, each its own
    assert torch.equal(ref.transformer.wte.weight, good) and torch.equal(ref.lm_head.weight, other)
    m = registry.get("hf/gpt2")
    with pytest.raises(
        WeightsMismatch,
        match="tied pair.*(transformer.wte.weight and lm_head.weight|lm_head.weight and transformer.wte.weight)",
    ) as raised:
        m.materialize(weights=differ)
    assert {frozenset(pair) for pair in raised.value.tied} == {frozenset(("transformer.wte.weight", "lm_head.weight"))}
    assert on_meta(m)  # nothing changed
    untied = registry.get("hf/gpt2", weights=differ, tie_word_embeddings=False)  # as the error's hint says
    assert torch.equal(untied.transformer.wte.weight, good) and torch.equal(untied.lm_head.weight, other)

    same = registry.get("hf/gpt2", weights=_both_keys(folder, tmp_path / "same", good, good.clone(), head_first))
    assert same.lm_head.weight is same.transformer.wte.weight and torch.equal(same.lm_head.weight, good)
