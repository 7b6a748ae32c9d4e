"""Which checkpoint key fills which tensor: matching, wrapper prefixes, key maps, and what does not fit.

Torch-free, so `zoo check` compares a registry row with a file's header without importing torch.
"""

from dataclasses import dataclass, field

WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")  # DataParallel/DDP, Lightning, torch.compile


@dataclass(frozen=True)
class Target:
    """One distinct tensor of a model under all its names (ties)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    persistent: bool


@dataclass
class Fit:
    matched: dict[str, int] = field(default_factory=dict)  # checkpoint key -> target index
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    misshaped: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # key, file shape, model shape
    dtype_mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # key, file dtype, model dtype

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped or self.dtype_mismatched)

    def as_dict(self) -> dict:
        return {"exact": self.exact, "matched": len(self.matched), "missing": self.missing,
                "unexpected": self.unexpected, "misshaped": [list(m) for m in self.misshaped],
                "dtype_mismatched": [list(m) for m in self.dtype_mismatched]}


def fit(targets: list[Target], specs: dict, key_map=None, ignore=frozenset()) -> Fit:
    """specs: checkpoint key -> object with .shape and .dtype (a torch dtype name). Keys that name a
    tensor in `ignore` are skipped, as a key the key_map maps to None is."""
    by_name = {n: i for i, t in enumerate(targets) if t.persistent for n in t.names}
    result = Fit()
    for key, name in _key_mapping(list(specs), key_map, by_name).items():
        if name is None or name in ignore:
            continue
        index = by_name.get(name)
        if index is None:
            result.unexpected.append(key)
            continue
        if index in result.matched.values():
            continue  # a tie is loaded once, from its first key
        result.matched[key] = index
        target, spec = targets[index], specs[key]
        if tuple(spec.shape) != tuple(target.shape):
            result.misshaped.append((key, tuple(spec.shape), tuple(target.shape)))
        elif spec.dtype != target.dtype:
            result.dtype_mismatched.append((key, spec.dtype, target.dtype))
    loaded = set(result.matched.values())
    result.missing = [t.names[0] for i, t in enumerate(targets) if t.persistent and i not in loaded]
    return result


def _key_mapping(keys: list[str], key_map, by_name) -> dict[str, str | None]:
    """Checkpoint key -> model name. Without a key_map, a wrapper prefix that every key carries is
    removed when that makes more keys match."""
    if callable(key_map):
        return {k: key_map(k) for k in keys}
    if isinstance(key_map, dict):
        return {k: key_map.get(k, k) for k in keys}
    best = {k: k for k in keys}
    score = sum(k in by_name for k in keys)
    for prefix in WRAPPER_PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            stripped = {k: k[len(prefix):] for k in keys}
            matches = sum(v in by_name for v in stripped.values())
            if matches > score:
                best, score = stripped, matches
    return best


def targets_from_table(table) -> list[Target]:
    """Targets from a registry tensor table (zoo.inspection.TensorInfo rows, aliases marked tied_to)."""
    first: dict[str, list] = {}
    for t in table:
        if t.tied_to is None:
            first[t.name] = [[t.name], t]
        else:
            first[t.tied_to][0].append(t.name)
    return [Target(tuple(names), tuple(t.shape), t.dtype, t.persistent) for names, t in first.values()]
