"""torchvision family: every name in torchvision.models.list_models(), built with no weights of any kind."""

from zoo.errors import UntrustedBuilder
from zoo.families import torch_version

NAME = "torchvision"

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


def check(builder: str, kwargs: dict) -> None:
    from torchvision.models import list_models

    if builder not in list_models():
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed torchvision")


def build(builder: str, kwargs: dict):
    import inspect

    from torchvision.models import get_model_builder

    fn = get_model_builder(builder)
    off = {"weights": None}
    # Detection and segmentation builders download backbone weights unless told not to.
    if "weights_backbone" in inspect.signature(fn).parameters:
        off["weights_backbone"] = None
    return fn(**{**kwargs, **off})  # a falsy weights argument in kwargs says the same


def task_of(builder: str) -> str:
    from torchvision.models import get_model_builder

    parts = get_model_builder(builder).__module__.split(".")
    return _TASKS.get(parts[2], "image-classification") if len(parts) > 3 else "image-classification"


def describe(builder: str, module) -> dict:
    from torchvision.models import get_model_weights

    task = task_of(builder)
    transforms = get_model_weights(builder).DEFAULT.transforms()
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
