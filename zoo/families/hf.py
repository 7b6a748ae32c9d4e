"""Hugging Face family: a transformers architecture built from its config with `AutoModelFor*.from_config`.

A recipe is an auto class from a fixed allowlist (the builder) and the model's config.json as JSON
(kwargs["config"]); any other kwarg overrides one config field (`zoo.get(name, num_hidden_layers=2)`).
Only transformers' own classes are built: configs that ask for remote code (`auto_map`,
`trust_remote_code`) are refused, and a model_type transformers does not know is a build error.
transformers is imported only when a model is built (it takes seconds).
"""

import json
import os
import re
from pathlib import Path

from zoo.errors import CheckpointError, InvalidRecipe, UntrustedBuilder
from zoo.families import torch_version
from zoo.recipe import Recipe
from zoo.weights.hub import REPO_ID
from zoo.weights.paths import open_regular

NAME = "hf"
LANGUAGE_MODEL = True  # its rows get the language-model fields (zoo.analysis.llm): KV cache, active params, ...

# The auto classes a recipe may name, in the order a config without `architectures` tries them,
# each with its mapping in transformers.models.auto.modeling_auto and the hub's pipeline task.
HEADS = {
    "AutoModelForSeq2SeqLM": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation"),
    "AutoModelForSpeechSeq2Seq": ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "automatic-speech-recognition"),
    "AutoModelForMaskedLM": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "fill-mask"),
    "AutoModelForCausalLM": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation"),
    "AutoModelForSequenceClassification": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification"),
    "AutoModelForTokenClassification": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification"),
    "AutoModelForQuestionAnswering": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "question-answering"),
    "AutoModel": ("MODEL_MAPPING_NAMES", "feature-extraction"),
}
_FALLBACK_HEADS = ("AutoModelForSeq2SeqLM", "AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel")
# Config keys that would load code from a repository; zoo never runs it.
_REMOTE_CODE_KEYS = frozenset({"auto_map", "trust_remote_code"})
# Provenance, not architecture: a local path here would only leak into the registry.
_DROPPED_KEYS = ("_name_or_path", "_commit_hash")


def available(patterns=()) -> list[str]:
    return []  # configs are indexed one by one: `zoo index hf SOURCE...`


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    """JSON checks only, so nothing is imported for a recipe zoo refuses."""
    if builder not in HEADS:
        raise UntrustedBuilder(f"{builder!r} is not an allowed transformers auto class ({', '.join(HEADS)})")
    config = kwargs.get("config")
    if not isinstance(config, dict):
        raise InvalidRecipe("an hf recipe needs kwargs['config']: the model's config.json as a JSON object")
    _check_config(kwargs)
    remote = _remote_code_keys(kwargs)  # the config and any override, at any depth
    if remote:
        raise UntrustedBuilder(
            f"config asks for remote code ({', '.join(sorted(remote))}); zoo builds only "
            f"transformers' own classes and never runs code from a repository"
        )


def _check_config(kwargs: dict) -> None:
    """A config's bounds and the types of the keys zoo reads itself, before anything else reads it."""
    _check_bounds(kwargs)
    config = kwargs["config"]
    model_type = kwargs.get("model_type", config.get("model_type"))  # an override wins, as in _config_object
    if not isinstance(model_type, str):
        raise InvalidRecipe(
            "config has no model_type"
            if model_type is None
            else f"config's model_type is a string, not {type(model_type).__name__} ({str(model_type)[:80]})"
        )
    architectures = kwargs.get("architectures", config.get("architectures"))
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise InvalidRecipe(f"config's architectures is a list of class names, not {str(architectures)[:80]}")


# Bounds on a config, which is untrusted: real ones nest a few levels (a composite model's sub-configs) and have
# at most a few hundred layers; a deeper one ended in RecursionError, and 10**5 layers grew past 3 GiB.
MAX_DEPTH = 16
MAX_LAYERS = 1024
_LAYER_COUNT = re.compile(r"(^|_)layers?$")  # num_hidden_layers, n_layer, num_layers, encoder_layers, ...


def _check_bounds(kwargs: dict) -> None:
    """InvalidRecipe naming the key where a config nests past MAX_DEPTH or counts more than MAX_LAYERS layers
    (iteratively: the check itself must not recurse as deep as the config does)."""
    todo: list[tuple[dict | list, str, int]] = [(kwargs, "", 0)]
    while todo:
        value, path, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise InvalidRecipe(
                f"config key {path!r} is nested more than {MAX_DEPTH} levels deep: not a model's config"
            )
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and _LAYER_COUNT.search(key) and type(item) is int and item > MAX_LAYERS:
                # (negative values are layer indices: LLaVA's vision_feature_layer -2)
                raise InvalidRecipe(
                    f"config key {where!r} = {item}: more layers than any model's (at most {MAX_LAYERS})"
                )
            if isinstance(item, (dict, list)):
                todo.append((item, where, depth + 1))


def _remote_code_keys(value) -> set[str]:
    """Remote-code keys anywhere in a config: composite models nest their sub-configs."""
    if isinstance(value, dict):
        found = value.keys() & _REMOTE_CODE_KEYS
        for v in value.values():
            found |= _remote_code_keys(v)
        return found
    if isinstance(value, list):
        return set().union(*map(_remote_code_keys, value))
    return set()


def _config_object(kwargs: dict):
    """transformers' own config class for the model_type, filled from the JSON (plus overrides)."""
    import transformers
    from transformers import CONFIG_MAPPING

    data = {**kwargs["config"], **{k: v for k, v in kwargs.items() if k != "config"}}
    model_type = data["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise InvalidRecipe(
            f"model_type {model_type!r} is not known to the installed transformers "
            f"{transformers.__version__}; zoo does not run a repository's own code"
        )
    return CONFIG_MAPPING[model_type].from_dict(data)


def build(builder: str, kwargs: dict):
    import transformers

    # The config dtype is kept, as from_pretrained's default dtype="auto" keeps it; no download
    # can happen here (zoo.build keeps huggingface_hub offline for the build) and remote code is off by default.
    return getattr(transformers, builder).from_config(_config_object(kwargs))


# The documented sequence length of an hf row's analysis: FLOPs, activations and output shapes at batch 1
# are measured for this many tokens (fewer where the model's context is shorter); flops_per_token
# divides by it, so rows compare across lengths.
SEQ_LEN = 128
_TOKENS = {"shape": ["seq"], "dtype": "int64"}


def input_spec(module) -> dict | None:
    """The inputs a transformers model's forward needs (zoo.analysis.inputs spec): token ids for text
    models (decoder_input_ids too for encoder-decoders), pixel_values for vision towers, input_features
    for speech encoders (Whisper), and both token ids and pixels for dual encoders (CLIP, SigLIP).
    None where the main input is none of these."""
    config = getattr(module, "config", None)
    main = getattr(module, "main_input_name", "input_ids")
    if config is None:
        return None
    kwargs: dict[str, object] = {}
    if main == "input_ids":
        kwargs["input_ids"] = _TOKENS
        if hasattr(module, "get_image_features") and getattr(config, "vision_config", None) is not None:
            kwargs["pixel_values"] = _pixels(config.vision_config)  # a dual encoder scores text against images
    elif main == "pixel_values":
        kwargs["pixel_values"] = _pixels(getattr(config, "vision_config", None) or config)
    elif main == "input_features":
        frames = 2 * int(getattr(config, "max_source_positions", 1500))  # two conv strides down to the positions
        kwargs["input_features"] = [int(config.num_mel_bins), frames]
    else:
        return None
    if getattr(config, "is_encoder_decoder", False):
        kwargs["decoder_input_ids"] = _TOKENS
    if any(v is _TOKENS for v in kwargs.values()):
        text = getattr(config, "text_config", None) or config  # a dual encoder's text tower (CLIP: 77)
        limit = next(
            (
                getattr(text, k)
                for k in ("max_position_embeddings", "max_target_positions", "n_positions")
                if getattr(text, k, None)
            ),
            None,
        )
        return {"kwargs": kwargs, "seq_len": min(SEQ_LEN, int(limit)) if limit else SEQ_LEN}
    return {"kwargs": kwargs}


def _pixels(config) -> list[int]:
    size = config.image_size
    height, width = (
        (size, size)
        if isinstance(size, int)
        else (size["height"], size["width"])
        if isinstance(size, dict)
        else tuple(size)
    )
    return [int(getattr(config, "num_channels", 3)), int(height), int(width)]


def describe(builder: str, module, tag: str | None = None) -> dict:
    return {"task": HEADS[builder][1], "input_size": None, "input": input_spec(module)}


def versions() -> dict:
    from importlib.metadata import version

    return {"torch": torch_version(), "transformers": version("transformers")}


# --- config sources -> recipes (the indexer records them: zoo.indexing.indexer.index_configs) -------------------------


def head_of(config: dict) -> str:
    """The auto class for a config: the one whose mapping lists its `architectures` class, else the
    first head (seq2seq, masked LM, causal LM, base) that transformers has for its model_type."""
    from transformers.models.auto import modeling_auto

    model_type = config.get("model_type")

    def classes(head: str) -> tuple:
        names = getattr(modeling_auto, HEADS[head][0]).get(model_type, ())
        return (names,) if isinstance(names, str) else tuple(names)

    for arch in config.get("architectures") or ():
        for head in HEADS:
            if arch in classes(head):
                return head
    for head in _FALLBACK_HEADS:
        if classes(head):
            return head
    return "AutoModel"  # an unknown model_type: the build records the error


def recipe_of(config: dict):
    """The recipe for a config.json. `auto_map` is dropped where transformers has the model_type itself
    (many hub configs carry it beside a native class): the native class is what gets built."""
    from transformers import CONFIG_MAPPING

    config = {k: v for k, v in config.items() if k not in _DROPPED_KEYS}
    _check_config({"config": config})  # types and bounds, before the lookups below use them
    if "auto_map" in config and config.get("model_type") in CONFIG_MAPPING:
        config.pop("auto_map")
    recipe = Recipe(NAME, head_of(config), {"config": config})
    check(recipe.builder, recipe.kwargs)  # not a config, or remote code: refused before any row is written
    return recipe


def is_repo_id(source: str) -> bool:
    return bool(REPO_ID.fullmatch(source)) and not Path(source).exists()


def load_config(source: str, revision: str | None = None) -> tuple[dict, str]:
    """(config dict, default name) from a config.json, a directory holding one, a catalog file
    ORG__NAME.json, or a hub repo id (`hf://ORG/NAME[@REV]` too) read through huggingface_hub's cache."""
    path = Path(source)
    if path.exists():
        if revision:
            raise InvalidRecipe(f"revision applies to hub repo ids, not to the local {source}")
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise InvalidRecipe(f"{source}: no config.json in this directory")
        config = read_config(file)
        if "__" in file.stem and file.name != "config.json":  # a catalog file: ORG__NAME.json
            return config, "hf/" + file.stem.replace("__", "/", 1)
        named = config.get("_name_or_path")
        if isinstance(named, str) and "/" in named and is_repo_id(named):
            return config, f"hf/{named}"
        file = file.resolve()
        return config, f"hf/{file.parent.name if file.name == 'config.json' else file.stem}"
    if source.startswith("hf://"):
        from zoo.weights.hub import parse_uri

        source, at = parse_uri(source)
        revision = revision or at
    if not is_repo_id(source):
        raise InvalidRecipe(f"{source!r} is neither a config.json, a directory holding one, nor a hub repo id")
    from zoo.weights.hub import download

    return read_config(Path(download(source, "config.json", revision))), f"hf/{source}"


# The largest config.json read: real ones are kilobytes (a 22k-class label map about 1 MB); a 40 MB one grew
# an index run past 3 GiB.
MAX_CONFIG_BYTES = 4 << 20


def read_config(path: Path) -> dict:
    """A config.json as a dict; InvalidRecipe if it is larger than MAX_CONFIG_BYTES, not JSON, nested past the
    parser's recursion, or not a JSON object (the file is untrusted)."""
    try:
        with os.fdopen(open_regular(path, "config.json"), "rb") as f:  # a FIFO named config.json must not hang
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except (CheckpointError, OSError) as e:
        raise InvalidRecipe(f"{path}: not a readable config.json ({e})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise InvalidRecipe(f"{path}: config.json is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a model's config")
    try:
        config = json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON, an integer past Python's 4300-digit limit
        raise InvalidRecipe(f"{path}: not a readable config.json ({e})") from None
    except RecursionError:
        raise InvalidRecipe(f"{path}: config.json is nested too deeply to be a model's config") from None
    if not isinstance(config, dict):
        raise InvalidRecipe(f"{path}: a config.json holds a JSON object")
    return config


def tokenize(name: str, text: str) -> list[int]:
    """The token ids of a text, with the repo's tokenizer read from the local Hugging Face cache only
    (never downloaded). Raises TokenizerNotCached where the cache lacks it."""
    from zoo.errors import TokenizerNotCached

    if not is_repo_id(name):
        raise TokenizerNotCached(
            f"text needs a hub model's tokenizer; {name!r} is not a hub repo id: "
            f"give token-id shapes instead, e.g. zoo.scan(name, (1, 16))"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as e:  # not cached: transformers raises OSError; an unusable one ValueError
        raise TokenizerNotCached(
            f"the tokenizer of {name} is not in the local Hugging Face cache ({type(e).__name__}); download it "
            f"with `hf download {name} tokenizer.json tokenizer_config.json`, or give token-id "
            f"shapes instead, e.g. zoo.scan('hf/{name}', (1, 16))"
        ) from None
    return list(tokenizer(text)["input_ids"])
