"""The meta build: a recipe's module under forced meta, init skipped, downloads blocked."""

import contextlib
import contextvars
import os

from zoo.errors import BuildFailed, RegistryDrift, ZooError
from zoo.families import family
from zoo.offline import no_downloads
from zoo.recipe import Recipe
from zoo.scoped import guard, scope


def vetted(recipe: Recipe, trusted: set[str] | None = None):
    """The recipe's family, once it has vetted the builder; nothing of the builder is imported before."""
    fam = family(recipe.family)
    fam.check(recipe.builder, recipe.kwargs, trusted=trusted)
    return fam


def _run(recipe: Recipe, fam, *contexts):
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(no_downloads())
            for context in contexts:
                stack.enter_context(context)
            return fam.build(recipe.builder, dict(recipe.kwargs))
    except ZooError:
        raise
    except (Exception, SystemExit) as e:  # a builder that calls sys.exit (a CLI's main) ends no index run
        raise BuildFailed(f"{recipe.family}/{recipe.builder}: {type(e).__name__}: {e}") from e


_FILES_READ = contextvars.ContextVar("zoo_files_read", default=None)  # a list inside a meta build


def _loading_on_meta(load):
    def guarded(f, *location_and_pickle_module, **kwargs):
        files_read = _FILES_READ.get()
        if files_read is None:
            return load(f, *location_and_pickle_module, **kwargs)
        if isinstance(f, (str, os.PathLike)):
            files_read.append(os.path.abspath(f))
        rest = {k: v for k, v in kwargs.items() if k not in ("map_location", "pickle_module", "weights_only", "mmap")}
        return load(f, map_location="meta", weights_only=True, **rest)

    return guarded


def loads_on_meta(files_read: list):
    """torch.load inside a meta build reads no data: a constructor that loads its own shipped weights
    gets them on meta (weights_only: a pickle's code never runs), and the files are noted in files_read.
    Only this thread's build: a materialize beside it in another thread loads for real."""
    import torch

    guard(torch, "load", _loading_on_meta)
    return scope(_FILES_READ, files_read)


def build_meta(
    recipe: Recipe, trusted: set[str] | None = None, keep_all_values: bool = False, files_read: list | None = None
):
    """The module of `recipe` with every tensor on meta. Constructed values of small tensors ride
    along (zoo.meta); keep_all_values keeps them at any size, for materialize's non-persistent buffers.
    Files the constructor reads with torch.load are appended to files_read (see loads_on_meta)."""
    import sys

    from zoo.meta import SHADOW_LIMIT, force_meta

    fam = vetted(recipe, trusted)
    return _run(
        recipe,
        fam,
        loads_on_meta([] if files_read is None else files_read),
        force_meta(sys.maxsize if keep_all_values else SHADOW_LIMIT),
    )


def build_real(recipe: Recipe, device):
    """The model built eagerly, exactly as its own constructor builds it (init and RNG draws included)."""
    import torch

    return _run(recipe, vetted(recipe, None), torch.device(device))


def cast_meta(module, dtype) -> None:
    """A meta module's floating tensors in `dtype`, as timm.create_model(..., dtype=) builds them; the
    values their constructor computed (zoo.meta shadows) stay with them."""

    def cast(t):
        if not t.is_floating_point():
            return t
        new = t.to(dtype)
        new.__dict__.update(t.__dict__)
        return new

    module._apply(cast)


def check_against_record(name: str, module, recorded) -> None:
    """A build must match its row (its recorded tensor table): the installed library may differ from the
    one that indexed it."""
    from zoo.inspection import inspect_module

    want = {t.name: (t.shape, t.dtype) for t in recorded}
    got = {t.name: (t.shape, t.dtype) for t in inspect_module(module).tensor_table}
    if want != got:
        diff = sorted(set(want.items()) ^ set(got.items()))[:5]
        raise RegistryDrift(
            f"{name}: the installed library builds other tensors than the registry records "
            f"(first differences: {diff}); re-index it with `zoo index`"
        )
