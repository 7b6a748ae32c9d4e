"""get / info / search against a registry made by zoo's own indexer, with real timm and torchvision; on SQLite
and on PostgreSQL (the same registry copied there with zoo db copy)."""

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, SMALL_TIMM


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def registry_url(request, small_registry) -> str:
    if request.param == "sqlite":
        return small_registry
    from zoo.registry.transfer import copy_registry

    url = request.getfixturevalue("pg_server").fresh()
    copy_registry(small_registry, url)
    return url


@pytest.fixture
def zoo_at(registry_url, monkeypatch):
    """The zoo module, pointed at the small registry on each backend."""
    import zoo

    monkeypatch.setenv("ZOO_REGISTRY", registry_url.removeprefix("sqlite:///"))
    return zoo


def test_get_returns_the_models_own_class_all_on_meta_as_recorded(zoo_at):
    import timm

    for name in SMALL_TIMM:
        m = zoo_at.get(f"timm/{name}")
        reference = timm.create_model(name)  # real, eager
        assert type(m) is type(reference)
        assert all(t.is_meta for t in [*m.parameters(), *m.buffers()])
        recorded = {t.name: (t.shape, t.dtype) for t in zoo_at.info(f"timm/{name}", tensors=True).tensor_table}
        built = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in m.state_dict().items()}
        eager = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in reference.state_dict().items()}
        assert built == eager
        assert {k: v for k, v in recorded.items() if k in built} == built


def test_each_get_is_a_fresh_module(zoo_at):
    a, b = zoo_at.get("timm/resnet18"), zoo_at.get("timm/resnet18")
    assert a is not b and a.fc is not b.fc and a.fc.weight is not b.fc.weight
    a.fc = torch.nn.Identity()
    a.pretrained_cfg["mutated"] = True
    c = zoo_at.get("timm/resnet18")
    assert isinstance(c.fc, torch.nn.Linear) and "mutated" not in c.pretrained_cfg


def test_meta_forward_runs_on_a_gotten_module(zoo_at):
    m = zoo_at.get("timm/vit_tiny_patch16_224")
    out = m(torch.empty(2, 3, 224, 224, device="meta"))
    assert out.shape == (2, 1000) and out.is_meta


def test_overrides_rebuild_with_those_kwargs(zoo_at):
    m = zoo_at.get("timm/resnet18", num_classes=10)
    assert m.fc.out_features == 10
    assert zoo_at.get("timm/resnet18").fc.out_features == 1000


def test_overrides_that_would_load_weights_are_refused(zoo_at):
    with pytest.raises(zoo_at.InvalidRecipe, match="pretrained"):
        zoo_at.get("timm/resnet18", pretrained=True)


def test_info_records_counts_bytes_and_input(zoo_at):
    import timm

    info = zoo_at.info("timm/resnet18")
    eager = timm.create_model("resnet18")
    assert info.params == sum(p.numel() for p in eager.parameters())
    assert info.trainable == info.params
    assert info.buffers == sum(b.numel() for b in eager.buffers())
    assert info.tensors == len(eager.state_dict())
    assert info.bytes == info.param_bytes + info.buffer_bytes == 4 * (info.params + info.buffers) - 4 * 20 + 8 * 20
    assert info.input_size == (3, 224, 224) and info.task == "image-classification"
    assert info.arch == "timm.models.resnet.ResNet" and info.family == "timm" and info.status == "ok"
    assert info.versions["timm"] == timm.__version__


def test_torchvision_rows(zoo_at):
    det = zoo_at.info("torchvision/fasterrcnn_mobilenet_v3_large_fpn")
    assert det.task == "object-detection"
    cls = zoo_at.info("torchvision/mobilenet_v3_small")
    assert cls.input_size == (3, 224, 224) and cls.task == "image-classification"
    m = zoo_at.get("torchvision/fasterrcnn_mobilenet_v3_large_fpn")
    assert all(p.is_meta for p in m.parameters())


def test_tied_parameters_are_one_tensor_counted_once(zoo_at):
    m = zoo_at.get("user/tied")
    assert m.head.weight is m.embed.weight
    info = zoo_at.info("user/tied", tensors=True)
    assert info.params == sum(p.numel() for p in m.parameters())  # what PyTorch counts: the tie once
    table = {t.name: t for t in info.tensor_table}
    assert table["head.weight"].tied_to == "embed.weight"
    assert table["embed.weight"].tied_to is None


def test_non_persistent_buffers_are_recorded_as_such(zoo_at):
    table = {t.name: t for t in zoo_at.info("user/tied", tensors=True).tensor_table}
    assert table["positions"].kind == "buffer" and not table["positions"].persistent
    assert table["scale"].persistent
    swin = {t.name: t for t in zoo_at.info("timm/swin_tiny_patch4_window7_224", tensors=True).tensor_table}
    index = swin["layers.0.blocks.0.attn.relative_position_index"]
    assert not index.persistent and index.dtype == "int64" and index.shape == (49, 49)


def test_bare_names_resolve_when_unique(zoo_at):
    assert zoo_at.info("vit_tiny_patch16_224").name == "timm/vit_tiny_patch16_224"
    assert zoo_at.info("mobilenet_v3_small").name == "torchvision/mobilenet_v3_small"


def test_ambiguous_bare_names_list_the_candidates(zoo_at):
    with pytest.raises(zoo_at.AmbiguousName) as err:
        zoo_at.get("resnet18")
    assert err.value.candidates == ["timm/resnet18", "torchvision/resnet18"]
    assert isinstance(err.value, KeyError)
    assert "timm/resnet18" in str(err.value) and "torchvision/resnet18" in str(err.value)


def test_unknown_names_suggest_the_closest(zoo_at):
    with pytest.raises(zoo_at.ModelNotFound) as err:
        zoo_at.get("timm/resnt18")
    assert isinstance(err.value, KeyError)
    assert err.value.suggestions[0] == "timm/resnet18"
    assert "did you mean timm/resnet18" in str(err.value)
    with pytest.raises(zoo_at.ModelNotFound) as err:
        zoo_at.info("efficientnet_b")
    assert "timm/efficientnet_b0" in err.value.suggestions


def test_search_from_python(zoo_at):
    names = [i.name for i in zoo_at.search("params<5e6", order_by="params")]
    assert names and names == sorted(names, key=lambda n: zoo_at.info(n).params)
    assert all(zoo_at.info(n).params < 5e6 for n in names)
    via_f = [i.name for i in zoo_at.search(zoo_at.F.params < 5e6, order_by="params")]
    assert via_f == names
    assert [i.name for i in zoo_at.search("family=torchvision and task=object-detection")] == [
        "torchvision/fasterrcnn_mobilenet_v3_large_fpn"
    ]
    assert len(zoo_at.search(limit=None)) == 8
    assert len(zoo_at.search(limit=3)) == 3


def test_info_and_search_never_import_torch(small_registry):
    code = (
        "import sys, zoo\n"
        "zoo.search('params<1e8 and name~\"*vit*\"', order_by='-params')\n"
        "zoo.info('timm/resnet18', tensors=True)\n"
        "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('torch')]\n"
    )
    env = {"ZOO_REGISTRY": small_registry.removeprefix("sqlite:///"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_read_paths_of_a_sqlite_registry_never_import_sqlalchemy(small_registry, tmp_path):
    """info, get (its row and tensor check), a weights tag lookup, a materialize from a file, search, `zoo show`
    and `zoo search` read a SQLite file with sqlite3 (zoo.registry.lite): SQLAlchemy's import alone was most of a first
    get's time (and half a second more at exit)."""
    code = (
        "import sys, zoo, zoo.cli\n"
        "info = zoo.info('timm/resnet18', tensors=True)\n"
        "assert info.tensor_table and info.weights == []\n"
        "assert zoo.info('vit_tiny_patch16_224').name == 'timm/vit_tiny_patch16_224'  # a bare name\n"
        "m = zoo.get('timm/resnet18')\n"
        "assert zoo.connect().weights_path('timm/resnet18', 'w.safetensors') == 'w.safetensors'\n"
        "from safetensors.torch import save_file\n"
        "save_file(zoo.get('timm/resnet18').materialize().state_dict(), sys.argv[1])\n"
        "m.materialize(weights=sys.argv[1])  # a load from a file: the read path, not the indexer\n"
        "assert zoo.cli.main(['show', 'timm/resnet18']) == 0\n"
        "assert 'timm/resnet18' in [i.name for i in zoo.search('name~*resnet18 and params>1e6', order_by='-params')]\n"
        "assert zoo.cli.main(['search', 'params<1e8', '--sort', '-params']) == 0\n"
        "assert 'sqlalchemy' not in sys.modules, [m for m in sys.modules if m.startswith('sqlalchemy')]\n"
    )
    env = {"ZOO_REGISTRY": small_registry.removeprefix("sqlite:///"), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "w.safetensors")],
        check=True,
        env=env,
        cwd=ROOT,
        capture_output=True,
    )


def test_user_builders_are_imported_only_when_trusted(zoo_at, monkeypatch):
    monkeypatch.setenv("ZOO_TRUSTED_MODULES", "")
    with pytest.raises(zoo_at.UntrustedBuilder, match="ZOO_TRUSTED_MODULES"):
        zoo_at.get("user/tied", dim=4)


def test_a_row_naming_an_unknown_builder_is_never_imported(small_registry, tmp_path, monkeypatch):
    """A tampered row pointing timm at some other module must be refused before any import."""
    import sqlite3

    from sqlalchemy import create_engine, text

    import zoo

    path = tmp_path / "tampered.db"
    with sqlite3.connect(small_registry.removeprefix("sqlite:///")) as src, sqlite3.connect(path) as dst:
        src.backup(dst)  # the WAL's pages too
    with create_engine(f"sqlite:///{path}").begin() as conn:
        conn.execute(text("UPDATE models SET builder='os:system' WHERE name='timm/resnet18'"))
        conn.execute(text("UPDATE models SET family='nope' WHERE name='torchvision/resnet18'"))
    tampered = zoo.connect(str(path))
    with pytest.raises(zoo.UntrustedBuilder):
        tampered.get("timm/resnet18")
    with pytest.raises(zoo.ZooError, match="unknown family"):
        tampered.get("torchvision/resnet18")


def test_search_fields_lists_every_searchable_field_with_its_unit(small_registry):
    import json

    import zoo
    from tests.conftest import run_cli

    listed = json.loads(run_cli("search", "--fields", "--json", registry=small_registry).stdout)
    # the columns, then the fields over zoo bench's measurements (zoo.throughput.measured), then the predictions (one
    # per row of the hardware table, named for the measured column each predicts)
    predicted = [
        "pred_infer_4090_amp",
        "pred_infer_5090_amp",
        "pred_infer_pro6000_amp",
        "pred_infer_i7_12700h_fp32",
        "pred_train_3090_amp",
    ]
    assert [f["field"] for f in listed] == [
        *zoo.FIELDS,
        "bench_cpu",
        "bench_cuda",
        "bench_train_cpu",
        "bench_train_cuda",
        *predicted,
    ]
    assert {f["field"]: f["unit"] for f in listed}["bench_train_cuda"] == "samples/s"
    assert all(
        f["meaning"].startswith("PREDICTED, not measured") and f["unit"] == "samples/s"
        for f in listed
        if f["field"] in predicted
    )
    by_name = {f["field"]: f for f in listed}
    assert by_name["params"]["unit"] == "elements" and by_name["flops"]["unit"] == "FLOPs"
    assert by_name["bytes"]["type"] == "number" and by_name["task"]["type"] == "string"
