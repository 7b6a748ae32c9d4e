"""timm family: every name in timm.list_models(), built with pretrained=False."""

from zoo.errors import UntrustedBuilder
from zoo.families import torch_version

NAME = "timm"


def available(patterns=()) -> list[str]:
    import timm

    return timm.list_models(list(patterns) or "")


def check(builder: str, kwargs: dict) -> None:
    import timm

    if not timm.is_model(builder):
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed timm {timm.__version__}")


def build(builder: str, kwargs: dict):
    import timm

    return timm.create_model(builder, **{**kwargs, "pretrained": False})


def describe(builder: str, module) -> dict:
    cfg = getattr(module, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    return {"task": "image-classification", "input_size": list(size) if size else None,
            "input": {"args": [list(size)]} if size else None}  # zoo.analysis input spec: one image batch


def versions() -> dict:
    import timm

    return {"torch": torch_version(), "timm": timm.__version__}
