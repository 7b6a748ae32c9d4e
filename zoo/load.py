"""The load layer: what weights= names (a WeightsRef, resolved once), the .materialize zoo.get binds to a module,
and the lazy load on first use (dispatch="lazy").

It reads the registry rows it needs through zoo.registry, never through zoo.api: the api sits above it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from zoo.constants import CONSTRUCTOR_TAG
from zoo.errors import CheckpointError, InvalidArgument, MaterializeError
from zoo.registry.rows import row_of
from zoo.state import ZooState, set_state, state_of

# --- what weights= names ----------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsRef:
    """What a weights= argument names. kind: "init" (None: the constructor initializes), "given" (a state
    dict, Source or path object, loaded as it is), "path" (a file or directory), "tag" (a file recorded
    for the model, sha256 checked), "hub" (hf://ORG/NAME, through the hub cache), "pretrained" (the library's
    published weights: `tag`, None for its default) or "constructor" (the constructor reads its own
    files, checked). source: what load_into reads; None where the constructor gives the values."""

    kind: str
    source: object = None
    tag: str | None = None
    sha256: str | None = None  # a tag's, checked


def resolve_weights(weights, state: ZooState) -> WeightsRef:
    """weights= of a module's .materialize, resolved once: files found, hashes checked, nothing loaded."""
    from zoo.pretrained import published_tag

    tag = published_tag(state.recipe, weights)
    if tag is not False:  # "pretrained" (the row's own: a variant's tag), or torchvision's own spellings
        return WeightsRef("pretrained", tag=state.tag if tag is None else tag)
    if weights is None:
        return WeightsRef("init")
    if isinstance(weights, str) and weights == CONSTRUCTOR_TAG and constructor_files(state.url, state.name):
        return WeightsRef("constructor")  # its files, now checked, read by the constructor as it does eagerly
    return weights_file(state.url, state.name, weights)


def weights_file(url: str | None, name: str | None, weights) -> WeightsRef:
    """One file (or state dict) for `weights`: hf://ORG/NAME through the hub cache; a tag recorded for the
    model ("default", "v1.0") becomes its file, sha256 checked; any other string is a path (one with a '/'
    is never a tag, so it loads without the registry); anything but a string is itself."""
    if not isinstance(weights, str):
        return WeightsRef("given", weights)
    if weights == "pretrained":  # no one file: timm's filters need the module (see zoo.pretrained)
        raise InvalidArgument(
            "weights='pretrained' loads through zoo.get(name, weights='pretrained') or "
            ".materialize(weights='pretrained'); it names no single file to check"
        )
    if weights.startswith("hf://"):
        from zoo.weights.hub import resolve_hub_weights

        return WeightsRef("hub", resolve_hub_weights(weights))
    if weights.startswith("~"):  # the user's home, as a shell would have read it before handing zoo the path
        return WeightsRef("path", os.path.expanduser(weights))
    if "/" in weights:
        return WeightsRef("path", weights)
    from zoo.weights.digest import verify

    recorded = _recorded(url, name)
    entry = next((w for w in recorded if w["tag"] == weights), None)  # a tag first: "v1.0" is a tag, then a file
    if entry is None:
        if "." in weights or _exists(weights):  # a file, or a directory (save_pretrained's, DCP's, shards)
            return WeightsRef("path", weights)
        raise CheckpointError(
            f"{weights!r} is neither a file nor a weights tag of {name} "
            f"(tags: {', '.join(w['tag'] for w in recorded) or 'none; add one with `zoo weights add`'})"
        )
    verify(entry["path"], entry["sha256"])
    return WeightsRef("tag", entry["path"], weights, entry["sha256"])


def open_tag(ref: WeightsRef):
    """A tag's checkpoint opened, then its sha256 checked again (remembered for the file's state: not hashed
    twice) and its open files compared with what the path names now: a file swapped in after the check
    weights_file made is refused, never loaded."""
    from zoo.weights.digest import verify
    from zoo.weights.opening import open_source
    from zoo.weights.sources import file_state

    file, sha256 = ref.source, ref.sha256
    assert isinstance(file, (str, Path)) and sha256 is not None, "a tag's ref holds its file's path and sha256"
    source = open_source(file)
    try:
        verify(file, sha256)
        for path, state in zip(getattr(source, "paths", ()), getattr(source, "states", ())):
            if file_state(path) != state:
                raise CheckpointError(f"{path}: replaced while it was being opened; load it again")
    except BaseException:
        source.close()
        raise
    return source


def constructor_files(url: str | None, name: str | None) -> list[str]:
    """The weights files a model's constructor reads itself (recorded at index time as tags
    "constructor", "constructor-2", ...), each checked against its recorded sha256."""
    from zoo.indexing.indexer import is_constructor_tag
    from zoo.weights.digest import verify

    files = [w for w in _recorded(url, name) if is_constructor_tag(w["tag"])]
    for w in files:
        verify(w["path"], w["sha256"])
    return [w["path"] for w in files]


def _recorded(url: str | None, name: str | None) -> list[dict]:
    """The weights files recorded for a model's registry row."""
    assert url is not None and name is not None, "a model with recorded weights has a registry row"
    weights = row_of(url, name)[0].weights
    assert weights is not None  # row_of reads a row with its recorded weights
    return weights


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except OSError:  # a name too long for the file system is no file
        return False


# --- what zoo.get binds to a module -------------------------------------------------------------


def bind(module, state: ZooState):
    """Give a built meta module its zoo state and its .materialize; returns the module."""
    set_state(module, state)
    module.__dict__["materialize"] = Materializer(module)
    return module


class Materializer:
    """A gotten module's .materialize(device="cpu", weights=None, dtype=None, strict=True, key_map=None,
    copy=None, cast_non_persistent=False, reinit=False) (see zoo.materialize.materialize); `weights` may
    also be a tag recorded for the model, hf://ORG/NAME, or "constructor" for a model whose constructor loads
    weights files it ships (checked by sha256, then loaded by the constructor itself), or "pretrained" for
    the library's published weights of a timm or torchvision model (a variant row: its tag; an architecture
    row: the library's default, as timm.create_model(name, pretrained=True) and torchvision's "DEFAULT"),
    read from the library's own cache (see zoo.pretrained); a torchvision model also takes torchvision's
    spellings: "DEFAULT", a weights name ("IMAGENET1K_V2") or a WeightsEnum member. After each call,
    .incompatible_keys holds the missing and unexpected keys (empty unless strict=False), as
    load_state_dict returns them. Any materialization cancels a pending lazy load (.pending). An object,
    not a closure, so that the module pickles."""

    def __init__(self, module):
        self.module = module
        self.incompatible_keys = None
        self.pending: LazyLoad | None = None

    def __call__(
        self,
        device="cpu",
        weights=None,
        dtype=None,
        strict=True,
        key_map=None,
        copy=None,
        cast_non_persistent=False,
        reinit=False,
        only_meta=False,
    ):
        from zoo.materialize import load_into
        from zoo.pretrained import pretrained_source

        state = state_of(self.module)
        if state is None:
            raise MaterializeError(
                "this module has no zoo state (its '_zoo' attribute was removed): get it again "
                "with zoo.get, or use zoo.materialize.materialize with weights="
            )
        ref = resolve_weights(weights, state)
        options = dict(
            device=device,
            dtype=dtype,
            copy=copy,
            cast_non_persistent=cast_non_persistent,
            recipe=state.recipe,
            reinit=reinit,
            only_meta=only_meta,
        )
        if ref.kind == "pretrained":
            if key_map is not None:
                raise InvalidArgument("weights='pretrained' maps keys as the library does: key_map does not apply")
            source, strict = pretrained_source(state.recipe, ref.tag, self.module, state.load_args)
            keys = load_into(self.module, weights=source, strict=strict, **options)
        else:
            with open_tag(ref) if ref.kind == "tag" else contextlib.nullcontext(ref.source) as weights:
                keys = load_into(self.module, weights=weights, strict=strict, key_map=key_map, **options)
        self.incompatible_keys = keys
        if self.pending is not None:
            self.pending.detach()
        return self.module


class _BeforeCall:
    """A lazy module's forward pre-hook: the load. Under torch.compile it runs outside the trace, before
    Dynamo holds weak references to the meta parameters (swap_tensors refuses a tensor with one). A
    class, not a closure, so that a pending module pickles."""

    def __init__(self, lazy: LazyLoad):
        self.lazy = lazy

    def __call__(self, sub, args):
        import torch

        torch.compiler.disable(self.lazy.load)()


class LazyLoad:
    """dispatch="lazy": the load runs at the module's first use, and fills only what is still on meta.

    A use is a call of the module or of any submodule (forward_features, generate, a head alone),
    state_dict(), load_state_dict() without assign (which then copies over the loaded values), listing
    the whole module's parameters or buffers (parameters(), named_parameters(), buffers(), named_buffers():
    an optimizer, DistributedDataParallel), or moving it (.to, .cuda, .float: _apply). FSDP2's fully_shard and
    tensor parallelism list each module's own parameters (recurse=False) and load nothing. Anything the
    user materialized since (load_state_dict(assign=True), to_empty, a new head) is left as it is: the
    load never overwrites a tensor that is not on meta, and an explicit .materialize cancels it. It
    keeps waiting until a load succeeds. It is the module's .materialize.pending until then."""

    USES = ("state_dict", "load_state_dict", "_apply", "to_empty")
    LISTINGS = ("named_parameters", "named_buffers")  # parameters() and buffers() call these

    def __init__(self, module, options: dict):
        self.module, self.options, self.busy = module, options, False
        self.handles = [sub.register_forward_pre_hook(_BeforeCall(self)) for sub in module.modules()]
        for sub in module.modules():
            for use in self.USES:
                sub.__dict__[use] = functools.partial(getattr(self, use), sub)
        for listing in self.LISTINGS:
            module.__dict__[listing] = functools.partial(self._listed, listing)
        module.materialize.pending = self

    def load(self) -> None:
        if self.busy:  # the load itself, or to_empty, uses the module: no second load from inside it
            return
        self.busy = True
        try:
            if any(t.is_meta for t in (*self.module.parameters(), *self.module.buffers())):
                self.module.materialize(**self.options, only_meta=True)  # detaches on success
            else:
                self.detach()
        finally:
            self.busy = False

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        for sub in self.module.modules():
            for use in self.USES:
                sub.__dict__.pop(use, None)
        for listing in self.LISTINGS:
            self.module.__dict__.pop(listing, None)
        self.module.materialize.pending = None

    def _listed(self, listing, prefix="", recurse=True, remove_duplicate=True):
        if recurse:
            self.load()
        return getattr(type(self.module), listing)(self.module, prefix, recurse, remove_duplicate)

    def state_dict(self, sub, *args, **kwargs):
        self.load()
        return type(sub).state_dict(sub, *args, **kwargs)

    def load_state_dict(self, sub, state_dict, strict=True, assign=False):
        if not assign:  # a copy into meta tensors would keep nothing: load first, then copy over
            self.load()
        return type(sub).load_state_dict(sub, state_dict, strict=strict, assign=assign)

    def _apply(self, sub, fn, recurse=True):
        self.load()
        return type(sub)._apply(sub, fn, recurse)

    def to_empty(self, sub, *, device, recurse=True):
        self.busy = True  # empty memory is what the user asks for: no load first
        try:
            return type(sub).to_empty(sub, device=device, recurse=recurse)
        finally:
            self.busy = False
