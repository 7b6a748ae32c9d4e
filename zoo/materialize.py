"""Materialize a meta module in place: allocate on a device, fill from weights, or initialize as its constructor does.

Nothing touches the module until every new tensor is filled: a corrupt file, a mismatch or an
out-of-memory leaves it exactly as it was, on meta, and the new memory is freed.
"""

import os
from dataclasses import replace

import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys as IncompatibleKeys  # load_state_dict's

from zoo.errors import CheckpointError, InvalidArgument, MaterializeError, WeightsMismatch
from zoo.families.hf_keys import hf_key_map, is_transformers_model
from zoo.inspection import dtype_name
from zoo.load_options import LoadOptions
from zoo.meta import value_of
from zoo.plain_tensors import plain_tensor_values
from zoo.state import state_of
from zoo.weights.alloc import allocate, map_private, parallel, populate
from zoo.weights.fit import Fit, Part, Target, fit
from zoo.weights.opening import open_source
from zoo.weights.parametrized import through_parametrizations
from zoo.weights.placement import leading_rows
from zoo.weights.slots import Slot, differing_ties, like, slots_of
from zoo.weights.sources import SafetensorsSource, Source
from zoo.weights.stream import stream_into

STREAMED = ("cuda",)  # device types that safetensors files stream onto through a ring of pinned buffers
# PyTorch's CPU allocator aligns every tensor to 64 bytes, and some kernels (MKL, one thread) round differently
# on other alignments: a view at another offset would train apart, by ulps, from the library's own model.
VIEW_ALIGNMENT = 64


def materialize(module: nn.Module, device="cpu", weights=None, **options) -> nn.Module:
    """Allocate `module`'s meta tensors on `device` and fill them, in place; returns module (load_into
    does the same and returns the missing and unexpected keys, as load_state_dict does). `options` are
    zoo.load_options.LoadOptions: dtype, strict, key_map, copy, cast_non_persistent, recipe, reinit, only_meta.

    weights: a .safetensors file, a sharded checkpoint (directory or *.safetensors.index.json), a
    torch pickle (.pt/.pth/.bin/.ckpt, weights_only=True; memory-mapped unless legacy non-zip), a
    state dict, or a zoo.weights.sources.Source. None initializes the model as its own constructor
    does (needs the recipe zoo.get attaches); on a module that already holds values (a parameter
    not on meta) that would discard them, so it is refused unless reinit=True.
    dtype (a floating torch dtype or its name: "bfloat16", "bf16", "fp16", ...) casts parameters and
    floating persistent buffers; integer buffers never, floating non-persistent ones (RoPE
    frequencies) only with cast_non_persistent. strict=False allows missing and unexpected keys
    (missing ones get the constructor's values), never a misshaped one, nor a checkpoint of which
    not one key matches. key_map maps checkpoint keys to module keys (a dict or a function; None
    drops a key). On CPU, a safetensors tensor whose file dtype is the one asked for is by default
    (copy=None, as transformers and safetensors do) a view of a private copy-on-write mapping of the
    file, with a storage of its own: no bytes are copied, training writes go to private pages and the
    file is never changed; the file must not be truncated while the model lives. A tensor the file
    does not hold 64-byte aligned, as PyTorch allocates, is copied (kernels round by alignment), except
    in a transformers model: from_pretrained maps it at that same alignment, and so does zoo.
    copy=True gives owned memory; copy=False insists on views, at any alignment of the tensor's
    dtype (InvalidArgument, first, where one would be copied or off CPU).
    A dtype cast converts straight from the mapped file into the destination, chunk by chunk.
    On CUDA a safetensors file streams through a few reusable pinned buffers, copied asynchronously
    on a stream of its own while the next ones are read; dtype casts run on the GPU; the call
    returns when every copy is done.
    DTensors (FSDP2's fully_shard, tensor parallelism, both, any placement but Partial) get this
    rank's part only, read from the file (on CUDA, onto the rank's current device when device="cuda"
    names none). Hooks registered on the meta parameters (register_hook,
    register_post_accumulate_grad_hook) move to the loaded ones. only_meta=True leaves tensors that
    are not on meta as they are, and the checkpoint's keys for them unread (a lazy load: what the
    user set since is theirs).
    Arguments, keys, shapes and headers are checked before anything is allocated; a failure after
    that leaves the module exactly as it was.
    """
    load_into(module, weights, LoadOptions.of(device, **options))
    return module


def load_into(module: nn.Module, weights, o: LoadOptions) -> IncompatibleKeys:
    """materialize with its options resolved, returning the missing and unexpected keys (empty unless
    strict=False), as load_state_dict does."""
    state = state_of(module)  # a module zoo.get returned knows how it was built
    if o.recipe is None and state is not None:
        o = replace(o, recipe=state.recipe)
    device, dtype, recipe = o.device, o.dtype, o.recipe
    slots = slots_of(module)
    kept = frozenset(n for s in slots if o.only_meta and not s.tensor.is_meta for n in s.names)
    slots = [s for s in slots if not kept.intersection(s.names)]
    if o.reinit and weights is not None:
        raise InvalidArgument("reinit=True re-initializes from the constructor: it takes no weights")
    held = [s.name for s in slots if s.is_param and not s.tensor.is_meta] if weights is None else []
    if held and not o.reinit:
        raise MaterializeError(
            f"the module already holds values ({_names(held)}); materialize() without weights "
            f"would re-initialize them: pass reinit=True to do that, or weights="
        )
    result = Fit()
    try:
        if weights is None:
            _initialize(slots, device, recipe)
        else:
            if o.key_map is None:  # transformers' own renames and expert fusing, as from_pretrained does
                o = replace(o, key_map=hf_key_map(module, [n for s in slots_of(module) for n in s.names]))
            with open_source(weights) as opened:
                source = through_parametrizations(module, opened)  # weight_norm and the like, added since
                result = _load(slots, source, o, kept, state.ties if state else (), _view_alignment(module))
        _fill_non_persistent(slots, device, recipe)
        for slot in slots:
            assert slot.new is not None  # initialized, loaded or filled above
            want = _target_dtype(slot, dtype, o.cast_non_persistent)
            if slot.new.device != device or slot.new.dtype != want:
                slot.new = slot.new.to(device=device, dtype=want)
            slot.new = like(slot.tensor, slot.new)
            if slot.is_param and slot.new is not slot.tensor:  # made here: it can fail, the swap must not
                slot.new = nn.Parameter(slot.new, requires_grad=slot.tensor.requires_grad)
        plain = plain_tensor_values(module, device, recipe)
    except BaseException:
        for slot in slots:
            slot.new = None  # drop every new tensor: the module was never touched
        raise
    _commit(slots)
    for mod, attr, value in plain:
        mod.__dict__[attr] = value
    return IncompatibleKeys(result.missing, result.unexpected)


def _names(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _target_dtype(slot: Slot, dtype, cast_non_persistent: bool) -> torch.dtype:
    t = slot.tensor
    if dtype is None or not t.is_floating_point() or not (slot.persistent or cast_non_persistent):
        return t.dtype
    return dtype


# --- weights ---------------------------------------------------------------------------------


def check_fit(
    slots: list[Slot], specs: dict, strict: bool, key_map=None, ignore=frozenset(), ties=()
) -> tuple[list, Fit]:
    """The loading plan ((checkpoint key, slot) pairs; a key may fill two slots: a tie that sharding broke)
    and the fit, or WeightsMismatch naming what is missing, unexpected or misshaped. A dtype difference is
    fine: the value is cast. Keys naming `ignore` (tensors a lazy load leaves as they are) are neither loaded
    nor unexpected."""
    targets = [Target(tuple(s.names), tuple(s.tensor.shape), dtype_name(s.tensor.dtype), s.persistent) for s in slots]
    result = fit(targets, specs, key_map, ignore, ties)
    if result.misshaped or (strict and (result.missing or result.unexpected)):
        hint = "strict=False allows missing and unexpected keys" if not result.misshaped and strict else ""
        raise WeightsMismatch(
            result.missing if strict else [], result.unexpected if strict else [], result.misshaped, hint
        )
    if not result.matched and result.missing:  # strict=False would initialize everything: surely not meant
        raise WeightsMismatch(
            result.missing, result.unexpected, [], "not one key matches: wrong file, or give a key_map"
        )
    pairs = [*result.matched.items(), *((key, i) for i, key in result.untied.items())]
    return [(key, slots[i]) for key, i in pairs], result


def _load(slots, source: Source, o: LoadOptions, ignore=frozenset(), ties=(), alignment=VIEW_ALIGNMENT) -> Fit:
    device, dtype, recipe, copy = o.device, o.dtype, o.recipe, o.copy
    pairs, result = check_fit(slots, source.specs, o.strict, o.key_map, ignore, ties)
    parts = {key: (slot, result.parts[key]) for key, slot in pairs if key in result.parts}  # each fills part of one
    plan = [(key, slot) for key, slot in pairs if key not in result.parts]  # (key, slot): each fills a whole tensor
    fused = list({id(slot): slot for slot, _ in parts.values()}.values())
    loaded = {id(s) for _, s in pairs}
    missing = [s for s in slots if s.persistent and s.tensor.is_meta and id(s) not in loaded]
    constructed = _constructed(missing, recipe) if missing else {}  # refused now, before allocating
    for slot in slots:  # tensors made real inside zoo.meta.real() are moved, not wiped
        if not slot.tensor.is_meta and id(slot) not in loaded:
            slot.new = slot.tensor.to(device)
    if copy is not True and device.type == "cpu" and isinstance(source, SafetensorsSource):
        insist = copy is False
        plan = _map_file_views(plan, source, dtype, o.cast_non_persistent, insist, None if insist else alignment)
    if copy is False and (plan or parts):
        raise InvalidArgument(
            f"copy=False: {_names([k for k, _ in plan] + [*parts])} cannot be views of the file (a "
            f"cast, a pickle, misaligned, fused or strided tensors): leave copy unset to copy those"
        )
    _allocate_slots([*(s for _, s in plan), *fused], device, dtype, o.cast_non_persistent)
    # (key, slot, part): no local holds a new tensor (a traceback keeps its frames' locals; on an error the
    # slots must be the only holders)
    reads: list[tuple[str, Slot, Part | None]] = [(key, slot, None) for key, slot in plan]
    reads += [(key, slot, part) for key, (slot, part) in parts.items()]
    if device.type in STREAMED and isinstance(source, SafetensorsSource):
        # contiguous byte ranges stream through the pinned ring; a box strided in the file is read on the host
        strided = [part is None and _rows(key, slot.box, source) is False for key, slot, part in reads]
        stream_into(
            [
                (key, dest, _rows(key, box, source))
                for (key, slot, part), host in zip(reads, strided)
                if not host
                for dest, box in _destinations(key, slot, part)
            ],
            source,
            device,
        )
        reads = [read for read, host in zip(reads, strided) if host]
    parallel(
        lambda read: _read(source, *read),
        reads,
        lambda read: read[1].new.nbytes // (1 if read[2] is None else read[1].local_shape[0] * read[2].pieces),
    )
    differ = differing_ties(slots, result.tied, result.matched, source)
    if differ:  # from_pretrained unties such a pair; this model ties them: one of the two would be lost
        raise WeightsMismatch(
            tied=differ,
            hint="the model holds one tensor for both names: get it untied (an hf model: zoo.get(name, "
            "tie_word_embeddings=False), as from_pretrained then loads both), or map one key to None (key_map)",
        )
    source.check_unchanged()
    if missing:  # strict=False: the constructor's own values, as if these keys were never asked for
        _from_constructor(missing, device, recipe, constructed)
    return result


def _read(source: Source, key: str, slot: Slot, part) -> None:
    for dest, box in _destinations(key, slot, part):
        populate(dest)
        source.read_into(key, dest, box)


def _destinations(key: str, slot: Slot, part) -> list:
    """(tensor, box) a key is read into: the slot's tensor and box, or the piece of a fused tensor."""
    return [(slot.new, slot.box)] if part is None else [(dest, None) for dest in _piece(key, slot, part)]


def _rows(key: str, box, source: Source):
    """The rows of dim 0 a box covers (None: all) when they are one byte range of the file, else False."""
    return leading_rows(box, source.specs[key].shape)


def _piece(key: str, slot: Slot, part) -> list[torch.Tensor]:
    """Where a key that fills part of a fused tensor goes in this rank's tensor (no place when another
    rank holds that expert). Contiguous: a row of dim 0, cut along the next dim."""
    rows = leading_rows(slot.box, tuple(slot.tensor.shape))
    if rows is False:
        raise MaterializeError(
            f"{key} fills part of {slot.name}, which is sharded on a dim other than its experts' "
            f"(dim 0): materialize it before sharding it that way"
        )
    start, stop = rows or (0, slot.local_shape[0])
    if not start <= part.row < stop:
        return []
    assert slot.new is not None  # allocated before any read
    return list(slot.new[part.row - start].chunk(part.pieces))[part.piece : part.piece + 1]


def _allocate_slots(slots, device, dtype, cast_non_persistent) -> None:
    """Each slot's new, empty tensor. A function of its own so that no local variable holds one: a
    traceback keeps its frames' locals, and on an error the slots must be the only holders (device memory)."""
    for slot, new in zip(
        slots, allocate([(s.local_shape, _target_dtype(s, dtype, cast_non_persistent)) for s in slots], device)
    ):
        slot.new = new


def _view_alignment(module: nn.Module) -> int | None:
    """The file alignment a tensor needs to become a view by default: PyTorch's, so that it computes as the
    library's own model; for a transformers model none beyond its dtype's, as from_pretrained's own views."""
    return None if is_transformers_model(module) else VIEW_ALIGNMENT


def _map_file_views(plan, source: SafetensorsSource, dtype, cast_non_persistent, insist: bool, alignment):
    """Zero-copy: tensors that can be views of the mapped file become them (each with a storage of its
    own over the mapping); the rest stay in the plan, as do a file's tensors where it cannot be mapped (no
    address space for it under `ulimit -v`, a file system without mmap) unless views are insisted on.
    A tensor becomes a view where it lies `alignment`-aligned in the file (the mapping starts on a page),
    or, with no alignment asked, where its dtype can be read there at all."""
    maps = {}  # (fd, use) -> a mapping: a key read twice (a tie sharding broke) is mapped twice, each copy-on-write
    rest: list[tuple[str, Slot]] = []
    uses: dict[str, int] = {}
    for key, slot in plan:
        rows = _rows(key, slot.box, source)
        file_dtype = getattr(torch, source.specs[key].dtype)
        fd, start, length = source.byte_range(key, rows or None)
        if (
            rows is False
            or start % (alignment or file_dtype.itemsize)
            or length == 0
            or _target_dtype(slot, dtype, cast_non_persistent) != file_dtype
        ):
            rest.append((key, slot))
            continue
        uses[key] = use = uses.get(key, -1) + 1
        if (fd, use) not in maps:
            source.check_unchanged()  # a view past the end would fault (SIGBUS) when read
            try:
                maps[fd, use] = map_private(fd, os.fstat(fd).st_size)  # private: writes never reach the file
            except OSError as e:
                if insist:
                    raise MaterializeError(f"copy=False: {key}: {e.strerror}; leave copy unset to read it") from None
                maps[fd, use] = None
        if maps[fd, use] is None:
            rest.append((key, slot))
            continue
        if start + length > len(maps[fd, use]):
            raise CheckpointError(f"{key}: the weights file is shorter than its header says (changed since opened)")
        flat = torch.frombuffer(maps[fd, use], dtype=torch.uint8, count=length, offset=start)
        slot.new = flat.view(file_dtype).view(slot.local_shape)
    return rest


# --- values nobody loads: non-persistent buffers, initialization -----------------------------


def _fill_non_persistent(slots, device, recipe) -> None:
    """Non-persistent buffers are in no checkpoint: they get the values their constructor computed,
    kept beside the meta build (zoo.meta shadows), or from a rebuild that keeps every value."""
    todo = [s for s in slots if s.new is None]
    unknown = []
    for slot in todo:
        value = value_of(slot.tensor) if slot.tensor.is_meta else slot.tensor
        if value is None:
            unknown.append(slot)
        else:
            slot.new = value.to(device=device, copy=True)
    if unknown:
        _from_constructor(unknown, device, recipe, meta_first=True)


def _constructed(todo: list[Slot], recipe) -> dict[str, Slot]:
    """The slots of a meta rebuild that keeps every constructed value, by name. Refuses, before
    anything is allocated, a module without a recipe, or tensors its constructor does not make (a
    submodule added after zoo.get): nothing could give them values."""
    from zoo.build import build_meta

    if recipe is None:
        raise MaterializeError(
            f"no value for {_names([s.name for s in todo])}: they are in no checkpoint, and "
            f"this module has no recipe to rebuild them (get it with zoo.get)"
        )
    with torch.random.fork_rng(devices=[]):  # the caller's RNG state is for the constructor's own init
        built = {name: s for s in slots_of(build_meta(recipe, keep_all_values=True)) for name in s.names}
    unknown = [s.name for s in todo if s.name not in built]
    if unknown:
        raise MaterializeError(
            f"no value for {_names(unknown)}: the model's constructor does not make them (added "
            f"after zoo.get?) and the weights do not hold them; load them from weights, or "
            f"materialize that submodule yourself (to_empty, then initialize it)"
        )
    return built


def _from_constructor(todo: list[Slot], device, recipe, built=None, meta_first: bool = False) -> None:
    """Values from the model's constructor: a meta rebuild that keeps all constructed values when
    that suffices (buffers), else an eager build on CPU (random init)."""
    from zoo.build import build_real

    built = built or _constructed(todo, recipe)
    if meta_first:
        for slot in todo:
            value = value_of(built[slot.name].tensor)
            if value is not None:
                slot.new = value.to(device=device, copy=True)
        todo = [s for s in todo if s.new is None]
        if not todo:
            return
    _take(todo, build_real(recipe, "cpu"), device)


def _initialize(slots, device, recipe) -> None:
    """weights=None: the model's own constructor, run eagerly on the device under the caller's RNG
    state, gives every value (custom inits included); its tensors move into our module, no copy."""
    from zoo.build import build_real

    if recipe is None:
        raise MaterializeError("initializing without weights needs the model's recipe: get the module with zoo.get")
    _constructed(slots, recipe)  # every tensor is one the constructor makes, checked on meta first
    _take(slots, build_real(recipe, device), device)


def _take(slots, eager: nn.Module, device) -> None:
    """Each slot's value from an eager build, found by any of its names. A tensor two slots take (a tie
    sharding broke) is copied for the second: each its own memory, as when read from a file."""
    tensors = {name: s.tensor for s in slots_of(eager) for name in s.names}
    taken = set()
    for slot in slots:
        full = tensors[slot.name]
        slot.new = slot.local(full.detach() if id(full) not in taken else full.detach().clone()).to(device)
        taken.add(id(full))


def _commit(slots) -> None:
    """Swap the new tensors in. Parameters keep their identity (hooks, optimizers, FSDP hold them).
    torch can still refuse a swap (a parameter with a weakref to it): then the ones already swapped
    are swapped back, and the module is as it was."""
    swapped: list[Slot] = []
    for slot in slots:
        if slot.is_param and slot.new is not slot.tensor:
            try:
                torch.utils.swap_tensors(slot.tensor, slot.new)
            except Exception as e:
                for done in reversed(swapped):
                    torch.utils.swap_tensors(done.tensor, done.new)
                for s in slots:
                    s.new = None
                raise MaterializeError(f"cannot swap {slot.name} in place ({e}); nothing was changed") from e
            swapped.append(slot)
    for slot in swapped:
        _rebind_tensor_hooks(slot.tensor)
    for slot in slots:
        if not slot.is_param:
            for mod, local in slot.owners:
                mod._buffers[local] = slot.new
        slot.new = None


def _rebind_tensor_hooks(param: torch.Tensor) -> None:
    """swap_tensors moves the Python object's hook dicts with it, but autograd keeps tensor hooks on
    the tensor it swapped out: assigning the dicts again registers them on the loaded tensor, so
    hooks registered on meta fire, and their handles still remove them."""
    for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
        hooks = getattr(param, attr)
        if hooks:
            setattr(param, attr, hooks)
