"""The family protocol: everything zoo asks of a family, typed, and the answers of a family with nothing to say.

A family is a module (zoo.families.timm, ...) named in zoo.families.FAMILIES. It implements `Family` (module
attributes satisfy a Protocol as class attributes do); what it has no use for, zoo.families.family() answers
from the defaults here, so that every family answers every question and nothing probes with hasattr.
tests/test_layout.py checks
each family against this protocol, signatures included, and that no module outside zoo.families branches on
a family's name. Families build and describe; recording is the indexer's, and nothing here imports the
registry or the API.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from zoo.errors import AnalysisError, InvalidArgument


@runtime_checkable
class Family(Protocol):
    NAME: str  # its prefix in model names ("timm/resnet50")
    # True: a variant constructed with exactly its architecture's arguments is that module (zoo.construction)
    CONSTRUCTION_DECIDES: bool
    BUILDS: bool  # False: its rows record tensors only, and zoo.get refuses them (checkpoint)
    LANGUAGE_MODEL: bool  # True: its rows get the language-model fields (zoo.analysis.llm)
    PUBLISHED_RESULTS: bool  # True: it reads a folder of the library's published results (read_results)
    # where weights="pretrained" finds the library's published weights (zoo.pretrained): "timm-cfg" (a tag's
    # pretrained cfg: the hub or its URL, timm's own load arguments), "weights-enum" (a torchvision weights
    # enum's URL in torch hub's cache), or None (the family publishes none)
    PRETRAINED: str | None
    INPUTS_RECORDED: bool  # True: a row's recorded inputs are its forward's (user builders, given when indexed)

    def available(self, patterns=()) -> list[str]:
        """The builder names it can index, filtered by glob patterns."""

    def check(self, builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
        """Raise UntrustedBuilder / InvalidRecipe before anything is imported (trusted: the packages a user
        builder may come from, where the caller names them)."""

    def importable(self, builder: str) -> None:
        """Raise InvalidRecipe when the builder's code cannot be imported (a vetted one: check() first), so that
        indexing records nothing for a typo; a builder that imports and then fails is recorded as failed."""

    def build(self, builder: str, kwargs: dict) -> Any:
        """The module (called under forced meta, with downloads blocked)."""

    def describe(self, builder: str, module, tag: str | None = None) -> dict:
        """{"task", "input_size"} for the row, and optionally "input": the spec of a batch-1 forward (scan,
        estimate, FLOPs), at the weights `tag`'s own size for a variant."""

    def versions(self) -> dict:
        """{"torch": ..., LIBRARY: ...}: a change means its models are rebuilt."""

    def results_folder(self) -> str | None:
        """The folder of the library's published results that the checkout ships (None: none, or installed)."""

    def read_results(self, folder) -> dict | None:
        """The published results in `folder` (None: results_folder()'s, if the family has any), as variants()
        and architecture_columns() take them."""

    def variants(self, patterns=(), results: dict | None = None) -> list[dict]:
        """Every pretrained variant matching the patterns: builder, kwargs, tag, arch_name and its columns."""

    def variant_name(self, variant: dict) -> str:
        """A variant's name after the family's prefix."""

    def architecture_columns(self, builder: str, input_size, results: dict) -> dict:
        """Published columns of an architecture row at its input size, from read_results (timm's measured
        throughput); every column it can set is a key, None where nothing was published at that size."""

    def weights_tag(self, builder: str, weights) -> str | bool:
        """The tag of its published weights that a library spelling of weights names (torchvision's "DEFAULT",
        "IMAGENET1K_V2", an enum member); False for anything else (a file, a recorded tag, hf://...)."""

    def tokenize(self, name: str, text: str) -> list[int]:
        """A text as the token ids of the model `name` (after the family's prefix), for zoo.scan(name, text)."""

    def preprocess(self, info) -> dict:
        """The input preprocessing of a ModelInfo: its recorded dict, else the library's for its weights."""

    def load_arguments(self, builder: str, kwargs: dict) -> dict | None:
        """What weights="pretrained" needs beyond the module, as JSON for the row's load_args, caught at index time
        so that a pretrained load builds once (timm: its load_pretrained arguments); None: nothing to record."""


# The names of the protocol: its flags and its hooks (zoo.families.WithDefaults answers these from here).
PROTOCOL = frozenset(Family.__annotations__) | {n for n, v in vars(Family).items() if not n.startswith("_")}

CONSTRUCTION_DECIDES = False
BUILDS = True
LANGUAGE_MODEL = False
PUBLISHED_RESULTS = False
PRETRAINED = None
INPUTS_RECORDED = False


def importable(builder: str) -> None:
    return None  # a library's model: check() has found it in the library already


def results_folder() -> str | None:
    return None


def read_results(folder) -> dict | None:
    if folder is not None:
        raise InvalidArgument("results (published validation results) apply to timm's pretrained variants")
    return None


def variants(patterns=(), results: dict | None = None) -> list[dict]:
    raise InvalidArgument("this family has no pretrained variants to index (timm and torchvision have)")


def architecture_columns(builder: str, input_size, results: dict) -> dict:
    return {}


def variant_name(variant: dict) -> str:
    return f"{variant['builder']}.{variant['tag']}"


def weights_tag(builder: str, weights) -> str | bool:
    return False


def tokenize(name: str, text: str) -> list[int]:
    raise AnalysisError(
        "text is scanned for a registered hf model, as its one input: zoo.scan('hf/ORG/NAME', 'some text')"
    )


def load_arguments(builder: str, kwargs: dict) -> dict | None:
    return None


def preprocess(info) -> dict:
    recorded = info.preprocess
    if isinstance(recorded, dict) and recorded.get("input_size"):
        return dict(recorded)
    raise InvalidArgument(f"{info.name}: no recorded preprocessing, and {info.family} models publish none")
