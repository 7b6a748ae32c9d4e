"""Plans from what zoo index records (plan_shapes, plan_activations) and search by fit: the recorded fit equals a meta
measurement at other sizes, in both regimes; a plan by name builds nothing and equals one measured now; search --fits
keeps exactly the rows whose plan fits; a spec it cannot answer is a typed error."""

import json
import sqlite3

import pytest
import transformers

import zoo
from tests.conftest import run_cli
from zoo.errors import HardwareNotFound, InvalidArgument
from zoo.fitting import fits_options
from zoo.planning import RECORDED_MODES, PlanOptions, mode_of, model_states, shape_groups

WIDE = "hf/test-org/wide-vocab-llama"  # a vocabulary large beside its layers: its peak changes regime with the batch
MODELS = ["timm/resnet18", "timm/vit_tiny_patch16_224", WIDE]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> zoo.Zoo:
    """A registry of a timm CNN, a ViT and a small Llama whose embedding (16,000 x 64) outweighs a sample's
    activations at short sequences."""
    root = tmp_path_factory.mktemp("fits")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=16_000,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    config.save_pretrained(root / "wide")
    z = zoo.connect(f"sqlite:///{root / 'fits.db'}")
    assert z.index("hf", [str(root / "wide")], name=WIDE).failed == {}
    assert z.index("timm", [m.removeprefix("timm/") for m in MODELS[:2]]).failed == {}
    return z


# --- the spec ------------------------------------------------------------------------------------------------


def test_a_fits_spec_is_the_plans_own_keywords():
    got = fits_options("H100 train batch=8 seq=4096 fsdp=8 devices=8")
    assert got == PlanOptions(hardware="H100", training=True, batch=8, seq_len=4096, fsdp=8, devices=8).checked()
    assert fits_options("RTX 4090 infer").hardware == "RTX 4090" and not fits_options("RTX 4090").training
    got = fits_options("a100-80gb TRAIN dtype=bf16 optimizer=adam tp=2 devices=2 seq_len=64 checkpointing=false")
    assert (got.dtype, got.optimizer, got.tp, got.seq_len, got.checkpointing) == ("bf16", "adam", 2, 64, False)


@pytest.mark.parametrize(
    "spec, error, match",
    [
        ("", InvalidArgument, "fits is a hardware and a run"),
        ("train batch=8", InvalidArgument, "starts with the hardware"),
        ("H100 train batch=eight", InvalidArgument, "batch is a whole number"),
        ("H100 train lr=1e-4", InvalidArgument, "unknown key 'lr'"),
        ("H100 train batch=8 fast", InvalidArgument, "'fast' after the run's options"),
        ("H100 train checkpointing", InvalidArgument, "without checkpointing"),
        ("H100 train dtype=fp32", InvalidArgument, "zoo plan NAME"),
        ("H100 dtype=fp32", InvalidArgument, "inference at bf16 or fp16"),
        ("H100 train fsdp=3 devices=8", InvalidArgument, "multiple of fsdp x tp"),
        ("H1000 train", HardwareNotFound, "H100"),
    ],
)
def test_a_spec_search_cannot_answer_is_a_typed_error(spec, error, match):
    with pytest.raises(error, match=match):
        zoo.search("params<1e6", fits=spec)


def test_the_recorded_modes_are_the_modes_of_their_options():
    assert {mode_of(PlanOptions(hardware=1, **o)) for o in RECORDED_MODES.values()} == set(RECORDED_MODES)
    # what else shares a recorded mode: fp16 with bf16, any optimizer, amp-* with bf16 under FSDP2
    assert mode_of(PlanOptions(hardware=1, training=True, dtype="amp-fp16", optimizer="sgd")) == "train-amp"
    assert mode_of(PlanOptions(hardware=1, training=True, fsdp=2, devices=2)) == "train-16"


# --- what zoo index records ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_the_recorded_shapes_count_what_the_tensor_table_does(registry, name):
    info = registry.info(name, tensors=True)
    for o in (
        PlanOptions(hardware=1, training=True, fsdp=4, devices=4),
        PlanOptions(hardware=1, training=True, dtype="fp32", optimizer="sgd"),
    ):
        o = o.checked()
        assert model_states(info.plan_shapes, o) == model_states(shape_groups(info.tensor_table), o)
    assert all(isinstance(info.plan_activations[m], list) for m in RECORDED_MODES)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("mode", RECORDED_MODES)
def test_a_plan_by_name_in_a_recorded_mode_is_the_plan_measured_now(registry, name, mode):
    """zoo index measured the same points the plan of a module measures: the two plans are equal to the byte."""
    o = PlanOptions(hardware="RTX 4090", **RECORDED_MODES[mode]).checked()
    recorded = registry.plan(name, **{k: v for k, v in o.__dict__.items() if v is not None})
    measured = registry.plan(registry.get(name), **{k: v for k, v in o.__dict__.items() if v is not None})
    assert (recorded.per_device, recorded.max_batch) == (measured.per_device, measured.max_batch)


@pytest.mark.parametrize(
    "options, sizes",
    [
        (dict(training=True), [(1, 16), (3, 16), (256, 16), (40, 300), (2, 500)]),
        (dict(training=True, dtype="bf16", fsdp=2, devices=2), [(1, 16), (256, 16), (7, 200)]),
        (dict(), [(1, 16), (256, 16), (9, 500)]),
    ],
)
def test_the_recorded_fit_is_what_estimate_measures_in_both_regimes(registry, options, sizes):
    """Recorded at seq 128 and 256 (the row's, and twice it): elsewhere the fit equals a direct meta measurement. At
    seq 16 the embedding's gradient rules the training peak at a small batch and the samples at a large one: a fit
    of batch 1 and 2 alone would be wrong by orders of magnitude at 256."""
    o = PlanOptions(hardware="H100", **options).checked()
    kw = dict(dtype="bf16", training=o.training) | (dict(amp=o.fsdp == 1, optimizer="none") if o.training else {})
    for batch, seq in sizes:
        p = registry.plan(WIDE, hardware="H100", batch=batch, seq_len=seq, **options)
        e = registry.estimate(WIDE, batch=batch, seq_len=seq, **kw)
        assert p.per_device["activations"] == pytest.approx(e.activations + e.inputs, rel=0.01), (batch, seq)
    if o.training and o.fsdp == 1:  # under autocast the weights' casts add to the batch-independent part
        one, two, big = (registry.estimate(WIDE, batch=b, seq_len=16, **kw) for b in (1, 2, 256))
        assert (two.activations - one.activations) * 5 < (big.activations - two.activations) / 254  # two regimes


# --- search by fit --------------------------------------------------------------------------------------------

SPECS = ["RTX 4090 train batch=1500", "L4 infer batch=10000", "H100 train seq=300 batch=3000 fsdp=2 devices=2"]


@pytest.mark.parametrize("spec", SPECS)
def test_search_keeps_exactly_the_models_whose_plan_fits(registry, spec):
    o = fits_options(spec)
    found = registry.search(None, fields=["name", "max_batch"], fits=spec)
    options = {k: v for k, v in o.__dict__.items() if v is not None}
    kept = {}
    for name in MODELS:
        p = registry.plan(name, **(options if name == WIDE else {k: v for k, v in options.items() if k != "seq_len"}))
        if p.fits:
            kept[name] = p.max_batch
    assert {r["name"]: r["max_batch"] for r in found} == kept
    assert 0 < len(kept) < len(MODELS)  # the spec splits them: the test sees both sides


def test_search_by_fit_on_the_shipped_registry_agrees_with_plan():
    """Every row search --fits returns fits by zoo.plan at the max_batch it reports, and a sample of the rows it
    leaves out does not fit."""
    spec = "L4 train batch=160"
    kept = zoo.search("family=timm and kind=architecture", fits=spec, fields=["name", "max_batch"])
    every = [m["name"] for m in zoo.search("family=timm and kind=architecture", fields=["name", "plan_activations"])]
    left_out = sorted(set(every) - {r["name"] for r in kept})
    assert len(kept) > 100 and len(left_out) > 100
    for row in kept[:: len(kept) // 15]:
        p = zoo.plan(row["name"], hardware="L4", training=True, batch=160)
        assert p.fits and p.max_batch == row["max_batch"] >= 160
    for name in left_out[:: len(left_out) // 15]:
        assert not zoo.plan(name, hardware="L4", training=True, batch=160).fits, name


def test_a_row_without_a_recorded_plan_is_named_and_still_planned(registry, tmp_path):
    copy = tmp_path / "old.db"
    source = sqlite3.connect(registry.url.removeprefix("sqlite:///"))
    target = sqlite3.connect(copy)
    source.backup(target)
    target.execute("UPDATE models SET plan_activations = NULL WHERE name = 'timm/resnet18'")  # indexed before them
    target.commit()
    source.close(), target.close()
    old = zoo.Zoo(f"sqlite:///{copy}")
    rows, unplanned = old._search_fits(None, None, None, ["name"], "RTX 4090 train")
    assert unplanned == ["timm/resnet18"] and "timm/resnet18" not in [r["name"] for r, _ in rows]
    assert old.plan("timm/resnet18", hardware="RTX 4090", training=True) == registry.plan(
        "timm/resnet18", hardware="RTX 4090", training=True
    )  # measured on meta instead: the same plan
    result = run_cli("search", "--fits", "RTX 4090 train", registry=old.url)
    assert "1 matching models record no plan for this run, such as timm/resnet18" in result.stderr


def test_with_plan_fits_off_an_index_records_none_and_a_plan_measures(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_PLAN_FITS", "0")
    off = zoo.connect(f"sqlite:///{tmp_path / 'off.db'}")
    assert off.index("timm", ["resnet18"]).failed == {}
    info = off.info("timm/resnet18")
    assert info.plan_activations is None and info.scan_status == "ok" and info.plan_shapes
    monkeypatch.delenv("ZOO_PLAN_FITS")
    options = dict(hardware="RTX 4090", training=True)
    assert off.plan("timm/resnet18", **options) == registry.plan("timm/resnet18", **options)
    assert off._search_fits(None, None, None, ["name"], "RTX 4090 train")[1] == ["timm/resnet18"]


def test_zoo_search_fits_prints_max_batch_as_a_column_and_in_json(registry):
    spec = "RTX 4090 train batch=1500"
    want = {r["name"]: r["max_batch"] for r in registry.search(None, fields=["name", "max_batch"], fits=spec)}
    text = run_cli("search", "--fits", spec, registry=registry.url).stdout
    header, *lines = text.strip().splitlines()
    assert header.split()[-1] == "max_batch"
    assert {line.split()[0]: int(line.split()[-1]) for line in lines} == want
    got = json.loads(run_cli("search", "--fits", spec, "--json", registry=registry.url).stdout)
    assert {m["name"]: m["max_batch"] for m in got} == want and all("params" in m for m in got)
    failed = run_cli("search", "--fits", "H100 train lr=1", registry=registry.url, check=False)
    assert failed.returncode != 0 and "unknown key 'lr'" in failed.stderr
