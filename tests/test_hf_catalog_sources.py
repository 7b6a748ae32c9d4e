"""The shipped HF catalog against its sources (catalog/hf/README.md): every catalog/hf file records where it came
from in published.json (its hub repository, and a hub commit or the URL of the copy it was taken from or checked
against, with how far that was confirmed), and no language model's config lacks what decides how it is built and
sized: its architectures and its dtype. A config without a dtype is built, and sized, at transformers' float32
default (Llama-3.1-8B-Instruct was recorded at 29.9 GiB for its 15.0 GiB of bfloat16 weights). Reads files only."""

import json
import re

import pytest

from tests.conftest import ROOT

CATALOG = ROOT / "catalog" / "hf"
PUBLISHED = json.loads((CATALOG / "published.json").read_text())
FILES = sorted(CATALOG.glob("*__*.json"))
STATUSES = {"copy", "partial", "unconfirmed"}  # README: what each says about the file against its source
REVISION = re.compile(r"[0-9a-f]{40}")
URL = re.compile(r"https://(github\.com|huggingface\.co)/\S+")
DTYPES = {"float32", "float16", "bfloat16"}

# The file shipped before this check (a copy of a copy that left out three of the hub file's keys).
UNFIXED_LLAMA_3_1_8B_INSTRUCT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 128256,
}


def name_of(path) -> str:
    return "hf/" + path.stem.replace("__", "/", 1)


def provenance_problems(name: str, entry: dict) -> list[str]:
    problems = []
    if entry.get("config_repo") != name.removeprefix("hf/"):
        problems.append(f"config_repo {entry.get('config_repo')!r} is not the file's hub repository")
    revision, url = entry.get("config_revision"), entry.get("config_url")
    if revision is not None and not (isinstance(revision, str) and REVISION.fullmatch(revision)):
        problems.append(f"config_revision {revision!r} is not a 40-digit hub commit")
    if url is not None and not (isinstance(url, str) and URL.fullmatch(url)):
        problems.append(f"config_url {url!r} is not an https URL on github.com or huggingface.co")
    if revision is None and url is None:
        problems.append("neither a hub commit (config_revision) nor the URL of a copy (config_url)")
    if entry.get("config_status") not in STATUSES:
        problems.append(f"config_status {entry.get('config_status')!r} is not one of {sorted(STATUSES)}")
    if not (isinstance(entry.get("config_source"), str) and entry["config_source"].strip()):
        problems.append("no config_source: what the copy is and how the file was checked against it")
    return problems


def is_language_model(config: dict) -> bool:
    """Built as a text generator: zoo's head for it is AutoModelForCausalLM (task text-generation), or it says so."""
    from zoo.families.hf import head_of

    architectures = config.get("architectures") or ()
    return head_of(config) == "AutoModelForCausalLM" or any(a.endswith("ForCausalLM") for a in architectures)


def language_model_problems(config: dict, entry: dict) -> list[str]:
    problems = []
    architectures = config.get("architectures")
    if not (isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)):
        problems.append(f"architectures is {architectures!r}, not the list of class names the hub file has")
    dtype = config.get("torch_dtype", config.get("dtype"))
    no_dtype = entry.get("config_no_dtype")
    if dtype is None and not no_dtype:
        problems.append(
            "no torch_dtype or dtype: built and sized at float32, and published.json does not record "
            "(config_no_dtype) that the source has none"
        )
    elif dtype is not None and dtype not in DTYPES:
        problems.append(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    elif dtype is not None and no_dtype:
        problems.append(f"config_no_dtype is recorded, but the config has dtype {dtype!r}: stale")
    return problems


def test_every_catalog_file_records_its_source():
    assert FILES and {name_of(p) for p in FILES} == set(PUBLISHED)
    problems = {name: found for name in sorted(PUBLISHED) if (found := provenance_problems(name, PUBLISHED[name]))}
    assert not problems


def test_no_language_model_config_lacks_its_architectures_or_dtype():
    pytest.importorskip("transformers")
    problems, checked = {}, 0
    for path in FILES:
        config = json.loads(path.read_text())
        if not is_language_model(config):
            continue
        checked += 1
        if found := language_model_problems(config, PUBLISHED[name_of(path)]):
            problems[name_of(path)] = found
    assert not problems
    assert checked >= 80  # the catalog's text generators, not a filter that lets everything through


def test_the_checks_catch_what_they_are_for():
    pytest.importorskip("transformers")
    assert is_language_model(UNFIXED_LLAMA_3_1_8B_INSTRUCT)  # told by its model_type when architectures is missing
    found = language_model_problems(UNFIXED_LLAMA_3_1_8B_INSTRUCT, {})
    assert len(found) == 2 and "architectures" in found[0] and "torch_dtype" in found[1]
    fixed = {**UNFIXED_LLAMA_3_1_8B_INSTRUCT, "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}
    assert language_model_problems(fixed, {}) == []
    assert "stale" in language_model_problems(fixed, {"config_no_dtype": "the hub file has none"})[0]
    assert not is_language_model(json.loads((CATALOG / "google-bert__bert-base-uncased.json").read_text()))
    assert provenance_problems(
        "hf/a/b",
        {
            "config_repo": "a/b",
            "config_revision": None,
            "config_url": None,
            "config_status": "copy",
            "config_source": "x",
        },
    )
    assert provenance_problems(
        "hf/a/b",
        {
            "config_repo": "a/b",
            "config_revision": "main",
            "config_url": None,
            "config_status": "copy",
            "config_source": "x",
        },
    )


def test_the_shipped_registry_is_built_from_the_catalog_files_as_they_are():
    """Each catalog file's recipe hashes to its shipped row's source hash: a file fixed without `make registry`
    leaves the registry sizing the old config (the fixed 8B-Instruct stayed at float32 in registry.db)."""
    from zoo.families import hf
    from zoo.indexing.record import source_hash
    from zoo.registry import lite

    versions = hf.versions()
    stale = []
    for path in FILES:
        recipe = hf.recipe_of(hf.load_config(str(path), None)[0])
        found = lite.info(f"sqlite:///{ROOT / 'registry.db'}", name_of(path))
        if found is None or found[1] != source_hash(recipe, versions):
            stale.append(name_of(path))
    assert stale == [], "rebuild registry.db: make registry"
