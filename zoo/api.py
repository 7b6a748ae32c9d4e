"""The public operations on one registry: find (search, info), build (get, scan, estimate), load
(check, weights), and record (index, remove, the schema). The CLI and any other reader go through here."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, overload

from zoo.columns import BY_NAME, check_name, name_part
from zoo.constants import refuse_unnamed_write, registry_named, registry_url
from zoo.errors import BuildFailed, InvalidArgument, NotBuildable, WeightsMismatch
from zoo.query import check_fields
from zoo.registry.rows import row_of


class _OnFirstUse:
    """A module imported when first used: zoo.registry.db and .store import SQLAlchemy (0.2-0.4 s), which a
    search of a SQLite registry does without (zoo.registry.lite)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


db, store = _OnFirstUse("zoo.registry.db"), _OnFirstUse("zoo.registry.store")

if TYPE_CHECKING:  # torch only when a module is built; ModelInfo when a search returns one
    from torch import nn

    from zoo.analysis import Estimate, Scan
    from zoo.indexing.indexer import Outcome
    from zoo.model_info import ModelInfo
    from zoo.weights.fit import Fit


class Zoo:
    """A registry at a SQLAlchemy URL (or file path); the shipped registry.db by default."""

    def __init__(self, url: str | None = None):
        self.url, self._named = registry_url(url), registry_named(url)

    def __repr__(self) -> str:
        return f"Zoo({db.masked(self.url)!r})"

    def __str__(self) -> str:  # the URL as messages show it: no password
        return db.masked(self.url)

    @property
    def _writable(self) -> str:
        """The URL to write: the shipped registry only when it is named (zoo.constants.refuse_unnamed_write)."""
        return self.url if self._named else refuse_unnamed_write()

    def exists(self) -> bool:
        """Whether the registry is there (a SQLite file exists; a server database is taken to)."""
        return db.exists(self.url)

    # --- find ---------------------------------------------------------------------------------

    def info(self, name: str, tensors: bool = False) -> ModelInfo:
        """The recorded metadata of a model, without importing torch; tensors=True adds its tensor table."""
        return self._row(name, tensors)[0]

    @overload
    def search(
        self, expression=..., order_by: str | None = ..., limit: int | None = ..., fields: None = ...
    ) -> list[ModelInfo]: ...
    @overload
    def search(
        self, expression=..., order_by: str | None = ..., limit: int | None = ..., fields: Iterable[str] = ...
    ) -> list[dict]: ...
    def search(
        self,
        expression=None,
        order_by: str | None = None,
        limit: int | None = None,
        fields: Iterable[str] | None = None,
    ) -> list[ModelInfo] | list[dict]:
        """Every model matching a search string or F-expression (or the first `limit`), by name or by
        order_by: a field, "-field" for descending ("-params"). fields=("name", "params", ...): a dict of
        just those fields per model instead of a ModelInfo (faster); any field the search takes, a measured
        one (bench_cpu: the best recorded run) or a predicted one (pred_*) too."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63):
            raise InvalidArgument(f"limit is a whole number >= 0 (or None for every match), not {limit!r}")
        if order_by is not None and not isinstance(order_by, str):
            raise InvalidArgument(f"order_by names a field, e.g. 'params' or '-params', not {order_by!r}")
        fields = None if fields is None else check_fields(fields)
        computed = [f for f in fields or () if not (f in BY_NAME and BY_NAME[f].public)]
        if not computed:
            return self._search(expression, order_by, limit, fields)
        assert fields is not None  # computed is a part of fields
        # measured and predicted fields are not columns: read the columns they come from, then compute them
        from zoo.throughput.measured import MEASURED
        from zoo.throughput.roofline import INPUTS, PREDICTED, predicted

        read = [*(f for f in fields if f not in computed), "name", *(INPUTS if set(computed) & set(PREDICTED) else ())]
        rows = self._search(expression, order_by, limit, tuple(dict.fromkeys(read)))
        best = {}
        if set(computed) & set(MEASURED):
            from zoo.throughput.benchmark import fastest

            best = {f: fastest(self, [r["name"] for r in rows], f) for f in computed if f in MEASURED}
        return [
            {
                f: best[f].get(r["name"]) if f in MEASURED else predicted(r, f) if f in PREDICTED else r[f]
                for f in fields
            }
            for r in rows
        ]

    def _search(self, expression, order_by, limit, fields):
        from zoo.registry import lite

        found = lite.search(self.url, expression, order_by, limit, fields)  # SQLite, without SQLAlchemy
        if found is not None:
            return found
        with db.session(self.url) as s:
            return store.search(s, expression, order_by, limit, fields)

    def variants(self, name: str) -> tuple[str, list[ModelInfo]]:
        """The architecture of `name` ("timm/resnet50", or one of its variants, "resnet50.a1_in1k") and every
        pretrained variant recorded for it, by name."""
        check_name(name)
        from zoo.registry import lite

        found = lite.variants(self.url, name)  # SQLite, without SQLAlchemy
        if found is not None:
            return found
        with db.session(self.url) as s:
            return store.variants_of(s, name)

    def preprocess(self, name: str) -> dict:
        """A model's input preprocessing (input_size, crop_pct, crop_mode, interpolation, mean, std, ...): the
        row's recorded dict, else the library's for its weights (no model is built)."""
        from zoo.preprocess import preprocess_of

        return preprocess_of(self.info(name))

    def transform(self, name: str, train: bool = False, test_size: bool = False):
        """The torchvision transform (PIL image -> normalized tensor) the model's weights expect, as timm's
        create_transform(**resolve_data_config(...)) or torchvision's weights.transforms() build it."""
        from zoo.preprocess import transform

        return transform(self.preprocess(name), train=train, test_size=test_size)

    # --- build --------------------------------------------------------------------------------

    def get(self, name: str, weights=None, device=None, dtype=None, dispatch: str = "now", **overrides) -> nn.Module:
        """A fresh instance of the model's own class with every tensor on meta; overrides rebuild with
        those kwargs. The module has .materialize(device, weights, ...) (see zoo.materialize).

        With weights or device it is materialized at once (in `dtype`); dispatch="lazy" defers that to
        the module's first use (see zoo.load.LazyLoad), and keeps deferring until a load succeeds.
        dtype alone gives the meta module in that dtype.
        """
        if dispatch not in ("now", "lazy"):
            raise InvalidArgument(f"dispatch must be 'now' or 'lazy', not {dispatch!r}")
        if dtype is not None:  # refused now, not at a lazy load's first forward
            from zoo.dtypes import float_dtype

            dtype = float_dtype(dtype)
        module = self._get_meta(name, overrides)
        if weights is None and device is None:
            if dtype is not None:  # a meta module in that dtype, as timm.create_model(..., dtype=) builds
                from zoo.build import cast_meta

                cast_meta(module, dtype)
            return module
        options = dict(device=device or "cpu", weights=weights, dtype=dtype)
        if dispatch == "now":
            return module.materialize(**options)
        from zoo.load import LazyLoad

        LazyLoad(module, options)
        return module

    def _get_meta(self, name: str, overrides: dict) -> nn.Module:
        from zoo import model_cache
        from zoo.build import build_meta, check_against_record
        from zoo.families import family
        from zoo.load import bind
        from zoo.recipe import Recipe
        from zoo.state import ZooState

        info, source_hash = self._row(name)
        if not family(info.family).BUILDS:
            raise NotBuildable(f"{info.name} is an indexed checkpoint: it records tensors, not a module")
        if info.status != "ok":
            raise BuildFailed(f"{info.name} failed to build when it was indexed: {info.error}")
        recipe = Recipe(info.family, info.builder, {**info.kwargs, **overrides})
        key = (self.url, info.name, source_hash, recipe.kwargs_json())
        inputs = info.inputs if family(info.family).INPUTS_RECORDED and info.inputs else None

        def build():
            module = build_meta(recipe)
            if not overrides:
                # one snapshot: the row as it is now, and its tensor table. A writer may have re-indexed the
                # model since the row above was read: its table is then another version's, and the module is
                # the version this call began with (no drift)
                now, now_hash = self._row(info.name, tensors=True)
                if now.status == "ok" and now_hash == source_hash:
                    check_against_record(info.name, module, now.tensor_table)
            return module

        # scan and estimate run with the row's own inputs (zoo.analysis.inputs.described): a variant's tag, a user's
        module, ties = model_cache.cached(key, build)
        return bind(
            module,
            ZooState(
                recipe,
                info.name,
                self.url,
                info.tag if info.kind == "variant" else None,
                inputs,
                None if overrides else info.load_args,
                ties,
            ),
        )

    def _row(self, name: str, tensors: bool = False) -> tuple[ModelInfo, str]:
        """A model's ModelInfo and source hash, in one snapshot (see zoo.registry.rows.row_of)."""
        return row_of(self.url, name, tensors)

    def _module(self, name_or_module) -> nn.Module:
        return self.get(name_or_module) if isinstance(name_or_module, str) else name_or_module

    def scan(self, name_or_module, *inputs, **options) -> Scan:
        """Every module's output shapes and dtypes from one meta forward (see zoo.analysis.scan)."""
        from zoo.analysis import scan

        module = self._module(name_or_module)
        if any(isinstance(i, str) for i in inputs):
            full = self.info(name_or_module).name if isinstance(name_or_module, str) else None
            from zoo.analysis.inputs import tokenized

            return scan(module, **tokenized(full, module, inputs), **options)
        return scan(module, *inputs, **options)

    def estimate(
        self,
        name_or_module,
        batch: int = 1,
        dtype="bf16",
        training: bool = False,
        optimizer: str = "adamw",
        seq_len: int | None = None,
        kv_dtype=None,
        weights_dtype=None,
        group_size: int = 128,
        checkpointing: bool = False,
    ) -> Estimate:
        """Bytes for weights, gradients, optimizer states, KV cache and activations, measured on meta (see
        zoo.analysis.estimate): kv_dtype for the cache ("fp8"), weights_dtype for weight-only quantization
        ("int8", "int4" with group_size, "fp8"), checkpointing for training. The options are checked
        before the model is built."""
        from zoo.analysis import estimate
        from zoo.analysis.memory import check_options

        options = dict(
            batch=batch,
            dtype=dtype,
            training=training,
            optimizer=optimizer,
            seq_len=seq_len,
            kv_dtype=kv_dtype,
            weights_dtype=weights_dtype,
            group_size=group_size,
            checkpointing=checkpointing,
        )
        check_options(**options)
        name = name_or_module if isinstance(name_or_module, str) else None
        return estimate(self._module(name_or_module), name=name, **options)

    # --- load ---------------------------------------------------------------------------------

    def check(self, name: str, weights, key_map=None) -> Fit:
        """How a checkpoint fits a model, from the registry and the file's metadata alone (no tensor
        data read; torch is imported only for pickles)."""
        from zoo.weights.fit import fit, targets_from_table
        from zoo.weights.opening import specs_of

        info = self.info(name, tensors=True)
        if info.tensor_table is None or info.status != "ok":
            raise BuildFailed(f"{info.name} has no recorded tensors (status {info.status})")
        return fit(targets_from_table(info.tensor_table), specs_of(self.weights_path(info.name, weights)), key_map)

    def add_weights(self, name: str, path, tag: str = "default", strict: bool = True) -> str:
        """Record a weights file for a model under a tag, with its sha256, once it fits the model; returns the
        sha256."""
        from zoo.indexing.indexer import is_constructor_tag
        from zoo.weights.digest import digest

        if (
            not isinstance(tag, str)
            or not tag.strip()
            or len(tag) > 64
            or "/" in tag
            or tag.startswith("hf:")
            or is_constructor_tag(tag)
            or tag == "pretrained"
        ):
            raise InvalidArgument(
                f"a weights tag is a name of 1 to 64 characters without '/', such as 'default' "
                f"or 'v1.0' ('constructor' and 'pretrained' are zoo's own), not {tag!r}"
            )
        result = self.check(name, Path(path))  # a Path is never a tag; checked first: resolve() crashes on a loop
        path = Path(path).resolve()
        nothing = not result.matched and result.missing  # strict=False must not record an unrelated file
        if result.misshaped or (strict and (result.missing or result.unexpected)) or nothing:
            raise WeightsMismatch(
                result.missing,
                result.unexpected,
                result.misshaped,
                "not one key matches: wrong file, or a different model?" if nothing else "",
            )
        sha256, nbytes = digest(path)
        with db.session(self._writable, write=True) as s, s.begin():
            store.add_weights(s, name, tag, str(path), sha256, nbytes)
        return sha256

    def weights_path(self, name: str, weights):
        """What to load for `weights`: hf://ORG/NAME through the hub cache; a tag recorded for the model
        ("default", "v1.0") becomes its file, sha256 checked; any other string is a path (one with a '/'
        is never a tag, so it loads without the registry); a state dict is itself. "pretrained" names no
        one file: .materialize loads it (zoo.pretrained). See zoo.load.weights_file."""
        from zoo.load import weights_file

        return weights_file(self.url, name, weights).source

    def constructor_files(self, name: str) -> list[str]:
        """The weights files a model's constructor reads itself (recorded at index time as tags
        "constructor", "constructor-2", ...), each checked against its recorded sha256."""
        from zoo.load import constructor_files

        return constructor_files(self.url, name)

    # --- record -------------------------------------------------------------------------------

    def index(
        self,
        source: str,
        targets=(),
        jobs: int = 1,
        force: bool = False,
        name: str | None = None,
        revision: str | None = None,
        progress=None,
        pretrained: bool = False,
        results=None,
        author=None,
        search=None,
        filter=None,
        limit: int | None = None,
        local_cache: bool = False,
    ) -> Outcome:
        """Build models on meta and record them, skipping unchanged ones unless force; progress(name, done, total)
        after each. source "timm" or "torchvision": targets are glob patterns (none: every model); pretrained=True:
        a row per pretrained variant instead ("timm/resnet50.a1_in1k", the patterns match "resnet50.a1_in1k"),
        built with the kwargs its weights need, with its published metadata and metrics; results: the folder of
        timm's published results (default catalog/timm-results). source "installed": both families at once,
        architectures and variants. source "hf": targets are config sources (config.json files, directories,
        catalog files, hub repo ids), `name` for a single one, `revision` for repo ids; or instead the hub's
        repos that author, search, filter, limit or local_cache pick (index_hub)."""
        from zoo.indexing import indexer

        indexer.workers_for(jobs)  # refused before anything is built
        targets = [targets] if isinstance(targets, str) else list(targets)  # one pattern or source, not its letters
        listing = bool(author or search or filter or local_cache) or limit is not None  # repos the hub picks
        if source == "hf" and not pretrained and results is None:
            if listing == bool(targets) or listing and (name is not None or revision is not None):  # both or neither
                raise InvalidArgument(
                    "index hf takes config sources (targets, with name and revision) or the hub's "
                    "listing (author, search, filter, limit, local_cache): one of the two"
                )
            return (
                self.index_hub(author, search, filter, limit, local_cache, force=force, progress=progress)
                if listing
                else indexer.index_configs(self._writable, targets, name, revision, force, progress)
            )
        if name is not None or revision is not None or listing:
            raise InvalidArgument(f"name, revision and the hub's listing apply to hf sources, not to {source}")
        if source == "installed":
            if pretrained:
                raise InvalidArgument(
                    "installed indexes the architectures and their pretrained variants both: no pretrained flag"
                )
            return indexer.index_installed(
                self._writable, targets, jobs=jobs, force=force, progress=progress, results=results
            )
        return indexer.index_family(
            self._writable,
            source,
            targets,
            jobs=jobs,
            force=force,
            progress=progress,
            pretrained=pretrained,
            results=results,
        )

    def index_hub(
        self,
        author: str | None = None,
        search: str | None = None,
        filter: str | None = None,
        limit: int | None = None,
        local_cache: bool = False,
        force: bool = False,
        progress=None,
    ) -> Outcome:
        """Index Hugging Face hub repos from config.json alone (never weights): those the hub's listing gives for
        author/search/filter (at most limit), or with local_cache every model in the local hub cache, offline.
        Each repo is a row hf/ORG/NAME with the hub's metadata; a repo that fails is a row with its reason.
        Repos already recorded from the same commit are skipped, so a rerun resumes an interrupted run."""
        from zoo.indexing import hub, hub_listing

        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise InvalidArgument(f"limit is a whole number >= 1, not {limit!r}")
        url = self._writable  # refused before the hub is asked
        if local_cache:
            if author or search or filter:
                raise InvalidArgument("local_cache indexes the whole local cache: no author, search or filter")
            repos, origin = hub_listing.cached_repos()[:limit], "local cache"
        else:
            if not (author or search or filter or limit):
                raise InvalidArgument("say which hub repos: author, search, filter or limit (the hub holds millions)")
            repos, origin = hub_listing.list_repos(author, search, filter, limit), "hub listing"
        return hub.index_hub(url, repos, origin, force=force, progress=progress)

    def index_builder(
        self, builder: str, name: str, kwargs: dict | None = None, force: bool = False, inputs=None
    ) -> dict:
        """Index a model built by a user's MODULE:FUNCTION (its package trusted for this call); returns its row.
        A model of another family or builder under that name is replaced only with force=True. `inputs`:
        its input spec, "1,3,224,224" or [{"shape": [1, 16], "dtype": "int64", "name": "input_ids"}, ...]
        (the first dimension is the batch), recorded so that the model gets FLOPs, scan and estimate."""
        from zoo.analysis.inputs import parse_inputs
        from zoo.indexing import indexer
        from zoo.recipe import Recipe

        parsed = parse_inputs(inputs) if inputs is not None else None  # refused before anything is built
        recipe = Recipe("user", builder, kwargs or {})
        full = check_name(name if "/" in check_name(name) else f"user/{name}", new=True)
        return indexer.index_one(
            self._writable, full, recipe, trusted={builder.split(":")[0].split(".")[0]}, force=force, inputs=parsed
        )

    def index_checkpoint(self, path, name: str | None = None, force: bool = False) -> dict:
        """Record a weights file's tensors (no module); returns its row."""
        from zoo.indexing import indexer

        name = name or name_part(Path(path).stem)  # a name without a family is a checkpoint's, as a builder's is user/
        name = check_name(name if "/" in check_name(name) else f"checkpoint/{name}", new=True)
        return indexer.index_checkpoint(self._writable, str(path), name, force=force)

    def remove(self, name: str) -> str:
        """Delete a model, its tensors and its recorded weights; returns its full name."""
        check_name(name)
        with db.session(self.url) as s:  # an unknown name is refused before the file is opened for writing
            full = store.resolve(s, name).name
        with db.session(self._writable, write=True) as s, s.begin():
            return store.remove(s, full)

    def upgrade(self, revision: str = "head") -> str | None:
        """Bring the schema to `revision` through the alembic migrations; returns the revision now."""
        db.upgrade(self._writable, revision)
        return self.revision()

    def revision(self) -> str | None:
        """The schema revision of the registry, None for an empty database."""
        return db.revision_of(self.url)

    def compact(self) -> str:
        """SQLite: fold the write-ahead log into the file and shrink it; PostgreSQL: VACUUM (ANALYZE).
        Returns what was done."""
        return db.compact(self._writable)

    def copy_to(self, target, replace: bool = False) -> dict[str, int]:
        """Copy this whole registry into the one at `target` (URL or path; SQLite <-> PostgreSQL) in one
        transaction there, ids kept; a target holding models is refused unless replace. Rows per table.
        The shipped registry is a target only when named, as for every write."""
        from zoo.registry.transfer import copy_registry

        url = registry_url(target) if registry_named(target) else refuse_unnamed_write()
        return copy_registry(self.url, url, replace)


def connect(url: str | None = None) -> Zoo:
    """The registry at a SQLAlchemy URL or file path (None: $ZOO_REGISTRY, else the shipped registry.db)."""
    return Zoo(url)
