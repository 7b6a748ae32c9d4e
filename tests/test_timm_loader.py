"""timm's load_pretrained arguments are caught from one meta build, then remembered under $ZOO_CACHE: a later
process replays them without building the model again, and a record never names code outside timm."""

import json

import pytest

timm = pytest.importorskip("timm")

from tests.test_pretrained_load import assert_bitwise, caches, hub_file, safetensors_bytes, seeded_state  # noqa: E402,F401 - after importorskip; caches is a pytest fixture, used as an argument
from zoo.families import timm_loader  # noqa: E402 - after importorskip

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


def test_a_model_timm_loads_loosely_is_remembered_too(cache, monkeypatch):
    """dla46_c: timm's builder passes strict=False, which a registry row cannot prove (only a build tells); zoo's
    own record under $ZOO_CACHE is taken as it is, so a later process still builds once."""
    first = timm_loader.timm_load_arguments("dla46_c", {})
    assert first["strict"] is False  # timm's own value for this model
    monkeypatch.setattr(timm_loader, "_caught", {})
    monkeypatch.setattr(timm_loader, "_catch", _no_build)
    assert timm_loader.timm_load_arguments("dla46_c", {}) == first
    record = json.loads(next((cache / "timm-loader").glob("*.json")).read_text())
    assert timm_loader._replayed(record, "dla46_c", {}, own_cache=True)["strict"] is False
    assert timm_loader._replayed(record, "dla46_c", {}) is None  # the same record in a registry row: refused


def test_kwargs_are_part_of_what_is_remembered(cache):
    assert timm_loader.timm_load_arguments(TAG, {})["in_chans"] == 3
    assert timm_loader.timm_load_arguments(TAG, {"in_chans": 1})["in_chans"] == 1
    assert len(list((cache / "timm-loader").glob("*.json"))) == 2


@pytest.mark.parametrize(
    "filter_fn",
    ["os:system", "builtins:eval", "timm.models.vision_transformer:_ANY.x", "timm.models.vision_transformer:os"],
)
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
        assert timm_loader._recalled(json.dumps([timm.__version__, TAG, {}], sort_keys=True), TAG, {}) is None


# --- recorded at index time --------------------------------------------------------------------------


@pytest.fixture
def indexed(fresh_url, cache):
    """TAG and its architecture indexed as `zoo index timm` does, into a fresh registry."""
    from zoo.indexing import indexer

    indexer.index_family(fresh_url, "timm", [TAG], pretrained=True)
    indexer.index_family(fresh_url, "timm", [TAG.split(".")[0]])
    return fresh_url


def test_the_index_records_what_timm_passes_to_load_pretrained(indexed):
    from timm.models.vision_transformer import checkpoint_filter_fn

    import zoo

    caught = timm_loader._catch(TAG, {})  # timm's own call, caught from a build
    for builder in (TAG, TAG.split(".")[0]):  # the tag, and the architecture whose default it is
        recorded = zoo.connect(indexed).info(f"timm/{builder}").load_args
        assert recorded["timm"] == timm.__version__
        assert recorded["filter_fn"] == "timm.models.vision_transformer:checkpoint_filter_fn"
        replayed = timm_loader._replayed(recorded, builder, {}, zoo.connect(indexed).get(f"timm/{builder}"))
        assert replayed == {
            **caught,
            "cfg": {k: tuple(v) if isinstance(v, list) else v for k, v in caught["cfg"].items()},
        }
        assert replayed["filter_fn"] is checkpoint_filter_fn


def test_an_architecture_without_published_weights_records_nothing():
    from zoo.families import timm as timm_family

    cfg = timm.models.get_pretrained_cfg("botnet50ts_256")  # timm publishes no weights for it
    assert cfg is not None and not (cfg.hf_hub_id or cfg.url)
    assert timm_family.load_arguments("botnet50ts_256", {}) is None
    assert timm_family.load_arguments(TAG, {})["cfg"]["hf_hub_id"] == f"timm/{TAG}"


def _pretrained_file(hub_cache):
    hub_file(hub_cache, f"timm/{TAG}", "model.safetensors", safetensors_bytes(seeded_state("vit_tiny_patch16_224", 7)))


def test_a_pretrained_load_of_an_indexed_tag_builds_once(indexed, caches, monkeypatch):  # noqa: F811 - the caches fixture imported from test_pretrained_load
    """The row's load_args are replayed: no build to catch them, no record under $ZOO_CACHE, and the model is
    what timm.create_model(TAG, pretrained=True) builds from the same file."""
    import zoo

    _pretrained_file(caches[0])
    monkeypatch.setattr(timm_loader, "_catch", _no_build)
    for name in (f"timm/{TAG}", f"timm/{TAG.split('.')[0]}"):
        ours = zoo.connect(indexed).get(name, weights="pretrained")
        assert_bitwise(ours, timm.create_model(TAG, pretrained=True))
    assert timm_loader._caught == {}


def _catches(monkeypatch) -> list:
    caught, real_catch = [], timm_loader._catch
    monkeypatch.setattr(timm_loader, "_catch", lambda *a: caught.append(a) or real_catch(*a))
    return caught


def test_other_kwargs_or_another_timm_catch_again(indexed, caches, monkeypatch):  # noqa: F811 - the caches fixture imported from test_pretrained_load
    """The record is for the row's own build by the timm that made it: a build with other kwargs, or a record
    by another timm version, is caught from a build (and loads as timm does)."""
    import zoo
    from zoo.registry import db

    _pretrained_file(caches[0])
    caught = _catches(monkeypatch)
    zoo.connect(indexed).get(f"timm/{TAG}", weights="pretrained", num_classes=10)
    assert caught == [(TAG, {"num_classes": 10})]
    with db.open_registry(indexed, write=True).begin() as con:
        con.exec_driver_sql("UPDATE models SET load_args = replace(load_args, ?, '0.0.1')", (timm.__version__,))
    zoo.cache_clear()
    ours = zoo.connect(indexed).get(f"timm/{TAG}", weights="pretrained")
    assert caught[1:] == [(TAG, {})]
    assert_bitwise(ours, timm.create_model(TAG, pretrained=True))


def test_a_filter_timm_builds_as_a_partial_is_recorded_and_replayed(fresh_url, cache, caches, monkeypatch):  # noqa: F811 - the caches fixture imported from test_pretrained_load
    """DeiT's builder passes functools.partial(checkpoint_filter_fn, ...) to load_pretrained: the record keeps
    the function's name and the partial's keywords, and a load replays both without a build."""
    import functools

    import zoo
    from zoo.indexing import indexer

    tag = "deit_tiny_patch16_224.fb_in1k"
    caught = timm_loader._catch(tag, {})["filter_fn"]
    assert isinstance(caught, functools.partial) and caught.keywords  # timm's own builder made it so
    indexer.index_family(fresh_url, "timm", [tag], pretrained=True)
    recorded = zoo.connect(fresh_url).info(f"timm/{tag}").load_args
    assert recorded["filter_fn"] == f"{caught.func.__module__}:{caught.func.__qualname__}"
    assert recorded["filter_kwargs"] == caught.keywords
    replayed = timm_loader._replayed(recorded, tag, {}, zoo.connect(fresh_url).get(f"timm/{tag}"))["filter_fn"]
    assert (replayed.func, replayed.keywords) == (caught.func, caught.keywords)
    hub_file(caches[0], f"timm/{tag}", "model.safetensors", safetensors_bytes(seeded_state("deit_tiny_patch16_224", 8)))
    monkeypatch.setattr(timm_loader, "_catch", _no_build)
    assert_bitwise(
        zoo.connect(fresh_url).get(f"timm/{tag}", weights="pretrained"), timm.create_model(tag, pretrained=True)
    )


def _in21k_cfg(record):
    """The cfg of another tag that timm registers for the same architecture (other weights, another head)."""
    return {
        **record,
        "cfg": json.loads(json.dumps(timm.models.get_pretrained_cfg("vit_tiny_patch16_224.augreg_in21k").to_dict())),
    }


TAMPERED = {  # a registry row's load_args, changed: each is refused, and the load is caught from a build
    "another repository": lambda r: {**r, "cfg": {**r["cfg"], "hf_hub_id": "someone/else"}},
    "another URL": lambda r: {**r, "cfg": {**r["cfg"], "url": "https://example.com/other.pth", "hf_hub_id": None}},
    "a tag timm lacks": lambda r: {**r, "cfg": {**r["cfg"], "tag": "no_such_tag"}},
    "another tag's whole cfg": _in21k_cfg,
    "another class count": lambda r: {**r, "num_classes": 10},
    "a string for the class count": lambda r: {**r, "num_classes": "1000"},
    "a looser load": lambda r: {**r, "strict": False},
    "timm code that is no filter": lambda r: {
        **r,
        "filter_fn": "timm.utils.summary:update_summary",
        "filter_kwargs": {"filename": "/tmp/zoo-never-written"},
    },
    "another model's filter": lambda r: {**r, "filter_fn": "timm.models.resnet:_create_resnet"},
    "a keyword the filter does not take": lambda r: {**r, "filter_kwargs": {"not_an_argument": 1}},
    "a keyword that is the filter's own first argument": lambda r: {**r, "filter_kwargs": {"state_dict": {}}},
    "no cfg": lambda r: {**r, "cfg": None},
    "not an object": lambda r: [1],
}


@pytest.mark.parametrize("tamper", list(TAMPERED))
def test_a_row_naming_other_weights_or_malformed_is_not_replayed(indexed, caches, monkeypatch, tamper):  # noqa: F811 - the caches fixture imported from test_pretrained_load
    """A registry row is data: load_args that name weights timm does not register for the builder, numbers timm
    would not pass, code that is no filter of the model's, or a malformed record are caught again from a build,
    and the load is timm's own."""
    import zoo
    from zoo.registry import db

    info = zoo.connect(indexed).info(f"timm/{TAG}")
    with db.open_registry(indexed, write=True).begin() as con:
        con.exec_driver_sql(
            "UPDATE models SET load_args = ? WHERE name = ?",
            (json.dumps(TAMPERED[tamper](dict(info.load_args))), info.name),
        )
    zoo.cache_clear()
    _pretrained_file(caches[0])
    caught = _catches(monkeypatch)
    ours = zoo.connect(indexed).get(f"timm/{TAG}", weights="pretrained")
    assert caught == [(TAG, {})]
    assert_bitwise(ours, timm.create_model(TAG, pretrained=True))
