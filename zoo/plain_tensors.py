"""Meta tensors a module keeps as plain attributes (alone or in a list or tuple), outside its parameters,
buffers and state_dict: torchvision's anchor generators keep their cell anchors so. materialize gives them
the values their constructor computed."""

from typing import Any

import torch
from torch import nn

from zoo.errors import MaterializeError
from zoo.meta import value_of


def _plain_tensors(module: nn.Module):
    """(prefix, module, attribute, index in its list or tuple or None, tensor) for each."""
    for prefix, mod in module.named_modules():
        for attr, value in vars(mod).items():
            if attr in _MODULE_INTERNALS:
                continue
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.is_meta:
                yield prefix, mod, attr, None, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, torch.Tensor) and item.is_meta:
                        yield prefix, mod, attr, i, item


_MODULE_INTERNALS = frozenset(vars(nn.Module()))


def plain_tensor_values(module, device, recipe) -> list:
    """Plain tensor attributes get the values their constructor computed (zoo.meta shadows), or,
    failing that, those of an eager build. They are in no checkpoint and no parameter list."""
    found = list(_plain_tensors(module))
    if not found:
        return []
    values = [value_of(t) for *_, t in found]
    if any(v is None for v in values):
        from zoo.build import build_real

        if recipe is None:
            raise MaterializeError("plain tensor attributes have no known value and there is no recipe to rebuild them")
        eager = dict(build_real(recipe, "cpu").named_modules())
        values = [
            v if v is not None else getattr(eager[prefix], attr) if i is None else getattr(eager[prefix], attr)[i]
            for v, (prefix, _, attr, i, _) in zip(values, found)
        ]
    # (module, attribute, value): a tensor, or the rebuilt list or tuple, made now so that assigning cannot fail
    new: dict[tuple[int, str], tuple[nn.Module, str, Any]] = {}
    for (_, mod, attr, i, _), value in zip(found, values):
        assert value is not None  # every missing value was rebuilt above
        value = value.to(device=device, copy=True)
        if i is not None:
            items = new.get((id(mod), attr), (mod, attr, list(getattr(mod, attr))))[2]
            items[i], value = value, items
        new[id(mod), attr] = (mod, attr, value)
    return [
        (mod, attr, value if isinstance(value, torch.Tensor) else type(getattr(mod, attr))(value))
        for mod, attr, value in new.values()
    ]
