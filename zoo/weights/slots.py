"""A module's tensors as slots: each distinct tensor once with every name it goes by (ties), whether it
is a parameter or a persistent buffer, and, for a DTensor, the box of the full tensor this rank holds."""

from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.inspection import named_tensors
from zoo.weights.placement import Box, box_slices, local_box


@dataclass
class Slot:
    """One distinct tensor of a module and every name it goes by (ties)."""

    names: list[str]
    owners: list[tuple[nn.Module, str]]
    tensor: torch.Tensor
    is_param: bool
    persistent: bool
    box: Box | None = None  # of a DTensor: the part of the full tensor this rank holds
    new: torch.Tensor | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape) if self.box is None else tuple(e - s for s, e in self.box)

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of a full value (a copy, so the full one can be freed)."""
        return full if self.box is None else full[box_slices(self.box)].clone()


def slots_of(module: nn.Module) -> list[Slot]:
    by_id: dict[int, Slot] = {}
    for attr in ("_parameters", "_buffers"):
        is_param = attr == "_parameters"
        for name, owner, local, t in named_tensors(module, attr):
            slot = by_id.get(id(t))
            if slot is None:
                persistent = is_param or local not in owner._non_persistent_buffers_set
                slot = by_id[id(t)] = Slot([], [], t, is_param, persistent, local_box(t))
            if name not in slot.names:
                slot.names.append(name)
                slot.owners.append((owner, local))
    return list(by_id.values())


def like(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """new, wrapped as a DTensor with old's mesh and placements when old is one."""
    if getattr(old, "placements", None) is None:
        return new
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        new, old.device_mesh, old.placements, run_check=False, shape=old.shape, stride=old.stride()
    )


def differing_ties(slots: list[Slot], tied: dict[str, int], matched: dict[str, int], source) -> list[tuple[str, str]]:
    """(first key, other key) for each second key of a tied tensor whose values differ from those read into the
    tensor from its first key. Each is read aside, as the slot's dtype, and compared on the slot's device."""
    first = {index: key for key, index in matched.items()}
    differ = []
    for key, index in tied.items():
        slot = slots[index]
        assert slot.new is not None  # read from the first key
        other = torch.empty(slot.local_shape, dtype=slot.new.dtype)
        source.read_into(key, other, slot.box)
        if not torch.equal(other.to(slot.new.device), slot.new):
            differ.append((first[index], key))
    return differ
