"""A model's row as the readers above the registry take it (zoo.api, zoo.load): through zoo.registry.lite on a
SQLite file, without importing SQLAlchemy, else through the store. Here, not in zoo.load, so that `zoo show` and
zoo.info import nothing of the load layer."""

from __future__ import annotations

from zoo.columns import check_name

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `zoo search` process

if TYPE_CHECKING:
    from zoo.model_info import ModelInfo


def row_of(url: str, name: str, tensors: bool = False) -> tuple[ModelInfo, str]:
    """A model's ModelInfo (with its weights, and its tensor table when asked) and source hash, in one
    snapshot: through zoo.registry.lite on a SQLite file (no SQLAlchemy import), else SQLAlchemy."""
    from zoo.registry import lite

    found = lite.info(url, check_name(name), tensors)
    if found is not None:
        return found
    from zoo.registry import db, store

    with db.session(url) as s:
        row = store.resolve(s, name)
        return store.info(s, row.name, tensors), row.source_hash
