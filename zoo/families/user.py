"""User family: a model built by the user's own `module:function`, imported only from trusted packages."""

import importlib

from zoo.constants import trusted_modules
from zoo.errors import InvalidRecipe, UntrustedBuilder
from zoo.families import torch_version

NAME = "user"


def available(patterns=()) -> list[str]:
    return []  # user builders are indexed one by one: `zoo index builder MODULE:FUNCTION`


def split(builder: str) -> tuple[str, str]:
    module, sep, function = builder.partition(":")
    if not sep or not all(p.isidentifier() for p in module.split(".")) or not function.isidentifier():
        raise InvalidRecipe(f"builder must be MODULE:FUNCTION, e.g. mypkg.models:build_net; got {builder!r}")
    return module, function


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    module, _ = split(builder)
    allowed = trusted_modules() if trusted is None else trusted
    if module.split(".")[0] not in allowed:
        raise UntrustedBuilder(
            f"builder {builder!r} is not from a trusted package; zoo imports user builders only from "
            f"packages listed in ZOO_TRUSTED_MODULES (e.g. ZOO_TRUSTED_MODULES={module.split('.')[0]})"
        )


def build(builder: str, kwargs: dict):
    module, function = split(builder)
    return getattr(importlib.import_module(module), function)(**kwargs)


def describe(builder: str, module) -> dict:
    return {"task": None, "input_size": None}


def versions() -> dict:
    return {"torch": torch_version()}
