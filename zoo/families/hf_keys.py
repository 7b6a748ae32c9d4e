"""Checkpoint keys as transformers renames and fuses them on load, read by zoo in place.

transformers 5 keeps a MoE's experts fused (`mlp.experts.gate_up_proj`, one tensor per layer) while
the checkpoints people have, and what its own `save_pretrained` writes, hold one key per expert
(`block_sparse_moe.experts.3.w1.weight`). `from_pretrained` converts them with the conversion table
transformers ships per model type; zoo asks transformers for that same table, so the two agree on
every model type it covers, and reads each per-expert key straight into its part of the fused tensor.
"""

import re
import sys
from collections.abc import Callable

from zoo.errors import CheckpointError
from zoo.weights.fit import WRAPPER_PREFIXES, Part


def is_transformers_model(module) -> bool:
    if "transformers" not in sys.modules:  # a transformers model was built, so it is imported
        return False
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel)


def hf_key_map(module, names) -> Callable | None:
    """checkpoint key -> model name, or (model name, Part) for a key that fills part of a fused tensor;
    None when the module is no transformers model (nothing to convert). `names`: the module's tensor
    names (a prefix that only the base model has is added or dropped, as transformers does)."""
    if not is_transformers_model(module):
        return None
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, apply_renamings

    transforms = get_model_conversion_mapping(module)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    names, prefix = set(names), module.base_model_prefix

    def convert(key: str):
        name = apply_renamings(key, renamings)
        for converter in converters:  # at most one converter applies to a key, as in transformers
            renamed, pattern = converter.rename_source_key(name)
            if pattern is not None:
                return _with_prefix(renamed, names, prefix), _part(key, name, converter, pattern)
        return _with_prefix(name, names, prefix)

    def convert_unwrapped(key: str):
        """A key saved from a wrapper (DDP's `module.`, torch.compile's `_orig_mod.`) is read without it."""
        direct = convert(key)
        for found in [direct, *(convert(key[len(p) :]) for p in WRAPPER_PREFIXES if key.startswith(p))]:
            if (found[0] if isinstance(found, tuple) else found) in names:
                return found
        return direct

    return convert_unwrapped


def _with_prefix(name: str, names: set, prefix: str) -> str:
    if name in names or not prefix:
        return name
    if name.startswith(prefix + ".") and name[len(prefix) + 1 :] in names:
        return name[len(prefix) + 1 :]
    return f"{prefix}.{name}" if f"{prefix}.{name}" in names else name


def _part(key: str, name: str, converter, pattern: str) -> Part:
    """Where one per-expert key goes in the fused tensor: experts stacked on dim 0 (MergeModulelist),
    then, for several source patterns (gate and up), concatenated on dim 1 in pattern order."""
    ops = [(type(op).__name__, getattr(op, "dim", None)) for op in converter.operations]
    if ops not in ([("MergeModulelist", 0)], [("MergeModulelist", 0), ("Concatenate", 1)]):
        raise CheckpointError(
            f"{key}: transformers converts this key with {', '.join(o for o, _ in ops)}; zoo "
            f"reads in place only experts stacked (and concatenated) the way MoE models fuse them"
        )
    found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), name)
    if found is None or not found.groups():
        raise CheckpointError(f"{key}: no expert index where transformers' pattern {pattern!r} expects one")
    return Part(int(found.group(1)), converter.source_patterns.index(pattern), len(converter.source_patterns))
