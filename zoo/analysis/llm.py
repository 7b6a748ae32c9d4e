"""Language-model fields of a built (meta) transformers module and its config: active parameters per token,
KV-cache bytes per token, and the shape figures (layers, width, heads, vocabulary, experts).

Parameters are counted from the module itself, so a mixture-of-experts model's active count follows what
transformers actually builds: every parameter of an `experts` module is routed (shared experts live in
their own `shared_expert(s)` module and count in full), and a token uses `experts_per_token` of them. The
KV figure is the config's formula, since a cache is not part of the module: per token and layer, K and V of
`kv_heads x head_dim` each (grouped-query attention), or multi-latent attention's one compressed vector
(`kv_lora_rank + qk_rope_head_dim`, DeepSeek-V2/V3), at the config dtype. Sliding-window layers keep at most
`sliding_window` tokens, which the per-token figure does not cap: the window is recorded beside it.
"""

from __future__ import annotations

FIELDS = (
    "active_params",
    "kv_bytes_per_token",
    "context_length",
    "sliding_window",
    "layers",
    "hidden_size",
    "heads",
    "kv_heads",
    "vocab_size",
    "experts",
    "experts_per_token",
)

# Config keys for the routed experts and the experts each token uses, across transformers' MoE models.
_EXPERTS_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k")


def _get(config, *keys):
    """The first of `keys` the config sets to a value (attribute maps included: gpt2's n_layer, t5's d_model)."""
    for key in keys:
        value = getattr(config, key, None)
        if value is not None:
            return value
    return None


def text_config(config):
    """The language model's config of a composite model (Gemma 3, Llava, CLIP: text_config); the config
    itself otherwise. (transformers' get_text_config(decoder=True) is not used: for Whisper it gives a
    fresh config with default sizes.)"""
    sub = getattr(config, "text_config", None)
    return sub if sub is not None else config


def dtype_bytes(config, module=None) -> int:
    """Bytes per element at the config's dtype; the module's parameter dtype where the config names none."""
    import torch

    # transformers 5 calls it dtype and warns on every read of the old name (into zoo's output): that only where
    # the config has no dtype attribute (transformers 4)
    dtype = _get(config, "dtype" if hasattr(config, "dtype") else "torch_dtype")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) and module is not None:
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    return dtype.itemsize


def routed_experts(module) -> tuple[int, int]:
    """(routed experts per MoE layer, parameters of all routed experts) counted from the module: every
    distinct parameter under a submodule named `experts` (a fused [experts, ...] tensor, or a ModuleList
    of expert MLPs)."""
    from torch import nn

    count, seen, total = 0, set(), 0
    for name, sub in module.named_modules():
        if name.rsplit(".", 1)[-1] != "experts":
            continue
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)):
            count = max(count, len(sub))
        else:
            first = next((p for p in sub.parameters(recurse=False)), None)
            if first is not None and first.dim() >= 2:
                count = max(count, first.shape[0])
        for p in sub.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return count, total


def _sliding_window(config) -> int | None:
    """The window where some layer slides; None where the config carries one that no layer uses (Qwen2's
    use_sliding_window=false)."""
    window = _get(config, "sliding_window")
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return int(window) if any("sliding" in str(t) for t in types) else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def kv_bytes_per_token(config, module=None) -> int | None:
    """KV-cache bytes one token adds across the decoder's layers at the config dtype; None for a model
    that keeps no cache (encoder-only: BERT)."""
    if module is not None and not _generates(module, config):
        return None
    layers = _layers(config)
    assert layers is not None, "a decoder's config counts its layers"
    nbytes = dtype_bytes(config, module)
    if _get(config, "kv_lora_rank") is not None:  # multi-latent attention: one latent and one rope key per token
        return layers * (int(config.kv_lora_rank) + int(_get(config, "qk_rope_head_dim") or 0)) * nbytes
    heads = _heads(config)
    assert heads is not None, "a decoder's config counts its attention heads"
    kv_heads = _get(config, "num_key_value_heads") if not config.is_encoder_decoder else None
    kv_heads = int(kv_heads or heads)
    return layers * kv_heads * _head_dim(config, heads) * 2 * nbytes


def _generates(module, config) -> bool:
    can = getattr(module, "can_generate", None)
    if callable(can) and can():
        return True
    # a base decoder (LlamaModel) keeps a cache too: its model_type has a causal LM head
    from transformers.models.auto import modeling_auto

    return (
        config.model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and not getattr(config, "is_encoder_decoder", False)
        and config.model_type not in _ENCODERS
    )


# Encoders that transformers also lets run as decoders (BertLMHeadModel): their checkpoints are encoders.
_ENCODERS = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "electra",
        "ernie",
        "camembert",
        "data2vec-text",
        "bert-generation",
        "roberta-prelayernorm",
        "xmod",
        "megatron-bert",
        "rembert",
        "big_bird",
        "deberta",
        "deberta-v2",
        "modernbert",
    }
)


def _layers(config) -> int | None:
    if getattr(config, "is_encoder_decoder", False):
        value = _get(config, "num_decoder_layers", "decoder_layers", "num_hidden_layers")
    else:
        value = _get(config, "num_hidden_layers")
    return int(value) if value is not None else None


def _heads(config) -> int | None:
    if getattr(config, "is_encoder_decoder", False):
        value = _get(config, "decoder_attention_heads", "num_decoder_heads", "num_attention_heads")
    else:
        value = _get(config, "num_attention_heads")
    return int(value) if value is not None else None


def _head_dim(config, heads: int) -> int:
    explicit = _get(config, "head_dim", "d_kv")  # Gemma, Qwen3, T5 set it apart from hidden_size / heads
    return int(explicit) if explicit else int(config.hidden_size) // heads


def context_length(config) -> int | None:
    value = _get(config, "max_position_embeddings", "max_target_positions", "n_positions", "max_seq_len")
    return int(value) if value is not None else None


def llm_fields(module, config) -> dict:
    """The registry's language-model columns for a built transformers module and its config object
    (transformers' PretrainedConfig; a composite model's text config is used). Keys: FIELDS."""
    config = text_config(config)
    params = sum({id(p): p.numel() for p in module.parameters()}.values())
    count, routed = routed_experts(module)
    top_k = int(_get(config, *_TOP_K_KEYS) or 0) if count else 0
    experts = int(_get(config, *_EXPERTS_KEYS) or count) if count else 0
    active = params - routed + (routed * top_k // count if count else 0)
    heads = _heads(config)
    kv_heads = None
    if heads is not None:
        kv_heads = int((_get(config, "num_key_value_heads") if not config.is_encoder_decoder else None) or heads)
    vocab = _get(config, "vocab_size")
    hidden = _get(config, "hidden_size")
    return {
        "active_params": active,
        "kv_bytes_per_token": kv_bytes_per_token(config, module) if heads and hidden else None,
        "context_length": context_length(config),
        "sliding_window": _sliding_window(config),
        "layers": _layers(config),
        "hidden_size": int(hidden) if hidden is not None else None,
        "heads": heads,
        "kv_heads": kv_heads,
        "vocab_size": int(vocab) if vocab is not None else None,
        "experts": experts,
        "experts_per_token": top_k,
    }
