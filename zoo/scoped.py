"""Effects scoped to a build instead of swapped process-wide.

A library function that a build must change (torch.hub's download, huggingface_hub's offline check,
timm's load_pretrained) is replaced once, for good, by a guard that asks a ContextVar whether the
calling thread (or asyncio task) is inside a scope, and otherwise calls the function it replaced.
Swapping the function for the length of a build instead changed it for every other thread at the
same time, and two overlapping builds restored each other's swaps in the wrong order.

A ContextVar is per thread: a new thread starts outside every scope, so threads a builder starts
itself are not covered; asyncio tasks and contextvars.copy_context().run carry the scope along.
"""

import contextlib
import contextvars
import functools
import threading

_INSTALLING = threading.Lock()


def guard(owner, name: str, make) -> None:
    """Replace owner.name by make(original), once: a second call (from any thread) finds the guard in place.

    Code that bound the name before (`from torch.hub import download_url_to_file`) keeps the original;
    code that binds it later gets the guard, which outside a scope is the original."""
    with _INSTALLING:
        current = getattr(owner, name)
        if getattr(current, "_zoo_guard", None) is make:
            return
        wrapper = functools.wraps(current)(make(current))
        wrapper._zoo_guard = make  # type: ignore[attr-defined]  # a marker attribute on the wrapper function
        setattr(owner, name, wrapper)


@contextlib.contextmanager
def scope(var: contextvars.ContextVar, value):
    """var is value for this thread's (task's) code until the block ends, however it ends; nested scopes
    restore the outer value."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
