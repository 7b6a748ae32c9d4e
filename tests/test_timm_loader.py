"""timm's load_pretrained arguments are caught from one meta build, then remembered under $ZOO_CACHE: a later
process replays them without building the model again, and a record never names code outside timm."""

import json

import pytest

timm = pytest.importorskip("timm")

from zoo import timm_loader  # noqa: E402

TAG = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(timm_loader, "_caught", {})  # as a fresh process starts
    return tmp_path


def _no_build(*_):
    raise AssertionError("the model was built again to catch timm's arguments")


def test_caught_once_then_replayed_by_a_later_process_without_a_build(cache, monkeypatch):
    first = timm_loader.timm_load_arguments(TAG, {})
    from timm.models.vision_transformer import checkpoint_filter_fn

    # timm's own values for this tag: its cfg, ViT's checkpoint filter, 1000 classes, strict
    assert first["filter_fn"] is checkpoint_filter_fn
    assert (first["num_classes"], first["in_chans"], first["strict"]) == (1000, 3, True)
    assert first["cfg"]["hf_hub_id"] == f"timm/{TAG}"
    assert first["cfg"]["input_size"] == timm.models.get_pretrained_cfg(TAG).input_size
    assert len(list((cache / "timm-loader").glob("*.json"))) == 1
    monkeypatch.setattr(timm_loader, "_caught", {})
    monkeypatch.setattr(timm_loader, "_catch", _no_build)
    again = timm_loader.timm_load_arguments(TAG, {})
    assert again == first
    assert again["cfg"] is not first["cfg"]


def test_kwargs_are_part_of_what_is_remembered(cache):
    assert timm_loader.timm_load_arguments(TAG, {})["in_chans"] == 3
    assert timm_loader.timm_load_arguments(TAG, {"in_chans": 1})["in_chans"] == 1
    assert len(list((cache / "timm-loader").glob("*.json"))) == 2


@pytest.mark.parametrize("filter_fn", ["os:system", "builtins:eval", "timm.models.vision_transformer:_ANY.x",
                                       "timm.models.vision_transformer:os"])
def test_a_record_naming_anything_but_a_timm_function_is_not_replayed(cache, monkeypatch, filter_fn):
    timm_loader.timm_load_arguments(TAG, {})
    record = next((cache / "timm-loader").glob("*.json"))
    saved = json.loads(record.read_text())
    record.write_text(json.dumps({**saved, "filter_fn": filter_fn}))
    monkeypatch.setattr(timm_loader, "_caught", {})
    caught = []
    real_catch = timm_loader._catch
    monkeypatch.setattr(timm_loader, "_catch", lambda *a: caught.append(1) or real_catch(*a))
    args = timm_loader.timm_load_arguments(TAG, {})
    assert caught == [1]  # caught again from a build
    assert args["filter_fn"].__module__ == "timm.models.vision_transformer"


def test_a_record_for_another_key_or_corrupt_is_a_miss(cache, monkeypatch):
    timm_loader.timm_load_arguments(TAG, {})
    record = next((cache / "timm-loader").glob("*.json"))
    for text in ["{", json.dumps({**json.loads(record.read_text()), "key": "another timm version"})]:
        record.write_text(text)
        monkeypatch.setattr(timm_loader, "_caught", {})
        assert timm_loader._recalled(json.dumps([timm.__version__, TAG, {}], sort_keys=True)) is None
