"""Every cache zoo keeps for the life of a process, each with its bound, and one reset: zoo.cache_clear().

A module that keeps one registers it here at import: a name, how to empty it, how full it is and the most
it may hold. `zoo.caches()` reports them (tests/test_layout.py checks that no module keeps an unregistered
one), and `zoo.cache_clear()` empties them all, e.g. after installing another timm in a long-lived process.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cache:
    name: str
    clear: Callable[[], None]
    size: Callable[[], int]
    bound: int  # entries; where it is full the module empties it (or drops its oldest) before adding


_ALL: dict[str, Cache] = {}


def register(
    name: str,
    store=None,
    bound: int = 0,
    clear: Callable[[], None] | None = None,
    size: Callable[[], int] | None = None,
) -> None:
    """Register a dict or set (or, with clear and size, anything else) as the cache `name`."""
    _ALL[name] = Cache(name, clear or store.clear, size or (lambda: len(store)), bound)


def trim(store, bound: int) -> None:
    """Empty a dict or set that is full, before an entry goes in: what comes next matters most."""
    if len(store) >= bound:
        store.clear()


def caches() -> dict[str, tuple[int, int]]:
    """The size of every cache zoo keeps in this process (of the modules imported so far).

    Returns:
        name -> (entries now, bound).

    It raises nothing.

    Examples:
        >>> all(size <= bound for size, bound in zoo.caches().values())
        True
    """
    return {c.name: (c.size(), c.bound) for c in _ALL.values()}


def cache_clear() -> None:
    """Empty every cache zoo keeps in this process: registry engines are disposed of (their connections closed),
    built templates are built again when next asked.

    Returns:
        None.

    It raises nothing.

    Examples:
        >>> zoo.cache_clear()
    """
    for c in _ALL.values():
        c.clear()
