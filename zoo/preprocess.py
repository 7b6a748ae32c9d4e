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


def preprocess_of(info) -> dict:
    """The preprocessing of a ModelInfo: its recorded dict, else the library's for its weights (its family's)."""
    from zoo.families import family

    return family(info.family).preprocess(info)


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
        return T.Compose(
            [T.RandomResizedCrop((height, width), interpolation=interpolation), T.RandomHorizontalFlip(), *normalize]
        )
    if preprocess.get("resize_size") and not test_size:  # torchvision: resize the short side, then crop
        return T.Compose(
            [
                T.Resize(preprocess["resize_size"], interpolation=interpolation, antialias=True),
                T.CenterCrop((height, width)),
                *normalize,
            ]
        )
    crop_pct = (
        (preprocess.get("test_crop_pct") if test_size else None) or preprocess.get("crop_pct") or DEFAULT_CROP_PCT
    )
    scale = (math.floor(height / crop_pct), math.floor(width / crop_pct))  # timm's arithmetic
    mode = preprocess.get("crop_mode") or "center"
    if mode == "squash":
        steps = [T.Resize(scale, interpolation=interpolation), T.CenterCrop((height, width))]
    elif mode == "border":
        fill = [round(255 * v) for v in preprocess["mean"]]
        steps = [_ResizeKeepRatio(scale, interpolation, longest=1.0), _CenterCropOrPad((height, width), fill)]
    elif mode == "center":
        steps = [
            T.Resize(scale[0], interpolation=interpolation)
            if scale[0] == scale[1]
            else _ResizeKeepRatio(scale, interpolation, longest=0.0),
            T.CenterCrop((height, width)),
        ]
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
            pad = [
                (crop_w - w) // 2 if crop_w > w else 0,
                (crop_h - h) // 2 if crop_h > h else 0,
                (crop_w - w + 1) // 2 if crop_w > w else 0,
                (crop_h - h + 1) // 2 if crop_h > h else 0,
            ]
            img = F.pad(img, pad, fill=self.fill)
            h, w = F.get_dimensions(img)[1:]
            if (h, w) == (crop_h, crop_w):
                return img
        return F.crop(img, int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0)), crop_h, crop_w)
