"""User family: a model built by the user's own `module:function`, imported only from trusted packages."""

import importlib
import os
import sys

from zoo.constants import trusted_modules
from zoo.errors import InvalidRecipe, UntrustedBuilder
from zoo.families import torch_version

NAME = "user"
INPUTS_RECORDED = True  # `zoo index builder --input`: the forward's inputs are the row's, not the builder's to say


def available(patterns=()) -> list[str]:
    return []  # user builders are indexed one by one: `zoo index builder MODULE:FUNCTION`


def split(builder: str) -> tuple[str, str]:
    module, sep, function = builder.partition(":")
    if not sep or not all(p.isidentifier() for p in module.split(".")) or not function.isidentifier():
        raise InvalidRecipe(f"builder must be MODULE:FUNCTION, e.g. mypkg.models:build_net; got {builder!r}")
    return module, function


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    module, _ = split(builder)
    top = module.split(".")[0]
    if top in ("__main__", "zoo"):
        raise UntrustedBuilder(
            f"builder {builder!r} is zoo itself or the running program: name a function of your "
            f"own package, e.g. mypkg.models:build_net"
        )
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise UntrustedBuilder(
            f"builder {builder!r} is from Python's standard library, which builds no models "
            f"(and os:system or builtins:exec would run anything): name a function of your "
            f"own package, e.g. mypkg.models:build_net"
        )
    allowed = trusted_modules() if trusted is None else trusted
    if module.split(".")[0] not in allowed:
        raise UntrustedBuilder(
            f"builder {builder!r} is not from a trusted package; zoo imports user builders only from "
            f"packages listed in ZOO_TRUSTED_MODULES (e.g. ZOO_TRUSTED_MODULES={module.split('.')[0]})"
        )


def importable(builder: str) -> None:
    _function(builder)


def build(builder: str, kwargs: dict):
    return _function(builder)(**kwargs)


def _function(builder: str):
    """The builder's function, its module imported with the current directory on the path: a package in the
    directory zoo runs from needs no PYTHONPATH (it must still be trusted, above). The directory goes last, so
    it never shadows an installed package. An import that fails is the recipe's error (InvalidRecipe)."""
    module, function = split(builder)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        imported = importlib.import_module(module)
    except Exception as e:  # ImportError, or whatever the module's own code raised on import
        raise InvalidRecipe(f"builder {builder!r} cannot be imported: {type(e).__name__}: {e}") from e
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
    found = getattr(imported, function, None)
    if not callable(found):
        raise InvalidRecipe(f"builder {builder!r} cannot be imported: module {module} has no function {function}")
    return found


def describe(builder: str, module, tag: str | None = None) -> dict:
    return {"task": None, "input_size": None}


def versions() -> dict:
    return {"torch": torch_version()}
