"""The shipped registry's published numbers against timm's and torchvision's own published data (the CSVs in
catalog/timm-results, torchvision's weights enums), never against zoo's output: every number at the row's own
input size, the test-size result in fields of its own, throughput only where it was measured at that size."""

import csv
import json
import sqlite3

import pytest

import zoo
from tests.conftest import ROOT, run_cli
from zoo.registry import lite

SHIPPED = ROOT / "registry.db"
RESULTS = ROOT / "catalog" / "timm-results"
BENCHMARKS = {  # column -> (file, mode), as catalog/timm-results/README.md lists them
    "infer_4090_amp": ("benchmark-infer-amp-nchw-pt291-cu128-4090.csv", "infer"),
    "infer_5090_amp": ("benchmark-infer-amp-nchw-pt291-cu130-5090.csv", "infer"),
    "infer_pro6000_amp": ("benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv", "infer"),
    "infer_i7_12700h_fp32": ("benchmark-infer-fp32-nchw-pt240-cpu-i7_12700h-dynamo.csv", "infer"),
    "train_3090_amp": ("benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv", "train"),
}


def _rows(where: str, *columns) -> list[dict]:
    with sqlite3.connect(f"file:{SHIPPED}?mode=ro", uri=True) as c:
        c.row_factory = sqlite3.Row
        return [
            dict(r)
            for r in c.execute(f"SELECT name, builder, input_size, {', '.join(columns)} FROM models WHERE {where}")
        ]


def _csv(name: str) -> list[dict]:
    with open(RESULTS / name, newline="") as f:
        return list(csv.DictReader(f))


def test_top1_is_the_published_result_at_the_rows_input_size_and_test_top1_at_the_test_size():
    from timm.models import get_pretrained_cfg

    published: dict[str, dict[int, dict]] = {}
    for r in _csv("results-imagenet.csv"):
        published.setdefault(r["model"], {})[int(r["img_size"])] = r
    rows = _rows(
        "family = 'timm' AND kind = 'variant'",
        "top1",
        "top5",
        "test_top1",
        "test_top5",
        "test_input_size",
        "test_flops",
        "flops",
    )
    assert len(rows) > 1500
    at_input = at_test = 0
    for row in rows:
        tag, size = row["builder"], json.loads(row["input_size"])
        by_size = published.get(tag, {})
        cfg = get_pretrained_cfg(tag)
        assert list(cfg.input_size) == size, tag
        here = by_size.get(size[-1])
        assert (row["top1"], row["top5"]) == ((float(here["top1"]), float(here["top5"])) if here else (None, None)), tag
        at_input += here is not None
        test = cfg.test_input_size
        there = by_size.get(test[-1]) if test and test[-1] != size[-1] else None
        if there is None:
            assert (row["test_top1"], row["test_top5"], row["test_input_size"]) == (None, None, None), tag
            continue
        assert (row["test_top1"], row["test_top5"]) == (float(there["top1"]), float(there["top5"])), tag
        assert json.loads(row["test_input_size"]) == list(test), tag
        assert row["test_flops"] is not None and row["test_flops"] > row["flops"], tag  # a larger image costs more
        at_test += 1
    assert at_input == sum(
        1 for tag in published for s in published[tag] if s == get_pretrained_cfg(tag).input_size[-1]
    )
    assert at_test == 290  # the tags timm publishes twice (its results README)


def test_throughput_is_the_benchmark_at_the_rows_own_size_and_empty_elsewhere():
    rows = _rows(
        "family = 'timm' AND status = 'ok' AND input_size IS NOT NULL",
        *(c for column in BENCHMARKS for c in (column, f"{column}_batch")),
    )
    for column, (file, mode) in BENCHMARKS.items():
        measured = {
            (r["model"], int(r[f"{mode}_img_size"])): (
                float(r[f"{mode}_samples_per_sec"]),
                int(r[f"{mode}_batch_size"]),
            )
            for r in _csv(file)
        }
        filled = 0
        for row in rows:
            key = (row["builder"].split(".")[0], json.loads(row["input_size"])[-1])
            assert (row[column], row[f"{column}_batch"]) == measured.get(key, (None, None)), (column, row["name"])
            filled += key in measured
        # every architecture the file measured at the size timm's default cfg gives it has its number
        archs = {r["builder"]: json.loads(r["input_size"])[-1] for r in rows if "." not in r["builder"]}
        assert all(measured.get((a, s)) is not None for a, s in archs.items() if (a, s) in measured)
        assert filled > 300, column


def test_the_pretraining_data_is_the_published_metadata():
    pretrain = {r["model"]: r["pretrain"] for r in _csv("model_metadata-in1k.csv")}
    rows = {r["name"]: r["pretrain"] for r in _rows("family = 'timm' AND kind = 'variant'", "pretrain")}
    # an architecture's default tag, and a tag timm renamed from an older model name (timm's deprecations)
    assert rows["timm/resnet50.a1_in1k"] == pretrain["resnet50"]
    assert rows["timm/tf_efficientnet_b0.ns_jft_in1k"] == pretrain["tf_efficientnet_b0_ns"] == "jft300m-ns"
    assert rows["timm/resnet50.tv_in1k"] == pretrain["tv_resnet50"]
    assert sum(v is not None for v in rows.values()) >= 500


@pytest.mark.parametrize("backend", ["sqlalchemy", "lite"])
def test_accuracy_under_a_measured_speed_is_searchable_on_both_backends(backend):
    expr = "top1>83 and infer_4090_amp>3000"
    if backend == "lite":
        rows = lite.search(f"sqlite:///{SHIPPED}", expr, fields=("name", "top1"), order_by="-top1")
        assert rows is not None  # the torch-free reader answered, not the SQLAlchemy fallback
        found = [(r["name"], r["top1"]) for r in rows]
    else:
        found = [(i.name, i.top1) for i in zoo.connect(str(SHIPPED)).search(expr, order_by="-top1", limit=None)]
    expected = _rows("top1 > 83 AND infer_4090_amp > 3000", "top1")
    assert len(found) == len(expected) > 0
    assert {n for n, _ in found} == {r["name"] for r in expected}
    assert [t for _, t in found] == sorted((t for _, t in found), reverse=True)


def test_cli_search_and_fields_name_the_new_fields():
    out = run_cli("search", "top1>83 and infer_4090_amp>3000", "--sort", "-top1", registry=str(SHIPPED)).stdout
    assert out.splitlines()[0].split()[:3] == ["name", "top1", "infer_4090_amp"]
    shouted = run_cli("search", "TOP1>83 and Infer_4090_AMP>3000", "--sort", "-Top1", registry=str(SHIPPED)).stdout
    assert shouted == out  # field names ignore case in the search, so they do in the columns it shows
    fields = run_cli("search", "--fields").stdout
    for name, words in (
        ("test_top1", "test_input_size"),
        ("test_flops", "FLOPs"),
        ("pretrain", "pretrained"),
        ("infer_4090_amp", "RTX 4090"),
        ("infer_4090_amp_batch", "batch size"),
        ("infer_i7_12700h_fp32", "i7-12700H"),
        ("train_3090_amp", "RTX 3090"),
    ):
        line = next(line for line in fields.splitlines() if line.split()[0] == name)
        assert words in line, line


def _torchvision_weights_at_another_size() -> list[tuple[str, str, int]]:
    """(builder, weights, crop) of every torchvision weights whose published transform crops at another size than
    its model's DEFAULT weights (torchvision's own meta, not zoo's)."""
    from torchvision.models import get_model_weights, list_models

    out = []
    for builder in list_models():
        try:
            enum = get_model_weights(builder)
        except Exception:  # a model without published weights
            continue
        default = getattr(enum.DEFAULT.transforms(), "crop_size", None)
        for w in enum:
            crop = getattr(w.transforms(), "crop_size", None)
            if crop != default:
                out.append((builder, w.name, crop[0]))
    return out


@pytest.mark.parametrize("builder,tag,crop", _torchvision_weights_at_another_size())
def test_scan_estimate_and_the_index_run_a_variant_at_its_weights_size(builder, tag, crop):
    z = zoo.connect(str(SHIPPED))
    name = f"torchvision/{builder}.{tag}"
    assert list(z.info(name).input_size) == [3, crop, crop]  # the index
    assert z.info(name).inputs[0]["shape"] == [1, 3, crop, crop]
    assert z.estimate(name, batch=1, dtype="fp32").inputs == 3 * crop * crop * 4
    module = zoo.get(name)
    first = next(m for m in module.modules() if type(m).__name__ == "Conv2d")  # the stem: its output says the size
    side = (crop + 2 * first.padding[0] - first.dilation[0] * (first.kernel_size[0] - 1) - 1) // first.stride[0] + 1
    scanned = next(m for m in z.scan(name).modules if m.type == "Conv2d")
    assert scanned.outputs[0][1][-2:] == [side, side]


def test_show_says_the_size_each_published_number_is_at():
    at = {
        int(r["img_size"]): r["top1"]
        for r in _csv("results-imagenet.csv")
        if r["model"] == "convnextv2_large.fcmae_ft_in22k_in1k"
    }
    speed = next(
        r
        for r in _csv(BENCHMARKS["infer_i7_12700h_fp32"][0])
        if (r["model"], r["infer_img_size"]) == ("convnextv2_large", "224")
    )["infer_samples_per_sec"]
    out = run_cli("show", "timm/convnextv2_large.fcmae_ft_in22k_in1k", registry=str(SHIPPED)).stdout
    assert f"{float(at[224])}% at 224x224" in out and f"{float(at[288])}% at 288x288 (test size" in out
    assert f"{float(speed):.3g} samples/s at 224x224, batch 1" in out
    # beside the measurement, the roofline's prediction at the same size, called one
    predicted = next(line for line in out.splitlines() if line.startswith("pred_infer_i7_12700h_fp32 "))
    assert "samples/s at 224x224, batch 1 (PREDICTED" in predicted
