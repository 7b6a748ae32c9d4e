"""Input specs -> example inputs on meta, and the spec a gotten module's family documents.

A spec (a family's ``describe(...)["input"]``) is JSON data::

    {"args": [ARG, ...], "kwargs": {"name": ARG}, "seq_len": 128}

where ARG is a shape without the batch (``[3, 224, 224]``: a float tensor of shape
``[batch, 3, 224, 224]``) or ``{"shape": [...], "dtype": "int64", "list": true, "batch": true}``:
``list`` gives a Python list of ``batch`` tensors of that shape (torchvision detection),
``batch: false`` leaves the shape as written, and a ``"seq"`` entry in a shape is the sequence length
(``seq_len`` by default, ``estimate(seq_len=...)`` to change it).
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.errors import AnalysisError


def make_inputs(spec: dict, batch: int = 1, seq_len: int | None = None, dtype=None) -> tuple[list, dict]:
    """The (args, kwargs) an input spec describes, on meta. Float tensors take `dtype` (float32 by
    default); integer ones (token ids) stay integers."""
    seq = seq_len if seq_len is not None else spec.get("seq_len")

    def one(arg):
        if isinstance(arg, (list, tuple)):
            arg = {"shape": list(arg)}
        shape = []
        for d in arg["shape"]:
            if d == "seq":
                if seq is None:
                    raise AnalysisError("the input has a sequence dimension: give seq_len")
                d = seq
            shape.append(int(d))
        kind = getattr(torch, arg["dtype"]) if arg.get("dtype") else None
        float_dtype = kind is None or kind.is_floating_point
        tdtype = (dtype or torch.float32) if float_dtype else kind

        def tensor(s):
            return torch.empty(s, dtype=tdtype, device="meta")

        if arg.get("list"):
            return [tensor(shape) for _ in range(batch)]
        return tensor([batch, *shape] if arg.get("batch", True) else shape)

    return [one(a) for a in spec.get("args", [])], {k: one(v) for k, v in spec.get("kwargs", {}).items()}


def input_spec_of(module: nn.Module) -> dict | None:
    """The input spec of a module that zoo.get built (its family's describe()); None if it has none."""
    recipe = getattr(module, "_zoo_recipe", None)
    if recipe is None:
        return None
    from zoo.families import family

    return family(recipe.family).describe(recipe.builder, module).get("input")


def as_input(value):
    """A scan input: a shape (tuple / torch.Size of ints) becomes a meta tensor; tensors go to meta."""
    if isinstance(value, torch.Tensor):
        return value if value.is_meta else value.to("meta")
    if isinstance(value, (tuple, torch.Size)) and all(isinstance(d, int) for d in value):
        return torch.empty(tuple(value), device="meta", dtype=torch.float32)
    if isinstance(value, (list, tuple)):
        return type(value)(as_input(v) for v in value)
    if isinstance(value, dict):
        return {k: as_input(v) for k, v in value.items()}
    return value


def tensor_leaves(value):
    """Every tensor in a nested structure of dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensor_leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensor_leaves(v)
