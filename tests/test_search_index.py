"""The search's trigram index for name globs (migration 0005) stays in step with every write path: index,
re-index, remove, a raw rename, db copy with --replace; globs through it give what fnmatch gives."""

import fnmatch
import sqlite3

import zoo

NAMES = ["vision_a", "VITality", "resnet_vit", "plain"]
GLOBS = ["*vit*", "*VIT*", "user/res*", "vit*", "*ali*", "*a?i*", "*_vit", "*lain"]


def _consistent(url: str) -> None:
    """FTS5's own check that the trigram index matches the models table (a stale entry also makes a glob
    search fail with 'database disk image is malformed')."""
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        con.execute("INSERT INTO models_fts(models_fts, rank) VALUES ('integrity-check', 1)")
    finally:
        con.close()


def _globs_agree(registry) -> None:
    names = [i.name for i in registry.search(None)]
    for glob in GLOBS:
        want = {
            n
            for n in names
            if fnmatch.fnmatchcase(n.lower(), glob.lower())
            or fnmatch.fnmatchcase(n.split("/", 1)[1].lower(), glob.lower())
        }
        assert {i.name for i in registry.search(f"name~'{glob}'")} == want, glob


def test_trigram_index_follows_every_write(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    registry = zoo.connect(url)
    for name in NAMES:
        registry.index_builder("tests.builders:tied_net", name, {"dim": 4})
    _consistent(url)
    _globs_agree(registry)
    registry.index_builder("tests.builders:tied_net", "vision_a", {"dim": 8}, force=True)  # updated in place
    registry.remove("user/plain")
    _consistent(url)
    _globs_agree(registry)
    con = sqlite3.connect(tmp_path / "a.db")  # a rename by hand: the update trigger
    con.execute("UPDATE models SET name = 'user/plainvit', short = 'plainvit' WHERE name = 'user/resnet_vit'")
    con.commit()
    con.close()
    _consistent(url)
    _globs_agree(registry)
    assert "user/plainvit" in {i.name for i in registry.search("name~'*nvi*'")}

    other = f"sqlite:///{tmp_path / 'b.db'}"
    zoo.connect(other).index_builder("tests.builders:tied_net", "vitamin", {"dim": 4})
    registry.copy_to(other, replace=True)  # the target's rows deleted, the source's inserted
    _consistent(other)
    _globs_agree(zoo.connect(other))
    assert {i.name for i in zoo.connect(other).search("name~'*vit*'")} == {"user/VITality", "user/plainvit"}
