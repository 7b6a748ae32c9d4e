"""A family written in one file, for tests/test_family_protocol.py: a two-layer MLP ("mlp") and its wide variant
("mlp.wide": the same builder, 64 wide), implementing the protocol of zoo.families.base and nothing else of zoo's."""

from zoo.errors import UntrustedBuilder
from zoo.families import torch_version

NAME = "toy"


def available(patterns=()) -> list[str]:
    return ["mlp"]


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    if builder != "mlp" or set(kwargs) - {"hidden"}:
        raise UntrustedBuilder(f"{builder!r} is not a toy model")


def build(builder: str, kwargs: dict):
    import torch.nn as nn

    hidden = kwargs.get("hidden", 16)
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def describe(builder: str, module, tag: str | None = None) -> dict:
    return {"task": "toy-regression", "input_size": [8], "input": {"args": [[8]]}}


def versions() -> dict:
    return {"torch": torch_version(), "toy": "1"}


def variants(patterns=(), results: dict | None = None) -> list[dict]:
    return [
        {
            "builder": "mlp",
            "kwargs": {"hidden": 64},
            "kind": "variant",
            "tag": "wide",
            "arch_name": "toy/mlp",
            "license": "mit",
            "dataset": None,
            "num_classes": 3,
        }
    ]
