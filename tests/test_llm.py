"""Language models: LLM fields against the formula from each catalog config and the published
mixture-of-experts figures; an input spec and analysis for every catalog row; scan with token ids and with
text (tokenizer from a laid-out HF cache); estimate's KV cache against a real cached forward, the weights
term against each quantization formula, activation checkpointing; a user builder with an input spec."""

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402 - after importorskip
from tests.conftest import ROOT, cli_json, run_cli  # noqa: E402 - after importorskip
from zoo.errors import AnalysisError, InvalidArgument, TokenizerNotCached  # noqa: E402 - after importorskip

CATALOG = ROOT / "catalog" / "hf"
FILES = sorted(CATALOG.glob("*__*.json"))
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# Fields a SigLIP hub config leaves out: SiglipTextConfig / SiglipVisionConfig's documented defaults (Base/16).
OMITTED = {
    "siglip_text_model": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 64,
        "vocab_size": 32000,
    },
    "siglip_vision_model": {"image_size": 224, "patch_size": 16, "num_channels": 3},
}


def _config(file) -> dict:
    c = json.loads(file.read_text())
    for key in ("text_config", "vision_config"):
        if isinstance(c.get(key), dict):
            c[key] = {**OMITTED.get(c[key].get("model_type"), {}), **c[key]}
    return c


def _name(file) -> str:
    return "hf/" + file.stem.replace("__", "/", 1)


@pytest.fixture
def catalog(hf_catalog):
    """The shipped catalog indexed (with analysis) into a fresh registry (conftest)."""
    return zoo.connect(hf_catalog)


# --- LLM fields ---------------------------------------------------------------------------------

# Encoders keep no KV cache: their rows record none (a ViT has no vocabulary or context either).
ENCODERS = {"bert", "clip", "siglip", "vit", "roberta", "xlm-roberta", "distilbert"}


def expected_fields(c: dict) -> dict:
    """The LLM columns written out from a config.json as published (keys as each family spells them)."""
    model_type = c["model_type"]
    c = {**c, **c.get("text_config", {})}  # a dual encoder's (CLIP's) language fields are its text tower's
    first = lambda *keys: next((c[k] for k in keys if c.get(k) is not None), None)  # noqa: E731 - a one-line helper
    encoder_decoder = c.get("is_encoder_decoder", False)
    layers = (
        first("num_decoder_layers", "decoder_layers", "num_layers")
        if encoder_decoder
        else first("num_hidden_layers", "n_layer", "n_layers")
    )
    heads = (
        first("decoder_attention_heads", "num_heads")
        if encoder_decoder
        else first("num_attention_heads", "n_head", "n_heads")
    )
    hidden = first("hidden_size", "n_embd", "n_embed", "d_model", "dim")  # BLOOM: n_embed, DistilBERT: dim
    kv_heads = (None if encoder_decoder else c.get("num_key_value_heads")) or (1 if c.get("multi_query") else heads)
    head_dim = first("head_dim", "d_kv") or hidden // heads
    nbytes = BYTES[c.get("torch_dtype") or "float32"]
    if "kv_lora_rank" in c:  # multi-latent attention: the compressed latent and the rope key
        kv = layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * nbytes
    else:
        kv = layers * kv_heads * head_dim * 2 * nbytes
    window = c.get("sliding_window")
    if c.get("use_sliding_window") is False:  # Qwen2 configs carry a window no layer uses
        window = None
    return {
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "hidden_size": hidden,
        "vocab_size": c.get("vocab_size"),
        "kv_bytes_per_token": None if model_type in ENCODERS else kv,
        "context_length": first(
            "max_position_embeddings", "n_positions", "max_target_positions"
        ),  # Whisper: its decoder's
        "sliding_window": window,
        "experts": first("num_local_experts", "n_routed_experts", "num_experts") or 0,
        "experts_per_token": c.get("num_experts_per_tok", 0)
        if first("num_local_experts", "n_routed_experts", "num_experts")
        else 0,
    }


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.stem)
def test_llm_fields_against_the_config_formula(catalog, file):
    info = catalog.info(_name(file))
    got = {k: getattr(info, k) for k in expected_fields(_config(file))}
    assert got == expected_fields(_config(file))
    if not got["experts"]:
        assert info.active_params == info.params  # dense: every parameter is used for every token


def _expert_params(c: dict) -> tuple[int, int]:
    """(parameters of all routed experts, of one token's top-k) from the config: three matrices
    (gate, up, down) of hidden x expert width per expert and MoE layer."""
    hidden = c["hidden_size"]
    if c["model_type"] == "mixtral":
        per_expert, moe_layers, n = 3 * hidden * c["intermediate_size"], c["num_hidden_layers"], c["num_local_experts"]
    elif c["model_type"] == "qwen3_moe":  # every layer sparse: no mlp_only_layers, decoder_sparse_step 1
        assert c["mlp_only_layers"] == [] and c["decoder_sparse_step"] == 1
        per_expert, moe_layers, n = 3 * hidden * c["moe_intermediate_size"], c["num_hidden_layers"], c["num_experts"]
    else:  # deepseek: the first k layers are dense
        per_expert = 3 * hidden * c["moe_intermediate_size"]
        moe_layers, n = c["num_hidden_layers"] - c["first_k_dense_replace"], c["n_routed_experts"]
    return per_expert * n * moe_layers, per_expert * c["num_experts_per_tok"] * moe_layers


# Published totals / active parameters: the Mixtral announcements (mistral.ai/news/mixtral-of-experts:
# 46.7B total, 12.9B used per token; mistral.ai/news/mixtral-8x22b: 141B, 39B active) and the DeepSeek-V3
# technical report (arXiv 2412.19437: 671B total, 37B activated per token). Each within half a unit of
# the published figure's last digit, except DeepSeek's active: the report's 37B is 37.55B cut to whole
# billions (the input embedding, 0.93B, counted as Mixtral's 12.9B counts it), so [37B, 38B).
MOE_PUBLISHED = {
    "hf/mistralai/Mixtral-8x7B-v0.1": ((46.65e9, 46.75e9), (12.85e9, 12.95e9)),
    "hf/mistralai/Mixtral-8x22B-v0.1": ((140.5e9, 141.5e9), (38.5e9, 39.5e9)),
    "hf/deepseek-ai/DeepSeek-V3": ((670.5e9, 671.5e9), (37e9, 38e9)),
    "hf/deepseek-ai/DeepSeek-V2": ((235.5e9, 236.5e9), (20.5e9, 21.5e9)),  # arXiv 2405.04434: 236B, 21B activated
    "hf/Qwen/Qwen3-235B-A22B": ((234.5e9, 235.5e9), (21.5e9, 22.5e9)),  # model card: 235B total, 22B activated
}


@pytest.mark.parametrize("name", list(MOE_PUBLISHED))
def test_moe_totals_and_active_parameters_meet_the_published_figures(catalog, name):
    info = catalog.info(name)
    (lo, hi), (alo, ahi) = MOE_PUBLISHED[name]
    assert lo <= info.params <= hi and alo <= info.active_params <= ahi, (info.params, info.active_params)
    routed, used = _expert_params(_config(CATALOG / (name.removeprefix("hf/").replace("/", "__", 1) + ".json")))
    assert info.active_params == info.params - routed + used
    # prefill costs about 2 FLOPs per active parameter per token (the embedding lookup costs none)
    matmul = 2 * (info.active_params - info.vocab_size * info.hidden_size)
    assert matmul <= info.flops_per_token <= 1.1 * matmul
    assert catalog.search(f"active_params<40e9 and experts>0 and name='{name}'", fields=("name",))


# --- analysis for every catalog row -------------------------------------------------------------


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.stem)
def test_every_catalog_row_is_analysed_with_its_input_spec(catalog, file):
    info = catalog.info(_name(file))
    c = _config(file)
    assert info.scan_status == "ok", info.scan_error
    text = {**c, **c.get("text_config", {})}
    seq = min(128, text.get("max_position_embeddings") or text.get("max_target_positions") or 128)  # CLIP reads 77
    want = [] if c["model_type"] == "vit" else [{"name": "input_ids", "shape": [1, seq], "dtype": "int64"}]
    if c["model_type"] == "whisper":  # log-mel frames, two per encoder position (the second conv has stride 2)
        want = [
            {
                "name": "input_features",
                "shape": [1, c["num_mel_bins"], 2 * c["max_source_positions"]],
                "dtype": "float32",
            }
        ]
    if c.get("is_encoder_decoder"):
        want.append({"name": "decoder_input_ids", "shape": [1, seq], "dtype": "int64"})
    vision = c.get("vision_config") or (c if c["model_type"] == "vit" else None)
    if vision:  # images at the size the config names
        want.append(
            {
                "name": "pixel_values",
                "shape": [1, vision.get("num_channels", 3), vision["image_size"], vision["image_size"]],
                "dtype": "float32",
            }
        )
    assert info.inputs == want
    assert info.flops > 0 and info.flops_per_token == (info.flops // seq if text.get("vocab_size") else None)
    assert info.peak_activation_bytes > 0 and info.train_activation_bytes > 0


def test_gpt2_flops_per_token_by_hand(catalog):
    # Written out from GPT-2's shapes (Radford et al. 2019; the config's n_embd, n_layer, vocab_size), 2 FLOPs
    # per multiply-accumulate: per layer q, k, v, o (4 d^2) and the MLP (8 d^2); attention scores and values,
    # 2 x 128 x d per token and layer at the full length (the kernel computes the masked half too); the
    # output head (d x vocab). Kaplan et al. 2020 (table 1) write the same sum as 2N + 2 n_layer n_ctx d with
    # the values' product left out.
    c = _config(CATALOG / "openai-community__gpt2.json")
    d, layers, vocab = c["n_embd"], c["n_layer"], c["vocab_size"]
    want = 2 * (layers * 12 * d * d + layers * 2 * 128 * d + d * vocab)
    assert catalog.info("hf/openai-community/gpt2").flops_per_token == want


# --- scan: token ids and text -------------------------------------------------------------------

TINY_GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny configs indexed: a gpt2 under a hub-like name, a llama (GQA, untied), a mistral (sliding window)."""
    root = tmp_path_factory.mktemp("tiny-llm")
    configs = {
        "hf/test-org/tiny-gpt2": transformers.GPT2Config(**TINY_GPT2),
        "hf/test-org/tiny-llama": transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        ),
        "hf/test-org/tiny-mistral": transformers.MistralConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            sliding_window=4,
            tie_word_embeddings=False,
        ),
    }
    registry = zoo.connect(f"sqlite:///{root / 'tiny.db'}")
    for name, config in configs.items():
        folder = root / name.split("/")[-1]
        config.save_pretrained(folder)
        assert registry.index("hf", [str(folder)], name=name).failed == {}
    return registry, configs, root


def test_scan_with_token_id_shapes(tiny):
    registry, _, _ = tiny
    result = registry.scan("hf/test-org/tiny-gpt2", (1, 16))
    assert result.outputs[0] == ["logits", [1, 16, 128], "float32"]
    assert registry.scan("hf/test-org/tiny-gpt2", (3, 5))["transformer.h.0"].outputs[0][1] == [3, 5, 64]


def _tokenizer_files(folder, config):
    """A word-level tokenizer built with the tokenizers library, saved as a hub repo holds it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir()
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "zoo": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"})
    )
    config.save_pretrained(folder)  # AutoTokenizer reads the repo's config.json too
    return folder


def test_scan_text_needs_the_tokenizer_in_the_local_cache(tiny, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.test_hf import populate_cache

    registry, configs, _ = tiny
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerNotCached, match="test-org/tiny-gpt2 is not in the local Hugging Face cache"):
        registry.scan("hf/test-org/tiny-gpt2", "hello zoo world")
    populate_cache(cache, "test-org/tiny-gpt2", _tokenizer_files(tmp_path / "repo", configs["hf/test-org/tiny-gpt2"]))
    result = registry.scan("hf/test-org/tiny-gpt2", "hello zoo world again")
    assert result.outputs[0] == ["logits", [1, 4, 128], "float32"]  # 4 words, 4 token ids
    with pytest.raises(AnalysisError, match="registered hf model"):
        registry.scan("hf/test-org/tiny-gpt2", "hello", "world")


# --- estimate -----------------------------------------------------------------------------------


def _real_cache_bytes(config, batch: int, seq: int) -> int:
    """Bytes of the cache a real CPU forward with use_cache=True leaves, tensor by tensor."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    tensors = {id(t): t for layer in cache.layers for t in (layer.keys, layer.values)}
    return sum(t.untyped_storage().nbytes() for t in tensors.values())


@pytest.mark.parametrize("name", ["hf/test-org/tiny-llama", "hf/test-org/tiny-mistral"])
def test_estimate_kv_cache_equals_the_real_cache(tiny, name):
    registry, configs, _ = tiny
    got = registry.estimate(name, batch=3, seq_len=10, dtype="fp32")
    real = _real_cache_bytes(configs[name], 3, 10)
    assert got.kv_cache == real and got.kv_dtype == "float32"
    info = registry.info(name)
    if name.endswith("llama"):  # every layer keeps every token: the per-token figure times the tokens
        assert real == info.kv_bytes_per_token * 3 * 10
    fp8 = zoo.estimate(name, batch=3, seq_len=10, dtype="fp32", kv_dtype="fp8", registry=registry)
    assert fp8.kv_cache == real // 4 and fp8.total < got.total and fp8.activations == got.activations
    assert got.total <= got.upper_bound


def _linear_shapes(c) -> list[tuple[int, int]]:
    """(rows, columns) of every projection of a Llama config: q, k, v, o, gate, up, down per layer."""
    h, i, hd = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * hd
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * c.num_hidden_layers


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_estimate_weights_term_is_each_quantization_formula(tiny, fmt):
    registry, configs, _ = tiny
    c = configs["hf/test-org/tiny-llama"]
    got = registry.estimate("hf/test-org/tiny-llama", dtype="bf16", weights_dtype=fmt, group_size=32)
    linear = _linear_shapes(c)
    if fmt == "fp8":  # one byte per element, one fp32 scale per tensor
        quantized = sum(r * k + 4 for r, k in linear)
    else:  # bits / 8 per element, an fp16 scale per group of 32 along each row
        bits = {"int8": 8, "int4": 4}[fmt]
        quantized = sum(r * k * bits // 8 + r * math.ceil(k / 32) * 2 for r, k in linear)
    # at bf16: embeddings, the output head, the norms (2 per layer and the final one), the rope buffers
    rest = 2 * c.vocab_size * c.hidden_size + (2 * c.num_hidden_layers + 1) * c.hidden_size
    buffers = sum(b.numel() for b in registry.get("hf/test-org/tiny-llama").buffers())
    assert got.weights == quantized + 2 * (rest + buffers)
    assert got.weights_dtype == fmt and got.group_size == (None if fmt == "fp8" else 32)
    with pytest.raises(AnalysisError, match="inference"):
        registry.estimate("hf/test-org/tiny-llama", weights_dtype=fmt, training=True)


def test_estimate_options_are_refused_before_building(tiny):
    registry, _, _ = tiny
    for bad in (dict(weights_dtype="int3"), dict(kv_dtype="fp4"), dict(group_size=0), dict(checkpointing=True)):
        with pytest.raises(AnalysisError):
            registry.estimate("hf/test-org/tiny-llama", **bad)


def test_activation_checkpointing_keeps_less_for_backward(tiny):
    registry, _, _ = tiny
    plain = registry.estimate(
        "hf/test-org/tiny-llama", batch=4, seq_len=64, dtype="fp32", training=True, optimizer="none"
    )
    ckpt = registry.estimate(
        "hf/test-org/tiny-llama", batch=4, seq_len=64, dtype="fp32", training=True, optimizer="none", checkpointing=True
    )
    assert ckpt.checkpointing and ckpt.activations < plain.activations
    assert ckpt.weights == plain.weights and ckpt.gradients == plain.gradients


def test_estimate_of_the_405b_model_runs_on_meta(catalog):
    got = catalog.estimate("hf/meta-llama/Llama-3.1-405B", batch=8, seq_len=8192, dtype="bf16", kv_dtype="fp8")
    c = _config(CATALOG / "meta-llama__Llama-3.1-405B.json")
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    assert got.kv_cache == c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 2 * 1 * 8 * 8192
    info = catalog.info("hf/meta-llama/Llama-3.1-405B")
    assert got.weights == 2 * (info.params + info.buffers)  # bf16, nothing tied
    assert got.total > got.weights + got.kv_cache


def test_cli_estimate_prints_the_breakdown(tiny):
    registry, _, root = tiny
    out = run_cli(
        "estimate",
        "hf/test-org/tiny-llama",
        "--batch",
        "2",
        "--seq-len",
        "16",
        "--kv-dtype",
        "fp8",
        "--weights-dtype",
        "int4",
        registry=registry.url,
    ).stdout
    assert "KV cache (fp8)" in out and "weights (int4, group 128)" in out and "activations" in out
    got = cli_json(
        "estimate",
        "hf/test-org/tiny-llama",
        "--batch",
        "2",
        "--seq-len",
        "16",
        "--kv-dtype",
        "fp8",
        registry=registry.url,
    )
    assert got["kv_cache"] == registry.info("hf/test-org/tiny-llama").kv_bytes_per_token // 4 * 2 * 16


# --- user builders with an input spec -----------------------------------------------------------


def test_user_builder_with_input_gets_flops_scan_and_estimate(fresh_url):
    out = cli_json(
        "index", "builder", "tests.builders:conv_net", "--name", "convy", "--input", "1,3,32,32", registry=fresh_url
    )
    assert out["name"] == "user/convy"
    registry = zoo.connect(fresh_url)
    info = registry.info("user/convy")
    # by hand: a 3x3 convolution 3 -> 8 channels over 32 x 32 outputs, then a linear 8192 -> 10
    assert info.macs == 8 * 3 * 9 * 32 * 32 + 8 * 32 * 32 * 10 and info.flops == 2 * info.macs
    assert info.inputs == [{"name": None, "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert registry.scan("user/convy").outputs == [["", [1, 10], "float32"]]
    est = registry.estimate("user/convy", batch=4, dtype="fp32")
    assert est.inputs == 4 * 3 * 32 * 32 * 4 and est.weights == info.bytes
    # several inputs and dtypes as JSON: token ids for the tied language model
    spec = '[{"shape": [1, 5], "dtype": "int64", "name": "ids"}]'
    cli_json("index", "builder", "tests.builders:tied_net", "--name", "tied-ids", "--input", spec, registry=fresh_url)
    tied = registry.info("user/tied-ids")
    assert tied.scan_status == "ok" and tied.output_shapes == [["", [1, 5, 32], "float32"]]
    assert registry.scan("user/tied-ids", batch=2).outputs == [["", [2, 5, 32], "float32"]]


@pytest.mark.parametrize(
    "bad",
    [
        "1,x,3",
        "[]",
        '[{"shape": [0, 3]}]',
        '[{"shape": [1], "dtype": "complex"}]',
        '[{"shape": [1], "name": "a b"}]',
        '{"shape": [1], "extra": 1}',
    ],
)
def test_a_bad_input_spec_is_refused_and_writes_nothing(fresh_url, bad):
    with pytest.raises(InvalidArgument):
        zoo.connect(fresh_url).index_builder("tests.builders:conv_net", "convy", inputs=bad)
    assert not zoo.connect(fresh_url).exists() or zoo.connect(fresh_url).search("name='user/convy'") == []


# --- input specs of speech and vision models ----------------------------------------------------

_SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
TOWERS = {
    "whisper": (
        transformers.WhisperConfig(
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            vocab_size=100,
            num_mel_bins=8,
            max_source_positions=20,
            max_target_positions=30,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            architectures=["WhisperForConditionalGeneration"],
        ),
        # log-mel frames: two per encoder position (the second conv has stride 2)
        [
            {"name": "input_features", "shape": [1, 8, 40], "dtype": "float32"},
            {"name": "decoder_input_ids", "shape": [1, 30], "dtype": "int64"},
        ],
        [["logits", [1, 30, 100], "float32"]],
    ),
    "vit": (
        transformers.ViTConfig(**_SMALL, image_size=32, patch_size=8),
        [{"name": "pixel_values", "shape": [1, 3, 32, 32], "dtype": "float32"}],
        [["last_hidden_state", [1, 17, 32], "float32"]],
    ),  # 16 patches and the class token
    "clip": (
        transformers.CLIPConfig(
            text_config=dict(**_SMALL, vocab_size=100),
            vision_config=dict(**_SMALL, image_size=32, patch_size=8),
            projection_dim=16,
        ),
        [
            {"name": "input_ids", "shape": [1, 77], "dtype": "int64"},
            {"name": "pixel_values", "shape": [1, 3, 32, 32], "dtype": "float32"},
        ],
        [["logits_per_image", [1, 1], "float32"]],
    ),
}


@pytest.mark.parametrize("kind", list(TOWERS))
def test_speech_and_vision_models_get_their_own_inputs(kind):
    from zoo.families import hf
    from zoo.indexing.indexer import record_of

    config, inputs, first_output = TOWERS[kind]
    record, _ = record_of(f"hf/tiny-{kind}", hf.recipe_of(config.to_dict()))
    assert record["scan_status"] == "ok", record["scan_error"]
    assert json.loads(record["inputs"]) == inputs
    assert json.loads(record["output_shapes"])[:1] == first_output
    if kind == "whisper":  # the decoder's cache: 1 layer x 2 heads x 16 dims x K and V x 4 bytes
        assert record["task"] == "automatic-speech-recognition" and record["kv_bytes_per_token"] == 256
        assert record["layers"] == 1 and record["heads"] == 2
