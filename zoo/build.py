"""The meta build: a recipe's module under forced meta, init skipped, downloads blocked."""

import contextlib
import os

from zoo.errors import BuildFailed, DownloadBlocked, ZooError
from zoo.families import family
from zoo.recipe import Recipe


@contextlib.contextmanager
def no_downloads():
    """Make torch.hub and huggingface_hub refuse the network for the duration of a build."""
    import torch.hub

    def refuse(url, *args, **kwargs):
        raise DownloadBlocked(f"a meta build tried to download {url}; builds never download")

    saved_hub = torch.hub.download_url_to_file
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    torch.hub.download_url_to_file = refuse
    os.environ["HF_HUB_OFFLINE"] = "1"
    hf_constants = _hf_constants()
    saved_hf = hf_constants.HF_HUB_OFFLINE if hf_constants else None
    if hf_constants:
        hf_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        torch.hub.download_url_to_file = saved_hub
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env
        if hf_constants:
            hf_constants.HF_HUB_OFFLINE = saved_hf


def _hf_constants():
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    return constants


def _vetted(recipe: Recipe, trusted: set[str] | None):
    """The recipe's family, once it has vetted the builder; nothing of the builder is imported before."""
    fam = family(recipe.family)
    if trusted is not None and recipe.family == "user":
        fam.check(recipe.builder, recipe.kwargs, trusted=trusted)
    else:
        fam.check(recipe.builder, recipe.kwargs)
    return fam


def _run(recipe: Recipe, fam, context):
    try:
        with no_downloads(), context:
            return fam.build(recipe.builder, dict(recipe.kwargs))
    except ZooError:
        raise
    except Exception as e:
        raise BuildFailed(f"{recipe.family}/{recipe.builder}: {type(e).__name__}: {e}") from e


def build_meta(recipe: Recipe, trusted: set[str] | None = None, keep_all_values: bool = False):
    """The module of `recipe` with every tensor on meta. Constructed values of small tensors ride
    along (zoo.meta); keep_all_values keeps them at any size, for materialize's non-persistent buffers."""
    import sys

    from zoo.meta import SHADOW_LIMIT, force_meta

    fam = _vetted(recipe, trusted)
    return _run(recipe, fam, force_meta(sys.maxsize if keep_all_values else SHADOW_LIMIT))


def build_real(recipe: Recipe, device):
    """The model built eagerly, exactly as its own constructor builds it (init and RNG draws included)."""
    import torch

    return _run(recipe, _vetted(recipe, None), torch.device(device))
