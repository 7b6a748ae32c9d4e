"""The public operations on one registry: get, info, search, check, and weights recorded by tag."""

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
        if dispatch not in ("now", "lazy"):
            raise ValueError(f"dispatch must be 'now' or 'lazy', not {dispatch!r}")
        module = self._get_meta(name, overrides)
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
        _attach_materialize(module, recipe, self, row.name)
        return module

    def check(self, name: str, weights, key_map=None):
        """How a checkpoint fits a model, from the registry and the file's metadata alone (no tensor
        data read; torch is imported only for pickles): a zoo.weights.fit.Fit."""
        from zoo.weights.fit import fit, targets_from_table
        from zoo.weights.sources import specs_of

        info = self.info(name, tensors=True)
        if info.tensor_table is None or info.status != "ok":
            raise BuildFailed(f"{info.name} has no recorded tensors (status {info.status})")
        return fit(targets_from_table(info.tensor_table), specs_of(self.weights_path(info.name, weights)), key_map)

    def add_weights(self, name: str, path, tag: str = "default", strict: bool = True):
        """Record a weights file for a model under a tag, with its sha256, once it fits the model."""
        from pathlib import Path

        from zoo.errors import WeightsMismatch
        from zoo.weights.digest import digest

        path = Path(path).resolve()
        result = self.check(name, path)
        if result.misshaped or (strict and (result.missing or result.unexpected)):
            raise WeightsMismatch(result.missing, result.unexpected, result.misshaped)
        sha256, nbytes = digest(path)
        with db.session(self.url, write=True) as s, s.begin():
            store.add_weights(s, name, tag, str(path), sha256, nbytes)
        return sha256

    def weights_path(self, name: str, weights):
        """A tag recorded for the model ("default") becomes its file, its sha256 checked; anything else is as given."""
        from pathlib import Path

        if isinstance(weights, str) and weights.startswith("hf://"):
            from zoo.weights.hub import resolve_hub_weights
            return resolve_hub_weights(weights)
        if not isinstance(weights, str) or Path(weights).exists() or "/" in weights or "." in weights:
            return weights
        from zoo.weights.digest import verify

        with db.session(self.url) as s:
            entry = store.weights_entry(s, store.resolve(s, name).name, weights)
            tags = [w["tag"] for w in store.info(s, name).weights]
        if entry is None:
            from zoo.errors import CheckpointError

            raise CheckpointError(f"{weights!r} is neither a file nor a weights tag of {name} "
                                  f"(tags: {', '.join(tags) or 'none; add one with `zoo weights add`'})")
        verify(entry.path, entry.sha256)
        return entry.path


def _attach_materialize(module, recipe: Recipe, registry: "Zoo", name: str) -> None:
    """Give a gotten module its recipe (to initialize or rebuild buffers) and a .materialize method."""
    import types

    from zoo.materialize import materialize

    def bound(self, device="cpu", weights=None, dtype=None, strict=True, key_map=None, copy=True,
              cast_non_persistent=False):
        weights = registry.weights_path(name, weights)
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
