"""The load layer: what weights= names (a WeightsRef, resolved once), the .materialize zoo.get binds to a module,
and the lazy load on first use (dispatch="lazy").

It reads the registry rows it needs through zoo.registry, never through zoo.api: the api sits above it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, replace
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
    files, checked). source: what load_into reads; None where the constructor gives the values. tag: a tag's
    or published weights' name, a hub ref's repo id."""

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
        from zoo.weights.hub import parse_uri, resolve_hub_weights

        return WeightsRef("hub", resolve_hub_weights(weights), tag=parse_uri(weights)[0])
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


def from_pretrained_state(module, ref: WeightsRef, mode: bool = True) -> None:
    """A transformers model loaded from a folder (or a hub repo) given the state from_pretrained gives it: eval
    mode, the folder's config fields and generation config, name_or_path (zoo.families.hf_loaded)."""
    from zoo.families.hf_loaded import as_from_pretrained
    from zoo.weights.sources import split_ema

    folder, name = None, None
    if ref.kind == "hub":
        folder, name = Path(str(ref.source)).parent, ref.tag  # the snapshot, and what from_pretrained is given
    elif isinstance(ref.source, (str, os.PathLike)) and ref.kind in ("path", "tag", "given"):
        path = Path(split_ema(ref.source)[0])
        folder = path if path.is_dir() else path.parent
        if (folder / "config.json").is_file():  # a folder from_pretrained could load: the name it would record
            name = str(ref.source) if path.is_dir() else str(folder)
    as_from_pretrained(module, folder, name, mode)


def is_local_path(weights) -> bool:
    """weights= that names a file or folder by its path (a tag or hf://ORG/NAME needs resolving first)."""
    if isinstance(weights, os.PathLike):
        return True
    return isinstance(weights, str) and not weights.startswith("hf://") and ("/" in weights or weights[:1] == "~")


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
    """A gotten module's .materialize(device="cpu", weights=None, **options), the options those of
    zoo.materialize.materialize (dtype, strict, key_map, copy, cast_non_persistent, reinit); `weights` may
    also be a tag recorded for the model, hf://ORG/NAME, or "constructor" for a model whose constructor loads
    weights files it ships (checked by sha256, then loaded by the constructor itself), or "pretrained" for
    the library's published weights of a timm or torchvision model (a variant row: its tag; an architecture
    row: the library's default, as timm.create_model(name, pretrained=True) and torchvision's "DEFAULT"),
    read from the library's own cache (see zoo.pretrained); a torchvision model also takes torchvision's
    spellings: "DEFAULT", a weights name ("IMAGENET1K_V2") or a WeightsEnum member. After each call,
    .incompatible_keys holds the missing and unexpected keys (empty unless strict=False), as
    load_state_dict returns them; .state_key the entry of a training checkpoint the state dict was read
    from ("state_dict", "model", "state_dict_ema", ...; None: the file is one). A transformers model loaded
    from a folder is left as from_pretrained leaves it (eval mode, the folder's config, generation config and
    name_or_path). Any materialization cancels a pending lazy load (.pending). An object, not a closure, so
    that the module pickles."""

    def __init__(self, module):
        self.module = module
        self.incompatible_keys = None
        self.state_key: str | None = None
        self.pending: LazyLoad | None = None
        self.prepared = False  # a lazy get took from_pretrained's state already: its load leaves it as it is

    def __call__(self, device="cpu", weights=None, **options):
        from zoo.load_options import LoadOptions
        from zoo.materialize import load_into
        from zoo.pretrained import pretrained_source

        state = state_of(self.module)
        if state is None:
            raise MaterializeError(
                "this module has no zoo state (its '_zoo' attribute was removed): get it again "
                "with zoo.get, or use zoo.materialize.materialize with weights="
            )
        ref = resolve_weights(weights, state)
        o = LoadOptions.of(device, recipe=state.recipe, **options)  # refused before a file is opened
        if ref.kind == "pretrained":
            if o.key_map is not None:
                raise InvalidArgument("weights='pretrained' maps keys as the library does: key_map does not apply")
            source, strict = pretrained_source(state.recipe, ref.tag, self.module, state.load_args)
            keys = load_into(self.module, source, replace(o, strict=strict))
        else:
            with _opened(ref) as opened:
                keys = load_into(self.module, opened, o)
                self.state_key = getattr(opened, "origin", None)
        self.incompatible_keys = keys
        if ref.kind != "init" and not (o.only_meta and self.prepared):
            from_pretrained_state(self.module, ref, mode=not o.only_meta)
        if self.pending is not None:
            self.pending.detach()
        return self.module

    def prepare(self, weights) -> None:
        """A lazy get: from_pretrained's state now (generate() reads the generation config before it uses any
        weight), from the folder a path names; a tag's or a hub repo's is taken at the load."""
        if weights is None:
            return  # initialized, not loaded: from_config's state, which it has
        local = is_local_path(weights)
        from_pretrained_state(self.module, WeightsRef("path", os.path.expanduser(weights) if local else None))
        self.prepared = local


def _opened(ref: WeightsRef):
    """The source load_into reads for a ref, opened here so that the key it was found under is known."""
    from zoo.weights.opening import open_source

    if ref.kind == "tag":
        return open_tag(ref)
    return contextlib.nullcontext(None) if ref.source is None else open_source(ref.source)


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

    # named_children: torch.jit.trace and quantize_dynamic walk the module with it before they read a value
    # (train() and eval() walk it too, and read none: they do not load); __prepare_scriptable__: torch.jit.script
    USES = ("state_dict", "load_state_dict", "_apply", "to_empty", "named_children", "train", "__prepare_scriptable__")
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
        module.materialize.prepare(options["weights"])

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

    def named_children(self, sub):
        self.load()
        return type(sub).named_children(sub)

    def train(self, sub, mode=True):
        busy, self.busy = self.busy, True  # a mode is no value: no load
        try:
            return type(sub).train(sub, mode)
        finally:
            self.busy = busy

    def __prepare_scriptable__(self, sub):
        self.load()
        return sub

    def to_empty(self, sub, *, device, recurse=True):
        self.busy = True  # empty memory is what the user asks for: no load first
        try:
            return type(sub).to_empty(sub, device=device, recurse=recurse)
        finally:
            self.busy = False
