"""Index models: build each on meta in worker processes, record it, commit it in its own transaction."""

import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

from zoo.columns import BY_NAME
from zoo.errors import InvalidArgument, InvalidRecipe, ModelExists, ZooError, reason
from zoo.families import family
from zoo.recipe import Recipe
from zoo.registry import db, store

# Bump when what a build records changes: every model is then rebuilt on the next index.
RECORD_VERSION = 3  # 2: analysis columns (flops, macs, activation bytes, output shapes, scan status); 3: inputs,
# flops_per_token, LLM fields, hf input specs


@dataclass
class Outcome:
    indexed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> error
    timings: dict[str, dict] = field(default_factory=dict)  # name -> seconds: build, analysis, save

    def as_dict(self) -> dict:
        out = {"indexed": len(self.indexed), "unchanged": len(self.unchanged), "failed": self.failed}
        return {**out, "timings": self.timings} if self.timings else out  # built models only


def source_hash(recipe: Recipe, versions: dict, variant: dict | None = None) -> str:
    """Identifies everything a build depends on; an unchanged hash means an unchanged row. A variant's
    published metadata (metrics, source, preprocessing) is part of it: new results re-record it."""
    key = json.dumps([RECORD_VERSION, recipe.family, recipe.builder, recipe.kwargs, versions]
                     + ([variant] if variant else []), sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def record_of(name: str, recipe: Recipe, trusted: set[str] | None = None, variant: dict | None = None,
              inputs: list | None = None, known: dict | None = None) -> tuple[dict, list | None]:
    """Build one model on meta and describe it: the registry row and its tensor table.
    A build that fails gives a row with status "error" and the reason, never an exception.
    variant: a pretrained variant's published columns (a family's variants()); they are recorded even
    when the build fails, and its analysis runs at the weights' own input size. `inputs`: a user
    model's input spec (zoo.analysis.inputs.parse_inputs), for a family that documents none. `known`:
    structure digest -> analysis columns already recorded; a build with a known digest reuses its analysis,
    and a new one is added to it (zoo.structure)."""
    record, table, _ = _record(name, recipe, trusted, variant, inputs, known)
    return record, table


@dataclass
class _Built:
    """A meta build: the module, its tensor summary, the files its constructor read, the description of the
    construction that made it (zoo.construction; None where the builder returns another module or it has none), and
    its analyses so far: input spec (JSON) -> (structure digest, analysis columns)."""
    module: object
    summary: object
    files: list
    construction: str | None = None
    analysed: dict = field(default_factory=dict)


def _build(recipe: Recipe, trusted, fam, arch: _Built | None) -> tuple[_Built, bool]:
    """The build of `recipe`, and whether it is its architecture's: a variant whose construction equals `arch`'s
    stops there and takes arch's module (a family whose construction decides its module, zoo.construction)."""
    from zoo.build import build_meta
    from zoo.construction import SameConstruction, watch
    from zoo.inspection import inspect_module

    files_read = []
    watching = getattr(fam, "CONSTRUCTION_DECIDES", False)
    stop_at = arch.construction if arch is not None else None
    with warnings.catch_warnings():  # builders' deprecation chatter would bury the progress bar
        warnings.simplefilter("ignore")
        try:
            with watch(stop_at) if watching else contextlib.nullcontext() as seen:
                module = build_meta(recipe, trusted, files_read=files_read)
        except SameConstruction:
            return arch, True
    made_it = seen is not None and seen.first is module
    return _Built(module, inspect_module(module), sorted(set(files_read)), seen.call if made_it else None), False


def _record(name, recipe, trusted=None, variant=None, inputs=None, known=None, arch: _Built | None = None):
    """record_of, with the build it made (None if it failed); `arch`: the build of a variant's architecture."""
    fam = family(recipe.family)
    versions = fam.versions()
    base = dict(name=name, family=recipe.family, builder=recipe.builder, kwargs=recipe.kwargs_json(),
                versions=json.dumps(versions, sort_keys=True), source_hash=source_hash(recipe, versions, variant),
                **_variant_columns(variant))
    started = time.perf_counter()
    try:
        built, same = _build(recipe, trusted, fam, arch)
        module, summary = built.module, built.summary
        described = fam.describe(recipe.builder, module, **({"tag": variant["tag"]} if variant else {}))
        llm = {}
        if recipe.family == "hf":  # language-model fields from the built module and its config
            from zoo.analysis.llm import llm_fields

            llm = llm_fields(module, module.config)
    except Exception as e:  # recorded, not raised: one broken model must not stop an index run
        return {**base, "status": "error", "error": reason(e.__cause__ or e),
                "timing": {"build_s": round(time.perf_counter() - started, 4)}}, None, None
    built_at = time.perf_counter()
    spec = described.get("input")
    if spec is None and inputs:
        from zoo.analysis.inputs import spec_of_inputs

        spec = spec_of_inputs(inputs)
    at = json.dumps(spec, sort_keys=True)
    analysed = built.analysed.get(at)
    if analysed:  # this very module at this input (a variant's construction equal to its architecture's)
        digest, analysis, reused = *analysed, True
    else:
        from zoo.structure import structure_digest

        # the analysis also depends on the libraries and on zoo's analysis code: both are part of the key
        digest = structure_digest(module, (spec, base["versions"], RECORD_VERSION))
        reused = known is not None and digest in known
        analysis = dict(known[digest]) if reused else _analyze(module, spec)
        if analysis.get("scan_status") == "ok":  # a timeout or an error is not passed on
            built.analysed[at] = digest, analysis
            if known is not None and digest is not None:
                known[digest] = analysis
    cls = type(module)
    return {
        # seconds per stage, for `zoo index --json` (not a column: write_model takes only COLUMNS)
        "timing": {"build_s": round(built_at - started, 4), "build_reused": same,
                   "analysis_s": round(time.perf_counter() - built_at, 4), "analysis_reused": reused},
        "structure_digest": digest,
        **base, "status": "ok", "error": None, "arch": f"{cls.__module__}.{cls.__qualname__}",
        "constructor_files": built.files,  # recorded as weights tags, not a column
        "task": base.get("task") or described["task"],
        "input_size": BY_NAME["input_size"].encode(described["input_size"] or None),
        "dtype": summary.dtype, "params": summary.params, "trainable": summary.trainable,
        "buffers": summary.buffers, "tensors": summary.tensors, "param_bytes": summary.param_bytes,
        "buffer_bytes": summary.buffer_bytes, "bytes": summary.bytes, **analysis, **llm,
    }, summary.tensor_table, built


_VARIANT_KEYS = ("builder", "kwargs")  # a variant's recipe, not columns


def _variant_columns(variant: dict | None) -> dict:
    """A variant's published fields as the registry stores them (JSON columns encoded)."""
    if not variant:
        return {}
    return {k: BY_NAME[k].encode(v) for k, v in variant.items() if k not in _VARIANT_KEYS}


def _analyze(module, spec) -> dict:
    """FLOPs, activation bytes and output shapes from forwards of the same meta module (zoo.analysis);
    a forward that cannot run on meta is recorded with its reason, and the model still indexes."""
    from zoo.analysis import analyze

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(module, spec).columns()


CONSTRUCTOR_TAG = "constructor"


def is_constructor_tag(tag: str) -> bool:
    """The tags the indexer gives files a constructor reads itself: "constructor", "constructor-2", ..."""
    head, _, number = tag.partition("-")
    return head == CONSTRUCTOR_TAG and (not number or number.isdigit())


def save(url: str, record: dict, table, replace: bool = False) -> None:
    """One model, one transaction: a crash leaves it either fully there or not at all. Weights files
    its constructor read itself are recorded as tags "constructor", "constructor-2", ... with their sha256
    (replacing those of an earlier build)."""
    from zoo.weights.digest import digest

    shipped = [(path, *digest(path)) for path in record.get("constructor_files", ())]
    with db.session(url, write=True) as s, s.begin():
        if not store.write_model(s, record, table, replace):  # a new name has no tags to drop
            store.drop_weights(s, record["name"], [t for t in store.weights_tags(s, record["name"]) if is_constructor_tag(t)])
        for i, (path, sha256, nbytes) in enumerate(shipped):
            store.add_weights(s, record["name"], CONSTRUCTOR_TAG + (f"-{i + 1}" if i else ""), path, sha256, nbytes)


def workers_for(jobs: int) -> int:
    """Worker processes for -j: at least 1 is asked for, at most the CPU count is used."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise InvalidArgument(f"jobs is a whole number of worker processes >= 1, not {jobs!r}")
    return min(jobs, os.cpu_count() or 1)


def _worker_start(parent: int) -> None:
    """In each forked worker: die with the parent (a kill -9 of the indexer must not leave 0.5 GB
    workers behind) and drop the parent's pooled database connections without closing them (they
    are the parent's: closing would end its sessions; SQLAlchemy's advice for forks)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # not Linux: workers then end when their work queue closes
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    for eng in db.cached_engines():
        eng.dispose(close=False)


_known: dict = {}  # structure digest -> analysis, set by _index_groups before its workers fork: they inherit it


def _records_of_group(group: list):
    """Build a group in order (an architecture, then its variants), yielding (record, table): a variant whose
    construction equals its architecture's takes the architecture's build (zoo.construction), and one built
    unchanged reuses the analysis its architecture just recorded in _known."""
    arch = None
    for name, recipe, variant in group:
        record, table, built = _record(name, recipe, variant=variant, known=_known, arch=arch)
        if variant is None:
            arch = built
        yield record, table


def _build_group_in_worker(group: list) -> list:
    return list(_records_of_group(group))


def wanted_variants(family_name: str, patterns=(), results=None) -> dict[str, tuple[Recipe, dict]]:
    """name -> (recipe, published columns) of every pretrained variant of a family matching the patterns;
    timm's published results are read from the folder `results` (default: the project's catalog)."""
    fam = family(family_name)
    if not hasattr(fam, "variants"):
        raise InvalidArgument(f"{family_name} has no pretrained variants to index (timm and torchvision have)")
    if family_name == "timm":
        rows = fam.variants(patterns, fam.read_results(results or default_results()))
    else:
        if results is not None:
            raise InvalidArgument("results (published validation results) apply to timm")
        rows = fam.variants(patterns)
    return {f"{family_name}/{v['builder'] if family_name == 'timm' else v['builder'] + '.' + v['tag']}":
            (Recipe(family_name, v["builder"], v["kwargs"]), v) for v in rows}


def default_results() -> str:
    """The project's copy of timm's published results (catalog/timm-results, with its provenance)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "catalog" / "timm-results"
    if not folder.is_dir():
        raise InvalidArgument(f"timm's published results are not at {folder}: pass the folder that holds "
                              f"results-imagenet.csv (zoo index timm --pretrained --results DIR)")
    return str(folder)


def index_family(url: str, family_name: str, patterns=(), jobs: int = 1, force: bool = False,
                 progress=None, pretrained: bool = False, results=None) -> Outcome:
    """Index every model of a family matching the patterns; unchanged ones are skipped. pretrained: its
    pretrained variants instead (a row per published weights; timm's results from the folder `results`).

    `progress(name, done, total)` is called after each model. Ctrl-C stops after the models
    already committed; a re-run continues where this one stopped.
    """
    jobs = workers_for(jobs)
    fam = family(family_name)
    if pretrained:
        variants = wanted_variants(family_name, patterns, results)  # bad input refused before the registry
        groups = [[(name, recipe, variant)] for name, (recipe, variant) in variants.items()]
    elif results is not None:
        raise InvalidArgument("results apply to pretrained variants (pretrained=True)")
    else:
        groups = [[(f"{family_name}/{b}", Recipe(family_name, b), None)] for b in fam.available(patterns)]
    db.open_registry(url, write=True, create=True)  # create or check the schema before any work
    return _index_groups(url, [family_name], groups, jobs, force, progress)


INSTALLED = ("timm", "torchvision")  # the families `zoo index installed` covers: the vision zoo on this machine


def index_installed(url: str, patterns=(), jobs: int = 1, force: bool = False, progress=None,
                    results=None) -> Outcome:
    """The whole installed vision zoo in one run: every architecture of timm and torchvision matching the
    patterns and every pretrained variant matching them, each architecture followed by its variants in
    the same worker (so the variants that build it unchanged reuse its analysis at once). The same rows as
    index_family run per family and then with pretrained=True; one process and one pool instead of four."""
    jobs = workers_for(jobs)
    variants = {f: wanted_variants(f, patterns, results if f == "timm" else None) for f in INSTALLED}
    db.open_registry(url, write=True, create=True)
    groups = []
    for name in INSTALLED:
        by_arch: dict[str, list] = {}
        for variant_name, (recipe, variant) in variants[name].items():
            by_arch.setdefault(variant["arch_name"], []).append((variant_name, recipe, variant))
        for builder in family(name).available(patterns):
            arch = f"{name}/{builder}"
            groups.append([(arch, Recipe(name, builder), None), *by_arch.pop(arch, [])])
        groups += by_arch.values()  # variants whose architecture the patterns leave out
    return _index_groups(url, INSTALLED, groups, jobs, force, progress)


def _index_groups(url: str, families, groups: list, jobs: int, force: bool, progress) -> Outcome:
    """Build and save groups of (name, recipe, variant or None), unchanged rows skipped unless force; each
    group is built in order in one worker, and each model is saved in its own transaction as it comes."""
    outcome = Outcome()
    versions = {name: family(name).versions() for name in families}
    global _known
    with db.session(url) as s:
        _known = {} if force else {k: v for name in families for k, v in store.analyses_by_digest(s, name).items()}
        todo = []
        for group in groups:
            left = []
            for name, recipe, variant in group:
                if not force and store.ok_hash_of(s, name) == source_hash(recipe, versions[recipe.family], variant):
                    outcome.unchanged.append(name)
                else:
                    left.append((name, recipe, variant))
            if left:
                todo.append(left)
    total, done = sum(map(len, todo)), 0

    def finish(record, table):
        nonlocal done
        saving = time.perf_counter()
        try:
            save(url, record, table, replace=force)
        except ModelExists as e:  # a user row under this family's name: left alone, reported
            record = {**record, "status": "error", "error": str(e)}
        outcome.timings[record["name"]] = {**record.get("timing", {}),
                                           "save_s": round(time.perf_counter() - saving, 4)}
        done += 1
        if record["status"] == "ok":
            outcome.indexed.append(record["name"])
        else:
            outcome.failed[record["name"]] = record["error"]
        if progress:
            progress(record["name"], done, total)

    if jobs <= 1:
        for group in todo:
            for record, table in _records_of_group(group):
                finish(record, table)
        return outcome
    # fork: workers inherit the imported libraries instead of importing them again (seconds each)
    from zoo import analysis, build, structure  # noqa: F401 - imported once here, not in each worker

    # frozen, the libraries' 420,000 objects skip each full collection (workers and saves): 15% of a run, measured
    gc.freeze()
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start,
                                 initargs=(os.getpid(),)) as pool:
            pending = {pool.submit(_build_group_in_worker, group) for group in todo}
            try:
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        for record, table in fut.result():
                            finish(record, table)
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
    finally:
        gc.unfreeze()  # this process is the caller's: its objects are collected as before
    return outcome


def index_one(url: str, name: str, recipe: Recipe, trusted: set[str] | None = None, force: bool = False,
              inputs: list | None = None) -> dict:
    """Index a single model (a user builder); returns its row. force replaces a row of another builder.
    `inputs`: its input spec ([{name, shape, dtype}], the batch first), recorded so it gets FLOPs too.
    A builder zoo refuses (untrusted, the standard library) is an error, and nothing is written."""
    from zoo.build import vetted

    vetted(recipe, trusted)
    # a name taken by another model is refused before anything is built or written (an empty server
    # database, like a missing file, holds none: it is created below)
    if db.exists(url) and db.revision_of(url) is not None:
        with db.session(url) as s:
            store.check_replace(s, name, recipe.family, recipe.builder, force)
    db.open_registry(url, write=True, create=True)
    record, table = record_of(name, recipe, trusted, inputs=inputs)
    save(url, record, table, replace=force)
    return record


def index_checkpoint(url: str, path: str, name: str, force: bool = False) -> dict:
    """Record a weights file's tensors, from its header or a meta-loaded pickle; no data is read."""
    from zoo.families.checkpoint import read_tensors

    table = read_tensors(path)  # a file zoo cannot read is refused before the registry is touched
    db.open_registry(url, write=True, create=True)
    recipe = Recipe("checkpoint", os.path.abspath(path))
    stat = os.stat(path)
    unique = [t for t in table if t.tied_to is None]
    record = dict(
        name=name, family="checkpoint", builder=recipe.builder, kwargs="{}", versions="{}",
        source_hash=source_hash(recipe, {"size": stat.st_size, "mtime": stat.st_mtime_ns}), status="ok",
        error=None, arch=None, task=None, input_size=None,
        dtype=max({t.dtype for t in unique}, key=lambda d: sum(t.bytes for t in unique if t.dtype == d)),
        params=sum(t.numel for t in unique), trainable=sum(t.numel for t in unique), buffers=0,
        tensors=len(unique), param_bytes=sum(t.bytes for t in unique), buffer_bytes=0,
        bytes=sum(t.bytes for t in unique),
    )
    save(url, record, table, replace=force)
    return record


def index_configs(url: str, sources: list[str], name: str | None = None, revision: str | None = None,
                  force: bool = False, progress=None) -> Outcome:
    """Index Hugging Face config sources (config.json files, directories, catalog files, hub repo ids),
    unchanged ones skipped unless force. A source whose config cannot be read is reported as failed;
    the others still go in."""
    from zoo.families import hf

    if name is not None and len(sources) != 1:
        raise InvalidRecipe("--name names one model: give one source with it")
    db.open_registry(url, write=True, create=True)
    versions = hf.versions()
    outcome = Outcome()
    for done, source in enumerate(sources, 1):
        model = source
        try:
            config, default = hf.load_config(source, revision)
            recipe = hf.recipe_of(config)
        except (ZooError, OSError) as e:
            outcome.failed[source] = f"{type(e).__name__}: {e}"
        else:
            model = name or default
            model = model if model.startswith(f"{hf.NAME}/") else f"{hf.NAME}/{model}"
            with db.session(url) as s:
                unchanged = not force and store.ok_hash_of(s, model) == source_hash(recipe, versions)
            if unchanged:
                outcome.unchanged.append(model)
            else:
                record, table = record_of(model, recipe)
                try:
                    save(url, record, table, replace=force)
                except ModelExists as e:
                    record = {**record, "status": "error", "error": str(e)}
                if record["status"] == "ok":
                    outcome.indexed.append(model)
                else:
                    outcome.failed[model] = record["error"]
        if progress:
            progress(model, done, len(sources))
    return outcome
