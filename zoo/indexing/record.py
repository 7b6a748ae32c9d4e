"""One model's registry row: its meta build, what its family says of it, its tensor table and its analysis.

A variant built right after its architecture takes the architecture's build where its construction is the same
(zoo.construction), and an analysis is reused where the same module was analysed at the same input, or where a
module of the same structure was (zoo.structure). zoo.indexing.indexer runs this in its workers and saves what it gives.
"""

import contextlib
import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field

from zoo.columns import BY_NAME
from zoo.constants import plan_fits_enabled
from zoo.errors import ZooError, reason
from zoo.families import family
from zoo.planning import shape_groups
from zoo.recipe import Recipe

# Bump when what a build records changes: every model is then rebuilt on the next index.
RECORD_VERSION = 3  # 2: analysis columns (flops, macs, activation bytes, output shapes, scan status); 3: inputs,
# flops_per_token, LLM fields, hf input specs
# Bump when a row gains columns that need no new analysis: every row is rebuilt, its analysis reused (RECORD_VERSION
# is part of the structure digest, which keys analyses; this is not). 1: load_args; 2: plan_shapes, and
# plan_activations, measured alone where a reused analysis lacks them (_analysis_at).
ROW_VERSION = 2


def source_hash(recipe: Recipe, versions: dict, variant: dict | None = None) -> str:
    """Identifies everything a build depends on; an unchanged hash means an unchanged row. A variant's
    published metadata (metrics, source, preprocessing) is part of it: new results re-record it."""
    key = json.dumps(
        [RECORD_VERSION, ROW_VERSION, recipe.family, recipe.builder, recipe.kwargs, versions]
        + ([variant] if variant else []),
        sort_keys=True,
    )
    return hashlib.sha256(key.encode()).hexdigest()


def record_of(
    name: str,
    recipe: Recipe,
    trusted: set[str] | None = None,
    variant: dict | None = None,
    inputs: list | None = None,
    known: dict | None = None,
) -> tuple[dict, list | None]:
    """Build one model on meta and describe it: the registry row and its tensor table.
    A build that fails gives a row with status "error" and the reason, never an exception.
    variant: a pretrained variant's published columns (a family's variants()); they are recorded even
    when the build fails, and its analysis runs at the weights' own input size. `inputs`: a user
    model's input spec (zoo.analysis.inputs.parse_inputs), for a family that documents none. `known`:
    structure digest -> analysis columns already recorded; a build with a known digest reuses its analysis,
    and a new one is added to it (zoo.structure)."""
    record, table, _ = record_with_build(name, recipe, trusted, variant, inputs, known)
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
    from zoo.construction import watch
    from zoo.inspection import inspect_module

    files_read: list[str] = []
    watching = fam.CONSTRUCTION_DECIDES
    stop_at = arch.construction if arch is not None else None
    with warnings.catch_warnings():  # builders' deprecation chatter would bury the progress bar
        warnings.simplefilter("ignore")
        with watch(stop_at) if watching else contextlib.nullcontext() as seen:
            module = build_meta(recipe, trusted, files_read=files_read)
    if seen is not None and seen.stopped:
        assert arch is not None  # watch stops only at stop_at, arch's construction
        return arch, True
    construction = seen.call if seen is not None and seen.first is module else None
    return _Built(module, inspect_module(module), sorted(set(files_read)), construction), False


def record_with_build(name, recipe, trusted=None, variant=None, inputs=None, known=None, arch=None):
    """record_of, with the build it made (None if it failed); `arch`: the build of a variant's architecture, made
    just before in this process (the build is passed on to the next variant)."""
    fam = family(recipe.family)
    versions = fam.versions()
    base = dict(
        name=name,
        family=recipe.family,
        builder=recipe.builder,
        kwargs=recipe.kwargs_json(),
        versions=json.dumps(versions, sort_keys=True),
        source_hash=source_hash(recipe, versions, variant),
        **_variant_columns(variant),
    )
    started = time.perf_counter()
    try:
        built, same = _build(recipe, trusted, fam, arch)
        module, summary = built.module, built.summary
        from zoo.analysis.inputs import described as row_inputs  # the one resolver scan and estimate use too

        described = row_inputs(recipe, module, variant["tag"] if variant else None, inputs)
        llm = {}
        if fam.LANGUAGE_MODEL:  # language-model fields from the built module and its config
            from zoo.analysis.llm import llm_fields

            llm = llm_fields(module, module.config)
    except Exception as e:  # recorded, not raised: one broken model must not stop an index run
        return (
            {
                **base,
                "status": "error",
                "error": _failure(e),
                "timing": {"build_s": round(time.perf_counter() - started, 4)},
            },
            None,
            None,
        )
    built_at = time.perf_counter()
    spec = described.get("input")
    digest, analysis, reused = _analysis_at(built, spec, base["versions"], known)
    test_size = (variant or {}).get("test_input_size")
    if test_size and spec and len(spec.get("args", ())) == 1:  # the cost at timm's larger test size too
        at_test = _analysis_at(built, {**spec, "args": [list(test_size)]}, base["versions"], known)[1]
        analysis = {**analysis, "test_flops": at_test.get("flops")}
    cls = type(module)
    row = {
        # seconds per stage, for `zoo index --json` (not a column: write_model takes only COLUMNS)
        "timing": {
            "build_s": round(built_at - started, 4),
            "build_reused": same,
            "analysis_s": round(time.perf_counter() - built_at, 4),
            "analysis_reused": reused,
        },
        "structure_digest": digest,
        **base,
        "status": "ok",
        "error": None,
        "arch": f"{cls.__module__}.{cls.__qualname__}",
        "constructor_files": built.files,  # recorded as weights tags, not a column
        "task": base.get("task") or described["task"],
        "input_size": BY_NAME["input_size"].encode(described["input_size"] or None),
        "dtype": summary.dtype,
        "params": summary.params,
        "trainable": summary.trainable,
        "buffers": summary.buffers,
        "tensors": summary.tensors,
        "param_bytes": summary.param_bytes,
        "buffer_bytes": summary.buffer_bytes,
        "bytes": summary.bytes,
        "plan_shapes": BY_NAME["plan_shapes"].encode(shape_groups(summary.tensor_table)),
        **analysis,
        **llm,
        "load_args": BY_NAME["load_args"].encode(fam.load_arguments(recipe.builder, recipe.kwargs)),
    }
    too_large = _out_of_range(row, recipe.kwargs)
    if too_large:
        return {**base, "status": "error", "error": f"InvalidRecipe: {too_large}", "timing": row["timing"]}, None, None
    return row, summary.tensor_table, built


def _analysis_at(built: _Built, spec, versions: str, known: dict | None) -> tuple:
    """(structure digest, analysis columns, reused) of a build at an input spec: this very module's analysis at
    that input if it ran (a variant's construction equal to its architecture's), else a known one of the same
    structure, else a new one."""
    at = json.dumps(spec, sort_keys=True)
    if at in built.analysed:
        return *built.analysed[at], True
    from zoo.structure import structure_digest

    # the analysis also depends on the libraries and on zoo's analysis code: both are part of the key
    digest = structure_digest(built.module, (spec, versions, RECORD_VERSION))
    reused = known is not None and digest in known
    analysis = dict(known[digest]) if known is not None and reused else _analyze(built.module, spec)
    if analysis.get("scan_status") == "ok" and analysis.get("plan_activations") is None and plan_fits_enabled():
        # recorded before them: the fits alone
        analysis["plan_activations"] = BY_NAME["plan_activations"].encode(_plan_fits(built.module, spec))
    if analysis.get("scan_status") == "ok":  # a timeout or an error is not passed on
        built.analysed[at] = digest, analysis
        if known is not None and digest is not None:
            known[digest] = analysis
    return digest, analysis, reused


_INT_BITS = {c.name: 64 if c.wide else 32 for c in BY_NAME.values() if c.kind == "int"}


def _failure(e: Exception) -> str:
    """A recorded failure: zoo's typed error first (BuildFailed, InvalidRecipe, ...), then the library's own
    exception it wraps and the model code it came from, so a reader can both sort failures and find their cause."""
    if not isinstance(e, ZooError):
        return f"BuildFailed: {reason(e)}"  # describe or the LLM fields reading what the constructor made
    if e.__cause__ is None:
        return reason(e)
    return f"{type(e).__name__}: {reason(e.__cause__)}"


def _out_of_range(row: dict, kwargs: dict) -> str | None:
    """Why a row cannot be stored: an integer column past the registry's integers (a config's vocab_size 10**15
    or image_size 10**6 makes FLOPs past 2**63), naming the recipe's largest number, its likely cause."""
    for name, bits in _INT_BITS.items():
        value = row.get(name)
        if isinstance(value, int) and not -(1 << bits - 1) <= value < 1 << bits - 1:
            key, largest = _largest_number(kwargs)
            cause = f"; the recipe's largest number: {key} = {largest}" if key else ""
            return (
                f"{name} is a {len(str(abs(value)))}-digit number, past the registry's {bits}-bit integers: "
                f"sizes beyond any real model's{cause}"
            )
    return None


def _largest_number(kwargs: dict) -> tuple[str | None, int]:
    """The dotted key of the largest integer in a recipe's kwargs, at any depth, and the integer."""
    best: tuple[str | None, int] = (None, 0)
    todo: list[tuple[dict | list, str]] = [(kwargs, "")]
    while todo:
        value, path = todo.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if type(item) is int and abs(item) > abs(best[1]):
                best = where, item
            elif isinstance(item, (dict, list)):
                todo.append((item, where))
    return best


_VARIANT_KEYS = ("builder", "kwargs")  # a variant's recipe, not columns


def _variant_columns(variant: dict | None) -> dict:
    """A variant's published fields as the registry stores them (JSON columns encoded)."""
    if not variant:
        return {}
    return {k: BY_NAME[k].encode(v) for k, v in variant.items() if k not in _VARIANT_KEYS}


def _plan_fits(module, spec) -> dict | None:
    """The plan_activations of an analysis recorded before zoo recorded them (zoo.analysis.plan_record)."""
    from zoo.analysis.plan_record import plan_activations

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_activations(module, spec)


def _analyze(module, spec) -> dict:
    """FLOPs, activation bytes and output shapes from forwards of the same meta module (zoo.analysis);
    a forward that cannot run on meta is recorded with its reason, and the model still indexes."""
    from zoo.analysis import analyze

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(module, spec).columns()
