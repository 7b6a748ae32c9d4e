"""The public operations on one registry: find (search, info), build (get, scan, estimate), load
(check, weights), and record (index, remove, the schema). The CLI and any other reader go through here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.constants import registry_url
from zoo.errors import BuildFailed, CheckpointError, InvalidArgument, NotBuildable, RegistryDrift, WeightsMismatch
from zoo.model_info import ModelInfo
from zoo.recipe import Recipe
from zoo.registry import db, store

if TYPE_CHECKING:  # torch only when a module is built
    from torch import nn

    from zoo.analysis import Estimate, Scan
    from zoo.indexer import Outcome
    from zoo.weights.fit import Fit


class Zoo:
    """A registry at a SQLAlchemy URL (or file path); the shipped registry.db by default."""

    def __init__(self, url: str | None = None):
        self.url = registry_url(url)

    def __repr__(self) -> str:
        return f"Zoo({db.masked(self.url)!r})"

    def __str__(self) -> str:  # the URL as messages show it: no password
        return db.masked(self.url)

    def exists(self) -> bool:
        """Whether the registry is there (a SQLite file exists; a server database is taken to)."""
        return db.exists(self.url)

    # --- find ---------------------------------------------------------------------------------

    def info(self, name: str, tensors: bool = False) -> ModelInfo:
        """The recorded metadata of a model, without importing torch; tensors=True adds its tensor table."""
        with db.session(self.url) as s:
            return store.info(s, name, tensors)

    def search(self, expression=None, order_by: str | None = None, limit: int | None = None,
               fields: tuple[str, ...] | None = None) -> list[ModelInfo] | list[dict]:
        """Every model matching a search string or F-expression (or the first `limit`), by name or by
        order_by: a field, "-field" for descending ("-params"). fields=("name", "params", ...): a dict of
        just those fields per model instead of a ModelInfo (faster)."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63):
            raise InvalidArgument(f"limit is a whole number >= 0 (or None for every match), not {limit!r}")
        if order_by is not None and not isinstance(order_by, str):
            raise InvalidArgument(f"order_by names a field, e.g. 'params' or '-params', not {order_by!r}")
        with db.session(self.url) as s:
            return store.search(s, expression, order_by, limit, None if fields is None else tuple(fields))

    # --- build --------------------------------------------------------------------------------

    def get(self, name: str, weights=None, device=None, dtype=None, dispatch: str = "now", **overrides) -> nn.Module:
        """A fresh instance of the model's own class with every tensor on meta; overrides rebuild with
        those kwargs. The module has .materialize(device, weights, ...) (see zoo.materialize).

        With weights or device it is materialized at once (in `dtype`); dispatch="lazy" defers that to
        the module's first forward call, and keeps deferring until a load succeeds.
        """
        if dispatch not in ("now", "lazy"):
            raise InvalidArgument(f"dispatch must be 'now' or 'lazy', not {dispatch!r}")
        if dtype is not None and weights is None and device is None:
            raise InvalidArgument("dtype applies when the model is materialized: give device= or weights= too, "
                                  "or call .materialize(dtype=...) on the module")
        if dtype is not None:  # refused now, not at a lazy load's first forward
            from zoo.inspection import float_dtype

            float_dtype(dtype)
        module = self._get_meta(name, overrides)
        if weights is None and device is None:
            return module
        options = dict(device=device or "cpu", weights=weights, dtype=dtype)
        if dispatch == "now":
            return module.materialize(**options)
        load = _LoadOnFirstCall(options)
        load.handle = module.register_forward_pre_hook(load, with_kwargs=True)
        return module

    def _get_meta(self, name: str, overrides: dict) -> nn.Module:
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
        module.__dict__["_zoo_recipe"] = recipe
        module.__dict__["materialize"] = _Materializer(module, self.url, row.name)
        return module

    def _module(self, name_or_module) -> nn.Module:
        return self.get(name_or_module) if isinstance(name_or_module, str) else name_or_module

    def scan(self, name_or_module, *inputs, **options) -> Scan:
        """Every module's output shapes and dtypes from one meta forward (see zoo.analysis.scan)."""
        from zoo.analysis import scan

        return scan(self._module(name_or_module), *inputs, **options)

    def estimate(self, name_or_module, batch: int = 1, dtype="bf16", training: bool = False,
                 optimizer: str = "adamw", seq_len: int | None = None) -> Estimate:
        """Bytes for weights, gradients, optimizer states and activations, measured on meta (see
        zoo.analysis.estimate); the options are checked before the model is built."""
        from zoo.analysis import estimate
        from zoo.analysis.memory import check_options

        check_options(batch, dtype, training, optimizer, seq_len)
        name = name_or_module if isinstance(name_or_module, str) else None
        return estimate(self._module(name_or_module), batch=batch, dtype=dtype, training=training,
                        optimizer=optimizer, seq_len=seq_len, name=name)

    # --- load ---------------------------------------------------------------------------------

    def check(self, name: str, weights, key_map=None) -> Fit:
        """How a checkpoint fits a model, from the registry and the file's metadata alone (no tensor
        data read; torch is imported only for pickles)."""
        from zoo.weights.fit import fit, targets_from_table
        from zoo.weights.sources import specs_of

        info = self.info(name, tensors=True)
        if info.tensor_table is None or info.status != "ok":
            raise BuildFailed(f"{info.name} has no recorded tensors (status {info.status})")
        return fit(targets_from_table(info.tensor_table), specs_of(self.weights_path(info.name, weights)), key_map)

    def add_weights(self, name: str, path, tag: str = "default", strict: bool = True) -> str:
        """Record a weights file for a model under a tag, with its sha256, once it fits the model; returns the sha256."""
        from zoo.indexer import is_constructor_tag
        from zoo.weights.digest import digest

        if (not isinstance(tag, str) or not tag.strip() or len(tag) > 64 or "/" in tag or tag.startswith("hf:")
                or is_constructor_tag(tag)):
            raise InvalidArgument(f"a weights tag is a name of 1 to 64 characters without '/', such as 'default' "
                                  f"or 'v1.0' ('constructor' is zoo's own), not {tag!r}")
        result = self.check(name, Path(path))  # a Path is never a tag; checked first: resolve() crashes on a loop
        path = Path(path).resolve()
        nothing = not result.matched and result.missing  # strict=False must not record an unrelated file
        if result.misshaped or (strict and (result.missing or result.unexpected)) or nothing:
            raise WeightsMismatch(result.missing, result.unexpected, result.misshaped,
                                  "not one key matches: wrong file, or a different model?" if nothing else "")
        sha256, nbytes = digest(path)
        with db.session(self.url, write=True) as s, s.begin():
            store.add_weights(s, name, tag, str(path), sha256, nbytes)
        return sha256

    def weights_path(self, name: str, weights):
        """What to load for `weights`: hf://ORG/NAME through the hub cache; a tag recorded for the model
        ("default", "v1.0") becomes its file, sha256 checked; any other string is a path (one with a '/'
        is never a tag, so it loads without the registry); a state dict is itself."""
        if not isinstance(weights, str):
            return weights
        if weights.startswith("hf://"):
            from zoo.weights.hub import resolve_hub_weights
            return resolve_hub_weights(weights)
        if "/" in weights:
            return weights
        from zoo.weights.digest import verify

        with db.session(self.url) as s:
            full = store.resolve(s, name).name
            entry = store.weights_entry(s, full, weights)  # a tag first: "v1.0" is a tag before it is a file
            tags = [w["tag"] for w in store.info(s, full).weights]
        if entry is None:
            if "." in weights or _is_file(weights):
                return weights
            raise CheckpointError(f"{weights!r} is neither a file nor a weights tag of {name} "
                                  f"(tags: {', '.join(tags) or 'none; add one with `zoo weights add`'})")
        verify(entry.path, entry.sha256)
        return entry.path

    def constructor_files(self, name: str) -> list[str]:
        """The weights files a model's constructor reads itself (recorded at index time as tags
        "constructor", "constructor-2", ...), each checked against its recorded sha256."""
        from zoo.indexer import is_constructor_tag
        from zoo.weights.digest import verify

        files = [w for w in self.info(name).weights if is_constructor_tag(w["tag"])]
        for w in files:
            verify(w["path"], w["sha256"])
        return [w["path"] for w in files]

    # --- record -------------------------------------------------------------------------------

    def index(self, source: str, targets=(), jobs: int = 1, force: bool = False, name: str | None = None,
              revision: str | None = None, progress=None) -> Outcome:
        """Build models on meta and record them; unchanged ones are skipped unless force.

        source "timm" or "torchvision": targets are glob patterns (none: every model). source "hf":
        targets are config sources (config.json files, directories, catalog files, hub repo ids),
        with `name` for a single one and `revision` for repo ids. progress(name, done, total) after each.
        """
        from zoo import indexer

        indexer.workers_for(jobs)  # refused before anything is built
        if isinstance(targets, str):  # one pattern or source, not its letters
            targets = [targets]
        if source == "hf":
            return indexer.index_configs(self.url, list(targets), name, revision, force, progress=progress)
        if name is not None or revision is not None:
            raise InvalidArgument(f"name and revision apply to hf sources, not to {source}")
        return indexer.index_family(self.url, source, list(targets), jobs=jobs, force=force, progress=progress)

    def index_builder(self, builder: str, name: str, kwargs: dict | None = None, force: bool = False) -> dict:
        """Index a model built by a user's MODULE:FUNCTION (its package trusted for this call); returns its row.
        A model of another family or builder under that name is replaced only with force=True."""
        from zoo import indexer

        recipe = Recipe("user", builder, kwargs or {})
        full = name if "/" in name else f"user/{name}"
        return indexer.index_one(self.url, full, recipe, trusted={builder.split(":")[0].split(".")[0]}, force=force)

    def index_checkpoint(self, path, name: str | None = None, force: bool = False) -> dict:
        """Record a weights file's tensors (no module); returns its row."""
        from zoo import indexer

        return indexer.index_checkpoint(self.url, str(path), name or f"checkpoint/{Path(path).stem}", force=force)

    def remove(self, name: str) -> str:
        """Delete a model, its tensors and its recorded weights; returns its full name."""
        with db.session(self.url) as s:  # an unknown name is refused before the file is opened for writing
            full = store.resolve(s, name).name
        with db.session(self.url, write=True) as s, s.begin():
            return store.remove(s, full)

    def upgrade(self, revision: str = "head") -> str | None:
        """Bring the schema to `revision` through the alembic migrations; returns the revision now."""
        db.upgrade(self.url, revision)
        return self.revision()

    def revision(self) -> str | None:
        """The schema revision of the registry, None for an empty database."""
        return db.revision_of(self.url)

    def compact(self) -> str:
        """SQLite: fold the write-ahead log into the file and shrink it; PostgreSQL: VACUUM (ANALYZE).
        Returns what was done."""
        return db.compact(self.url)

    def copy_to(self, target, replace: bool = False) -> dict[str, int]:
        """Copy this whole registry into the one at `target` (URL or path; SQLite <-> PostgreSQL) in one
        transaction there, ids kept; a target holding models is refused unless replace. Rows per table."""
        from zoo.registry.transfer import copy_registry

        return copy_registry(self.url, registry_url(target), replace)


class _Materializer:
    """A gotten module's .materialize(device="cpu", weights=None, dtype=None, strict=True, key_map=None,
    copy=True, cast_non_persistent=False, reinit=False) (see zoo.materialize.materialize); `weights` may
    also be a tag recorded for the model, hf://ORG/NAME, or "constructor" for a model whose constructor loads
    weights files it ships (checked by sha256, then loaded by the constructor itself). An object, not a
    closure, so that the module pickles."""

    def __init__(self, module, url: str, name: str):
        self.module, self.url, self.name = module, url, name

    def __call__(self, device="cpu", weights=None, dtype=None, strict=True, key_map=None, copy=True,
                 cast_non_persistent=False, reinit=False):
        from zoo.indexer import CONSTRUCTOR_TAG
        from zoo.materialize import materialize

        registry = Zoo(self.url)
        if isinstance(weights, str) and weights == CONSTRUCTOR_TAG and registry.constructor_files(self.name):
            weights = None  # the constructor reads its own files, now checked, exactly as it does eagerly
        else:
            weights = registry.weights_path(self.name, weights)
        return materialize(self.module, device=device, weights=weights, dtype=dtype, strict=strict, key_map=key_map,
                           copy=copy, cast_non_persistent=cast_non_persistent,
                           recipe=self.module.__dict__.get("_zoo_recipe"), reinit=reinit)


class _LoadOnFirstCall:
    """dispatch="lazy": a forward pre-hook that materializes the module, and removes itself once that worked."""

    def __init__(self, options: dict):
        self.options, self.handle = options, None

    def __call__(self, module, args, kwargs):
        module.materialize(**self.options)
        self.handle.remove()


def _check_against_record(name: str, module, recorded: bytes) -> None:
    """A build must match its row: the installed library may differ from the one that indexed it."""
    from zoo.inspection import inspect_module
    from zoo.model_info import decode_tensors

    want = {t.name: (t.shape, t.dtype) for t in decode_tensors(recorded)}
    got = {t.name: (t.shape, t.dtype) for t in inspect_module(module).tensor_table}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:5]
        raise RegistryDrift(f"{name}: the installed library builds other tensors than the registry records "
                            f"(first differences: {diff}); re-index it with `zoo index`")


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except OSError:  # a name too long for the file system is no file
        return False


def connect(url: str | None = None) -> Zoo:
    """The registry at a SQLAlchemy URL or file path (None: $ZOO_REGISTRY, else the shipped registry.db)."""
    return Zoo(url)
