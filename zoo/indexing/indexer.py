"""Index models: build each on meta in worker processes, record it, commit it in its own transaction."""

import gc
import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

from zoo.caching import register
from zoo.constants import CONSTRUCTOR_TAG
from zoo.errors import InvalidArgument, ModelExists, ZooError, reason
from zoo.families import family
from zoo.indexing.record import record_of, record_with_build, source_hash
from zoo.recipe import Recipe
from zoo.registry import db, store


@dataclass
class Outcome:
    indexed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> error
    timings: dict[str, dict] = field(default_factory=dict)  # name -> seconds: build, analysis, save

    def as_dict(self) -> dict:
        out = {"indexed": len(self.indexed), "unchanged": len(self.unchanged), "failed": self.failed}
        return {**out, "timings": self.timings} if self.timings else out  # built models only


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
            store.drop_weights(
                s, record["name"], [t for t in store.weights_tags(s, record["name"]) if is_constructor_tag(t)]
            )
        for i, (path, sha256, nbytes) in enumerate(shipped):
            store.add_weights(s, record["name"], CONSTRUCTOR_TAG + (f"-{i + 1}" if i else ""), path, sha256, nbytes)


def save_counted(url: str, record: dict, table, replace: bool, outcome: Outcome, refused=(ModelExists,)) -> dict:
    """save, and the record counted in `outcome`: indexed if it is ok, failed with its reason if not. A refusal
    of the name (ModelExists: another model holds it) is that record's failure, not the run's."""
    try:
        save(url, record, table, replace=replace)
    except refused as e:
        record = {**record, "status": "error", "error": str(e)}
    if record["status"] == "ok":
        outcome.indexed.append(record["name"])
    else:
        outcome.failed[record["name"]] = record["error"]
    return record


def workers_for(jobs: int) -> int:
    """Worker processes for -j: at least 1 is asked for, at most the CPU count is used."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise InvalidArgument(f"jobs is a whole number of worker processes >= 1, not {jobs!r}")
    return min(jobs, os.cpu_count() or 1)


def _worker_start(parent: int) -> None:
    """In each forked worker: die with the parent (a kill -9 of the indexer must not leave 0.5 GB
    workers behind). The parent's database connections are left alone (zoo.registry.db, at the fork)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # not Linux: workers then end when their work queue closes
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    # One torch thread: libgomp is not fork-safe. Once the parent has run an OpenMP parallel region, a
    # forked child's first one waits forever for pool threads the fork did not copy (a worker hung in a
    # build's torch.zeros, tests/test_indexer.py). The worker is zoo's own process, one per core (-j),
    # so this process-wide setting changes no one else's threads.
    import torch

    torch.set_num_threads(1)


_known: dict = {}  # structure digest -> analysis, set by _index_groups before its workers fork: they inherit it
# bound: the families' recorded analyses, read whole at the start of an index run (one per distinct structure)
register("recorded analyses", _known, 1_000_000)


def _records_of_group(group: list):
    """Build a group in order (an architecture, then its variants), yielding (record, table): a variant whose
    construction equals its architecture's takes the architecture's build (zoo.construction), and one built
    unchanged reuses the analysis its architecture just recorded in _known."""
    arch = None
    for name, recipe, variant in group:
        record, table, built = record_with_build(name, recipe, variant=variant, known=_known, arch=arch)
        if variant is None:
            arch = built
        yield record, table


def _build_group_in_worker(group: list) -> list:
    return list(_records_of_group(group))


def wanted_variants(family_name: str, patterns=(), results=None) -> dict[str, tuple[Recipe, dict]]:
    """name -> (recipe, published columns) of every pretrained variant of a family matching the patterns; the
    family's published results are read from the folder `results` (default: the family's own, if it has any)."""
    fam = family(family_name)
    rows = fam.variants(patterns, fam.read_results(results))
    return {f"{family_name}/{fam.variant_name(v)}": (Recipe(family_name, v["builder"], v["kwargs"]), v) for v in rows}


def index_family(
    url: str,
    family_name: str,
    patterns=(),
    jobs: int = 1,
    force: bool = False,
    progress=None,
    pretrained: bool = False,
    results=None,
) -> Outcome:
    """Index every model of a family matching the patterns; unchanged ones are skipped. pretrained: its
    pretrained variants instead (a row per published weights; timm's results from the folder `results`).

    `progress(name, done, total)` is called after each model. Ctrl-C stops after the models
    already committed; a re-run continues where this one stopped.
    """
    jobs = workers_for(jobs)
    fam = family(family_name)
    groups: list[list[tuple[str, Recipe, dict | None]]]
    if pretrained:
        variants = wanted_variants(family_name, patterns, results)  # bad input refused before the registry
        groups = [[(name, recipe, variant)] for name, (recipe, variant) in variants.items()]
    elif results is not None:
        raise InvalidArgument("results apply to pretrained variants (pretrained=True)")
    else:
        groups = [[(f"{family_name}/{b}", Recipe(family_name, b), None)] for b in fam.available(patterns)]
    if patterns and not groups:  # a typo would otherwise report "0 indexed" and succeed
        raise InvalidArgument(nothing_matches([family_name], patterns))
    db.open_registry(url, write=True, create=True)  # create or check the schema before any work
    outcome = _index_groups(url, [family_name], groups, jobs, force, progress)
    if not pretrained and fam.results_folder():  # the published columns of architecture rows, as installed's
        record_architecture_columns(url, family_name, fam.read_results(None), patterns)
    return outcome


INSTALLED = ("timm", "torchvision")  # the families `zoo index installed` covers: the vision zoo on this machine


def index_installed(url: str, patterns=(), jobs: int = 1, force: bool = False, progress=None, results=None) -> Outcome:
    """The whole installed vision zoo in one run: every architecture of timm and torchvision matching the
    patterns and every pretrained variant matching them, each architecture followed by its variants in
    the same worker (so the variants that build it unchanged reuse its analysis at once). The same rows as
    index_family run per family and then with pretrained=True; one process and one pool instead of four."""
    jobs = workers_for(jobs)
    readers = [f for f in INSTALLED if family(f).PUBLISHED_RESULTS]  # `results` is their folder (timm's)
    variants = {f: wanted_variants(f, patterns, results if f in readers else None) for f in INSTALLED}
    if patterns and not any(variants.values()) and not any(family(f).available(patterns) for f in INSTALLED):
        raise InvalidArgument(nothing_matches(list(INSTALLED), patterns))
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
    outcome = _index_groups(url, INSTALLED, groups, jobs, force, progress)
    for name in readers:
        record_architecture_columns(url, name, family(name).read_results(results), patterns)
    return outcome


def nothing_matches(families: list[str], patterns) -> str:
    """What to say of patterns that match no model: the patterns of the closest names (vti_* -> vit_*)."""
    import difflib

    names = sorted({n for f in families for n in family(f).available(())})
    close = []
    for pattern in patterns:
        stem = pattern.strip("*?")
        prefixes = sorted({n[: len(stem)] for n in names})
        close += [f"{p}*" for p in difflib.get_close_matches(stem, prefixes, n=3, cutoff=0.6)]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"patterns {', '.join(map(repr, patterns))} match no {' or '.join(families)} model{hint}"


def record_architecture_columns(url: str, family_name: str, results: dict | None, patterns=()) -> int:
    """A family's published columns on its architecture rows (timm's throughput), each at the row's own input size
    (a variant records its own with its published data): data, not a build, so it is set on the stored rows and
    the rows are not rebuilt. Returns how many rows changed."""
    import json

    from sqlalchemy import select, update

    from zoo.registry.tables import models

    fam = family(family_name)
    columns = fam.architecture_columns("", None, {})
    if not columns or results is None:
        return 0
    changed = 0
    with db.session(url, write=True) as s:
        rows = s.execute(
            select(models.c.id, models.c.builder, models.c.input_size, *(models.c[c] for c in columns)).where(
                models.c.family == family_name, models.c.kind == "architecture"
            )
        ).all()
        wanted = set(fam.available(patterns))
        for row in rows:
            if row.builder not in wanted:
                continue
            now = fam.architecture_columns(row.builder, json.loads(row.input_size) if row.input_size else None, results)
            if any(getattr(row, k) != v for k, v in now.items()):
                s.execute(update(models).where(models.c.id == row.id).values(**now))
                changed += 1
        s.commit()
    return changed


def _index_groups(url: str, families, groups: list, jobs: int, force: bool, progress) -> Outcome:
    """Build and save groups of (name, recipe, variant or None), unchanged rows skipped unless force; each
    group is built in order in one worker, and each model is saved in its own transaction as it comes."""
    outcome = Outcome()
    versions = {name: family(name).versions() for name in families}
    with db.session(url) as s:
        _known.clear()
        if not force:
            _known.update({k: v for name in families for k, v in store.analyses_by_digest(s, name).items()})
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
        record = save_counted(url, record, table, force, outcome)  # a user row under this name: left alone, reported
        outcome.timings[record["name"]] = {**record.get("timing", {}), "save_s": round(time.perf_counter() - saving, 4)}
        done += 1
        if progress:
            progress(record["name"], done, total)

    if jobs <= 1:
        for group in todo:
            for record, table in _records_of_group(group):
                finish(record, table)
        return outcome
    # fork: workers inherit the imported libraries instead of importing them again (seconds each)
    from zoo import analysis, build, construction, structure  # noqa: F401 - imported once here, not in each worker

    # frozen, the libraries' 420,000 objects skip each full collection (workers and saves): 15% of a run, measured
    gc.freeze()
    try:
        with ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("fork"), initializer=_worker_start, initargs=(os.getpid(),)
        ) as pool:
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


def index_one(
    url: str,
    name: str,
    recipe: Recipe,
    trusted: set[str] | None = None,
    force: bool = False,
    inputs: list | None = None,
) -> dict:
    """Index a single model (a user builder); returns its row. force replaces a row of another builder.
    `inputs`: its input spec ([{name, shape, dtype}], the batch first), recorded so it gets FLOPs too.
    A builder zoo refuses (untrusted, the standard library) is an error, and nothing is written."""
    from zoo.build import vetted

    vetted(recipe, trusted).importable(recipe.builder)  # a builder that cannot be imported records nothing
    # a name taken by another model is refused before anything is built or written (an empty server
    # database, like a missing file, holds none: it is created below)
    if db.exists(url) and db.revision_of(url) is not None:
        with db.session(url) as s:
            store.check_replace(s, name, recipe.family, recipe.builder, force)
            if inputs is None:  # a re-index without inputs keeps those recorded for this builder
                inputs = store.recorded_inputs(s, name, recipe.family, recipe.builder)
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
        name=name,
        family="checkpoint",
        builder=recipe.builder,
        kwargs="{}",
        versions="{}",
        source_hash=source_hash(recipe, {"size": stat.st_size, "mtime": stat.st_mtime_ns}),
        status="ok",
        error=None,
        arch=None,
        task=None,
        input_size=None,
        dtype=max({t.dtype for t in unique}, key=lambda d: sum(t.bytes for t in unique if t.dtype == d)),
        params=sum(t.numel for t in unique),
        trainable=sum(t.numel for t in unique),
        buffers=0,
        tensors=len(unique),
        param_bytes=sum(t.bytes for t in unique),
        buffer_bytes=0,
        bytes=sum(t.bytes for t in unique),
    )
    save(url, record, table, replace=force)
    return record


def index_configs(
    url: str,
    sources: list[str],
    name: str | None = None,
    revision: str | None = None,
    force: bool = False,
    progress=None,
) -> Outcome:
    """Index Hugging Face config sources (config.json files, directories, catalog files, hub repo ids),
    unchanged ones skipped unless force. A source whose config cannot be read is reported as failed;
    the others still go in."""
    from zoo.families import hf

    if name is not None and len(sources) != 1:
        raise InvalidArgument("name names one model: give one source with it", "name")
    db.open_registry(url, write=True, create=True)
    versions = hf.versions()
    outcome = Outcome()
    for done, source in enumerate(sources, 1):
        model = source
        try:
            config, default = hf.load_config(source, revision)
            recipe = hf.recipe_of(config)
        except Exception as e:  # typed where zoo knows the fault; any other fails this source alone, as a build does
            outcome.failed[source] = f"{type(e).__name__}: {e}" if isinstance(e, (ZooError, OSError)) else reason(e)
        else:
            model = name or default
            model = model if model.startswith(f"{hf.NAME}/") else f"{hf.NAME}/{model}"
            with db.session(url) as s:
                unchanged = not force and store.ok_hash_of(s, model) == source_hash(recipe, versions)
            if unchanged:
                outcome.unchanged.append(model)
            else:
                record, table = record_of(model, recipe)
                # taken, or a name outside the character set: that source's failure
                save_counted(url, record, table, force, outcome, refused=(ModelExists, InvalidArgument))
        if progress:
            progress(model, done, len(sources))
    return outcome
