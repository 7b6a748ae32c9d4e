"""The public operations on one registry: find (search, info), build (get, scan, estimate), load
(check, weights), and record (index, remove, the schema). The CLI and any other reader go through here."""

from __future__ import annotations

from collections.abc import Iterable

from zoo.columns import BY_NAME, check_name
from zoo.constants import registry_named, registry_url
from zoo.errors import BuildFailed, InvalidArgument, NotBuildable
from zoo.query import check_fields
from zoo.recording import Recording
from zoo.registry.rows import row_of
from zoo.sizing import Sizing


class _OnFirstUse:
    """A module imported when first used: zoo.registry.db and .store import SQLAlchemy (0.2-0.4 s), which a
    search of a SQLite registry does without (zoo.registry.lite)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


db, store = _OnFirstUse("zoo.registry.db"), _OnFirstUse("zoo.registry.store")

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process
if TYPE_CHECKING:  # torch only when a module is built; ModelInfo when a search returns one
    from typing import overload

    from torch import nn

    from zoo.model_info import ModelInfo
    from zoo.weights.fit import Fit


class Zoo(Sizing, Recording):
    """A registry at a SQLAlchemy URL (or file path); the shipped registry.db by default."""

    def __init__(self, url: str | None = None):
        self.url, self._named = registry_url(url), registry_named(url)

    def __repr__(self) -> str:
        return f"Zoo({db.masked(self.url)!r})"

    def __str__(self) -> str:  # the URL as messages show it: no password
        return db.masked(self.url)

    def exists(self) -> bool:
        """Whether the registry is there: a SQLite file exists (a server database is taken to).

        Returns:
            True when it can be opened for reading.

        A missing file is False: it raises nothing.
        """
        return db.exists(self.url)

    # --- find ---------------------------------------------------------------------------------

    def info(self, name: str, tensors: bool = False) -> ModelInfo:
        """A model's recorded metadata, from the registry alone (torch is never imported).

        Args:
            name: "timm/resnet50", or a unique short name ("resnet50").
            tensors: add its tensor table (name, shape, dtype, bytes of every parameter and buffer, ties).

        Returns:
            The ModelInfo (every search field an attribute).

        Raises:
            ModelNotFound: no such model (close names suggested).
            AmbiguousName: a short name of several models (they are named).
            RegistryNotFound: no registry at the URL.

        Examples:
            >>> zoo.info("timm/resnet50").params
            25557032
        """
        return self._row(name, tensors)[0]

    if TYPE_CHECKING:

        @overload
        def search(
            self,
            expression=...,
            order_by: str | None = ...,
            limit: int | None = ...,
            fields: None = ...,
            fits: str | None = ...,
        ) -> list[ModelInfo]: ...
        @overload
        def search(
            self,
            expression=...,
            order_by: str | None = ...,
            limit: int | None = ...,
            fields: Iterable[str] = ...,
            fits: str | None = ...,
        ) -> list[dict]: ...

    def search(
        self,
        expression=None,
        order_by: str | None = None,
        limit: int | None = None,
        fields: Iterable[str] | None = None,
        fits: str | None = None,
    ) -> list[ModelInfo] | list[dict]:
        """Every model matching a search, from the registry alone, in milliseconds.

        Args:
            expression: a search string ("params<7e9 and family=timm and name~'vit_*'"; `zoo search --fields` lists
                the fields) or an F-expression (F.params < 7e9); None: every model.
            order_by: a field, "-field" for descending ("-params"); default: by name.
            limit: the first `limit` matches only.
            fields: field names: a dict of just those per model instead of a ModelInfo (faster); a measured field
                (bench_cpu: the best recorded run) or a predicted one (pred_*) too; with fits, `max_batch`.
            fits: only the models whose plan fits: a hardware and a run, "H100 train batch=8 seq=4096 fsdp=8
                devices=8" (zoo.fitting.fits_options), answered from what zoo index records (no model is built).

        Returns:
            A list of ModelInfo, or of dicts with `fields`.

        Raises:
            SearchSyntaxError: a malformed search (with the column of the error), an unknown field (close ones
                named); InvalidComparison: a value of the wrong kind for its field.
            InvalidArgument: a bad limit, order_by or field name; a fits spec that is malformed or names a run
                zoo index does not record (zoo plan measures one model in any run).
            HardwareNotFound: a fits spec whose hardware is neither a listed device nor an amount of memory.
            RegistryNotFound: no registry at the URL.

        Examples:
            >>> [m.name for m in zoo.search("params<3e6 and family=timm", order_by="-params", limit=2)]
            ['timm/efficientvit_m1', 'timm/efficientvit_m1.r224_in1k']
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63):
            raise InvalidArgument(f"limit is a whole number >= 0 (or None for every match), not {limit!r}")
        if order_by is not None and not isinstance(order_by, str):
            raise InvalidArgument(f"order_by names a field, e.g. 'params' or '-params', not {order_by!r}")
        if fits is not None:
            return [found for found, _ in self._search_fits(expression, order_by, limit, fields, fits)[0]]
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

    def count(self, expression=None, limit: int | None = None) -> int:
        """How many models match a search, by SQL alone (no row is read into Python).

        Args:
            expression: a search string or an F-expression, as search() takes; None: every model.
            limit: count at most this many (a bound on the time: a million matches take seconds to count, the
                first 10,000 a millisecond); None: every match.

        Returns:
            The number of matches, at most `limit`.

        Raises:
            SearchSyntaxError: a malformed search; InvalidComparison: a value of the wrong kind for its field.
            InvalidArgument: a bad limit.
            RegistryNotFound: no registry at the URL.

        Examples:
            >>> zoo.count("family=timm and params<1e7", limit=10_001) <= 10_001
            True
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63):
            raise InvalidArgument(f"limit is a whole number >= 0 (or None to count every match), not {limit!r}")
        from zoo.registry import lite

        found = lite.count(self.url, expression, limit)  # SQLite, without SQLAlchemy
        if found is not None:
            return found
        with db.session(self.url) as s:
            return store.count(s, expression, limit)

    def _search_fits(self, expression, order_by, limit, fields, fits) -> tuple[list[tuple], list[str]]:
        """search with fits: ([(ModelInfo, or a dict of `fields` with max_batch; its Plan)], the names of matching
        rows that record no plan for this run)."""
        from zoo.fitting import FIELDS, ROW_FIELDS, fits_options, fitting

        o = fits_options(fits)
        wanted = None if fields is None else check_fields([f for f in fields if f not in FIELDS])
        rows = self.search(expression, order_by, None, tuple(dict.fromkeys([*ROW_FIELDS, *(wanted or ())])))
        kept, unplanned = fitting(rows, o)
        kept = kept[:limit] if limit is not None else kept
        if fields is None:  # whole rows, for the names that fit
            found = {m.name: m for m in self.search(expression, order_by, None)}
            return [(found[row["name"]], p) for row, p in kept], unplanned
        return [({f: p.max_batch if f == "max_batch" else row[f] for f in fields}, p) for row, p in kept], unplanned

    def _search(self, expression, order_by, limit, fields):
        from zoo.registry import lite

        found = lite.search(self.url, expression, order_by, limit, fields)  # SQLite, without SQLAlchemy
        if found is not None:
            return found
        with db.session(self.url) as s:
            return store.search(s, expression, order_by, limit, fields)

    def variants(self, name: str) -> tuple[str, list[ModelInfo]]:
        """The architecture of a model and every pretrained variant recorded for it.

        Args:
            name: an architecture ("timm/resnet50") or one of its variants ("resnet50.a1_in1k").

        Returns:
            (the architecture's name, its variants' ModelInfo by name).

        Raises:
            ModelNotFound: no such model.
            AmbiguousName: a short name of several models.
        """
        check_name(name)
        from zoo.registry import lite

        found = lite.variants(self.url, name)  # SQLite, without SQLAlchemy
        if found is not None:
            return found
        with db.session(self.url) as s:
            return store.variants_of(s, name)

    def preprocess(self, name: str) -> dict:
        """A model's input preprocessing, with no model built.

        Args:
            name: the model.

        Returns:
            {input_size, crop_pct, crop_mode, interpolation, mean, std, ...}: the row's recorded dict, else the
            library's for its weights.

        Raises:
            ModelNotFound: no such model.
            InvalidArgument: a model that records no preprocessing and whose library publishes none.
        """
        from zoo.preprocess import preprocess_of

        return preprocess_of(self.info(name))

    def transform(self, name: str, train: bool = False, test_size: bool = False):
        """The torchvision transform (PIL image -> normalized tensor) a model's weights expect, as timm's
        create_transform(**resolve_data_config(...)) or torchvision's weights.transforms() build it.

        Args:
            name: the model.
            train: the training transform (random resized crop, flip) instead of evaluation's.
            test_size: at the variant's published test size (test_input_size) instead of its input size.

        Returns:
            A torchvision transform.

        Raises:
            ModelNotFound: no such model.
            InvalidArgument: no recorded preprocessing (see preprocess).

        Examples:
            >>> zoo.transform("timm/resnet50.a1_in1k")
            Compose(...)
        """
        from zoo.preprocess import transform

        return transform(self.preprocess(name), train=train, test_size=test_size)

    # --- build --------------------------------------------------------------------------------

    def get(self, name: str, weights=None, device=None, dtype=None, dispatch: str = "now", **overrides) -> nn.Module:
        """The model as an nn.Module of its own class, every tensor on meta: no weights, no memory.

        The module has .materialize(device=, weights=, dtype=, ...) (see zoo.materialize.materialize) to allocate
        it and load its weights in place.

        Args:
            name: the model.
            weights: with device, materialize at once from: a file or directory (safetensors, torch pickles read
                without running code, DCP, sharded), a recorded tag ("default"), "pretrained" (the library's
                published weights from their cache), "hf://ORG/NAME" (the hub cache), or a state dict.
            device: materialize on this device ("cpu", "cuda:0"); without weights the model's constructor init.
            dtype: the floating dtype ("bf16", torch.float16); alone, the meta module in that dtype.
            dispatch: "now", or "lazy": materialize at the module's first use (a forward, .to(), state_dict()).
            **overrides: constructor kwargs to rebuild with (num_classes=10).

        Returns:
            The module (materialized when weights or device is given and dispatch is "now").

        Raises:
            ModelNotFound: no such model; AmbiguousName: a short name of several.
            NotBuildable: an indexed checkpoint (tensors, no module).
            BuildFailed: the model failed to build when indexed, or now with these overrides.
            InvalidArgument: a bad dispatch, dtype or device ("gpu": did you mean "cuda").
            WeightsMismatch: the weights do not fit (missing, unexpected, misshaped keys named).
            CheckpointError: a file that cannot be read, or a tag whose sha256 changed.
            MaterializeError: the allocation or load failed; the module is left as it was.

        Examples:
            >>> m = zoo.get("timm/resnet50")
            >>> m.fc.weight.device
            device(type='meta')
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

    # --- load ---------------------------------------------------------------------------------

    def check(self, name: str, weights, key_map=None) -> Fit:
        """How a checkpoint fits a model, from the registry and the file's metadata alone (no tensor data read;
        torch is imported only for pickles).

        Args:
            name: the model.
            weights: a file, directory, recorded tag or hf:// reference (as get's).
            key_map: a dict or function from checkpoint keys to the model's names (None for a key to skip).

        Returns:
            A Fit: matched, missing, unexpected, misshaped and dtype-mismatched keys; .exact and .loads.

        Raises:
            ModelNotFound: no such model.
            BuildFailed: a model with no recorded tensors (it failed to build).
            CheckpointError: a file that cannot be read.

        Examples:
            >>> zoo.check("timm/resnet18", "resnet18.safetensors").exact
            True
        """
        from zoo.weights.fit import fit, targets_from_table
        from zoo.weights.opening import specs_and_origin

        info = self.info(name, tensors=True)
        if info.tensor_table is None or info.status != "ok":
            raise BuildFailed(f"{info.name} has no recorded tensors (status {info.status})")
        specs, origin = specs_and_origin(self.weights_path(info.name, weights))
        result = fit(targets_from_table(info.tensor_table), specs, key_map)
        result.state_key = origin
        return result

    def weights_path(self, name: str, weights):
        """The file (or state dict) `weights` names for a model, as get and check resolve it.

        Args:
            name: the model.
            weights: "hf://ORG/NAME" (through the hub cache), a tag recorded for the model (its file, sha256
                checked), any other string a path (one with a '/' is never a tag), anything else itself.

        Returns:
            A path, or the object given.

        Raises:
            InvalidArgument: "pretrained", which names no single file.
            CheckpointError: neither a file nor a tag, or a tag whose file's sha256 changed.
            HubUnavailable: an hf:// reference not in the hub cache (nothing is downloaded).
        """
        from zoo.load import weights_file

        return weights_file(self.url, name, weights).source

    def constructor_files(self, name: str) -> list[str]:
        """The weights files a model's constructor reads itself, recorded at index time as tags "constructor",
        "constructor-2", ...

        Args:
            name: the model.

        Returns:
            Their paths, each checked against its recorded sha256.

        Raises:
            ModelNotFound: no such model.
            CheckpointError: a file whose sha256 changed since it was recorded.
        """
        from zoo.load import constructor_files

        return constructor_files(self.url, name)


def connect(url: str | None = None) -> Zoo:
    """The registry at a SQLAlchemy URL or file path, with every operation as a method.

    Args:
        url: "sqlite:///team.db", "postgresql+psycopg://host/zoo", or a path; None: $ZOO_REGISTRY, else the
            shipped registry.db.

    Returns:
        A Zoo (nothing is opened until a method needs it).

    Raises:
        RegistryNotFound: never here: the first method that opens a missing registry raises it.

    Examples:
        >>> zoo.connect("registry.db").info("timm/resnet50").family
        'timm'
    """
    return Zoo(url)
