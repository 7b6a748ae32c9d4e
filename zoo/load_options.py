"""How a load fills a module: materialize's keyword arguments, checked and resolved once (the device tried, the
dtype parsed) and passed down as one object to every stage of the load."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from zoo.dtypes import float_dtype
from zoo.errors import InvalidArgument


@dataclass(frozen=True)
class LoadOptions:
    """See zoo.materialize.materialize for what each does."""

    device: torch.device
    dtype: torch.dtype | None = None  # floating only: an integer parameter cannot require grad
    strict: bool = True
    key_map: Any = None  # checkpoint key -> module name (a dict or a function; None drops a key)
    copy: bool | None = None  # None: views of a mapped file where they can be, True: owned memory, False: views only
    cast_non_persistent: bool = False
    recipe: Any = None  # how the module was built (zoo.recipe.Recipe): its constructor's init and values
    reinit: bool = False
    only_meta: bool = False  # a lazy load: tensors the user set since are theirs

    @classmethod
    def of(cls, device="cpu", **options) -> LoadOptions:
        """The options from materialize's keyword arguments; every one is checked here, before the module or a
        file is touched."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(options) - set(known)):
            raise InvalidArgument(f"unknown load option {', '.join(unknown)}: the options are {', '.join(known)}")
        if options.get("copy") is False and str(device).split(":")[0] != "cpu":
            raise InvalidArgument(
                f"copy=False makes tensors views of the file mapped in CPU memory; on {device} they "
                f"are always copied: leave copy unset",
                "copy",
            )
        dtype = options.pop("dtype", None)
        return cls(device=resolved_device(device), dtype=None if dtype is None else float_dtype(dtype), **options)


def resolved_device(device) -> torch.device:
    """The device, tried with an empty tensor: an absent backend or device index fails here, not halfway. A bare
    "cuda" is the rank's current device, as set_device chose."""
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except Exception as e:
        hint = "; did you mean 'cuda'?" if str(device).lower().startswith("gpu") else ""
        why = " ".join(str(e).split())[:200]
        raise InvalidArgument(f"device {str(device)!r} cannot be used{hint} ({why})", "device") from None
    if device.type == "meta":
        raise InvalidArgument("device='meta': the module is on meta already; materialize onto 'cpu', 'cuda', ...")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
