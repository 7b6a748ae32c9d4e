"""The hub at scale: which repos to index (the hub's listing API, or the local cache) and each one's config.json.

Torch-free. Only metadata is read: the listing (with the hub's own safetensors parameter count), and each
repo's config.json at the listed commit; never a weights file. The endpoint is huggingface_hub's (HF_ENDPOINT).
Each failure is classified, so that the indexer records it with its reason and knows whether a rerun
should try again: "gated" (no access without a token), "no-config" (the repo has no config.json),
"transient" (network, server); "config" (a config.json that is unreadable, too large or not an object: an
InvalidRecipe) and "remote-code" are recorded by zoo.indexing.hub.
"""

from dataclasses import dataclass, field
from datetime import datetime
from math import prod
from pathlib import Path

from zoo.errors import CheckpointError, HubUnavailable
from zoo.families.hf import read_config
from zoo.weights.reach import hub_unreachable

# What one listing call asks the hub for, per repo: everything a row records, so no per-repo API call is needed.
EXPAND = ["sha", "lastModified", "downloads", "likes", "gated", "pipeline_tag", "tags", "safetensors"]


@dataclass
class HubRepo:
    repo_id: str
    sha: str | None = None
    last_modified: datetime | None = None
    downloads: int | None = None
    likes: int | None = None
    gated: str | None = None  # "false", "auto" or "manual"; None: not known (the local cache)
    license: str | None = None
    pipeline_tag: str | None = None
    hub_params: int | None = None  # the hub's safetensors total, or the cached safetensors headers' count
    config_path: str | None = None  # local cache: the config.json already on disk
    notes: list[str] = field(default_factory=list)


def list_repos(author=None, search=None, filter=None, limit=None) -> list[HubRepo]:
    """The hub's models matching the arguments (huggingface_hub follows the listing's Link-header pages)."""
    from huggingface_hub import HfApi

    down = hub_unreachable()
    if down:
        raise HubUnavailable(f"listing the hub's models failed: {down}", "transient")
    try:
        return [
            _from_info(m)
            for m in HfApi().list_models(author=author, search=search, filter=filter, limit=limit, expand=EXPAND)
        ]
    except Exception as e:  # the listing itself failed: nothing to index, nothing written
        raise HubUnavailable(f"listing the hub's models failed: {type(e).__name__}: {_first_line(e)}") from None


def _from_info(m) -> HubRepo:
    tags = m.tags or []
    license = next((t.split(":", 1)[1] for t in tags if t.startswith("license:")), None)
    gated = None if m.gated is None else str(m.gated).lower()
    return HubRepo(
        m.id,
        m.sha,
        m.last_modified,
        m.downloads,
        m.likes,
        gated,
        license,
        m.pipeline_tag,
        m.safetensors.total if m.safetensors else None,
    )


def fetch_config(repo: HubRepo) -> dict:
    """The repo's config.json at the listed commit (downloaded into huggingface_hub's cache, or the cached copy)."""
    if repo.config_path:
        return read_config(Path(repo.config_path))
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError

    down = hub_unreachable()  # the cached copy alone, at once, when the hub does not answer
    if down:
        cached = try_to_load_from_cache(repo.repo_id, "config.json", revision=repo.sha)
        if not isinstance(cached, str):
            raise HubUnavailable(f"{repo.repo_id}: config.json not in the local cache, and {down}", "transient")
        return read_config(Path(cached))
    try:
        return read_config(Path(hf_hub_download(repo.repo_id, "config.json", revision=repo.sha)))
    except GatedRepoError:
        raise HubUnavailable(
            f"{repo.repo_id} is gated ({repo.gated or 'access required'}): its config.json "
            f"needs a token with access (HF_TOKEN or `hf auth login`)",
            "gated",
        ) from None
    except LocalEntryNotFoundError as e:  # before EntryNotFoundError, its base: the hub was not reached
        raise HubUnavailable(f"{repo.repo_id}: hub not reached: {_first_line(e)}", "transient") from None
    except EntryNotFoundError:
        raise HubUnavailable(f"{repo.repo_id} has no config.json (not a transformers model)", "no-config") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        kind = "gated" if status in (401, 403) else "transient"
        raise HubUnavailable(f"{repo.repo_id}: config.json: HTTP {status}: {_first_line(e)}", kind) from None
    except OSError as e:  # connection refused or reset, disk
        raise HubUnavailable(
            f"{repo.repo_id}: config.json: {type(e).__name__}: {_first_line(e)}", "transient"
        ) from None


def cached_repos(cache_dir=None) -> list[HubRepo]:
    """Every model repo in the local huggingface_hub cache that holds a config.json, offline: the snapshot
    refs/main points to (else the newest), with the parameter count of its cached safetensors headers
    when every shard is there."""
    from huggingface_hub import constants, scan_cache_dir

    cache_dir = cache_dir or constants.HF_HUB_CACHE  # as it is now: scan_cache_dir's default is its value at import
    try:
        info = scan_cache_dir(cache_dir)
    except Exception as e:  # no cache directory; huggingface_hub's message names its own cache_dir argument
        raise HubUnavailable(
            f"cannot read the local hub cache at {cache_dir} "
            f"({type(e).__name__}): it is $HF_HUB_CACHE, else $HF_HOME/hub"
        ) from None
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        files = {f.file_name: f.file_path for f in revision.files}
        if "config.json" not in files:
            continue
        entry = HubRepo(repo.repo_id, revision.commit_hash, config_path=str(files["config.json"]))
        try:  # a corrupt cached checkpoint does not change the architecture: the repo is still indexed
            entry.hub_params = _cached_params(files, entry.notes)
        except (CheckpointError, OSError) as e:
            entry.notes.append(
                f"cached safetensors not readable ({type(e).__name__}: {e}): parameter count not checked"
            )
        found.append(entry)
    return found


def _cached_params(files: dict, notes: list) -> int | None:
    """Elements in the cached safetensors files' headers (no tensor data read); None if a shard is missing."""
    from zoo.weights.safetensors_format import parse_json, read_header

    if "model.safetensors.index.json" in files:
        index = parse_json(Path(files["model.safetensors.index.json"]).read_bytes(), "index", "shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise CheckpointError("model.safetensors.index.json: weight_map is not an object of file names")
        shards = sorted(set(weight_map.values()))
    else:
        shards = [n for n in files if n == "model.safetensors"]
    if not shards or any(s not in files for s in shards):
        notes.append("no complete safetensors checkpoint in the cache: parameter count not checked")
        return None
    return sum(prod(e.shape) for s in shards for e in read_header(files[s])[0])


def _first_line(e: Exception) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
