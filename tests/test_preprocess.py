"""The transform zoo builds from a model's preprocessing data gives the same tensor, bit for bit, as
timm's create_transform(**resolve_data_config(...)) and torchvision's weights.transforms() on real images."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from zoo.families import timm as timm_family
from zoo.families import torchvision as torchvision_family
from zoo.preprocess import transform


def timm_preprocess(tag):  # a row of that tag with nothing recorded: timm's pretrained cfg
    return timm_family.preprocess(SimpleNamespace(preprocess=None, builder=tag))


def torchvision_preprocess(builder, tag):  # a variant row with nothing recorded: the weights' transforms()
    return torchvision_family.preprocess(SimpleNamespace(preprocess=None, builder=builder, tag=tag, kind="variant"))


def images():
    """A landscape, a portrait and a small image (smaller than the crop: border mode pads it), each a
    smooth gradient with noise, so that interpolation modes differ visibly."""
    rng = np.random.default_rng(0)
    out = []
    for h, w in ((375, 500), (640, 427), (150, 201)):
        y, x = np.mgrid[0:h, 0:w]
        rgb = np.stack([x * 255 / w, y * 255 / h, (x + y) % 256], -1) + rng.normal(0, 20, (h, w, 3))
        out.append(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)))
    return out


TIMM_TAGS = [
    "resnet50.a1_in1k",  # center, bicubic, crop_pct 0.95; test size 288 at crop_pct 1.0
    "resnet18.tv_in1k",  # center, bilinear, 0.875
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",  # mean/std 0.5, crop_pct 0.9
    "coat_lite_medium_384.in1k",  # squash
    "deepseek_vit_412m.deepseek_v4_1_flash",  # border: keep the ratio, pad with the mean
    "vit_5b_patch16_sapiens2.fb",  # squash to a non-square 1024x768
]


@pytest.mark.parametrize("tag", TIMM_TAGS)
@pytest.mark.parametrize("test_size", [False, True])
def test_timm_eval_transform_matches_timm(tag, test_size):
    import timm.data
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(tag).to_dict()
    theirs = timm.data.create_transform(**timm.data.resolve_data_config(pretrained_cfg=cfg, use_test_size=test_size))
    ours = transform(timm_preprocess(tag), test_size=test_size)
    for image in images():
        a, b = ours(image), theirs(image)
        assert a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize(
    "builder, tag",
    [
        ("resnet50", "IMAGENET1K_V2"),
        ("resnet50", "IMAGENET1K_V1"),
        ("efficientnet_b3", "IMAGENET1K_V1"),
        ("vit_h_14", "IMAGENET1K_SWAG_E2E_V1"),
    ],
)
def test_torchvision_eval_transform_matches_weights_transforms(builder, tag):
    from torchvision.models import get_model_weights

    theirs = get_model_weights(builder)[tag].transforms()
    ours = transform(torchvision_preprocess(builder, tag))
    for image in images():
        a, b = ours(image), theirs(image)
        assert a.shape == b.shape and torch.equal(a, b)


def test_zoo_transform_by_name_without_building_the_model(fresh_url):
    """A row without recorded preprocessing gets the library's, for its weights; no model is built."""
    import timm.data
    from timm.models import get_pretrained_cfg

    import zoo
    from tests.test_pretrained_load import add_row

    add_row(fresh_url, "timm/resnet18.a1_in1k", "timm", "resnet18.a1_in1k", tag="a1_in1k")
    registry = zoo.connect(fresh_url)
    assert registry.preprocess("timm/resnet18.a1_in1k")["crop_pct"] == 0.95  # timm's published cfg
    theirs = timm.data.create_transform(
        **timm.data.resolve_data_config(pretrained_cfg=get_pretrained_cfg("resnet18.a1_in1k").to_dict())
    )
    image = images()[0]
    assert torch.equal(registry.transform("timm/resnet18.a1_in1k")(image), theirs(image))
    train = registry.transform("timm/resnet18.a1_in1k", train=True)(image)
    assert train.shape == (3, 224, 224)


def test_recorded_preprocessing_is_what_the_transform_uses(fresh_url):
    """A row the indexer wrote with its preprocess dict: that dict, read without torch, drives the transform."""
    import json

    import timm.data
    from timm.models import get_pretrained_cfg

    import zoo
    from zoo.indexing import indexer
    from zoo.recipe import Recipe
    from zoo.registry import db

    tag = "resnet50.a1_in1k"
    cfg = get_pretrained_cfg(tag).to_dict()
    recorded = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in cfg.items()
        if k in ("input_size", "test_input_size", "crop_pct", "crop_mode", "interpolation", "mean", "std")
    }
    db.open_registry(fresh_url, write=True, create=True)
    record, table = indexer.record_of(f"timm/{tag}", Recipe("timm", tag, {}), None)
    record.update(kind="variant", tag="a1_in1k", preprocess=json.dumps(recorded))
    indexer.save(fresh_url, record, table)
    registry = zoo.connect(fresh_url)
    assert registry.info(f"timm/{tag}").preprocess == recorded
    assert registry.preprocess(f"timm/{tag}") == recorded
    theirs = timm.data.create_transform(**timm.data.resolve_data_config(pretrained_cfg=cfg))
    image = images()[1]
    assert torch.equal(registry.transform(f"timm/{tag}")(image), theirs(image))
