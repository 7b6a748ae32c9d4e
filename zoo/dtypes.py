"""The one parser of a dtype argument: materialize, get, estimate and bench take the same names."""

from zoo.errors import InvalidArgument

# Each floating dtype by its torch name, its short name and its C name.
FLOAT_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
}


def float_dtype(dtype):
    """A floating torch dtype from itself or a name above (any case, "torch." allowed); InvalidArgument for
    anything else, an integer dtype included."""
    import torch

    found = dtype
    if isinstance(dtype, str):
        found = getattr(torch, FLOAT_NAMES.get(dtype.lower().removeprefix("torch."), ""), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise InvalidArgument(
            f"dtype must be a floating torch dtype or its name (bfloat16/bf16, float16/fp16/half, "
            f"float32/fp32, float64/fp64), not {dtype!r:.80}"
        )
    return found


def short_name(dtype) -> str:
    """fp32, bf16, fp16 or fp64: how a run records a floating dtype given as any name float_dtype takes."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}[
        str(float_dtype(dtype)).removeprefix("torch.")
    ]
