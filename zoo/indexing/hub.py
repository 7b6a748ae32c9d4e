"""The Hugging Face hub at scale: `zoo index hf --author/--search/--filter/--limit` and `--local-cache`.
A row per repo from its config.json alone (never weights), with the hub's metadata; reruns skip what is done."""

import hashlib
import json
from datetime import UTC

from zoo.columns import BY_NAME, check_name
from zoo.errors import InvalidArgument, UntrustedBuilder
from zoo.indexing.indexer import Outcome, save_counted
from zoo.indexing.record import RECORD_VERSION, record_of
from zoo.registry import db


def hub_key(repo, versions: dict) -> str:
    """What a hub row was recorded from: the repo's commit and the libraries; the same key means nothing to redo."""
    return hashlib.sha256(
        json.dumps([RECORD_VERSION, repo.repo_id, repo.sha, versions], sort_keys=True).encode()
    ).hexdigest()


def _hub_done(row, key: str) -> bool:
    """A row needs no rerun: recorded from the same commit with the same libraries, and its outcome would not
    change by retrying (a transient failure would; so would a gated repo once a token is there)."""
    if row is None or not isinstance(row.card, str):
        return False
    card = json.loads(row.card)
    if card.get("index_key") != key:
        return False
    if card.get("failure") == "gated":
        from huggingface_hub import get_token

        return get_token() is None
    return card.get("failure") != "transient"


def _hub_fields(repo, origin: str, key: str) -> dict:
    modified = repo.last_modified
    if modified is not None and modified.tzinfo is not None:  # stored as naive UTC, like indexed_at
        modified = modified.astimezone(UTC).replace(tzinfo=None)
    return dict(
        task=repo.pipeline_tag,
        downloads=repo.downloads,
        likes=repo.likes,
        gated=repo.gated,
        license=repo.license,
        last_modified=modified,
        hub_params=repo.hub_params,
        weights_source=BY_NAME["weights_source"].encode({"hf_hub_id": repo.repo_id, "revision": repo.sha}),
        card={"origin": origin, "index_key": key, "failure": None, "notes": list(repo.notes)},
    )


def _params_check(record: dict, hub_params: int | None) -> str | None:
    """The hub's safetensors count against the meta build, said plainly when they differ (never hidden)."""
    if hub_params is None or record.get("params") is None:
        return None
    params, buffers = record["params"], record.get("buffers") or 0
    if hub_params == params:
        return "equal"
    if hub_params == params + buffers:
        return "equal with buffers: the checkpoint stores the module's buffers too"
    return (
        f"differs: hub {hub_params:,}, meta build {params:,} parameters (+{buffers:,} buffer elements); "
        f"hub - meta = {hub_params - params:+,}"
    )


def index_hub(url: str, repos, origin: str = "hub listing", force: bool = False, progress=None) -> Outcome:
    """Index hub repos (zoo.indexing.hub_listing.HubRepo), each from its config.json only; a row per repo,
    failed ones with their reason. Repos recorded from the same commit with the same libraries are skipped
    before anything is downloaded, so an interrupted run continues where it stopped."""
    from sqlalchemy import select

    from zoo.families import hf
    from zoo.indexing.hub_listing import fetch_config
    from zoo.registry.tables import Model

    db.open_registry(url, write=True, create=True)
    versions = hf.versions()
    outcome = Outcome()
    for done, repo in enumerate(repos, 1):
        name, key = f"{hf.NAME}/{repo.repo_id}", hub_key(repo, versions)
        try:  # a repo id zoo cannot write (a cache folder models--org--bad name): this repo fails alone
            check_name(name, new=True)
        except InvalidArgument as e:
            outcome.failed[name] = f"{type(e).__name__}: {e}"
            if progress:
                progress(name, done, len(repos))
            continue
        with db.session(url) as s:
            row = s.scalar(select(Model).where(Model.name == name))
            ours = row is not None and row.family == hf.NAME
            skip = not force and repo.sha is not None and _hub_done(row, key)
        if skip:
            outcome.unchanged.append(name)
        else:
            fields = _hub_fields(repo, origin, key)
            try:
                recipe = hf.recipe_of(fetch_config(repo))
            except Exception as e:  # gated, no config.json, remote code, the hub not answering: recorded
                fields["card"]["failure"] = getattr(e, "kind", None) or (
                    "remote-code" if isinstance(e, UntrustedBuilder) else "config"
                )
                record, table = (
                    dict(
                        name=name,
                        family=hf.NAME,
                        builder="AutoModel",
                        kwargs="{}",
                        versions=json.dumps(versions, sort_keys=True),
                        source_hash=key,
                        status="error",
                        error=f"{type(e).__name__}: {e}",
                    ),
                    None,
                )
            else:
                record, table = record_of(name, recipe)
                check = _params_check(record, repo.hub_params)
                fields["card"]["hub_params_check"] = check
                if check and check.startswith("differs"):
                    fields["card"]["notes"].append(f"hub parameter count {check}")
                if record["status"] != "ok":
                    fields["card"]["failure"] = "build"
                fields["task"] = repo.pipeline_tag or record.get("task")
            record = {**record, **fields, "card": BY_NAME["card"].encode(fields["card"])}
            save_counted(url, record, table, force or ours, outcome)  # a failed row of ours may become a build
        if progress:
            progress(name, done, len(repos))
    return outcome
