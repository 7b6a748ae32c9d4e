"""Family plug-ins: each turns a recipe into a module; this table is the only place zoo imports builders from.

A family module implements zoo.families.base.Family: what it builds and how it describes it, its versions, its
pretrained variants and published results, its preprocessing, and flags for what zoo does with its rows
(BUILDS, LANGUAGE_MODEL, CONSTRUCTION_DECIDES, PUBLISHED_RESULTS); what it has no use for it takes from
zoo.families.base. Adding a family is a module (tests/toy_family.py is one) and a line in FAMILIES. Families
build and describe; recording is the indexer's (zoo.indexing.indexer), and nothing here imports the registry or the API.
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
