"""Zoo's writes, one method per source: index (timm, torchvision, installed, hf configs, the hub's listing, a
builder, a checkpoint), weights tags, remove, and the registry's schema. A base of zoo.api.Zoo, kept apart so that
each module stays one screenful of a job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from zoo.columns import check_name, name_part
from zoo.constants import refuse_unnamed_write, registry_named, registry_url
from zoo.errors import InvalidArgument, WeightsMismatch

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process
if TYPE_CHECKING:
    from zoo.indexing.indexer import Outcome
    from zoo.weights.fit import Fit


class Recording:
    """The write half of a Zoo: everything that changes the registry at self.url."""

    url: str
    _named: bool

    if TYPE_CHECKING:

        def check(self, name: str, weights, key_map=None) -> Fit: ...

    @property
    def _writable(self) -> str:
        """The URL to write: the shipped registry only when it is named (zoo.constants.refuse_unnamed_write)."""
        return self.url if self._named else refuse_unnamed_write()

    def add_weights(self, name: str, path, tag: str = "default", strict: bool = True) -> str:
        """Record a weights file for a model under a tag, with its sha256, once the file fits the model.

        Args:
            name: the model ("timm/resnet50", or a unique short name).
            path: the weights file (safetensors, a torch pickle read without running its code, ...).
            tag: the name to load it by: get(name, weights=tag); 1-64 characters, no '/'; 'constructor' and
                'pretrained' are zoo's own.
            strict: refuse a file with missing or unexpected keys (False: record it anyway; a file no key of
                which matches is refused either way).

        Returns:
            The file's sha256 (hex), checked again on every load by tag.

        Raises:
            InvalidArgument: a bad tag.
            WeightsMismatch: the file does not fit the model (its misshaped, missing and unexpected keys named).
            CheckpointError: a file zoo cannot read.
            ModelNotFound: an unknown model.
            RegistryError: the registry cannot be written (the shipped one must be named).

        Examples:
            >>> zoo.connect("my.db").add_weights("timm/resnet50", "r50.safetensors", tag="v1")
        """
        from zoo.indexing.indexer import is_constructor_tag
        from zoo.registry import db, store
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

    def index(self, source: str, targets=(), **options) -> Outcome:
        """Build models on meta and record them, from one source, as `zoo index SOURCE` does: the method of that
        source with its options.

        Args:
            source: "timm" or "torchvision" (index_family; targets are glob patterns), "installed"
                (index_installed), or "hf": config sources as targets (index_configs), or none and the hub's
                listing options instead (index_hub).
            targets: the patterns or sources (one string is one).
            **options: the keyword arguments of that method (force, progress, jobs, ...).

        Returns:
            What was indexed, left unchanged and failed (zoo.indexing.indexer.Outcome).

        Raises:
            InvalidArgument: an unknown source, or an option the source's method does not take.

        Examples:
            >>> zoo.connect("my.db").index("timm", ["resnet*"], jobs=2).indexed[:1]
            ['timm/resnet10t']
        """
        targets = [targets] if isinstance(targets, str) else list(targets)  # one pattern or source, not its letters
        options = {k: v for k, v in options.items() if v is not None and v is not False}  # as not given (the CLI's)
        listing = {"author", "search", "filter", "limit", "local_cache"}
        method: Callable[..., Outcome]
        arguments: tuple = ()
        if source == "hf":
            if bool(targets) == bool(listing & options.keys()) or not targets and options.keys() & {"name", "revision"}:
                raise InvalidArgument(
                    "index hf takes config sources (targets, with name and revision) or the hub's "
                    "listing (author, search, filter, limit, local_cache): one of the two"
                )
            method, arguments = (self.index_configs, (targets,)) if targets else (self.index_hub, ())
        elif source == "installed":
            if options.get("pretrained"):
                raise InvalidArgument(
                    "installed indexes the architectures and their pretrained variants both: no pretrained flag"
                )
            method, arguments = self.index_installed, (targets,)
        else:
            method, arguments = self.index_family, (source, targets)
        import inspect

        taken = set(inspect.signature(method).parameters)
        if extra := sorted(options.keys() - taken):
            what = "hf sources" if set(extra) <= listing | {"name", "revision"} else f"zoo.Zoo.{method.__name__}"
            raise InvalidArgument(
                f"{', '.join(extra)} apply to {what}, not to {source}"
                + ("" if what == "hf sources" else f" (it takes {', '.join(sorted(taken - {'family', 'patterns'}))})")
            )
        return method(*arguments, **options)

    def index_family(
        self,
        family: str,
        patterns=(),
        pretrained: bool = False,
        results=None,
        jobs: int = 1,
        force: bool = False,
        progress=None,
    ) -> Outcome:
        """Build a family's models on meta and record them; unchanged ones are skipped unless force.

        Args:
            family: "timm" or "torchvision" (any family of zoo.families.FAMILIES that lists its models).
            patterns: glob patterns of its model names ("resnet*"); none: every model.
            pretrained: a row per pretrained variant instead ("timm/resnet50.a1_in1k"; the patterns match
                "resnet50.a1_in1k"), built with the kwargs its weights need, with its published metadata.
            results: the folder of timm's published results (default catalog/timm-results).
            jobs: worker processes.
            force: rebuild unchanged models too.
            progress: progress(name, done, total), called after each model.

        Returns:
            The Outcome: names indexed, unchanged and failed (with their reasons).

        Raises:
            InvalidArgument: patterns that match nothing (the close names said), a bad job count, results for a
                family that publishes none, pretrained for a family without variants.
            UnknownFamily: a family zoo does not know.
            RegistryError: the registry cannot be written (the shipped one must be named to be written).
        """
        from zoo.indexing import indexer

        indexer.workers_for(jobs)  # refused before anything is built
        return indexer.index_family(
            self._writable,
            family,
            patterns,
            jobs=jobs,
            force=force,
            progress=progress,
            pretrained=pretrained,
            results=results,
        )

    def index_installed(self, patterns=(), results=None, jobs: int = 1, force: bool = False, progress=None) -> Outcome:
        """timm and torchvision at once: every architecture matching the patterns and every pretrained variant of
        it, each architecture followed by its variants in one worker (the same rows as index_family of each,
        without and with pretrained, in one run).

        Args:
            patterns: glob patterns of model or variant names; none: the whole installed zoo.
            results: the folder of timm's published results (default catalog/timm-results).
            jobs: worker processes.
            force: rebuild unchanged models too.
            progress: progress(name, done, total), called after each model.

        Returns:
            The Outcome: names indexed, unchanged and failed.

        Raises:
            InvalidArgument: patterns that match nothing, a bad job count.
            RegistryError: the registry cannot be written.
        """
        from zoo.indexing import indexer

        indexer.workers_for(jobs)
        return indexer.index_installed(
            self._writable, patterns, jobs=jobs, force=force, progress=progress, results=results
        )

    def index_configs(
        self, sources, name: str | None = None, revision: str | None = None, force: bool = False, progress=None
    ) -> Outcome:
        """Record Hugging Face models from their config.json alone (never weights), built on meta.

        Args:
            sources: config.json files, directories holding one, catalog files (catalog/hf/*.json), hub repo ids
                ("ORG/NAME", read from the local hub cache: nothing is downloaded).
            name: the row's name for a single source ("hf/ORG/NAME"; default: from the config or repo id).
            revision: a repo id's revision (branch, tag or commit).
            force: rebuild unchanged models too.
            progress: progress(name, done, total), called after each model.

        Returns:
            The Outcome; a source whose config cannot be read is in `failed` with its reason, the others go in.

        Raises:
            InvalidArgument: name or revision with several sources.
            RegistryError: the registry cannot be written.
        """
        from zoo.indexing import indexer

        sources = [sources] if isinstance(sources, str) else list(sources)
        return indexer.index_configs(self._writable, sources, name, revision, force, progress)

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
        """Record Hugging Face hub repos from their config.json alone (never weights).

        Each repo is a row hf/ORG/NAME with the hub's metadata; a repo that fails is in the outcome's `failed` with
        its reason. Repos already recorded from the same commit are skipped, so a rerun resumes an interrupted run.

        Args:
            author: the repos of this hub user or organization.
            search: the repos whose name contains this text.
            filter: a hub tag ("text-generation").
            limit: at most this many repos (the hub's listing order).
            local_cache: instead, every model repo in the local huggingface_hub cache, offline.
            force: rebuild unchanged repos too.
            progress: progress(name, done, total), called after each repo.

        Returns:
            The Outcome: names indexed, unchanged and failed.

        Raises:
            InvalidArgument: no selection at all, local_cache with a selection, a limit below 1.
            HubUnavailable: the hub cannot be reached (HF_HUB_OFFLINE, no network).
            RegistryError: the registry cannot be written.
        """
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
        """Record a model built by your own MODULE:FUNCTION, its package trusted for this call.

        Args:
            builder: "mypkg.models:build_net", imported with the current directory on the path (last).
            name: the row's name; without a family it is user/NAME.
            kwargs: JSON keyword arguments for the builder.
            force: replace a model of another family or builder under that name.
            inputs: the forward's input, the batch first: "1,3,224,224", or [{"shape": [1, 16], "dtype": "int64",
                "name": "input_ids"}, ...] for several; recorded so the model gets FLOPs, scan and estimate.

        Returns:
            The row recorded (a dict of its fields); a builder that raises gives a row with status "error".

        Raises:
            UntrustedBuilder: a builder from the standard library, zoo itself or __main__.
            InvalidRecipe: a builder that is not MODULE:FUNCTION, or whose module or function cannot be imported
                (nothing is recorded).
            InvalidArgument: a malformed input spec.
            ModelExists: the name is another model's (force replaces it).
            RegistryError: the registry cannot be written.

        Examples:
            >>> zoo.connect("my.db").index_builder("mypkg.models:build_net", "net", inputs="1,3,32,32")
        """
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
        """Record a weights file's tensors as a row of their own (no module: zoo.get refuses it; zoo check and
        search by size work).

        Args:
            path: the weights file; only its header (or a pickle loaded on meta, no code run) is read.
            name: the row's name; default checkpoint/FILE_STEM.
            force: replace a model of that name.

        Returns:
            The row recorded (a dict of its fields).

        Raises:
            CheckpointError: a file zoo cannot read (its reason said); nothing is recorded.
            ModelExists: the name is taken (force replaces it).
            RegistryError: the registry cannot be written.
        """
        from zoo.indexing import indexer

        name = name or name_part(Path(path).stem)  # a name without a family is a checkpoint's, as a builder's is user/
        name = check_name(name if "/" in check_name(name) else f"checkpoint/{name}", new=True)
        return indexer.index_checkpoint(self._writable, str(path), name, force=force)

    def remove(self, name: str) -> str:
        """Delete a model, its tensors and its recorded weights tags (the files stay).

        Args:
            name: the model, full or a unique short name.

        Returns:
            The full name removed.

        Raises:
            ModelNotFound: no such model (close names suggested).
            AmbiguousName: a short name of several models.
            RegistryError: the registry cannot be written.
        """
        from zoo.registry import db, store

        check_name(name)
        with db.session(self.url) as s:  # an unknown name is refused before the file is opened for writing
            full = store.resolve(s, name).name
        with db.session(self._writable, write=True) as s, s.begin():
            return store.remove(s, full)

    def upgrade(self, revision: str = "head") -> str | None:
        """Bring the schema to `revision` through the alembic migrations (a new file is created at head).

        Args:
            revision: an alembic revision; "head" is the newest.

        Returns:
            The registry's revision afterwards.

        Raises:
            RegistryError: the registry cannot be written, or is newer than this zoo.
        """
        from zoo.registry import db

        db.upgrade(self._writable, revision)
        return self.revision()

    def revision(self) -> str | None:
        """The registry's schema revision.

        Returns:
            The alembic revision, None for an empty database.

        Raises:
            RegistryError: the registry cannot be read.
        """
        from zoo.registry import db

        return db.revision_of(self.url)

    def compact(self) -> str:
        """Fold SQLite's write-ahead log into the file and shrink it (then it reads with nothing beside it, on a
        read-only mount too); on PostgreSQL, VACUUM (ANALYZE).

        Returns:
            What was done, as a sentence.

        Raises:
            RegistryLocked: another process holds the file (a long-lived reader, a writer).
            RegistryError: the registry cannot be written.
        """
        from zoo.registry import db

        return db.compact(self._writable)

    def copy_to(self, target, replace: bool = False) -> dict[str, int]:
        """Copy this whole registry into another (SQLite <-> PostgreSQL), ids kept, in one transaction there.

        Args:
            target: a SQLAlchemy URL or SQLite path; the shipped registry only when named, as for every write.
            replace: empty a target that holds models first (otherwise refused).

        Returns:
            Rows copied per table.

        Raises:
            RegistryError: source and target are the same, the target holds models (without replace), or either
                cannot be opened.
        """
        from zoo.registry.transfer import copy_registry

        url = registry_url(target) if registry_named(target) else refuse_unnamed_write()
        return copy_registry(self.url, url, replace)
