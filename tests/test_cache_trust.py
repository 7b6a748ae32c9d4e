"""A shared or world-writable $ZOO_CACHE is hostile ground (issue 38, fourth pass): a record there is trusted only
where the user alone can write it, records are written through fresh temporary files, a FIFO, a link or a record
too deep or too large is a miss said once; and a hub cache without symlinks says once that it went unchecked.

Another user is simulated by chown to uid 65534 (nobody): those cases need root and are skipped otherwise."""

import hashlib
import json
import os
import threading
import warnings
from pathlib import Path

import pytest

from zoo.weights import cache_files, verified

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture(autouse=True)
def _fresh_warnings():
    cache_files._said.clear()  # each test sees its own first warnings
    yield
    cache_files._said.clear()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private $ZOO_CACHE (the user's own, 0700), not yet made."""
    root = tmp_path / "zoo_cache"
    monkeypatch.setenv("ZOO_CACHE", str(root))
    return root


def _shared(root: Path, kind: str, how: str) -> Path:
    """$ZOO_CACHE/kind made hostile as `how` says; returns the kind's folder."""
    root.mkdir(mode=0o700, exist_ok=True)
    folder = root / kind
    folder.mkdir(mode=0o700, exist_ok=True)
    if how == "cache 1777, the folder another user's":
        os.chmod(root, 0o1777)
        os.chmod(folder, 0o777)
        os.chown(folder, NOBODY, NOBODY)
    elif how == "folder world-writable":
        os.chmod(folder, 0o777)
    elif how == "cache group-writable":
        os.chmod(root, 0o770)
    return folder


def _plant(path: Path, data: str, owner: int | None = None, mode: int = 0o644) -> None:
    path.write_text(data)
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)


def _weights(path: Path, value: float) -> Path:
    import torch
    from safetensors.torch import save_file

    from tests.builders import tied_net

    state = {k: torch.full_like(v, value) for k, v in tied_net().state_dict().items() if k != "head.weight"}
    save_file(state, str(path))
    return path


def _record_of(path: Path, sha: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return json.dumps({"state": [real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns], "hash": sha})


def _verified_name(path: Path) -> str:
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()


# --- a planted record vouches for nothing ---------------------------------------------------------------------------


@needs_root
def test_a_record_planted_in_a_shared_cache_does_not_make_a_tampered_file_load(fresh_url, tmp_path, cache):
    """Everything a verified/ record holds (real path, inode, size, mtime, ctime, the recorded hash) is readable by
    anyone: planted in a world-writable cache, it made a file of 1e30s load as the recorded weights."""
    import zoo
    from zoo.errors import CheckpointError
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    indexer.index_one(fresh_url, "user/tied", Recipe("user", "tests.builders:tied_net"), trusted={"tests"})
    registry = zoo.connect(fresh_url)
    path = _weights(tmp_path / "tied.safetensors", 0.5)
    good = registry.add_weights("user/tied", str(path), tag="default")
    _weights(path, 1e30)  # same shapes, same size: the tampered file
    folder = _shared(cache, "verified", "cache 1777, the folder another user's")
    _plant(folder / _verified_name(path), _record_of(path, good), owner=NOBODY)
    with (
        pytest.warns(UserWarning, match="not trusted"),
        pytest.raises(CheckpointError, match="differs from the recorded"),
    ):
        registry.get("user/tied").materialize(weights="default")


@pytest.mark.parametrize(
    "how",
    [
        "cache 1777, the folder another user's",
        "folder world-writable",
        "cache group-writable",
        "record another user's",
        "record world-writable",
    ],
)
def test_a_record_anyone_else_could_write_is_a_miss(cache, tmp_path, how):
    if "another user" in how and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path = _weights(tmp_path / "w.safetensors", 1e30)
    folder = _shared(cache, "verified", how if "record" not in how else "")
    owner, mode = (NOBODY, 0o644) if how == "record another user's" else (None, 0o666 if "record" in how else 0o644)
    _plant(folder / _verified_name(path), _record_of(path, "0" * 64), owner=owner, mode=mode)
    with pytest.warns(UserWarning, match="not trusted|owned by uid|writable by group"):
        assert verified.recall(path) is None
        assert not verified.known(path, "0" * 64)


@needs_root
def test_a_timm_loader_record_in_a_shared_cache_is_not_replayed(cache, monkeypatch):
    """A timm-loader record is replayed with the strictness it names (own_cache): planted, it could turn strict off."""
    timm = pytest.importorskip("timm")
    from zoo.families import timm_loader

    monkeypatch.setattr(timm_loader, "_caught", {})  # as a fresh process starts: the record is written
    tag, kwargs = "resnet18.a1_in1k", {}
    timm_loader.timm_load_arguments(tag, kwargs)

    key = json.dumps([timm.__version__, tag, kwargs], sort_keys=True)
    assert timm_loader._recalled(key, tag, kwargs) is not None  # the user's own record is replayed
    record = cache / "timm-loader" / timm_loader._record(key)
    os.chown(record, NOBODY, NOBODY)
    with pytest.warns(UserWarning, match="owned by uid"):
        assert timm_loader._recalled(key, tag, kwargs) is None


# --- writes go through fresh temporary files ------------------------------------------------------------------------


def _caught_timm_args() -> dict:
    return {"cfg": {"url": ""}, "num_classes": 10, "in_chans": 3, "filter_fn": None, "strict": True}


def _write_at_the_old_temporary_name(kind: str, cache: Path, tmp_path: Path) -> tuple[Path, callable]:
    """(the record, a call that writes it): where zoo wrote `<record>.<pid>.tmp` before renaming it."""
    from zoo.families import timm_loader
    from zoo.weights.digest import digest

    if kind == "verified":
        path = _weights(tmp_path / "w.safetensors", 0.5)
        return cache / kind / _verified_name(path), lambda: digest(path)  # what `zoo weights add` runs
    return cache / kind / timm_loader._record("key"), lambda: timm_loader._remember("key", _caught_timm_args())


@pytest.mark.parametrize("kind", ["verified", "timm-loader"])
def test_a_link_planted_at_the_old_temporary_name_is_not_written_through(cache, tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file")
    record, write = _write_at_the_old_temporary_name(kind, cache, tmp_path)
    record.parent.mkdir(parents=True, mode=0o700)
    (record.parent / f"{record.name}.{os.getpid()}.tmp").symlink_to(victim)
    write()
    assert victim.read_text() == "the victim's own file"
    assert record.is_file() and not record.is_symlink() and json.loads(record.read_text())
    assert {p.name for p in record.parent.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()} == set()


@needs_root
@pytest.mark.parametrize("kind", ["verified", "timm-loader"])
def test_nothing_is_written_into_a_shared_cache(cache, tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own file")
    record, write = _write_at_the_old_temporary_name(kind, cache, tmp_path)
    folder = _shared(cache, kind, "cache 1777, the folder another user's")
    (folder / f"{record.name}.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.warns(UserWarning, match="not trusted"):
        write()
    assert victim.read_text() == "the victim's own file" and not record.exists()


# --- a record that is no small regular file is a miss, not a hang or a crash -----------------------------------------


def _readers(kind: str, cache: Path, tmp_path: Path):
    """(the record's path, a call that reads it and returns what it found)."""
    from zoo.families import timm_loader

    if kind == "verified":
        path = _weights(tmp_path / "w.safetensors", 0.5)
        return cache / kind / _verified_name(path), lambda: verified.recall(path)
    key = json.dumps(["0", "resnet18", {}])
    return cache / kind / timm_loader._record(key), lambda: timm_loader._recalled(key, "resnet18", {})


def _within(call, seconds: float, fifo: Path):
    """What call() returns if it returns within `seconds`; else the FIFO is opened and closed for writing, which
    ends the reader's wait with an end of file, and the test fails."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", call()), daemon=True)
    thread.start()
    thread.join(seconds)
    hung = thread.is_alive()
    if hung:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
    assert not hung, "reading a FIFO record hung"
    return out.get("value")


@pytest.mark.parametrize("kind", ["verified", "timm-loader"])
def test_a_fifo_record_is_a_miss_not_a_hang(cache, tmp_path, kind):
    record, read = _readers(kind, cache, tmp_path)
    record.parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(record, 0o600)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert _within(read, 5, record) is None
    assert [str(w.message) for w in said if "not a regular file" in str(w.message)]


@pytest.mark.parametrize("kind", ["verified", "timm-loader"])
@pytest.mark.parametrize(
    "bad", ["nested 100,000 deep", "nested 20,000 deep", "a link to /dev/zero", "a 64 MiB sparse file", "not UTF-8"]
)
def test_a_deep_huge_or_endless_record_is_a_miss(cache, tmp_path, kind, bad):
    """A RecursionError or a MemoryError where the README says a bad record is a miss: 20,000 deep fits under the
    size caps (the parse fails), 100,000 deep only under timm-loader's (1 MiB), past verified's (64 KiB)."""
    record, read = _readers(kind, cache, tmp_path)
    record.parent.mkdir(parents=True, mode=0o700)
    if bad.startswith("nested"):
        depth = int(bad.split()[1].replace(",", ""))
        record.write_text("[" * depth + "]" * depth)
    elif bad == "a link to /dev/zero":
        record.symlink_to("/dev/zero")
    elif bad == "a 64 MiB sparse file":
        with open(record, "wb") as f:
            f.truncate(64 << 20)
    else:
        record.write_bytes(b'{"key": "\xff\xfe"}')
    over = bad == "a 64 MiB sparse file" or (bad == "nested 100,000 deep" and kind == "verified")
    why = "over .* bytes" if over else "a symbolic link" if "/dev/zero" in bad else "not a JSON record"
    with pytest.warns(UserWarning, match=f"{why}.*ignored"):
        assert read() is None


def test_each_cause_is_said_once_not_per_record(cache, tmp_path):
    (cache / "verified").mkdir(parents=True, mode=0o700)
    paths = [_weights(tmp_path / f"w{i}.safetensors", 0.5) for i in range(5)]
    for path in paths:
        (cache / "verified" / _verified_name(path)).write_text("[" * 50_000)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(3):
            assert all(verified.recall(p) is None for p in paths)
    assert len(said) == 1, [str(w.message) for w in said]
    assert "\n" not in str(said[0].message)


def test_a_private_cache_is_trusted_and_its_records_are_private(cache, tmp_path):
    """Created 0700 (a umask of 002 would otherwise make it group-writable, hence untrusted, on the next read)."""
    old = os.umask(0o002)
    try:
        path = _weights(tmp_path / "w.safetensors", 0.5)
        verified.remember(path, "a" * 64)
    finally:
        os.umask(old)
    verified._known.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verified.recall(path) == "a" * 64
    record = cache / "verified" / _verified_name(path)
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700) and oct(record.stat().st_mode & 0o777) == oct(0o600)


# --- a hub cache without symlinks -------------------------------------------------------------------------------


def test_a_hub_cache_without_symlinks_says_once_that_it_could_not_be_checked(tmp_path, monkeypatch):
    """Files copied into snapshots/ (no links to blobs named by their hash) loaded with no check and no word."""
    pytest.importorskip("transformers")
    from tests.test_bad_input_hf import _weights_cache
    from zoo.weights.hub import resolve_hub_weights

    _, link = _weights_cache(tmp_path, monkeypatch)
    data = link.read_bytes()
    link.unlink()
    link.write_bytes(data)  # a copy, as huggingface_hub leaves where the file system has no symlinks
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert Path(resolve_hub_weights("hf://test-org/w")) == link
        assert Path(resolve_hub_weights("hf://test-org/w")) == link
    messages = [str(w.message) for w in said if "could not be hash-checked" in str(w.message)]
    assert len(messages) == 1 and "model.safetensors" in messages[0] and "HF_HUB_OFFLINE" in messages[0], messages
