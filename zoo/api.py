"""The public operations on one registry: get, info, search, remove."""

import json

from zoo.constants import registry_url
from zoo.errors import BuildFailed, NotBuildable, RegistryDrift
from zoo.families import Recipe
from zoo.info import ModelInfo
from zoo.registry import db, store


class Zoo:
    """A registry at a SQLAlchemy URL (or file path); the shipped registry.db by default."""

    def __init__(self, url: str | None = None):
        if url is None:
            url = registry_url()
        self.url = url if "://" in url else f"sqlite:///{url}"

    def __repr__(self) -> str:
        return f"Zoo({self.url!r})"

    def info(self, name: str, tensors: bool = False) -> ModelInfo:
        """The recorded metadata of a model, without importing torch; tensors=True adds its tensor table."""
        with db.session(self.url) as s:
            return store.info(s, name, tensors)

    def search(self, expression=None, order_by: str | None = None, limit: int | None = 100) -> list[ModelInfo]:
        """Models matching a search string or F-expression; order_by "params" or "-params"; limit=None for all."""
        with db.session(self.url) as s:
            return store.search(s, expression, order_by, limit)

    def get(self, name: str, weights=None, device=None, dtype=None, dispatch: str = "now", **overrides):
        """A fresh instance of the model's own class with every tensor on meta; overrides rebuild with
        those kwargs. The module has .materialize(device, weights, ...) (see zoo.materialize).

        With weights or device it is materialized at once; dispatch="lazy" defers that to the
        module's first forward call.
        """
        module = self._get_meta(name, overrides)
        if dispatch not in ("now", "lazy"):
            raise ValueError(f"dispatch must be 'now' or 'lazy', not {dispatch!r}")
        if weights is None and device is None:
            return module
        options = dict(device=device or "cpu", weights=weights, dtype=dtype)
        if dispatch == "now":
            return module.materialize(**options)

        def on_first_call(mod, args, kwargs):
            handle.remove()
            mod.materialize(**options)

        handle = module.register_forward_pre_hook(on_first_call, with_kwargs=True)
        return module

    def _get_meta(self, name: str, overrides: dict):
        from zoo import templates
        from zoo.build import build_meta

        with db.session(self.url) as s:
            row = store.resolve(s, name)
            if row.family == "checkpoint":
                raise NotBuildable(f"{row.name} is an indexed checkpoint: it records tensors, not a module")
            if row.status != "ok":
                raise BuildFailed(f"{row.name} failed to build when it was indexed: {row.error}")
            recipe = Recipe(row.family, row.builder, {**json.loads(row.kwargs), **overrides})
            key = (self.url, row.name, row.source_hash, recipe.kwargs_json())

        def build():
            module = build_meta(recipe)
            if not overrides:
                with db.session(self.url) as s:
                    _check_against_record(row.name, module, store.tensor_blob(s, row.id))
            return module

        module = templates.cached(key, build)
        _attach_materialize(module, recipe, self)
        return module


def _attach_materialize(module, recipe: Recipe, registry: "Zoo") -> None:
    """Give a gotten module its recipe (to initialize or rebuild buffers) and a .materialize method."""
    import types

    from zoo.materialize import materialize

    def bound(self, device="cpu", weights=None, dtype=None, strict=True, key_map=None, copy=True,
              cast_non_persistent=False):
        return materialize(self, device=device, weights=weights, dtype=dtype, strict=strict, key_map=key_map,
                           copy=copy, cast_non_persistent=cast_non_persistent, recipe=recipe)

    bound.__doc__ = materialize.__doc__
    module.__dict__["_zoo_recipe"] = recipe
    module.__dict__["materialize"] = types.MethodType(bound, module)


def _check_against_record(name: str, module, recorded: bytes) -> None:
    """A build must match its row: the installed library may differ from the one that indexed it."""
    from zoo.info import decode_tensors
    from zoo.inspection import inspect_module

    want = {t.name: (t.shape, t.dtype) for t in decode_tensors(recorded)}
    got = {t.name: (t.shape, t.dtype) for t in inspect_module(module).tensor_table}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:5]
        raise RegistryDrift(f"{name}: the installed library builds other tensors than the registry records "
                            f"(first differences: {diff}); re-index it with `zoo index`")


def connect(url: str | None = None) -> Zoo:
    return Zoo(url)
