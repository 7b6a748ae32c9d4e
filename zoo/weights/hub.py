"""hf://ORG/NAME[@REVISION]: a hub repository's safetensors weights through huggingface_hub's cache.

Files are downloaded when online and read from the cache only when HF_HUB_OFFLINE is set. Every
file is checked against the hash the hub gave for it: huggingface_hub names each cached blob after
the file's ETag, which for an LFS file (the weights) is its sha256 and for a small git file (the
shard index) its git blob sha1, so the check works offline too; a snapshot link that leads anywhere but its
repository's blobs is refused. huggingface_hub itself checks only sizes. A cache without symlinks keeps no blob names;
there, online, the hashes come from the hub's paths-info API, and offline nothing can be checked: such files load
unchecked, and a warning says so once.
"""

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, overload

from zoo.errors import CheckpointError, HubUnavailable
from zoo.weights import verified
from zoo.weights.cache_files import warn_once
from zoo.weights.digest import file_sha256
from zoo.weights.reach import hub_unreachable

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # ORG/NAME, or a legacy bare NAME


def parse_uri(uri: str) -> tuple[str, str | None]:
    """("ORG/NAME", revision or None) from hf://ORG/NAME[@REVISION]."""
    repo, _, revision = uri.removeprefix("hf://").partition("@")
    repo = repo.strip("/")
    if not REPO_ID.fullmatch(repo):
        raise CheckpointError(f"{uri!r}: want hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return repo, revision or None


def offline() -> bool:
    """Whether huggingface_hub reads only its cache (HF_HUB_OFFLINE)."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


@overload
def download(repo_id: str, filename: str, revision: str | None = None, missing_ok: Literal[False] = False) -> str: ...
@overload
def download(repo_id: str, filename: str, revision: str | None = None, missing_ok: bool = False) -> str | None: ...
def download(repo_id: str, filename: str, revision: str | None = None, missing_ok: bool = False) -> str | None:
    """The local path of one file of a hub repo (cache first); None if missing_ok and the repo lacks it
    (or, offline, the cache does)."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    where = f"{repo_id}@{revision or 'main'}"
    down = hub_unreachable()  # one quick probe: an unreachable hub is not retried for minutes
    if down:  # the cache alone (a local_files_only download would still ask the hub for its agent registry)
        cached = try_to_load_from_cache(repo_id, filename, revision=revision)
        if isinstance(cached, str):
            return cached
        raise HubUnavailable(f"{where}: no {filename} in the local cache, and {down}")
    try:
        return hf_hub_download(repo_id, filename, revision=revision)
    except EntryNotFoundError as e:
        # Online, "not in the local cache" means the hub could not be reached: not a missing file.
        unreachable = isinstance(e, LocalEntryNotFoundError) and not offline()
        if missing_ok and not unreachable:
            return None
        hint = (
            " in the local cache (HF_HUB_OFFLINE is set)"
            if offline()
            else " in the local cache, and the hub could not be reached"
            if unreachable
            else ""
        )
        raise HubUnavailable(f"{where}: no {filename}{hint}") from None
    except Exception as e:  # repository not found, gated, offline without a cache, network down
        hint = "; HF_HUB_OFFLINE is set: only the local cache is read" if offline() else ""
        raise HubUnavailable(
            f"{where}: cannot get {filename}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}"
        ) from None


def resolve_hub_weights(uri: str) -> str:
    """A local path zoo's weight readers take: the cached shard index (its shards beside it) or the
    single model.safetensors, every file hash-checked."""
    from zoo.weights.sources import shard_names

    repo, revision = parse_uri(uri)
    try:
        index = download(repo, INDEX, revision, missing_ok=True)
    except HubUnavailable:  # the hub unreachable: a cached single-file checkpoint still serves
        index = None
    if index is None:
        single = download(repo, SINGLE, revision, missing_ok=True)
        if single is None:
            where = "in the local cache (HF_HUB_OFFLINE is set)" if offline() else "in the repository"
            raise HubUnavailable(f"{uri}: neither {INDEX} nor {SINGLE} {where}; zoo reads safetensors weights only")
        files, result = [single], single
    else:
        commit = Path(index).parent.name  # the snapshot's commit: every shard from the same one
        shards = shard_names(Path(index))  # not downloaded yet: names only
        if not shards:
            raise CheckpointError(f"{uri}: {INDEX} lists no shards")
        with ThreadPoolExecutor(min(8, len(shards))) as pool:
            files = [index, *pool.map(lambda s: download(repo, s, commit), shards)]
        result = index
    _check_hashes(uri, repo, files)
    return result


def _check_hashes(uri: str, repo: str, files: list[str]) -> None:
    todo = []
    for file in files:
        blob, named = _blob_of(uri, file)
        if named is None or not verified.known(blob, named):
            todo.append((file, blob, None, named))
    if any(expected is None for *_, expected in todo) and not offline():
        hub = _hashes_from_api(repo, [f for f, *_ in todo])
        todo = [(f, b, k, e or hub.get(Path(f).name)) for f, b, k, e in todo]
    unchecked = [Path(f) for f, *_, expected in todo if expected is None]
    if unchecked:  # loading them is what such a cache is for, but not without a word: once per snapshot
        why = "HF_HUB_OFFLINE is set" if offline() else "the hub gave no hashes for them"
        warn_once(
            ("hub unchecked", str(unchecked[0].parent)),
            f"zoo: {uri}: {', '.join(p.name for p in unchecked)} could not be hash-checked: the hub cache at "
            f"{unchecked[0].parent} holds copies, not links to blobs named by their hash (a file system "
            f"without symlinks), and {why}; loaded unchecked",
        )

    def check(job):
        file, blob, key, expected = job
        if expected is None:
            return  # a copied (not symlinked) cache, offline: nothing to check against
        actual = file_sha256(blob) if len(expected) == 64 else _git_sha1(blob)
        if actual != expected:
            kind = "sha256" if len(expected) == 64 else "git blob sha1"
            raise CheckpointError(
                f"{uri}: {Path(file).name}: {kind} {actual} differs from the hub's {expected}; "
                f"the cached file is corrupt (delete {blob} to download it again)"
            )
        verified.remember(blob, expected)

    with ThreadPoolExecutor(min(8, len(todo) or 1)) as pool:  # hashlib releases the GIL on large reads
        list(pool.map(check, todo))


def _blob_of(uri: str, file: str) -> tuple[Path, str | None]:
    """The file a cached snapshot entry resolves to, and the hash its blob's name promises. huggingface_hub links
    each snapshot file to its own repo's blobs/<ETag>: a link that resolves anywhere else (outside the cache, to a
    file merely named after a hash, to another repo's blob) is refused. A regular file in the snapshot (a cache
    without symlinks) promises no hash."""
    path = Path(os.path.abspath(file))
    blob = Path(os.path.realpath(path))
    repo = next((p.parent for p in path.parents if p.name == "snapshots"), None)
    if repo is not None:
        if blob.parent == Path(os.path.realpath(repo / "blobs")) and (
            _SHA256.fullmatch(blob.name) or _GIT_SHA1.fullmatch(blob.name)
        ):
            return blob, blob.name
        if not path.is_symlink() and blob.is_relative_to(os.path.realpath(repo / "snapshots")):
            return blob, None
    raise CheckpointError(
        f"{uri}: {path.name} in the hub cache resolves to {blob}, outside its repository's "
        f"blobs; refused unchecked (delete {path} to download it again)"
    )


def _hashes_from_api(repo: str, files: list[str]) -> dict[str, str]:
    """File name -> the hub's sha256 (LFS) or git blob sha1, for the snapshot these files are in."""
    from huggingface_hub import HfApi

    commit = Path(files[0]).parent.name
    if hub_unreachable():
        return {}
    try:
        infos = HfApi().get_paths_info(repo, [Path(f).name for f in files], revision=commit)
    except Exception:  # no answer: the files stay unchecked, as offline
        return {}
    return {i.path: (i.lfs.sha256 if getattr(i, "lfs", None) else i.blob_id) for i in infos if hasattr(i, "blob_id")}


def _git_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
