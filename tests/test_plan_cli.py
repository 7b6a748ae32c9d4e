"""`zoo plan --input-size`: a vision model planned at another input size, as zoo.plan(input_size=...) plans it."""

import json

import pytest

import zoo
from tests.conftest import run_cli

NAME = "timm/resnet18"  # its row's input: 3 x 224 x 224
OPTIONS = dict(hardware="RTX 4090", training=True, dtype="fp32", optimizer="sgd")
FLAGS = ["--hardware", "RTX 4090", "--training", "--dtype", "fp32", "--optimizer", "sgd", "--json"]


@pytest.fixture(scope="module")
def plans() -> dict:
    """The plan at the row's size and at 3 x 160 x 160, each from the CLI and from zoo.plan."""
    out = {}
    for size in (None, (3, 160, 160)):
        flags = ["--input-size", ",".join(map(str, size))] if size else []
        out[size] = (
            json.loads(run_cli("plan", NAME, *FLAGS, *flags).stdout),
            zoo.plan(NAME, input_size=size, **OPTIONS).as_dict(),
        )
    return out


def test_the_command_plans_at_the_input_size_given(plans):
    default, small = plans[None][0], plans[(3, 160, 160)][0]
    assert plans[None][0] == plans[None][1] and plans[(3, 160, 160)][0] == plans[(3, 160, 160)][1]
    # a CNN's activations scale with its pixels: (160 / 224)^2 = 0.51 per sample, so about twice the batch fits
    assert small["max_batch"] > 1.8 * default["max_batch"]
    assert small["per_device"]["weights"] == default["per_device"]["weights"]


def test_its_activations_are_what_estimate_measures_at_that_size():
    p = zoo.plan(NAME, input_size=(3, 160, 160), batch=8, **OPTIONS)
    e = zoo.estimate(NAME, input_size=(3, 160, 160), batch=8, training=True, dtype="fp32", optimizer="sgd")
    assert p.per_device["activations"] == pytest.approx(e.activations + e.inputs, rel=0.01)
    assert e.inputs == 8 * 3 * 160 * 160 * 4


@pytest.mark.parametrize("text", ["3,224", "3,0,224", "a,b,c", "3,224,224,1"])
def test_a_bad_input_size_is_refused_with_the_form_it_takes(text):
    failed = run_cli("plan", NAME, "--hardware", "H100", "--input-size", text, check=False)
    assert failed.returncode == 2 and "channels,height,width (3,224,224)" in failed.stderr
