"""`zoo catalog --out DIR`: the catalog's pages as static files for hosting without zoo.

DIR/index.html       the search page; static/grammar.js runs the whole search grammar over data/index.json
DIR/model.html       the model page (?name=NAME), from data/models/<file_name(NAME)>.json
DIR/static/          the same scripts and style the server sends
DIR/data/            index.json (every model's searchable fields) and one JSON per model: its info,
                     its whole tensor table, and with trees=True its module tree (a meta forward each)

Browsers refuse fetch() on file:// pages, so serve DIR over HTTP (any static server will do).
Estimates need torch: the static model page shows the command instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from zoo.api import Zoo
from zoo.errors import ZooError
from zoo.web import views
from zoo.web.app import STATIC, page

_PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def file_name(name: str) -> str:
    """A model's data file: every byte outside [A-Za-z0-9-] as _XX, so no name can leave data/models
    ('/', '..') or collide; static/format.js computes the same."""
    return "".join(chr(b) if chr(b) in _PLAIN else f"_{b:02x}" for b in name.encode()) + ".json"


def _write(path: Path, data) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")))


def export_catalog(out, url: str | None = None, trees: bool = False, progress=None) -> dict:
    """Write the static catalog of the registry at `url` into `out`; returns {"models": n, "out": path}.
    progress(name, done, total) after each model."""
    zoo = Zoo(url)
    out = Path(out)
    index = views.catalog_index(zoo)
    models_dir = out / "data" / "models"
    if models_dir.is_dir() and (out / "data" / "index.json").is_file():
        shutil.rmtree(models_dir)  # an earlier export: drop models removed since
    models_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(STATIC, out / "static", dirs_exist_ok=True)
    (out / "index.html").write_text(page("search.html", "zoo catalog", "", {"mode": "static"}))
    (out / "model.html").write_text(page("model.html", "zoo catalog", "", {"mode": "static"}))
    total = len(index["models"])
    for done, row in enumerate(index["models"], 1):
        data = {"model": views.model(zoo, row["name"], whole=True), "tree": None}
        if trees:
            try:
                data["tree"] = views.tree(zoo, row["name"])
            except ZooError as e:
                data["tree"] = {"failure": views.error(e)[1]}
        _write(models_dir / file_name(row["name"]), data)
        if progress:
            progress(row["name"], done, total)
    _write(out / "data" / "index.json", index)
    return {"models": total, "out": str(out.resolve())}
