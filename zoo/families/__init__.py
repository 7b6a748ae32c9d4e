"""Family plug-ins: each turns a recipe into a module; this table is the only place zoo imports builders from.

A family module defines:
  NAME                          its prefix in model names ("timm/resnet50")
  available(patterns)           the builder names it can index, filtered by glob patterns
  check(builder, kwargs)        raise UntrustedBuilder / InvalidRecipe before anything is imported
  build(builder, kwargs)        the module (called under forced meta, with downloads blocked)
  describe(builder, module)     {"task": ..., "input_size": [...]} for the registry row, and optionally
                                "input": the spec of a batch-1 forward (zoo.analysis: flops, activations,
                                scan, estimate), e.g. {"args": [[3, 224, 224]]} or, for token ids with a
                                default length, {"kwargs": {"input_ids": {"shape": ["seq"], "dtype": "int64"}},
                                "seq_len": 128}; without it a model's scan_status is "no-input"
  versions()                    {"torch": ..., LIBRARY: ...}: a change means its models are rebuilt
Adding a family is adding a module here and a line to FAMILIES.
"""

import importlib
import json
from dataclasses import dataclass, field
from types import ModuleType

from zoo.errors import InvalidRecipe, UnknownFamily

FAMILIES = {
    "timm": "zoo.families.timm",
    "torchvision": "zoo.families.torchvision",
    "user": "zoo.families.user",
    "checkpoint": "zoo.families.checkpoint",
    "hf": "zoo.families.hf",
}

# Keyword arguments that would fetch or read weights during a build; builds never do.
WEIGHT_KWARGS = frozenset({
    "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict", "checkpoint_path",
    "weights", "weights_backbone", "cache_dir",
})


def family(name: str) -> ModuleType:
    try:
        return importlib.import_module(FAMILIES[name])
    except KeyError:
        raise UnknownFamily(f"unknown family {name!r}; known families: {', '.join(FAMILIES)}") from None


@dataclass(frozen=True)
class Recipe:
    """How to rebuild a model: a family, a builder name inside it, and JSON keyword arguments."""

    family: str
    builder: str
    kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        check_kwargs(self.kwargs)

    def kwargs_json(self) -> str:
        return json.dumps(self.kwargs, sort_keys=True)


def check_kwargs(kwargs) -> None:
    """Keyword arguments must be JSON data with identifier keys, and must not ask for weights."""
    if not isinstance(kwargs, dict):
        raise InvalidRecipe(f"kwargs must be a JSON object, not {type(kwargs).__name__}")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise InvalidRecipe(f"kwarg name {key!r} is not an identifier")
    blocked = sorted(WEIGHT_KWARGS & kwargs.keys())
    if blocked:
        raise InvalidRecipe(f"{', '.join(blocked)}: builds never load weights; use materialize(weights=...)")
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidRecipe(f"kwargs must be plain JSON data: {e}") from None
