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

import math
import numbers

import torch
from torch import nn

from zoo.errors import AnalysisError, InvalidArgument
from zoo.state import state_of


def make_inputs(spec: dict, batch: int = 1, seq_len: int | None = None, dtype=None) -> tuple[list, dict]:
    """The (args, kwargs) an input spec describes, on meta. Float tensors take `dtype` (else their own
    dtype, else float32); integer ones (token ids) stay integers."""
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
        tdtype = (dtype or kind or torch.float32) if float_dtype else kind

        def tensor(s):
            return torch.empty(s, dtype=tdtype, device="meta")

        if arg.get("list"):
            return [tensor(shape) for _ in range(batch)]
        return tensor([batch, *shape] if arg.get("batch", True) else shape)

    return [one(a) for a in spec.get("args", [])], {k: one(v) for k, v in spec.get("kwargs", {}).items()}


def has_sequence(spec: dict) -> bool:
    """Whether a spec's inputs have a sequence dimension (token ids; a seq_len changes them)."""
    args = [*spec.get("args", []), *spec.get("kwargs", {}).values()]
    return any("seq" in (a["shape"] if isinstance(a, dict) else a) for a in args)


def described(recipe, module, tag: str | None = None, inputs: list | None = None) -> dict:
    """What a row's family says of its built module, {task, input_size, input}, at the row's own inputs: a
    variant's at its weights' size (its tag), a user builder's from its recorded inputs. The index records a row
    with it, and scan and estimate of a gotten module run with it: one answer to "what does this row take"."""
    from zoo.families import family

    out = family(recipe.family).describe(recipe.builder, module, tag)
    if out.get("input") is None and inputs:
        out = {**out, "input": spec_of_inputs(inputs)}
    return out


def input_spec_of(module: nn.Module) -> dict | None:
    """The input spec of a module that zoo.get built, as its row was recorded with (described); None if it
    has none."""
    state = state_of(module)
    if state is None:
        return None
    return described(state.recipe, module, state.tag, state.inputs).get("input")


def inputs_of(spec: dict) -> list[dict]:
    """The `inputs` column: [{name, shape, dtype}] of a spec's tensors at batch 1 and its own seq_len
    (name null for a positional argument, in order; "list": n for a list of n tensors)."""
    args, kwargs = make_inputs(spec, batch=1)

    def one(name, value):
        if isinstance(value, list):
            return {
                "name": name,
                "shape": list(value[0].shape),
                "dtype": str(value[0].dtype).removeprefix("torch."),
                "list": len(value),
            }
        return {"name": name, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}

    return [one(None, a) for a in args] + [one(k, v) for k, v in kwargs.items()]


# What a recorded or user-given input may be: bounded, so a registry row or a command line cannot ask
# for a tensor of any type or rank.
INPUT_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")
_MAX_INPUTS, _MAX_RANK = 16, 8


def parse_inputs(value) -> list[dict]:
    """A user's input spec -> the `inputs` column form. `value`: "1,3,224,224" (one float tensor; the
    first dimension is the batch), a JSON list of such entries ({"shape": [...], "dtype": "int64",
    "name": "input_ids"}; no name: positional, in order), or that list itself. Raises InvalidArgument."""
    import json

    from zoo.errors import InvalidArgument

    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("[", "{")):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise InvalidArgument(
                    f"inputs is a shape like 1,3,224,224 or a JSON list of "
                    f'{{"shape": [...], "dtype": ..., "name": ...}}: {e}',
                    "inputs",
                ) from None
        else:
            try:
                value = [{"shape": [int(d) for d in text.split(",")]}]
            except ValueError:
                raise InvalidArgument(
                    f"inputs: a shape is whole numbers separated by commas, e.g. 1,3,224,224, not {value!r}",
                    "inputs",
                ) from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_INPUTS:
        raise InvalidArgument(f"an input spec is 1 to {_MAX_INPUTS} inputs, not {value!r}")
    out: list[dict] = []
    names: set[str] = set()
    for entry in value:
        if not isinstance(entry, dict) or set(entry) - {"name", "shape", "dtype"}:
            raise InvalidArgument(f'an input is {{"shape": [...], "dtype": ..., "name": ...}}, not {entry!r}')
        shape, dtype, name = entry.get("shape"), entry.get("dtype") or "float32", entry.get("name")
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= _MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 2**31 for d in shape)
        ):
            raise InvalidArgument(
                f"an input shape is 1 to {_MAX_RANK} whole numbers >= 1, the batch first, not {shape!r}"
            )
        if dtype not in INPUT_DTYPES:
            raise InvalidArgument(f"an input dtype is one of {', '.join(INPUT_DTYPES)}, not {dtype!r}")
        if name is not None and (not isinstance(name, str) or not name.isidentifier() or name in names):
            raise InvalidArgument(f"an input name is a distinct Python identifier (a forward argument), not {name!r}")
        if name is None and names:
            raise InvalidArgument("positional inputs (no name) come before named ones")
        if name is not None:
            names.add(name)
        out.append({"name": name, "shape": list(shape), "dtype": dtype})
    return out


def spec_of_inputs(inputs: list[dict]) -> dict:
    """The spec of an `inputs` list: its first dimension is the batch (analysis runs at 1, estimate at
    its batch)."""
    args, kwargs = [], {}
    for entry in parse_inputs(inputs):
        arg = {"shape": entry["shape"][1:], "dtype": entry["dtype"]}
        if entry["name"] is None:
            args.append(arg)
        else:
            kwargs[entry["name"]] = arg
    return {"args": args, "kwargs": kwargs}


def check_scan_input(value, position: int) -> None:
    """A positional input of scan is a tensor, a shape (a tuple of whole numbers), or a non-empty list, tuple
    or dict of those (a detection model's list of images); anything else would reach the forward and end in
    torch's TypeError from deep inside it. Raises InvalidArgument naming the input. Sizes are checked when
    the shape becomes a tensor (as_input)."""

    def bad(v, why: str):
        where = "" if v is value else f" holds {v!r:.60}, which"
        raise InvalidArgument(
            f"scan's input {position + 1}, {value!r:.100},{where} {why}; give a tensor, or a shape "
            f"as a tuple of whole numbers such as (1, 3, 224, 224) (a list, tuple or dict of "
            f"them for a model that takes one)"
        )

    def walk(v) -> None:
        if isinstance(v, torch.Tensor) or (isinstance(v, tuple) and not v):  # (): the shape of a 0-d tensor
            return
        if isinstance(v, (tuple, list)) and v and all(isinstance(d, numbers.Number) for d in v):
            if isinstance(v, list):
                bad(v, "is a list of numbers, not a tuple")
            if not all(type(d) is int for d in v):  # not bool, float, NaN or a NumPy scalar
                bad(v, "is not a shape: its sizes are not all whole numbers (Python ints)")
            return
        if isinstance(v, (list, tuple, dict)):
            items = list(v.values() if isinstance(v, dict) else v)
            if not items:
                bad(v, f"is an empty {type(v).__name__}")
            for item in items:
                walk(item)
            return
        bad(v, "is not a tensor or a shape")

    walk(value)


def as_input(value):
    """A scan input: a shape (tuple / torch.Size of ints) becomes a meta tensor; tensors go to meta."""
    if isinstance(value, torch.Tensor):
        return value if value.is_meta else value.to("meta")
    if isinstance(value, (tuple, torch.Size)) and all(isinstance(d, int) for d in value):
        if any(d < 0 for d in value) or math.prod(value) >= 2**63:
            raise AnalysisError(f"an input shape is sizes >= 0 whose product fits in 64 bits, not {tuple(value)}")
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


def tokenized(name, module, texts) -> dict:
    """scan(name, "some text"): the text as token ids from the model's tokenizer in the local HF cache,
    the model's other recorded inputs (decoder_input_ids) at the same length."""
    from zoo.families import family

    state = state_of(module)
    if len(texts) != 1 or not isinstance(name, str) or state is None:
        raise AnalysisError(
            "text is scanned for a registered hf model, as its one input: zoo.scan('hf/ORG/NAME', 'some text')"
        )
    fam = family(state.recipe.family)
    ids = fam.tokenize(name.removeprefix(f"{fam.NAME}/"), texts[0])
    spec = input_spec_of(module) or {"kwargs": {"input_ids": {"shape": ["seq"], "dtype": "int64"}}}
    _, kwargs = make_inputs(spec, batch=1, seq_len=len(ids))
    kwargs["input_ids"] = torch.tensor([ids], dtype=torch.int64).to("meta")
    return kwargs
