"""Checkpoint keys through parametrizations registered on a module still on meta (weight_norm, spectral_norm,
orthogonal, ...: torch.nn.utils.parametrize).

A checkpoint saved from the plain model holds `fc.weight`; once parametrized, the module holds
`fc.parametrizations.weight.original` (or original0, original1, ...). The library's model, loaded and then
parametrized, computes those from the loaded value with the parametrizations' right_inverse, as
register_parametrization does; this source computes them the same way from the checkpoint's value, aside:
the module itself changes only when the load commits.
"""

import torch
from torch import nn

from zoo.weights.sources import Source, TensorDictSource


def through_parametrizations(module: nn.Module, source: Source) -> Source:
    """`source` as the parametrized module's keys, where it holds a parametrized tensor's plain key and not
    its originals; `source` itself where nothing needs mapping."""
    derived: dict[str, torch.Tensor] = {}
    replaced: set[str] = set()
    for prefix, mod in module.named_modules():
        for name, chain in getattr(mod, "parametrizations", {}).items():
            plain = f"{prefix}.{name}" if prefix else name
            originals = [(f"{prefix}.parametrizations.{name}.{n}".lstrip("."), t) for n, t in _originals(chain)]
            if plain not in source.specs or any(n in source.specs for n, _ in originals):
                continue
            if not all(t.is_meta for _, t in originals):
                continue  # set since: the load leaves it (and the key) as it is
            spec = source.specs[plain]
            value = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
            source.read_into(plain, value)
            new = _right_inverse(chain, value.to(originals[0][1].dtype))  # as the library's model held it
            for (n, _), v in zip(originals, [new] if isinstance(new, torch.Tensor) else new):
                derived[n] = v
            replaced.add(plain)
    return _Derived(source, TensorDictSource(derived), replaced) if derived else source


def _originals(chain) -> list[tuple[str, torch.Tensor]]:
    """A ParametrizationList's unconstrained tensors, in order: `original`, or `original0`, `original1`, ..."""
    found = {**chain._parameters, **chain._buffers}
    if "original" in found:
        return [("original", found["original"])]
    return [(f"original{i}", found[f"original{i}"]) for i in range(chain.ntensors)]


def _right_inverse(chain, value: torch.Tensor):
    """What register_parametrization stores for `value` (torch.nn.utils.parametrize.ParametrizationList)."""
    with torch.no_grad():
        for parametrization in reversed(chain):
            if hasattr(parametrization, "right_inverse"):
                try:
                    value = parametrization.right_inverse(value)
                except NotImplementedError:
                    pass
    return value


class _Derived(Source):
    """A source with some keys replaced by values computed from it."""

    def __init__(self, source: Source, derived: TensorDictSource, plain: set[str]):
        self.source, self.derived = source, derived
        self.specs = {k: v for k, v in source.specs.items() if k not in plain} | derived.specs

    def read_into(self, name, dest, box=None) -> None:
        (self.derived if name in self.derived.specs else self.source).read_into(name, dest, box)

    def check_unchanged(self) -> None:
        self.source.check_unchanged()
