"""`zoo catalog` replaces an earlier export whole or not at all, under file names every file system takes."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from tests.conftest import ROOT, run_cli
from zoo.web.export import export_catalog, file_name

TIED = "tests.builders:tied_net"
# 120 characters, each '.' and '_' 3 in a file name: 279 bytes, past the 255 every common file system allows
LONG = "user/" + "a._" * 38 + "z"


@pytest.fixture
def registry(tmp_path) -> str:
    path = tmp_path / "r.db"
    zoo.connect(str(path)).index_builder(TIED, "tied")
    return str(path)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _catalog(registry: str, out: Path, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """`zoo catalog`; with file_size_limit in its own process, under that RLIMIT_FSIZE, so that writing fails
    midway (EFBIG)."""
    if file_size_limit is None:
        return run_cli("--registry", registry, "catalog", "--out", str(out), "--quiet", check=False)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(
        [sys.executable, "-m", "zoo.cli", "--registry", registry, "catalog", "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_28_7_a_failed_export_leaves_the_previous_one_whole(registry, tmp_path):
    out = tmp_path / "out" / "site"
    export_catalog(out, f"sqlite:///{registry}")
    before = _tree(out)
    assert f"data/models/{file_name('user/tied')}" in before
    zoo.connect(registry).index_builder(TIED, "second")
    failed = _catalog(registry, out, file_size_limit=2048)  # the static scripts alone are larger
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert "the previous export" in failed.stderr and str(out) in failed.stderr
    assert _tree(out) == before  # index.json and every file it names, as they were
    assert sorted(p.name for p in out.parent.iterdir()) == ["site"]  # nothing left aside


def test_28_7_a_long_name_gets_bounded_file_names_and_a_rerun_replaces_the_export_whole(registry, tmp_path):
    out = tmp_path / "out" / "site"
    export_catalog(out, f"sqlite:///{registry}")
    zoo.connect(registry).index_builder(TIED, LONG)
    zoo.connect(registry).remove("user/tied")
    done = _catalog(registry, out)
    assert done.returncode == 0, done.stderr
    files = sorted(p for p in (out / "data" / "models").rglob("*") if p.is_file())
    index = json.loads((out / "data" / "index.json").read_text())
    assert [m["name"] for m in index["models"]] == [LONG]
    assert files == [out / "data" / "models" / file_name(LONG)]  # user/tied's file went with it
    assert json.loads(files[0].read_text())["model"]["name"] == LONG
    assert all(len(part.encode()) <= 200 for p in (out / "data").rglob("*") for part in p.relative_to(out).parts)
    assert sorted(p.name for p in out.parent.iterdir()) == ["site"]


@pytest.mark.parametrize("name", [LONG, "user/" + "+" * 250, "a" * 255, "a" * 120, "a" * 119 + ".", "ü/x"])
def test_28_7_a_data_file_name_is_bounded_one_to_one_and_the_pages_compute_the_same(name):
    made = file_name(name)
    parts = made.split("/")
    assert all(0 < len(p) <= 125 and not p.startswith(".") and p not in ("..", ".") for p in parts[:-1]), made
    assert len(parts[-1]) <= 130 and parts[-1].endswith(".json") and all("." not in p for p in parts[:-1])
    assert file_name(name + "x") != made and file_name(name[:-1]) != made
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: static/format.js's fileName not compared")
    script = (
        f"import {{ fileName }} from {json.dumps((ROOT / 'zoo/web/static/format.js').as_uri())};"
        f"process.stdout.write(fileName({json.dumps(name)}));"
    )
    assert (
        subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60).stdout
        == made
    )


def test_28_7_a_folder_that_holds_no_earlier_export_is_not_replaced(registry, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(zoo.CatalogError, match="holds no earlier export"):
        export_catalog(out, f"sqlite:///{registry}")
    assert _tree(out) == {"notes.txt": b"mine"}


def test_28_7_files_beside_an_earlier_export_survive_a_rerun(registry, tmp_path):
    out = tmp_path / "out" / "site"
    export_catalog(out, f"sqlite:///{registry}")
    (out / "CNAME").write_text("zoo.example.org\n")
    (out / ".nojekyll").write_text("")
    (out / ".git" / "refs").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/gh-pages\n")
    zoo.connect(registry).index_builder(TIED, "second")
    export_catalog(out, f"sqlite:///{registry}")
    after = _tree(out)
    assert after["CNAME"] == b"zoo.example.org\n" and after[".nojekyll"] == b""
    assert after[".git/HEAD"] == b"ref: refs/heads/gh-pages\n" and (out / ".git" / "refs").is_dir()
    assert f"data/models/{file_name('user/second')}" in after
    assert sorted(p.name for p in out.parent.iterdir()) == ["site"]


def _site(path: Path, text: str) -> Path:
    (path / "data").mkdir(parents=True)
    (path / "data" / "index.json").write_text(text)
    return path


def test_28_7_the_swap_by_two_renames_puts_the_new_export_in_place(tmp_path):
    from zoo.web.export import _swap_by_renames

    new, out = _site(tmp_path / ".site.new-x", "new"), _site(tmp_path / "site", "old")
    _swap_by_renames(new, out)
    assert (out / "data" / "index.json").read_text() == "new"
    assert (new / "data" / "index.json").read_text() == "old"  # the old one where the new was, for removal
    assert sorted(p.name for p in tmp_path.iterdir()) == [".site.new-x", "site"]


def test_28_7_the_swap_by_two_renames_restores_the_old_export_when_the_second_rename_fails(tmp_path):
    from zoo.web.export import _swap_by_renames

    out = _site(tmp_path / "site", "old")
    with pytest.raises(OSError):
        _swap_by_renames(tmp_path / ".site.new-gone", out)  # no such folder: the second rename fails
    assert (out / "data" / "index.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
