"""Which checkpoint key fills which tensor: matching, wrapper prefixes, key maps, and what does not fit.

Torch-free, so `zoo check` compares a registry row with a file's header without importing torch.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

WRAPPER_PREFIXES = ("module.", "model.", "_orig_mod.")  # DataParallel/DDP, Lightning, torch.compile


@dataclass(frozen=True)
class Target:
    """One distinct tensor of a model under all its names (ties)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    persistent: bool


class Part(NamedTuple):
    """The part of a fused tensor one checkpoint key fills: row `row` of dim 0, cut into `pieces`
    equal pieces along its first dim, of which this key is piece `piece` (a MoE's stacked experts,
    gate and up concatenated)."""

    row: int  # not `index`: a field of that name would hide tuple.index
    piece: int
    pieces: int

    def shape(self, shape: tuple) -> tuple | None:
        """The key's shape in a target of `shape`; None when the part is not in it."""
        if len(shape) < 2 or self.row >= shape[0] or shape[1] % self.pieces:
            return None
        return (shape[1] // self.pieces, *shape[2:])


@dataclass
class Fit:
    matched: dict[str, int] = field(default_factory=dict)  # checkpoint key -> target index
    parts: dict[str, Part] = field(default_factory=dict)  # checkpoint key -> the part of its target it fills
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    misshaped: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # key, file shape, model shape
    dtype_mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # key, file dtype, model dtype
    # target index -> the key it is read from as well: a tie the model was built with and that is broken now
    # (tensor parallelism distributes an embedding and its tied head separately), filled from the tie's one key
    untied: dict[int, str] = field(default_factory=dict)
    # checkpoint key -> target index: a second key for one tied tensor (a state dict holding both names of a
    # tie), shape-checked here and compared with the first key's values at load (not read into the tensor)
    tied: dict[str, int] = field(default_factory=dict)
    state_key: str | None = None  # the training checkpoint's entry the state dict was read from ("state_dict", ...)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped or self.dtype_mismatched)

    @property
    def loads(self) -> bool:
        """Whether a strict load takes the file: every tensor found, of its shape (a dtype is cast)."""
        return not (self.missing or self.unexpected or self.misshaped)

    def as_dict(self) -> dict:
        return {
            "exact": self.exact,
            "loads": self.loads,
            "matched": len(self.matched),
            "missing": self.missing,
            "unexpected": self.unexpected,
            "misshaped": [list(m) for m in self.misshaped],
            "dtype_mismatched": [list(m) for m in self.dtype_mismatched],
            **({"state_key": self.state_key} if self.state_key else {}),
        }


def fit(targets: list[Target], specs: dict, key_map=None, ignore=frozenset(), ties=()) -> Fit:
    """specs: checkpoint key -> object with .shape and .dtype (a torch dtype name). Keys that name a
    tensor in `ignore` are skipped, as a key the key_map maps to None is. A key_map may map a key to
    (name, Part): the key fills that part of the tensor, and the tensor is loaded when every part is.
    ties: groups of names that were one tensor when the model was built; a target no key fills is read
    from the key of another name of its group."""
    by_name = {n: i for i, t in enumerate(targets) if t.persistent for n in t.names}
    result = Fit()
    whole: set[int] = set()
    pieces: dict[int, set[Part]] = {}  # target index -> the parts loaded
    key_of: dict[str, str] = {}  # name -> the key that fills its tensor whole: a tie broken since reads it too
    for key, name in _key_mapping(list(specs), key_map, by_name).items():
        name, part = name if isinstance(name, tuple) else (name, None)
        if name is not None and part is None:
            key_of.setdefault(name, key)
        if name is None or name in ignore:
            continue
        index = by_name.get(name)
        if index is None:
            result.unexpected.append(key)
            continue
        target, spec = targets[index], specs[key]
        if part is None:
            # a tie is read once, from its first key; every other key of it is checked too: the file's key
            # order must not decide which of two different tensors the model gets
            (result.tied if index in whole else result.matched)[key] = index
            whole.add(index)
            expected: tuple | None = tuple(target.shape)
        else:
            if part in pieces.setdefault(index, set()):
                result.unexpected.append(key)  # a second key for the same part: which one is meant?
                continue
            pieces[index].add(part)
            result.parts[key] = part
            result.matched[key] = index
            expected = part.shape(tuple(target.shape))
        if expected is None or tuple(spec.shape) != expected:
            result.misshaped.append((key, tuple(spec.shape), tuple(target.shape)))
        elif spec.dtype != target.dtype:
            result.dtype_mismatched.append((key, spec.dtype, target.dtype))
    loaded = whole | {i for i, got in pieces.items() if len(got) == _count(targets[i].shape, got)}
    for key in [k for k in result.parts if result.matched[k] not in loaded]:  # half a tensor is no value
        del result.matched[key], result.parts[key]
    _fill_untied(targets, specs, ties, key_of, result, loaded)
    result.missing = [t.names[0] for i, t in enumerate(targets) if t.persistent and i not in loaded]
    return result


def _fill_untied(targets: list[Target], specs: dict, ties, key_of: dict, result: Fit, loaded: set) -> None:
    """Targets that no key fills but that were tied to a name a key fills whole (a tensor loaded, or one left
    as it is): read from that key too. One of another shape (a head replaced since) stays missing."""
    for i, target in enumerate(targets):
        if i in loaded or not target.persistent:
            continue
        key = next(
            (key_of[other] for group in ties if set(group) & set(target.names) for other in group if other in key_of),
            None,
        )
        if key is None or tuple(specs[key].shape) != tuple(target.shape):
            continue
        result.untied[i] = key
        loaded.add(i)
        if specs[key].dtype != target.dtype:
            result.dtype_mismatched.append((key, specs[key].dtype, target.dtype))


def _count(shape: tuple, parts: set) -> int:
    """How many parts fill a tensor of `shape` cut as these parts say."""
    return shape[0] * next(iter(parts)).pieces if len(shape) >= 2 else -1


def _key_mapping(keys: list[str], key_map, by_name) -> Mapping[str, str | tuple[str, Part] | None]:
    """Checkpoint key -> model name, (model name, Part) or None (skipped). Without a key_map, a wrapper
    prefix that every key carries is removed when that makes more keys match."""
    if callable(key_map):
        return {k: key_map(k) for k in keys}
    if isinstance(key_map, dict):
        return {k: key_map.get(k, k) for k in keys}
    best = {k: k for k in keys}
    score = sum(k in by_name for k in keys)
    for prefix in WRAPPER_PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            stripped = {k: k[len(prefix) :] for k in keys}
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
