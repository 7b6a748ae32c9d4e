"""Hugging Face family: tiny configs round trip exactly, the catalog's counts, hf:// weights through
huggingface_hub's cache (offline) and from a local hub server (online). No network."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402 - after importorskip

import zoo  # noqa: E402 - after importorskip
from tests.conftest import ROOT, cli_json  # noqa: E402 - after importorskip
from zoo.errors import CheckpointError, HubUnavailable, InvalidRecipe, UntrustedBuilder  # noqa: E402 - after importorskip

CATALOG = ROOT / "catalog" / "hf"
PUBLISHED = json.loads((CATALOG / "published.json").read_text())
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "test-org/tiny-llama"

# Tiny random configs: a few layers, small widths; each family's interesting parts kept (GQA, tied
# embeddings, llama3 RoPE scaling, sliding window, qkv biases, an encoder-decoder, a masked LM).
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
TINY = {
    "llama": (
        "LlamaConfig",
        "AutoModelForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            rope_parameters=_LLAMA3_ROPE,
        ),
    ),
    "mistral": (
        "MistralConfig",
        "AutoModelForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            sliding_window=4,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "AutoModelForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            tie_word_embeddings=True,
        ),
    ),
    "gpt2": (
        "GPT2Config",
        "AutoModelForCausalLM",
        dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0),
    ),
    "bert": (
        "BertConfig",
        "AutoModelForMaskedLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=128,
            max_position_embeddings=64,
        ),
    ),
    "t5": (
        "T5Config",
        "AutoModelForSeq2SeqLM",
        dict(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=128),
    ),
    # MoE: save_pretrained writes one key per expert, the model holds them fused (transformers converts)
    "mixtral": (
        "MixtralConfig",
        "AutoModelForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "AutoModelForCausalLM",
        dict(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            shared_expert_intermediate_size=64,
        ),
    ),
}
NAMES = {kind: "hf/test/tiny-llama" if kind == "llama" else f"hf/tiny-{kind}" for kind in TINY}


def tiny_config(kind: str):
    config_class, _, kwargs = TINY[kind]
    return getattr(transformers, config_class)(**kwargs)


def forward(model, kind: str, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (2, 9), generator=gen)
    model.eval()
    with torch.no_grad():
        if kind == "t5":
            return model(input_ids=ids, decoder_input_ids=ids[:, :5]).logits
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Each tiny model saved (sharded) with save_pretrained and indexed with the CLI: the llama one as
    `zoo index hf DIR --name hf/test/tiny-llama`, the rest in one call under their default names."""
    root = tmp_path_factory.mktemp("tiny")
    dirs = {}
    for kind, (_, auto, _) in TINY.items():
        torch.manual_seed(0)
        model = getattr(transformers, auto).from_config(tiny_config(kind))
        dirs[kind] = root / f"tiny-{kind}"
        model.save_pretrained(dirs[kind], max_shard_size="40KB")
    url = f"sqlite:///{root / 'tiny.db'}"
    out = cli_json("index", "hf", str(dirs["llama"]), "--name", "hf/test/tiny-llama", registry=url)
    assert out == {"indexed": 1, "unchanged": 0, "failed": {}}
    out = cli_json("index", "hf", *[str(d) for k, d in dirs.items() if k != "llama"], registry=url)
    assert out == {"indexed": len(TINY) - 1, "unchanged": 0, "failed": {}}
    return zoo.connect(url), dirs


@pytest.mark.parametrize("kind", list(TINY))
def test_tiny_round_trip_equals_from_pretrained(tiny, kind):
    registry, dirs = tiny
    auto = getattr(transformers, TINY[kind][1])
    assert len(list(dirs[kind].glob("*.safetensors"))) > 2  # sharded, read through the index JSON
    m = registry.get(NAMES[kind])
    assert all(t.is_meta for t in [*m.parameters(), *m.buffers()])
    ids_before = [id(p) for p in m.parameters()]
    m.materialize(device="cpu", weights=str(dirs[kind]))
    ref = auto.from_pretrained(dirs[kind])
    assert [id(p) for p in m.parameters()] == ids_before
    assert type(m) is type(ref)
    got, want = m.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    got_buffers, want_buffers = dict(m.named_buffers()), dict(ref.named_buffers())  # non-persistent ones too
    assert got_buffers.keys() == want_buffers.keys()
    for key, b in want_buffers.items():
        assert torch.equal(got_buffers[key], b), key
    assert torch.equal(forward(m, kind), forward(ref, kind))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from /proc")
def test_a_language_model_maps_its_file_where_from_pretrained_does_and_trains_as_it(tiny, tmp_path):
    """from_pretrained hands out views of the file wherever it holds a tensor; zoo's default load maps the same
    tensors, those not 64-byte aligned too, at the same alignment, and the two models train alike, bit for bit."""
    from tests.test_materialize import _mappings_of, pad_header
    from zoo.materialize import materialize
    from zoo.meta import force_meta

    registry, dirs = tiny
    src = tmp_path / "llama"
    shutil.copytree(dirs["llama"], src)
    for file in src.glob("*.safetensors"):
        pad_header(file, data_at=8)  # every tensor 8 bytes past a multiple of 64
    ref = transformers.AutoModelForCausalLM.from_pretrained(src)
    m = registry.get(NAMES["llama"]).materialize(weights=str(src))
    with force_meta():
        plain = transformers.AutoModelForCausalLM.from_config(ref.config)
    materialize(plain, weights=str(src))  # no zoo.get: the module's class says it is transformers'
    mapped = [r for file in src.glob("*.safetensors") for r in _mappings_of(file)]
    for model in (m, plain):
        for key, t in model.state_dict().items():
            assert any(lo <= t.data_ptr() < hi for lo, hi in mapped), f"{key} was copied"
        alignment = {k: t.data_ptr() % 64 for k, t in model.state_dict().items()}
        assert alignment == {k: t.data_ptr() % 64 for k, t in ref.state_dict().items()}
        assert set(alignment.values()) == {8}
    threads = torch.get_num_threads()

    def train(model):
        opt, gen, losses = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(1), []
        for _ in range(3):
            ids = torch.randint(1, 128, (2, 9), generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, model.state_dict()

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS for each rank
    try:
        (got_losses, got), (want_losses, want) = train(m.train()), train(ref.train())
    finally:
        torch.set_num_threads(threads)
    assert got_losses == want_losses
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_lazy_language_model_loads_on_generate_and_generates_as_from_pretrained(tiny):
    """generate() is not forward: its first use of the model (reading its device from its parameters, then the
    call) loads the weights, and greedy decoding gives from_pretrained's tokens. Fails with neither load."""
    registry, dirs = tiny
    m = registry.get(NAMES["llama"], weights=str(dirs["llama"]), dispatch="lazy")
    assert all(p.is_meta for mod in m.modules() for p in mod._parameters.values() if p is not None)  # not loaded
    ref = transformers.AutoModelForCausalLM.from_pretrained(dirs["llama"])
    ids = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(3))
    want = ref.generate(ids, max_new_tokens=5, do_sample=False)
    got = m.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(got, want) and got.shape == (1, 11)
    assert not any(p.is_meta for p in m.parameters())


def _moe_file(tiny, tmp_path, edit) -> str:
    """The tiny Mixtral's save_pretrained keys (one per expert) in one file, after `edit(tensors)`."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for shard in tiny[1]["mixtral"].glob("*.safetensors"):
        tensors.update(load_file(shard))
    edit(tensors)
    save_file(tensors, tmp_path / "moe.safetensors")
    return str(tmp_path / "moe.safetensors")


def test_moe_experts_each_fill_their_part_and_a_missing_one_is_named(tiny, tmp_path):
    registry, dirs = tiny
    ref = transformers.AutoModelForCausalLM.from_pretrained(dirs["mixtral"])
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    assert ref.state_dict()[fused].shape == (4, 2 * 96, 64)
    gone = "model.layers.0.block_sparse_moe.experts.2.w3.weight"
    weights = _moe_file(tiny, tmp_path, lambda t: t.pop(gone))
    with pytest.raises(zoo.WeightsMismatch, match=fused):
        registry.get(NAMES["mixtral"]).materialize(weights=weights)
    m = registry.get(NAMES["mixtral"])
    m.materialize(weights=weights, strict=False)
    assert m.materialize.incompatible_keys.missing_keys == [fused]
    assert m.materialize.incompatible_keys.unexpected_keys == []
    got, want = m.state_dict(), ref.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want if k != fused)  # the rest of the experts in place
    # the constructor's values for the whole tensor, as if it were never asked for; not half a file's tensor
    assert not any(torch.equal(got[fused][e], want[fused][e]) for e in range(4))


def test_moe_rank_holding_some_experts_reads_just_those(tiny):
    """FSDP2 shards a fused experts tensor on dim 0 (experts): rank 1 of 2 gets experts 2 and 3 from their
    own keys, the other experts' keys are read by no one here (a fake process group: one rank, in process)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    registry, dirs = tiny
    want = transformers.AutoModelForCausalLM.from_pretrained(dirs["mixtral"]).model.layers[0].mlp.experts
    dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,))
        m = registry.get(NAMES["mixtral"])
        experts = m.model.layers[0].mlp.experts
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            local = torch.empty((2, *full.shape[1:]), device="meta")
            sharded = DTensor.from_local(
                local, mesh, [Shard(0)], shape=full.shape, stride=full.stride(), run_check=False
            )
            setattr(experts, name, torch.nn.Parameter(sharded))
        m.materialize(weights=str(dirs["mixtral"]))
        for name in ("gate_up_proj", "down_proj"):
            assert torch.equal(getattr(experts, name).to_local(), getattr(want, name)[2:4]), name
    finally:
        dist.destroy_process_group()


def test_moe_keys_saved_from_a_ddp_wrapper_load(tiny, tmp_path):
    """`module.` + a per-expert key: the wrapper's prefix goes, then transformers' conversion applies."""
    weights = _moe_file(tiny, tmp_path, lambda t: t.update({f"module.{k}": t.pop(k) for k in list(t)}))
    m = tiny[0].get(NAMES["mixtral"]).materialize(weights=weights)
    want = transformers.AutoModelForCausalLM.from_pretrained(tiny[1]["mixtral"]).state_dict()
    assert all(torch.equal(m.state_dict()[k], v) for k, v in want.items())


def test_moe_expert_of_the_wrong_shape_is_refused(tiny, tmp_path):
    key = "model.layers.1.block_sparse_moe.experts.0.w1.weight"
    weights = _moe_file(tiny, tmp_path, lambda t: t.update({key: t[key][:-1]}))
    with pytest.raises(zoo.WeightsMismatch, match="experts.0.w1"):
        tiny[0].get(NAMES["mixtral"]).materialize(weights=weights)


def test_ties_stay_tied_on_meta_and_after_materialize(tiny):
    registry, dirs = tiny
    m = registry.get("hf/test/tiny-llama")
    assert m.lm_head.weight is m.model.embed_tokens.weight  # so zoo counts it once
    m.materialize(weights=str(dirs["llama"]))
    assert m.lm_head.weight is m.model.embed_tokens.weight
    info = registry.info("hf/test/tiny-llama", tensors=True)
    tied = {t.name: t.tied_to for t in info.tensor_table if t.tied_to}
    assert tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert info.params == sum(p.numel() for p in m.parameters())
    t5 = registry.get("hf/tiny-t5").materialize(weights=str(dirs["t5"]))
    assert t5.lm_head.weight is t5.shared.weight is t5.encoder.embed_tokens.weight is t5.decoder.embed_tokens.weight


def test_rope_inv_freq_holds_its_true_values(tiny):
    """inv_freq is a non-persistent buffer (in no checkpoint): materialize gives it the constructor's values."""
    registry, dirs = tiny
    m = registry.get("hf/test/tiny-llama").materialize(weights=str(dirs["llama"]))
    eager = transformers.AutoModelForCausalLM.from_config(tiny_config("llama"))  # built for real, on CPU
    rotary = m.model.rotary_emb
    assert "inv_freq" in rotary._non_persistent_buffers_set
    assert torch.equal(rotary.inv_freq, eager.model.rotary_emb.inv_freq)
    assert torch.equal(rotary.original_inv_freq, eager.model.rotary_emb.original_inv_freq)
    m = registry.get("hf/tiny-mistral").materialize(weights=str(dirs["mistral"]))
    dim = 64 // 4
    theta = m.config.rope_parameters["rope_theta"]
    want = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    assert torch.equal(m.model.rotary_emb.inv_freq, want)
    assert m.model.rotary_emb.inv_freq.dtype == torch.float32


def test_indexed_row(tiny):
    registry, _ = tiny
    info = registry.info("hf/test/tiny-llama")
    assert (info.family, info.builder, info.task) == ("hf", "AutoModelForCausalLM", "text-generation")
    assert info.arch == "transformers.models.llama.modeling_llama.LlamaForCausalLM"
    assert info.kwargs["config"]["model_type"] == "llama" and "_name_or_path" not in info.kwargs["config"]
    assert registry.info("hf/tiny-bert").task == "fill-mask"
    assert registry.info("hf/tiny-t5").task == "text2text-generation"
    assert "transformers" in info.versions


def test_overrides_rebuild_with_other_config_fields(tiny):
    registry, _ = tiny
    m = registry.get("hf/test/tiny-llama", num_hidden_layers=1)
    assert len(m.model.layers) == 1 and all(t.is_meta for t in m.parameters())


# --- safety ---------------------------------------------------------------------------------


def test_only_allowed_auto_classes_and_no_remote_code():
    from zoo.build import build_meta
    from zoo.families import hf
    from zoo.recipe import Recipe

    config = {"model_type": "llama", "hidden_size": 64}
    for builder in ("AutoModelForFoo", "LlamaForCausalLM", "transformers:AutoModel", "os.system"):
        with pytest.raises(UntrustedBuilder, match="allowed"):
            hf.check(builder, {"config": config})
    with pytest.raises(UntrustedBuilder, match="remote code"):
        hf.check("AutoModelForCausalLM", {"config": {**config, "auto_map": {"AutoModel": "x.Y"}}})
    with pytest.raises(UntrustedBuilder, match="remote code"):
        hf.check("AutoModel", {"config": {"model_type": "x", "text_config": {"auto_map": {}}}})
    with pytest.raises(UntrustedBuilder, match="trust_remote_code"):
        build_meta(Recipe("hf", "AutoModel", {"config": config, "trust_remote_code": True}))
    with pytest.raises(InvalidRecipe):
        hf.check("AutoModel", {"config": "llama"})


def test_unknown_model_type_is_an_error_recorded_at_index_time(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model", "architectures": ["X"]}))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index("hf", [str(tmp_path)], name="hf/test/unknown")
    assert "no-such-model" in outcome.failed["hf/test/unknown"]
    info = zoo.connect(url).info("hf/test/unknown")
    assert info.status == "error" and "not known to the installed transformers" in info.error


def test_a_hub_config_with_auto_map_for_a_native_type_builds_the_native_class(tmp_path):
    from zoo.families.hf import recipe_of

    config = tiny_config("llama").to_dict() | {"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}}
    recipe = recipe_of(config)
    assert "auto_map" not in recipe.kwargs["config"] and recipe.builder == "AutoModelForCausalLM"


def test_a_build_never_touches_the_network(monkeypatch):
    import socket

    from zoo.build import build_meta
    from zoo.families.hf import recipe_of

    def refuse(*args, **kwargs):
        raise AssertionError("a meta build opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    m = build_meta(recipe_of(tiny_config("qwen2").to_dict()))
    assert all(t.is_meta for t in m.parameters())


def test_search_and_info_do_not_import_transformers(catalog):
    url = catalog
    code = (
        "import sys, zoo\n"
        "z = zoo.connect(sys.argv[1])\n"
        "assert z.search('params<7e9 and task=text-generation') and z.info('hf/meta-llama/Llama-3.1-405B')\n"
        "import zoo.families.hf, zoo.weights.hub\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code, url], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# --- the catalog ----------------------------------------------------------------------------


@pytest.fixture
def catalog(hf_catalog):
    """The shipped catalog indexed with the CLI (conftest): its registry URL."""
    return hf_catalog


def test_catalog_files_and_published_figures_match_one_to_one():
    names = {"hf/" + p.stem.replace("__", "/", 1) for p in CATALOG.glob("*__*.json")}
    assert names == set(PUBLISHED)
    assert len(names) >= 109
    for entry in PUBLISHED.values():
        assert entry["source"] and isinstance(entry["params"], int)
        assert isinstance(entry.get("tolerance", 0), int) and 0 <= entry.get("tolerance", 0) <= entry["params"] / 10
        if "explained" in entry:  # a disagreement is stated with its reason, and bounded
            assert entry["explained"]["why"] and ("delta" in entry["explained"]) != ("within" in entry["explained"])


def published_disagreement(count: int, entry: dict) -> str | None:
    """None when the meta build's count meets the published figure: exactly, within the figure's rounding
    ("tolerance": half a unit in its last published digit), or by the stated, explained difference."""
    diff, tolerance = count - entry["params"], entry.get("tolerance", 0)
    explained = entry.get("explained")
    if explained is None:
        return None if abs(diff) <= tolerance else f"meta build {count:,}, published {entry['params']:,}"
    if abs(diff) <= tolerance:
        return "agrees with the published figure: its 'explained' difference is stale"
    bound = abs(diff - explained["delta"]) <= tolerance if "delta" in explained else abs(diff) <= explained["within"]
    return None if bound else f"meta build {count:,}, published {entry['params']:,}: not the explained difference"


def catalog_count(info, entry: dict) -> int:
    count = info.params
    if "plus_buffers" in entry:  # a checkpoint tensor that transformers keeps as a persistent buffer
        count += sum(
            t.numel
            for t in info.tensor_table
            if t.kind == "buffer" and t.persistent and t.tied_to is None and t.name.endswith(entry["plus_buffers"])
        )
    return count


def test_catalog_counts_equal_published_figures(catalog):
    """Every catalog model built on meta through zoo's family, tied embeddings counted once, against a figure
    published independently of transformers (keras-hub's counts, the hub's safetensors totals, model cards)."""
    registry = zoo.connect(catalog)
    wrong, exact = {}, 0
    for name, entry in PUBLISHED.items():
        info = registry.info(name, tensors="plus_buffers" in entry)
        assert info.status == "ok", (name, info.error)
        count = catalog_count(info, entry)
        exact += count == entry["params"]
        if (reason := published_disagreement(count, entry)) is not None:
            wrong[name] = reason
    assert not wrong
    assert exact >= 35  # most figures are exact counts, not rounded ones
    # no time limit: indexing runs meta forwards per model (analysis); bench/llm_estimate.py measures it


def test_published_disagreement_catches_a_wrong_count():
    entry = {"params": 1000, "tolerance": 5}
    assert published_disagreement(1004, entry) is None and published_disagreement(1006, entry)
    delta = {"params": 1000, "explained": {"delta": 50, "why": "w"}}
    assert published_disagreement(1050, delta) is None and published_disagreement(1051, delta)
    assert "stale" in published_disagreement(1000, delta)
    within = {"params": 1000, "explained": {"within": 80, "why": "w"}}
    assert published_disagreement(1079, within) is None and published_disagreement(1081, within)


def test_catalog_search_under_7e9_is_exactly_the_small_generators(catalog):
    registry = zoo.connect(catalog)
    infos = [registry.info(name) for name in PUBLISHED]
    want = {i.name for i in infos if i.params < 7e9 and i.task == "text-generation"}
    got = {i.name for i in registry.search("params<7e9 and task=text-generation", limit=None)}
    assert got == want and "hf/meta-llama/Llama-2-7b-hf" in got and "hf/google-bert/bert-base-uncased" not in got
    assert "hf/meta-llama/Llama-3.2-1B-Instruct" in got and "hf/Qwen/Qwen3-8B" not in got


def test_catalog_ties_are_recorded(catalog):
    registry = zoo.connect(catalog)

    def tied(name):
        return {t.name: t.tied_to for t in registry.info(name, tensors=True).tensor_table if t.tied_to}

    assert tied("hf/meta-llama/Llama-3.2-1B") == {"lm_head.weight": "model.embed_tokens.weight"}
    assert tied("hf/Qwen/Qwen2.5-0.5B") == {"lm_head.weight": "model.embed_tokens.weight"}
    assert tied("hf/meta-llama/Llama-3.1-8B") == {}
    assert tied("hf/openai-community/gpt2") == {"lm_head.weight": "transformer.wte.weight"}


def _status_kib(key: str) -> int:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))


def test_the_405b_model_is_got_on_meta_without_allocating_its_weights(catalog):
    """Only memory is asserted; bench/llm_estimate.py times it (timed asserts flake on a shared machine)."""
    from zoo import model_cache

    registry = zoo.connect(catalog)
    registry.get("hf/meta-llama/Llama-3.2-1B")  # transformers' llama modules imported: not what this measures
    model_cache.clear()
    open("/proc/self/clear_refs", "w").write(
        "5"
    )  # peak RSS (VmHWM) reset to now: earlier tests' peaks don't hide this one
    rss = _status_kib("VmHWM")
    m = registry.get("hf/meta-llama/Llama-3.1-405B")
    assert sum(p.numel() for p in m.parameters()) == PUBLISHED["hf/meta-llama/Llama-3.1-405B"]["params"]
    assert all(p.is_meta for p in m.parameters()) and m.lm_head.weight.dtype == torch.bfloat16
    assert _status_kib("VmHWM") - rss < 300 * 1024  # KiB: no weights allocated


def test_the_shipped_registry_holds_the_catalog():
    from zoo.constants import DEFAULT_REGISTRY
    from zoo.errors import SchemaOutdated

    registry = zoo.connect(str(DEFAULT_REGISTRY))
    try:
        shipped = {i.name for i in registry.search("family=hf", limit=None)}
    except SchemaOutdated:
        shipped = set()
    if not set(PUBLISHED) <= shipped:
        pytest.skip(
            f"registry.db predates the hf catalog ({len(set(PUBLISHED) - shipped)} of its models missing): "
            f"rebuild it with `make registry`"
        )
    for name, entry in PUBLISHED.items():
        if "plus_buffers" not in entry:
            assert published_disagreement(registry.info(name).params, entry) is None, name


# --- hf:// weights --------------------------------------------------------------------------


def shards(folder: Path) -> list[str]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def populate_cache(cache: Path, repo: str, source: Path, commit: str = COMMIT) -> Path:
    """Lay `source`'s files out as huggingface_hub's cache does: blobs named by their ETag (sha256 for
    LFS files, git sha1 for the rest), a snapshot of symlinks, refs/main."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    for file in source.iterdir():
        data = file.read_bytes()
        etag = hashlib.sha256(data).hexdigest() if file.suffix == ".safetensors" else git_sha1(data)
        (folder / "blobs" / etag).write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", etag))
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache, offline unless a test says otherwise."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hf_uri_offline_from_the_cache(tiny, hub_cache):
    registry, dirs = tiny
    populate_cache(hub_cache, REPO, dirs["llama"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(dirs["llama"])
    for uri in (f"hf://{REPO}", f"hf://{REPO}@main", f"hf://{REPO}@{COMMIT}"):
        m = registry.get("hf/test/tiny-llama").materialize(device="cpu", weights=uri)
        assert torch.equal(forward(m, "llama"), forward(ref, "llama")), uri
        assert m.lm_head.weight is m.model.embed_tokens.weight
    m = registry.get("hf/test/tiny-llama", weights=f"hf://{REPO}", device="cpu")  # the one-liner
    assert torch.equal(forward(m, "llama"), forward(ref, "llama"))


def test_hf_uri_a_corrupt_cached_shard_is_refused(tiny, hub_cache):
    registry, dirs = tiny
    folder = populate_cache(hub_cache, REPO, dirs["llama"])
    shard = (folder / "snapshots" / COMMIT / shards(dirs["llama"])[1]).resolve()
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # same size, one value changed: huggingface_hub's size check would pass
    shard.write_bytes(bytes(data))
    m = registry.get("hf/test/tiny-llama")
    with pytest.raises(CheckpointError, match="sha256 .* differs from the hub's"):
        m.materialize(weights=f"hf://{REPO}")
    assert all(p.is_meta for p in m.parameters())


def test_hf_uri_offline_without_the_files_is_a_clear_error(tiny, hub_cache):
    registry, dirs = tiny
    with pytest.raises(HubUnavailable, match="HF_HUB_OFFLINE"):
        registry.get("hf/test/tiny-llama").materialize(weights="hf://test-org/absent")
    folder = populate_cache(hub_cache, REPO, dirs["llama"])
    (folder / "snapshots" / COMMIT / shards(dirs["llama"])[2]).unlink()
    with pytest.raises(HubUnavailable, match=shards(dirs["llama"])[2]):
        registry.get("hf/test/tiny-llama").materialize(weights=f"hf://{REPO}")
    with pytest.raises(CheckpointError, match="hf://ORG/NAME"):
        registry.get("hf/test/tiny-llama").materialize(weights="hf://not a repo")


def test_index_a_hub_repo_id_from_the_cache(tiny, hub_cache, tmp_path):
    _, dirs = tiny
    populate_cache(hub_cache, REPO, dirs["llama"])
    url = f"sqlite:///{tmp_path / 'r.db'}"
    registry = zoo.connect(url)
    outcome = registry.index("hf", [REPO])
    assert outcome.indexed == ["hf/test-org/tiny-llama"]
    assert registry.index("hf", [f"hf://{REPO}@{COMMIT}"], name="pinned").indexed == ["hf/pinned"]
    assert registry.index("hf", [REPO]).unchanged == ["hf/test-org/tiny-llama"]
    assert "HF_HUB_OFFLINE" in registry.index("hf", ["test-org/absent"]).failed["test-org/absent"]
    info = zoo.connect(url).info("hf/test-org/tiny-llama")
    assert info.params == zoo.connect(url).info("hf/pinned").params > 0


class HubHandler(BaseHTTPRequestHandler):
    """Enough of the hub for hf_hub_download: HEAD and GET of /{repo}/resolve/{revision}/{file}."""

    files: dict[str, bytes] = {}
    requests: list[str] = []

    def log_message(self, *args):
        pass

    def _file(self):
        repo, sep, rest = self.path.partition("/resolve/")
        revision, _, name = rest.partition("/")
        data = self.files.get(name) if sep and repo.strip("/") == REPO and revision in ("main", COMMIT) else None
        self.requests.append(f"{self.command} {name}")
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        lfs = name.endswith(".safetensors")
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        etag = hashlib.sha256(data).hexdigest() if lfs else git_sha1(data)
        self.send_header("X-Linked-Etag" if lfs else "ETag", f'"{etag}"')
        if lfs:
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return data

    def do_HEAD(self):
        self._file()

    def do_GET(self):
        data = self._file()
        if data:
            self.wfile.write(data)


def test_hf_uri_downloads_from_a_local_hub_when_online(tiny, hub_cache, monkeypatch):
    from huggingface_hub import constants

    registry, dirs = tiny
    HubHandler.files = {p.name: p.read_bytes() for p in dirs["llama"].iterdir()}
    HubHandler.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # what HF_ENDPOINT sets
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(dirs["llama"])
    try:
        m = registry.get("hf/test/tiny-llama").materialize(weights=f"hf://{REPO}")
    finally:
        server.shutdown()
    assert torch.equal(forward(m, "llama"), forward(ref, "llama"))
    assert {f"GET {s}" for s in shards(dirs["llama"])} <= set(HubHandler.requests)
    assert not any("pytorch_model" in r for r in HubHandler.requests)  # safetensors only, never pickles
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the server is gone: the cache answers
    m = registry.get("hf/test/tiny-llama").materialize(weights=f"hf://{REPO}")
    assert torch.equal(forward(m, "llama"), forward(ref, "llama"))
    snapshot = hub_cache / "models--test-org--tiny-llama" / "snapshots" / COMMIT
    assert {p.name for p in snapshot.iterdir()} == {n for n in HubHandler.files if "safetensors" in n}
    shutil.rmtree(hub_cache / "models--test-org--tiny-llama")


def test_hf_uri_a_cached_single_file_serves_when_the_hub_is_unreachable(tiny, hub_cache, monkeypatch, tmp_path):
    """Online but with the hub down: the index is unknown, the cached model.safetensors still loads."""
    from huggingface_hub import constants
    from safetensors.torch import save_file

    registry, dirs = tiny
    ref = transformers.AutoModelForCausalLM.from_pretrained(dirs["llama"])
    single = tmp_path / "single"
    single.mkdir()
    state = {k: v.contiguous() for k, v in ref.state_dict().items() if k != "lm_head.weight"}  # tied: stored once
    save_file(state, str(single / "model.safetensors"))
    populate_cache(hub_cache, REPO, single)
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()  # nothing listens there: connections are refused
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    m = registry.get("hf/test/tiny-llama").materialize(weights=f"hf://{REPO}")
    assert torch.equal(forward(m, "llama"), forward(ref, "llama"))
