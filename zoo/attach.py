"""What zoo.get attaches to the module it returns: .materialize bound to the model's registry row, the
lazy load on first call (dispatch="lazy"), and the check that a build still matches its row."""

from zoo.errors import InvalidArgument, RegistryDrift


class Materializer:
    """A gotten module's .materialize(device="cpu", weights=None, dtype=None, strict=True, key_map=None,
    copy=True, cast_non_persistent=False, reinit=False) (see zoo.materialize.materialize); `weights` may
    also be a tag recorded for the model, hf://ORG/NAME, or "constructor" for a model whose constructor loads
    weights files it ships (checked by sha256, then loaded by the constructor itself), or "pretrained" for
    the library's published weights of a timm or torchvision model (a variant row: its tag; an architecture
    row: the library's default, as timm.create_model(name, pretrained=True) and torchvision's "DEFAULT"),
    read from the library's own cache (see zoo.pretrained). An object, not a closure, so that
    the module pickles."""

    def __init__(self, module, url: str, name: str):
        self.module, self.url, self.name = module, url, name

    def __call__(self, device="cpu", weights=None, dtype=None, strict=True, key_map=None, copy=True,
                 cast_non_persistent=False, reinit=False):
        from zoo.indexer import CONSTRUCTOR_TAG
        from zoo.materialize import materialize

        from zoo.api import Zoo  # the same layer: a module's registry, opened when it loads

        registry = Zoo(self.url)
        if isinstance(weights, str) and weights == "pretrained":  # the library's published weights
            return self._pretrained(registry, device, dtype, key_map, copy, cast_non_persistent)
        if isinstance(weights, str) and weights == CONSTRUCTOR_TAG and registry.constructor_files(self.name):
            weights = None  # the constructor reads its own files, now checked, exactly as it does eagerly
        else:
            weights = registry.weights_path(self.name, weights)
        return materialize(self.module, device=device, weights=weights, dtype=dtype, strict=strict, key_map=key_map,
                           copy=copy, cast_non_persistent=cast_non_persistent,
                           recipe=self.module.__dict__.get("_zoo_recipe"), reinit=reinit)


    def _pretrained(self, registry, device, dtype, key_map, copy, cast_non_persistent):
        """weights="pretrained": the library's published weights, from its own cache (zoo.pretrained).
        A variant row loads its tag; an architecture row the library's default weights."""
        from zoo.materialize import materialize
        from zoo.pretrained import pretrained_source

        if key_map is not None:
            raise InvalidArgument("weights='pretrained' maps keys as the library does: key_map does not apply")
        info = registry.info(self.name)
        recipe = self.module.__dict__.get("_zoo_recipe")
        source, strict = pretrained_source(recipe, info.tag if info.kind == "variant" else None, self.module)
        return materialize(self.module, device=device, weights=source, dtype=dtype, strict=strict, copy=copy,
                           cast_non_persistent=cast_non_persistent, recipe=recipe)


class LoadOnFirstCall:
    """dispatch="lazy": a forward pre-hook that materializes the module, and removes itself once that worked."""

    def __init__(self, options: dict):
        self.options, self.handle = options, None

    def __call__(self, module, args, kwargs):
        module.materialize(**self.options)
        self.handle.remove()


def check_against_record(name: str, module, recorded: bytes) -> None:
    """A build must match its row: the installed library may differ from the one that indexed it."""
    from zoo.inspection import inspect_module
    from zoo.model_info import decode_tensors

    want = {t.name: (t.shape, t.dtype) for t in decode_tensors(recorded)}
    got = {t.name: (t.shape, t.dtype) for t in inspect_module(module).tensor_table}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:5]
        raise RegistryDrift(f"{name}: the installed library builds other tensors than the registry records "
                            f"(first differences: {diff}); re-index it with `zoo index`")
