"""What zoo.get attaches to the module it returns: .materialize bound to the model's registry row, the
lazy load on first call (dispatch="lazy"), and the check that a build still matches its row."""

import functools

from zoo.errors import InvalidArgument, RegistryDrift


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
    load_state_dict returns them. Any materialization cancels a pending lazy load. An object, not a
    closure, so that the module pickles."""

    def __init__(self, module, url: str, name: str):
        self.module, self.url, self.name = module, url, name
        self.incompatible_keys = None

    def __call__(self, device="cpu", weights=None, dtype=None, strict=True, key_map=None, copy=None,
                 cast_non_persistent=False, reinit=False, only_meta=False):
        from zoo.constants import CONSTRUCTOR_TAG
        from zoo.materialize import load_into
        from zoo.pretrained import published_tag

        from zoo.api import Zoo  # the same layer: a module's registry, opened when it loads

        registry = Zoo(self.url)
        recipe = self.module.__dict__.get("_zoo_recipe")
        options = dict(device=device, dtype=dtype, copy=copy, cast_non_persistent=cast_non_persistent,
                       recipe=recipe, reinit=reinit, only_meta=only_meta)
        tag = published_tag(recipe, weights)
        if tag is not False:  # the library's published weights
            keys = self._pretrained(registry, tag, key_map, options)
        else:
            if isinstance(weights, str) and weights == CONSTRUCTOR_TAG and registry.constructor_files(self.name):
                weights = None  # the constructor reads its own files, now checked, exactly as it does eagerly
            else:
                weights = registry.weights_path(self.name, weights)
            keys = load_into(self.module, weights=weights, strict=strict, key_map=key_map, **options)
        self.incompatible_keys = keys
        lazy = self.module.__dict__.get("_zoo_lazy")
        if lazy is not None:
            lazy.detach()
        return self.module

    def _pretrained(self, registry, tag, key_map, options):
        """The library's published weights, from its own cache (zoo.pretrained): `tag`, or None for the
        row's own (a variant row: its tag; an architecture row: the library's default weights)."""
        from zoo.materialize import load_into
        from zoo.pretrained import pretrained_source

        if key_map is not None:
            raise InvalidArgument("weights='pretrained' maps keys as the library does: key_map does not apply")
        if tag is None:
            info = registry.info(self.name)
            tag = info.tag if info.kind == "variant" else None
        source, strict = pretrained_source(options["recipe"], tag, self.module)
        return load_into(self.module, weights=source, strict=strict, **options)


class LazyLoad:
    """dispatch="lazy": the load runs at the module's first use, and fills only what is still on meta.

    A use is a call of the module or of any submodule (forward_features, generate, a head alone),
    state_dict(), load_state_dict() without assign (which then copies over the loaded values), listing
    the whole module's parameters (its parameters() or named_parameters(): an optimizer,
    DistributedDataParallel), or moving it (.to, .cuda, .float: _apply). FSDP2's fully_shard and
    tensor parallelism list each module's own parameters (recurse=False) and load nothing. Anything the
    user materialized since (load_state_dict(assign=True), to_empty, a new head) is left as it is: the
    load never overwrites a tensor that is not on meta, and an explicit .materialize cancels it. It
    keeps waiting until a load succeeds."""

    USES = ("state_dict", "load_state_dict", "_apply", "to_empty")

    def __init__(self, module, options: dict):
        self.module, self.options, self.busy = module, options, False
        self.handles = [sub.register_forward_pre_hook(self._before_call) for sub in module.modules()]
        for sub in module.modules():
            for use in self.USES:
                sub.__dict__[use] = functools.partial(getattr(self, use), sub)
        module.__dict__["named_parameters"] = self.named_parameters
        module.__dict__["_zoo_lazy"] = self

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
        self.module.__dict__.pop("named_parameters", None)
        self.module.__dict__.pop("_zoo_lazy", None)

    def _before_call(self, sub, args):
        self.load()

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        if recurse:
            self.load()
        return type(self.module).named_parameters(self.module, prefix, recurse, remove_duplicate)

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


def cast_meta(module, dtype) -> None:
    """A meta module's floating tensors in `dtype`, as timm.create_model(..., dtype=) builds them; the
    values their constructor computed (zoo.meta shadows) stay with them."""
    def cast(t):
        if not t.is_floating_point():
            return t
        new = t.to(dtype)
        new.__dict__.update(t.__dict__)
        return new

    module._apply(cast)


def check_against_record(name: str, module, recorded) -> None:
    """A build must match its row (its recorded tensor table): the installed library may differ from the
    one that indexed it."""
    from zoo.inspection import inspect_module

    want = {t.name: (t.shape, t.dtype) for t in recorded}
    got = {t.name: (t.shape, t.dtype) for t in inspect_module(module).tensor_table}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:5]
        raise RegistryDrift(f"{name}: the installed library builds other tensors than the registry records "
                            f"(first differences: {diff}); re-index it with `zoo index`")
