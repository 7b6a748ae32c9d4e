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
Adding a family is adding a module here and a line to FAMILIES. Families build and describe; recording
is the indexer's (zoo.indexer), and nothing here imports the registry or the API.
"""

import importlib
from types import ModuleType

from zoo.errors import UnknownFamily

FAMILIES = {
    "timm": "zoo.families.timm",
    "torchvision": "zoo.families.torchvision",
    "user": "zoo.families.user",
    "checkpoint": "zoo.families.checkpoint",
    "hf": "zoo.families.hf",
}


def family(name: str) -> ModuleType:
    try:
        return importlib.import_module(FAMILIES[name])
    except KeyError:
        raise UnknownFamily(f"unknown family {name!r}; known families: {', '.join(FAMILIES)}") from None


def torch_version() -> str:
    """The installed torch's release ("2.14.1", without a local "+cu130" tag): part of every family's versions()."""
    import torch

    return torch.__version__.split("+")[0]
