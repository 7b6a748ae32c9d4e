"""Every environment variable zoo reads, the defaults they override, and names both the reader and the writer use."""

import os
from pathlib import Path

# The shipped registry: a file inside the installed package; in a checkout, zoo/registry.db links to
# the registry.db at the repository root.
DEFAULT_REGISTRY = (Path(__file__).parent / "registry.db").resolve()


def registry_url(value: str | os.PathLike | None = None) -> str:
    """A registry's SQLAlchemy URL from a URL or a file path; without one, ZOO_REGISTRY, else the shipped
    registry.db."""
    value = str(value if value is not None else os.environ.get("ZOO_REGISTRY", "")).strip()
    if not value:
        return f"sqlite:///{DEFAULT_REGISTRY}"
    return value if "://" in value else f"sqlite:///{Path(value).expanduser().resolve()}"


def registry_named(value: str | os.PathLike | None = None) -> bool:
    """Whether a registry is named (a value, or ZOO_REGISTRY) rather than the shipped registry.db by default."""
    return bool(str(value if value is not None else os.environ.get("ZOO_REGISTRY", "")).strip())


def user_registry() -> Path:
    """A user's own registry, where the refusal below points: $XDG_DATA_HOME/zoo/registry.db, else
    ~/.local/share/zoo/registry.db."""
    return (
        Path(os.environ.get("XDG_DATA_HOME", "").strip() or Path.home() / ".local" / "share").expanduser()
        / "zoo"
        / "registry.db"
    )


def refuse_unnamed_write():
    """The shipped registry is read-only to zoo unless it is named (--registry, ZOO_REGISTRY, connect(PATH)): the
    README's write examples would otherwise change the file a checkout tracks and an install shares."""
    from zoo.errors import RegistryError

    mine = user_registry()
    raise RegistryError(
        f"the shipped registry {DEFAULT_REGISTRY} is read-only to zoo unless it is named. Write to "
        f"a registry of your own: `mkdir -p {mine.parent} && zoo db copy {DEFAULT_REGISTRY} {mine}`, "
        f"then `export ZOO_REGISTRY={mine}` (or --registry {mine}; zoo.connect(PATH) in Python). To "
        f"change the shipped file itself, name it: --registry {DEFAULT_REGISTRY}"
    )


def trusted_modules() -> set[str]:
    """ZOO_TRUSTED_MODULES: comma-separated top-level packages whose user builders zoo may import."""
    return {m.strip() for m in os.environ.get("ZOO_TRUSTED_MODULES", "").split(",") if m.strip()}


def lock_timeout_s() -> float:
    """ZOO_LOCK_TIMEOUT: seconds a writer waits for another writer's lock (SQLite's busy timeout, PostgreSQL's
    lock_timeout; default 60)."""
    import math

    from zoo.errors import InvalidArgument

    value = os.environ.get("ZOO_LOCK_TIMEOUT", "").strip()
    if not value:
        return 60.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 <= seconds <= 86_400:
        raise InvalidArgument(f"ZOO_LOCK_TIMEOUT is a number of seconds from 0 to 86400, not {value!r}")
    return seconds


def kernel_cache_enabled() -> bool:
    """ZOO_KERNEL_CACHE=0: the meta forwards of scan, estimate and the index compute every op, none answered from
    remembered ones (zoo.analysis.kernel_cache); any other value or none: they are."""
    return os.environ.get("ZOO_KERNEL_CACHE", "1").strip() != "0"


def plan_fits_enabled() -> bool:
    """ZOO_PLAN_FITS=0: zoo index records no activation fits for zoo.plan (zoo.analysis.plan_record), several times
    faster for language models; a plan of such a row measures on meta, and search --fits names it. Any other value
    or none: they are recorded."""
    return os.environ.get("ZOO_PLAN_FITS", "1").strip() != "0"


def cache_dir() -> Path:
    """ZOO_CACHE: where zoo keeps what it may recompute (which weights files it has hash-checked);
    default $XDG_CACHE_HOME/zoo, else ~/.cache/zoo."""
    value = os.environ.get("ZOO_CACHE", "").strip()
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache").expanduser() / "zoo"


# The weights tag of files a constructor reads itself (a builder's own checkpoint): the indexer records it,
# materialize reads it, so it lives below both (the read path imports no writer, hence no SQLAlchemy).
CONSTRUCTOR_TAG = "constructor"
