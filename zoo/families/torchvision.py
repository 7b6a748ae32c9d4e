"""torchvision family: every name in torchvision.models.list_models(), built with no weights of any kind; and
every weights enum ("resnet50.IMAGENET1K_V2") as a variant row, built with the kwargs those weights need."""

from zoo.errors import InvalidArgument, UntrustedBuilder
from zoo.families import torch_version

NAME = "torchvision"
PRETRAINED = "weights-enum"

# torchvision's sub-packages name the task; hub pipeline names.
_TASKS = {
    "detection": "object-detection",
    "segmentation": "image-segmentation",
    "video": "video-classification",
    "optical_flow": "optical-flow",
}
_CLIP_FRAMES = 16  # torchvision's video models are documented on 16-frame clips


def available(patterns=()) -> list[str]:
    from torchvision.models import list_models

    return list_models(include=list(patterns) or None)


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    from torchvision.models import list_models

    if builder not in list_models():
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed torchvision")


def build(builder: str, kwargs: dict):
    import inspect

    from torchvision.models import get_model_builder

    fn = get_model_builder(builder)
    trained = kwargs.pop(IS_TRAINED, False)
    off = {"weights": None}
    # Detection and segmentation builders download backbone weights unless told not to.
    if "weights_backbone" in inspect.signature(fn).parameters:
        off["weights_backbone"] = None
    module = fn(**{**kwargs, **off})  # a falsy weights argument in kwargs says the same
    if trained and builder in _FROZEN_NORMS:
        freeze_backbone_norms(module)
    return module


def weights_of(builder: str, tag: str | None):
    """The weights enum member `tag` of a builder (None: its DEFAULT), or InvalidArgument naming the tags."""
    from torchvision.models import get_model_weights

    enum = get_model_weights(builder)
    if tag is None:
        return enum.DEFAULT
    try:
        return enum[tag]
    except KeyError:
        raise InvalidArgument(
            f"torchvision {builder} has no weights {tag!r}: {', '.join(w.name for w in enum)}"
        ) from None


def weights_tag(builder: str, weights):
    """The tag that torchvision's own spellings of weights name, as get_model(name, weights=...) takes
    them: "DEFAULT", a weights name ("IMAGENET1K_V2") or a WeightsEnum member; False for anything else."""
    from enum import Enum

    from torchvision.models import get_model_weights

    if not isinstance(weights, (str, Enum)):
        return False
    enum = get_model_weights(builder)
    if isinstance(weights, Enum):
        if not isinstance(weights, enum):
            raise InvalidArgument(
                f"{weights} are weights of another model: torchvision {builder} takes "
                f"{enum.__name__} ({', '.join(w.name for w in enum)})"
            )
        return weights.name
    if weights == "DEFAULT":
        return enum.DEFAULT.name
    return weights if weights in enum.__members__ else False


def task_of(builder: str) -> str:
    from torchvision.models import get_model_builder

    parts = get_model_builder(builder).__module__.split(".")
    return _TASKS.get(parts[2], "image-classification") if len(parts) > 3 else "image-classification"


def describe(builder: str, module, tag: str | None = None) -> dict:
    """tag: a variant's weights (their transforms' size); else the DEFAULT weights' size."""
    from torchvision.models import get_model_weights

    task = task_of(builder)
    enum = get_model_weights(builder)
    transforms = (enum[tag] if tag else enum.DEFAULT).transforms()
    crop = getattr(transforms, "crop_size", None) or getattr(transforms, "resize_size", None)
    size = None
    if crop:
        h, w = (crop * 2)[:2]
        size = [3, _CLIP_FRAMES, h, w] if task == "video-classification" else [3, h, w]
    image_size = getattr(module, "image_size", None)
    if size and task == "image-classification" and isinstance(image_size, int):
        # ViTs are built for an image size; without weights vit_h_14 is 224 (its weights' 518 would not fit).
        size = [3, image_size, image_size]
    return {"task": task, "input_size": size, "input": _input_spec(task, size, module)}


# torchvision publishes its optical-flow GFLOPS at 512x512 (its weights give only a minimum size).
_FLOW_SIZE = [3, 512, 512]


def _input_spec(task: str, size, module) -> dict | None:
    """zoo.analysis input spec: two images for optical flow, a list of images for detection (each resized
    by the model to its transform's min_size; a square image of that size), else one batch of `size`."""
    if task == "optical-flow":
        return {"args": [_FLOW_SIZE, _FLOW_SIZE]}
    if task == "object-detection":
        side = getattr(getattr(module, "transform", None), "min_size", None)
        side = side[0] if isinstance(side, (tuple, list)) else side
        return {"args": [{"shape": [3, int(side), int(side)], "list": True}]} if side else None
    return {"args": [size]} if size else None


def versions() -> dict:
    import torchvision

    return {"torch": torch_version(), "torchvision": torchvision.__version__.split("+")[0]}


# --- pretrained variants: a row per weights enum, "resnet50.IMAGENET1K_V2" -------------------------------------

# The builders that give the backbone FrozenBatchNorm2d norms when they build for weights (torchvision's
# `is_trained`): their norms' weight and bias are buffers then, not parameters, and the checkpoint has no
# num_batches_tracked. torchvision's num_params counts that model.
_FROZEN_NORMS = {
    "fasterrcnn_resnet50_fpn",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_mobilenet_v3_large_320_fpn",
    "fcos_resnet50_fpn",
    "keypointrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn",
    "retinanet_resnet50_fpn",
}
IS_TRAINED = "is_trained"  # zoo's recipe key for torchvision's is_trained (detection); the builder never sees it
# torchvision's _metrics -> the searchable float columns (zoo.columns)
_FLOATS = {
    ("ImageNet-1K", "acc@1"): "top1",
    ("ImageNet-1K", "acc@5"): "top5",
    ("COCO-val2017", "box_map"): "box_map",
    ("COCO-val2017", "mask_map"): "mask_map",
    ("COCO-val2017", "kp_map"): "keypoint_map",
    ("COCO-val2017-VOC-labels", "miou"): "miou",
    ("COCO-val2017-VOC-labels", "pixel_acc"): "pixel_acc",
    ("Kinetics-400", "acc@1"): "k400_top1",
    ("Kinetics-400", "acc@5"): "k400_top5",
}
# What the weights were trained on: torchvision names it in the tag (its docs say the same); longest first.
_DATASETS = {
    "COCO_WITH_VOC_LABELS": "COCO (20 VOC categories)",
    "IMAGENET1K_SWAG": "IG-3.6B (SWAG) + ImageNet-1K",
    "IMAGENET1K": "ImageNet-1K",
    "COCO": "COCO",
    "KINETICS400_IMAGENET22K": "ImageNet-22K + Kinetics-400",
    "KINETICS400": "Kinetics-400",
}
# RAFT's tags list its training stages: C_T_SKHT_K_V1 = Chairs, Things, Sintel+KITTI+HD1K+Things, KITTI.
_FLOW_STAGES = {"C": "FlyingChairs", "T": "FlyingThings3D", "SKHT": "Sintel+KITTI+HD1K+FlyingThings3D", "K": "KITTI"}


def dataset_of(tag: str) -> str:
    if tag.startswith("C_T"):
        return " -> ".join(_FLOW_STAGES[s] for s in tag.rsplit("_V", 1)[0].split("_"))
    return next((name for prefix, name in _DATASETS.items() if tag.startswith(prefix)), tag)


_CARD_KEYS = ("recipe", "_docs", "min_size", "min_temporal_size", "backend", "unquantized", "license")


def _ignored(builder: str) -> dict:
    """Keys the weights file holds that the model does not: googlenet's builder loads the file into a model
    with aux heads, then drops them (aux_logits=False)."""
    return {"ignore_prefixes": ["aux1.", "aux2."]} if builder.endswith("googlenet") else {}


def weights_kwargs(builder: str, weights) -> dict:
    """The keyword arguments torchvision's builder derives from `weights` (its _ovewrite_named_param and
    _ovewrite_value_param calls), so that a build without weights is the model the weights fit."""
    meta = weights.meta
    kwargs = {}
    if meta.get("categories") is not None:  # vgg16's IMAGENET1K_FEATURES has none: the builder's default
        kwargs["num_classes"] = len(meta["categories"])
    if "keypoint_names" in meta:
        kwargs["num_keypoints"] = len(meta["keypoint_names"])
    if builder.startswith(("deeplabv3_", "fcn_")):
        kwargs["aux_loss"] = True
    if builder.endswith("googlenet"):  # built with aux heads, which the builder then drops (aux_logits=False)
        kwargs.update(transform_input=True, aux_logits=False, init_weights=False)
    if builder.endswith("inception_v3"):  # keeps its aux head (the default aux_logits=True)
        kwargs.update(transform_input=True, aux_logits=True, init_weights=False)
    if builder.startswith("vit_"):
        kwargs["image_size"] = meta["min_size"][0]
    if builder.startswith("quantized_"):
        # quantize=True packs int8 weights into the model with a calibration forward that cannot run on meta,
        # and leaves no parameters. The row sizes the float model they were quantized from (the same module
        # classes with quantize=False), as torchvision's num_params and _ops do; loading these weights in
        # place is refused (zoo.pretrained).
        kwargs.update(quantize=False)
    if builder in _FROZEN_NORMS:
        kwargs[IS_TRAINED] = True
    return kwargs


def freeze_backbone_norms(module) -> None:
    """What the detection builders do for weights: the backbone's BatchNorm2d become FrozenBatchNorm2d
    (same eps). In place; called inside the meta build."""
    from torch import nn
    from torchvision.ops.misc import FrozenBatchNorm2d

    for name, child in list(module.backbone.named_modules()):
        if type(child) is nn.BatchNorm2d:
            parent, _, leaf = name.rpartition(".")
            setattr(module.backbone.get_submodule(parent), leaf, FrozenBatchNorm2d(child.num_features, child.eps))


def preprocess(info) -> dict:
    """The recorded preprocessing where it has the weights' resize size (crop_pct alone rounds), else torchvision's
    ImageClassification transform of the weights as the same keys, plus resize_size (exact)."""
    recorded = info.preprocess
    if isinstance(recorded, dict) and recorded.get("input_size") and "resize_size" in recorded:
        return dict(recorded)
    t = weights_of(info.builder, info.tag if info.kind == "variant" else None).transforms()
    crop, resize = getattr(t, "crop_size", None), getattr(t, "resize_size", None)
    if crop is None or resize is None:
        raise InvalidArgument(
            f"torchvision {info.builder} weights transform their input as {type(t).__name__}, "
            f"not a resize and crop of one image"
        )
    return {
        "input_size": [3, crop[0], crop[0]],
        "test_input_size": None,
        "crop_pct": crop[0] / resize[0],
        "crop_mode": "center",
        "interpolation": t.interpolation.value,
        "mean": list(t.mean),
        "std": list(t.std),
        "resize_size": resize[0],
    }


def variants(patterns=(), results: dict | None = None) -> list[dict]:
    """Every weights enum of every model, "resnet50.IMAGENET1K_V2", matching the patterns (fnmatch on that
    name): its recipe (the model name and the kwargs the weights need) and what it records (zoo.columns),
    with the metrics torchvision publishes in the enums (no results to read: `results` must be None)."""
    if results is not None:
        raise InvalidArgument("published validation results apply to timm's pretrained variants")
    import fnmatch

    from torch.hub import HASH_REGEX
    from torchvision.models import get_model_weights, list_models

    rows = []
    for builder in list_models():
        for weights in get_model_weights(builder):
            full = f"{builder}.{weights.name}"
            if patterns and not any(fnmatch.fnmatchcase(full, p) for p in patterns):
                continue
            meta = weights.meta
            file = weights.url.rsplit("/", 1)[-1]
            prefix = HASH_REGEX.search(file)
            # NaN (vgg16's IMAGENET1K_FEATURES: a feature extractor, not evaluated) is no number: null
            metrics = {k: {m: None if v != v else v for m, v in d.items()} for k, d in meta.get("_metrics", {}).items()}
            rows.append(
                {
                    "builder": builder,
                    "kwargs": weights_kwargs(builder, weights),
                    "kind": "variant",
                    "tag": weights.name,
                    "arch_name": f"{NAME}/{builder}",
                    "license": meta.get("license"),
                    "dataset": dataset_of(weights.name),
                    "num_classes": len(meta["categories"]) if meta.get("categories") is not None else None,
                    "task": task_of(builder),
                    # published in MiB with 3 decimals: the bytes to within 1 KiB
                    "weights_bytes": round(meta["_file_size"] * 2**20) if "_file_size" in meta else None,
                    "weights_source": {
                        "url": weights.url,
                        "sha256_prefix": prefix.group(1) if prefix else None,
                        "file": file,
                        **_ignored(builder),
                    },
                    "preprocess": preprocess_of(weights),
                    "card": {k.lstrip("_"): _plain(meta[k]) for k in _CARD_KEYS if k in meta}
                    | (
                        {
                            "notes": f"int8 weights ({meta['backend']}): figures are the float model's, as torchvision "
                            f"publishes them"
                        }
                        if builder.startswith("quantized_")
                        else {}
                    ),
                    "metrics": metrics,
                    **{
                        column: metrics[s][m]
                        for (s, m), column in _FLOATS.items()
                        if metrics.get(s, {}).get(m) is not None
                    },
                }
            )
    return rows


def _plain(value):
    """JSON data: tuples as lists, a weights enum (a quantized weights' "unquantized") as its name."""
    from enum import Enum

    if isinstance(value, Enum):
        return f"{type(value).__name__}.{value.name}"
    return list(value) if isinstance(value, tuple) else value


def preprocess_of(weights) -> dict:
    """The weights' transforms as the keys timm's rows use (zoo.families.timm.PREPROCESS_KEYS), plus
    resize_size; crop_pct stays empty: torchvision publishes resize_size instead."""
    t = weights.transforms()
    crop, resize = getattr(t, "crop_size", None), getattr(t, "resize_size", None)
    mode = getattr(t, "interpolation", None)
    size = None
    if crop:
        h, w = (list(crop) * 2)[:2]
        size = [3, h, w]
    return {
        "input_size": size,
        "test_input_size": None,
        "crop_pct": None,
        "test_crop_pct": None,
        "crop_mode": "center" if crop else None,
        "interpolation": mode.value if mode is not None else None,
        "mean": _plain(getattr(t, "mean", None)),
        "std": _plain(getattr(t, "std", None)),
        "resize_size": _plain(resize),
    }
