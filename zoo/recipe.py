"""A recipe: how to rebuild a model (a family, a builder inside it, JSON keyword arguments), vetted as data."""

import json
from dataclasses import dataclass, field

from zoo.errors import InvalidRecipe

# Keyword arguments that would fetch or read weights during a build; builds never do.
WEIGHT_KWARGS = frozenset(
    {
        "pretrained",
        "pretrained_cfg",
        "pretrained_cfg_overlay",
        "pretrained_strict",
        "checkpoint_path",
        "weights",
        "weights_backbone",
        "cache_dir",
    }
)


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
    blocked = sorted(k for k in WEIGHT_KWARGS & kwargs.keys() if kwargs[k])  # pretrained=False asks for nothing
    if blocked:
        raise InvalidRecipe(
            f"{', '.join(f'{k}={kwargs[k]!r}' for k in blocked)}: builds never load weights; "
            f"use materialize(weights=...)"
        )
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidRecipe(f"kwargs must be plain JSON data: {e}") from None
