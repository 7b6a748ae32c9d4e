"""A model's input preprocessing as data (size, crop, interpolation, mean, std), and the torchvision
transform it describes, built without the model.

The eval transform is the one timm's create_transform(**resolve_data_config(...)) builds (crop modes
center, squash and border) and, for torchvision weights, what weights.transforms() computes: resize,
center crop, to a float tensor in [0, 1], normalize. The dict comes from the registry row's
`preprocess`; where a row has none, from the library's metadata for the weights (timm's pretrained cfg,
torchvision's weights enum), which needs no model build.
"""

from __future__ import annotations

import math

from zoo.errors import InvalidArgument

DEFAULT_CROP_PCT = 0.875  # timm's, when a cfg gives none
KEYS = ("input_size", "test_input_size", "crop_pct", "test_crop_pct", "crop_mode", "interpolation", "mean", "std")


def preprocess_of(info) -> dict:
    """The preprocessing of a ModelInfo: its recorded dict, else the library's for its weights."""
    recorded = info.preprocess
    builder = info.builder
    if info.family == "torchvision" and isinstance(recorded, dict) and "resize_size" not in recorded:
        recorded = None  # crop_pct alone rounds: the weights' own resize size makes the transform exact
    if isinstance(recorded, dict) and recorded.get("input_size"):
        return dict(recorded)
    if info.family == "timm":
        return timm_preprocess(builder)
    if info.family == "torchvision":
        return torchvision_preprocess(builder, info.tag if info.kind == "variant" else None)
    raise InvalidArgument(f"{info.name}: no recorded preprocessing, and {info.family} models publish none")


def timm_preprocess(tag: str) -> dict:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(tag)
    if cfg is None:
        raise InvalidArgument(f"timm has no pretrained cfg for {tag!r}")
    cfg = cfg.to_dict()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items() if k in KEYS}


def torchvision_preprocess(builder: str, tag: str | None) -> dict:
    """torchvision's ImageClassification transform as the same keys, plus resize_size (exact, where
    crop_pct would be a rounded ratio)."""
    from zoo.families.torchvision import weights_of

    t = weights_of(builder, tag).transforms()
    crop, resize = getattr(t, "crop_size", None), getattr(t, "resize_size", None)
    if crop is None or resize is None:
        raise InvalidArgument(f"torchvision {builder} weights transform their input as {type(t).__name__}, "
                              f"not a resize and crop of one image")
    return {"input_size": [3, crop[0], crop[0]], "test_input_size": None, "crop_pct": crop[0] / resize[0],
            "crop_mode": "center", "interpolation": t.interpolation.value, "mean": list(t.mean), "std": list(t.std), "resize_size": resize[0]}


def transform(preprocess: dict, train: bool = False, test_size: bool = False):
    """A torchvision transform from PIL image to normalized float tensor. Eval (default): resize and
    center crop as timm's eval transform does (torchvision weights: as weights.transforms() does).
    test_size: timm's test_input_size (and test_crop_pct) where the weights publish one.
    train=True: RandomResizedCrop + horizontal flip + normalize, the plain base of a training pipeline
    (not timm's augmentations: those are training choices, not properties of the weights)."""
    from torchvision import transforms as T

    size = (preprocess.get("test_input_size") if test_size else None) or preprocess["input_size"]
    height, width = size[-2:]
    interpolation = T.InterpolationMode(preprocess.get("interpolation") or "bilinear")
    normalize = [T.ToTensor(), T.Normalize(mean=list(preprocess["mean"]), std=list(preprocess["std"]))]
    if train:
        return T.Compose([T.RandomResizedCrop((height, width), interpolation=interpolation),
                          T.RandomHorizontalFlip(), *normalize])
    if preprocess.get("resize_size") and not test_size:  # torchvision: resize the short side, then crop
        return T.Compose([T.Resize(preprocess["resize_size"], interpolation=interpolation, antialias=True),
                          T.CenterCrop((height, width)), *normalize])
    crop_pct = (preprocess.get("test_crop_pct") if test_size else None) or preprocess.get("crop_pct") \
        or DEFAULT_CROP_PCT
    scale = (math.floor(height / crop_pct), math.floor(width / crop_pct))  # timm's arithmetic
    mode = preprocess.get("crop_mode") or "center"
    if mode == "squash":
        steps = [T.Resize(scale, interpolation=interpolation), T.CenterCrop((height, width))]
    elif mode == "border":
        fill = [round(255 * v) for v in preprocess["mean"]]
        steps = [_ResizeKeepRatio(scale, interpolation, longest=1.0), _CenterCropOrPad((height, width), fill)]
    elif mode == "center":
        steps = [T.Resize(scale[0], interpolation=interpolation) if scale[0] == scale[1]
                 else _ResizeKeepRatio(scale, interpolation, longest=0.0), T.CenterCrop((height, width))]
    else:
        raise InvalidArgument(f"crop_mode {mode!r}: want center, squash or border")
    return T.Compose([*steps, *normalize])


class _ResizeKeepRatio:
    """Resize so that the image's longest (longest=1) or shortest (longest=0) side ratio meets the target."""

    def __init__(self, size, interpolation, longest: float):
        self.size, self.interpolation, self.longest = size, interpolation, longest

    def __call__(self, img):
        from torchvision.transforms import functional as F

        h, w = F.get_dimensions(img)[1:]
        ratio_h, ratio_w = h / self.size[0], w / self.size[1]
        ratio = max(ratio_h, ratio_w) * self.longest + min(ratio_h, ratio_w) * (1.0 - self.longest)
        return F.resize(img, [round(h / ratio), round(w / ratio)], self.interpolation)


class _CenterCropOrPad:
    """Pad (with fill) where the image is smaller than the crop, then center crop."""

    def __init__(self, size, fill):
        self.size, self.fill = size, fill

    def __call__(self, img):
        from torchvision.transforms import functional as F

        crop_h, crop_w = self.size
        h, w = F.get_dimensions(img)[1:]
        if crop_w > w or crop_h > h:
            pad = [(crop_w - w) // 2 if crop_w > w else 0, (crop_h - h) // 2 if crop_h > h else 0,
                   (crop_w - w + 1) // 2 if crop_w > w else 0, (crop_h - h + 1) // 2 if crop_h > h else 0]
            img = F.pad(img, pad, fill=self.fill)
            h, w = F.get_dimensions(img)[1:]
            if (h, w) == (crop_h, crop_w):
                return img
        return F.crop(img, int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0)), crop_h, crop_w)
