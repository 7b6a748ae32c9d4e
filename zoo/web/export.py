"""`zoo catalog --out DIR`: the catalog's pages as static files for hosting without zoo.

DIR/index.html       the search page; static/grammar.js runs the whole search grammar over data/index.json
DIR/model.html       the model page (?name=NAME), from data/models/<file_name(NAME)>.json
DIR/static/          the same scripts and style the server sends
DIR/data/            index.json (every model's searchable fields) and one JSON per model: its info,
                     its whole tensor table, and with trees=True its module tree (a meta forward each)

A new export is written beside DIR and swapped in whole: a failure leaves the previous one as it was.
Anything else at DIR's top level beside an earlier export (CNAME, .nojekyll, .git) is moved into the new one.
Browsers refuse fetch() on file:// pages, so serve DIR over HTTP (any static server will do).
Estimates need torch: the static model page shows the command instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from pathlib import Path

from zoo.api import Zoo
from zoo.errors import CatalogError, ZooError
from zoo.web import views
from zoo.web.app import STATIC, page

_PLAIN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_PART = 120  # characters of a data file's path per folder or file name: far below any file system's 255 bytes
_OWN = {"index.html", "model.html", "static", "data"}  # an export's top level; the rest of --out is carried over


def file_name(name: str) -> str:
    """A model's data file: every byte outside [A-Za-z0-9-] as _XX, so no name can leave data/models
    ('/', '..') or collide; a name past 120 such characters (a 255-character name can take 765) goes into
    folders of 120 each, so that no part is too long for the file system. static/format.js computes the same."""
    plain = "".join(chr(b) if chr(b) in _PLAIN else f"_{b:02x}" for b in name.encode())
    return "/".join(plain[i : i + _PART] for i in range(0, len(plain), _PART)) + ".json"


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":"), allow_nan=False))  # strict: JSON.parse reads it


def export_catalog(out, url: str | None = None, trees: bool = False, progress=None) -> dict:
    """Write the static catalog of the registry at `url` into `out`; returns {"models": n, "out": path}.
    progress(name, done, total) after each model."""
    zoo = Zoo(url)
    out = Path(out).expanduser().resolve()  # a link to the served folder stays a link
    index = views.catalog_index(zoo)
    earlier = out.is_dir() and (out / "data" / "index.json").is_file()
    if out.exists() and not earlier and (not out.is_dir() or any(out.iterdir())):
        raise CatalogError(
            f"{out} is not empty and holds no earlier export, which zoo catalog replaces whole: give "
            f"a new or empty folder"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        new = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    except OSError as e:
        raise CatalogError(f"cannot write the catalog beside {out}: {e}") from None
    try:
        _write_site(new, zoo, index, trees, progress)
        new.chmod(0o755)  # mkdtemp's folder is the owner's alone; a served site is read by others
        kept: list[str] = []
        try:
            if earlier:
                _carry(out, new, kept)
            _swap(new, out)
        except OSError:
            for name in kept:  # back where they were, beside the previous export
                (new / name).rename(out / name)
            raise
    except OSError as e:
        raise CatalogError(f"cannot write the catalog to {out} ({e}); the previous export is as it was") from None
    finally:
        shutil.rmtree(new, ignore_errors=True)  # the new export if it failed, the previous one once swapped
    return {"models": len(index["models"]), "out": str(out)}


def _write_site(out: Path, zoo: Zoo, index: dict, trees: bool, progress) -> None:
    shutil.copytree(STATIC, out / "static")
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
        _write(out / "data" / "models" / file_name(row["name"]), data)
        if progress:
            progress(row["name"], done, total)
    _write(out / "data" / "index.json", index)


def _carry(old: Path, new: Path, kept: list[str]) -> None:
    """Move the top-level entries of the earlier export `old` that an export does not own into `new` (the
    same file system), naming each in `kept` once moved."""
    for entry in sorted(old.iterdir()):
        if entry.name not in _OWN:
            entry.rename(new / entry.name)
            kept.append(entry.name)


def _swap(new: Path, out: Path) -> None:
    """Put the folder `new` at `out` in one step; an earlier `out` ends up at `new`. Linux exchanges the two
    atomically (renameat2 RENAME_EXCHANGE); elsewhere, or on a file system without it, two renames."""
    if not out.exists():
        new.rename(out)
        return
    try:
        exchanged = ctypes.CDLL(None, use_errno=True).renameat2(-100, os.fsencode(new), -100, os.fsencode(out), 2) == 0
    except (OSError, AttributeError):  # not Linux, or a C library without renameat2
        exchanged = False
    if not exchanged:
        _swap_by_renames(new, out)


def _swap_by_renames(new: Path, out: Path) -> None:
    """_swap without renameat2: `out` aside, `new` to `out`, the old one to `new`; the first undone if the
    second fails."""
    out.rename(aside := new.with_name(new.name + "-old"))
    try:
        new.rename(out)
    except OSError:
        aside.rename(out)
        raise
    aside.rename(new)
