"""Family plug-ins: each turns a recipe into a module; this table is the only place zoo imports builders from.

A family module implements zoo.families.base.Family: what it builds and how it describes it, its versions, its
pretrained variants and published results, its preprocessing, and flags for what zoo does with its rows
(BUILDS, LANGUAGE_MODEL, CONSTRUCTION_DECIDES, PUBLISHED_RESULTS); what it does not define, family() answers
with the protocol's defaults (zoo.families.base), so a new hook is one default there, not an edit to every family.
Adding a family is a module (tests/toy_family.py is one) and a line in FAMILIES. Families
build and describe; recording is the indexer's (zoo.indexing.indexer), and nothing here imports the registry or the API.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, cast

from zoo.errors import UnknownFamily

if TYPE_CHECKING:
    from zoo.families.base import Family

FAMILIES = {
    "timm": "zoo.families.timm",
    "torchvision": "zoo.families.torchvision",
    "user": "zoo.families.user",
    "checkpoint": "zoo.families.checkpoint",
    "hf": "zoo.families.hf",
}


def family(name: str) -> Family:
    """The family plug-in `name`, with the protocol's defaults for what its module does not define."""
    if name not in FAMILIES:
        raise UnknownFamily(f"unknown family {name!r}; known families: {', '.join(FAMILIES)}")
    return _with_defaults(FAMILIES[name])


@functools.cache  # one object per family module: the same answers, and identity, on every call
def _with_defaults(module_name: str) -> Family:
    return cast("Family", WithDefaults(importlib.import_module(module_name)))


class WithDefaults:
    """A family module as zoo asks it: its own attributes first, then the protocol's defaults (zoo.families.base)
    for the hooks and flags of the protocol it leaves out. Anything else is an AttributeError, as on the module."""

    def __init__(self, module: ModuleType):
        self.module = module

    def __getattr__(self, attr: str):
        from zoo.families import base

        try:
            return getattr(self.module, attr)
        except AttributeError:
            if attr in base.PROTOCOL:
                return getattr(base, attr)
            raise

    def __repr__(self) -> str:
        return f"<family {self.module.__name__}>"


def torch_version() -> str:
    """The installed torch's release ("2.14.1", without a local "+cu130" tag): part of every family's versions()."""
    import torch

    return torch.__version__.split("+")[0]
