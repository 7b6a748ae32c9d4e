"""Read a built module's tensors into plain records: names, shapes, dtypes, bytes, ties, persistence."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # "parameter" or "buffer"
    persistent: bool  # in state_dict(); non-persistent buffers are not
    shape: tuple[int, ...]
    dtype: str  # "float32", "int64", ...
    numel: int
    bytes: int
    tied_to: str | None = None  # the first name of the same tensor, when this name is an alias

    def to_row(self) -> list:
        return [
            self.name,
            self.kind,
            self.persistent,
            list(self.shape),
            self.dtype,
            self.numel,
            self.bytes,
            self.tied_to,
        ]

    @classmethod
    def from_row(cls, row: list) -> "TensorInfo":
        name, kind, persistent, shape, dtype, numel, nbytes, tied_to = row
        return cls(name, kind, bool(persistent), tuple(shape), dtype, numel, nbytes, tied_to)


@dataclass(frozen=True)
class Summary:
    """Counts over distinct tensors: a tensor under two names counts once, as module.parameters() does."""

    params: int
    trainable: int
    buffers: int
    tensors: int
    param_bytes: int
    buffer_bytes: int
    dtype: str | None
    tensor_table: list[TensorInfo] = field(repr=False)

    @property
    def bytes(self) -> int:
        return self.param_bytes + self.buffer_bytes


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def inspect_module(module) -> Summary:
    """Walk parameters then buffers (aliases included) and summarize distinct tensors."""
    first_name: dict[int, str] = {}
    table: list[TensorInfo] = []
    totals = {"params": 0, "trainable": 0, "buffers": 0, "param_bytes": 0, "buffer_bytes": 0}
    bytes_by_dtype: dict[str, int] = {}
    for kind, attr in (("parameter", "_parameters"), ("buffer", "_buffers")):
        for name, owner, local, tensor in named_tensors(module, attr):
            persistent = kind == "parameter" or local not in owner._non_persistent_buffers_set
            nbytes = tensor.numel() * tensor.element_size()
            tied_to = first_name.get(id(tensor))
            table.append(
                TensorInfo(
                    name,
                    kind,
                    persistent,
                    tuple(tensor.shape),
                    dtype_name(tensor.dtype),
                    tensor.numel(),
                    nbytes,
                    tied_to,
                )
            )
            if tied_to is not None:
                continue
            first_name[id(tensor)] = name
            if kind == "parameter":
                totals["params"] += tensor.numel()
                totals["trainable"] += tensor.numel() if tensor.requires_grad else 0
                totals["param_bytes"] += nbytes
                bytes_by_dtype[dtype_name(tensor.dtype)] = bytes_by_dtype.get(dtype_name(tensor.dtype), 0) + nbytes
            else:
                totals["buffers"] += tensor.numel()
                totals["buffer_bytes"] += nbytes
    dtype = max(bytes_by_dtype, key=bytes_by_dtype.__getitem__) if bytes_by_dtype else None
    return Summary(tensors=len(first_name), dtype=dtype, tensor_table=table, **totals)


def named_tensors(module, attr: str):
    """(name, owner module, local name, tensor) for every parameter (attr "_parameters") or buffer
    ("_buffers") under every name it has, aliases included, in named_parameters(remove_duplicate=False)'s order."""
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for local, tensor in getattr(owner, attr).items():
            if tensor is not None:
                yield (f"{prefix}.{local}" if prefix else local), owner, local, tensor
