"""timm family: every name in timm.list_models(), built with pretrained=False."""

import fnmatch

from zoo.errors import UntrustedBuilder

NAME = "timm"


def available(patterns=()) -> list[str]:
    import timm

    names = timm.list_models()
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def check(builder: str, kwargs: dict) -> None:
    import timm

    if not timm.is_model(builder):
        raise UntrustedBuilder(f"{builder!r} is not a model of the installed timm {timm.__version__}")


def build(builder: str, kwargs: dict):
    import timm

    return timm.create_model(builder, pretrained=False, **kwargs)


def describe(builder: str, module) -> dict:
    cfg = getattr(module, "pretrained_cfg", None) or {}
    size = cfg.get("input_size")
    return {"task": "image-classification", "input_size": list(size) if size else None,
            "input": {"args": [list(size)]} if size else None}  # zoo.analysis input spec: one image batch


def versions() -> dict:
    import timm
    import torch

    return {"torch": torch.__version__.split("+")[0], "timm": timm.__version__}
