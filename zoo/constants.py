"""Every environment variable zoo reads, and the defaults they override."""

import os
from pathlib import Path

# The shipped registry: a file inside the installed package; in a checkout, zoo/registry.db links to
# the registry.db at the repository root.
DEFAULT_REGISTRY = (Path(__file__).parent / "registry.db").resolve()


def registry_url() -> str:
    """ZOO_REGISTRY: a SQLAlchemy URL or a file path; the shipped registry.db by default."""
    value = os.environ.get("ZOO_REGISTRY", "").strip()
    if not value:
        return f"sqlite:///{DEFAULT_REGISTRY}"
    return value if "://" in value else f"sqlite:///{Path(value).expanduser().resolve()}"


def trusted_modules() -> set[str]:
    """ZOO_TRUSTED_MODULES: comma-separated top-level packages whose user builders zoo may import."""
    return {m.strip() for m in os.environ.get("ZOO_TRUSTED_MODULES", "").split(",") if m.strip()}


def lock_timeout_s() -> float:
    """ZOO_LOCK_TIMEOUT: seconds a writer waits for another writer's lock on a SQLite registry (default 60)."""
    value = os.environ.get("ZOO_LOCK_TIMEOUT", "").strip()
    try:
        return max(float(value), 0.0) if value else 60.0
    except ValueError:
        return 60.0
