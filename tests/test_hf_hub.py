"""Indexing the hub at scale against a local hub server on 127.0.0.1 (no network): the listing API and its
Link-header pages, gated repos, repos without config.json, remote code refused, a transient server error
and a killed run resumed, the hub's parameter count checked against the meta build, and --local-cache."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402 - after importorskip
from tests.conftest import ROOT  # noqa: E402 - after importorskip

PAGE = 2  # repos per listing page: several pages for a handful of repos

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
    max_position_embeddings=64,
)


def _saved(tmp: Path, config) -> tuple[dict, int]:
    """(config.json as save_pretrained writes it, elements in the safetensors file it writes): what the hub
    serves and what its safetensors metadata counts."""
    from safetensors import safe_open

    tmp.mkdir(parents=True)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
    with safe_open(str(tmp / "model.safetensors"), "np") as f:
        total = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    return json.loads((tmp / "config.json").read_text()), total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Hub:
    """The repos the fake hub holds, in listing order, and what happens to each request."""

    def __init__(self, repos: list[dict]):
        self.repos = repos
        self.requests: list[str] = []
        self.failing: set[str] = set()  # answer 500 to these repos' config.json (huggingface_hub retries)
        self.hold: str | None = None  # block this repo's config.json until `release` is set
        self.held = threading.Event()
        self.release = threading.Event()

    def handler(hub):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body=b"", headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                return body

            def _listing(self, url):
                query = parse_qs(url.query)
                hub.requests.append("list " + url.query)
                found = [
                    r
                    for r in hub.repos
                    if (not query.get("author") or r["id"].split("/")[0] == query["author"][0])
                    and (not query.get("search") or query["search"][0].lower() in r["id"].lower())
                    and all(f in r["tags"] or f == r.get("pipeline_tag") for f in query.get("filter", []))
                ]
                start = int(query.get("p", ["0"])[0])
                size = min(PAGE, int(query.get("limit", [PAGE])[0]))
                items = [
                    {k: v for k, v in r.items() if k not in ("config", "files")} for r in found[start : start + size]
                ]
                headers = [("Content-Type", "application/json")]
                if start + size < len(found):  # the hub's pagination: a Link header with rel="next"
                    nxt = {k: v for k, v in query.items()} | {"p": [str(start + size)]}
                    headers.append(
                        ("Link", f'<http://{self.headers["Host"]}/api/models?{urlencode(nxt, doseq=True)}>; rel="next"')
                    )
                return self._send(200, json.dumps(items).encode(), headers)

            def _file(self):
                url = urlparse(self.path)
                if url.path == "/api/models":
                    return self._listing(url)
                if url.path.startswith("/api/"):  # huggingface_hub's own calls (telemetry and the like)
                    hub.requests.append("api " + url.path)
                    return self._send(404)
                repo, _, rest = url.path.strip("/").partition("/resolve/")
                name = rest.partition("/")[2]
                hub.requests.append(f"{self.command} {repo} {name}")
                entry = next((r for r in hub.repos if r["id"] == repo), None)
                if entry is None:
                    return self._send(404, headers=[("X-Error-Code", "RepoNotFound")])
                if entry["gated"] and name:
                    return self._send(
                        401,
                        headers=[
                            ("X-Error-Code", "GatedRepo"),
                            ("X-Error-Message", "Access to this repo is restricted"),
                        ],
                    )
                if hub.hold == repo:
                    hub.held.set()
                    hub.release.wait(60)
                if repo in hub.failing:
                    return self._send(500, b"injected server error")
                data = entry["files"].get(name)
                if data is None:
                    return self._send(404, headers=[("X-Error-Code", "EntryNotFound"), ("X-Repo-Commit", entry["sha"])])
                blob_sha1 = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
                return self._send(
                    200,
                    data,
                    [
                        ("X-Repo-Commit", entry["sha"]),
                        ("ETag", f'"{blob_sha1}"'),
                    ],
                )

            def do_HEAD(self):
                self._file()

            def do_GET(self):
                body = self._file()
                if body and self.command == "GET":
                    self.wfile.write(body)

        return Handler


def _repo(repo_id, config=None, total=None, gated=False, tags=("transformers",), task="text-generation", n=0):
    files = {"config.json": json.dumps(config).encode()} if config is not None else {}
    item = {
        "id": repo_id,
        "sha": hashlib.sha1(repo_id.encode() + bytes([n])).hexdigest(),
        "lastModified": "2025-03-04T05:06:07.000Z",
        "downloads": 1000 + n,
        "likes": 10 + n,
        "gated": gated,
        "pipeline_tag": task,
        "tags": [*tags, "license:apache-2.0"],
        "private": False,
        "files": files,
    }
    if total is not None:
        item["safetensors"] = {"parameters": {"F32": total}, "total": total}
    return item


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubmodels")
    llama, llama_total = _saved(root / "llama", transformers.LlamaConfig(**SMALL, tie_word_embeddings=True))
    qwen, qwen_total = _saved(root / "qwen", transformers.Qwen2Config(**SMALL))
    return {"llama": (llama, llama_total), "qwen": (qwen, qwen_total)}


@pytest.fixture
def hub(models, tmp_path, monkeypatch):
    """A local hub holding seven test-org repos (and one of another author), huggingface_hub pointed at it
    (what HF_ENDPOINT sets) with an empty cache and no token; (Hub, endpoint, env for a CLI run)."""
    from huggingface_hub import constants

    (llama, llama_total), (qwen, qwen_total) = models["llama"], models["qwen"]
    remote = {**llama, "model_type": "my-own-arch", "auto_map": {"AutoModelForCausalLM": "modeling_mine.Mine"}}
    repos = [
        _repo("test-org/llama-a", llama, llama_total, n=1),
        _repo("test-org/gated", llama, llama_total, gated="manual", n=2),
        _repo("test-org/no-config", None, None, tags=("diffusers",), task="text-to-image", n=3),
        _repo("test-org/remote-code", remote, 12345, n=4),
        _repo("test-org/qwen-b", qwen, qwen_total + 7, n=5),  # the hub counts 7 more than the model has
        _repo("test-org/flaky", llama, llama_total, n=6),
        _repo("test-org/llama-c", llama, llama_total, tags=("transformers", "chat"), n=7),
        _repo("other-org/llama-z", llama, llama_total, n=8),
    ]
    state = Hub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    cache, home = tmp_path / "hub-cache", tmp_path / "hf-home"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_ENDPOINT": endpoint,
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    yield state, endpoint, env
    state.release.set()
    server.shutdown()


def _rows(url):
    registry = zoo.connect(url)
    return {i.name: i for i in registry.search("family=hf", limit=None)}


def test_bulk_index_pages_through_the_listing_and_records_every_repo(hub, tmp_path):
    state, _, _ = hub
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index_hub(author="test-org")
    lists = [r for r in state.requests if r.startswith("list ")]
    assert len(lists) == 4  # 7 repos, 2 a page: the Link header was followed to the end
    assert sorted(outcome.indexed) == [
        "hf/test-org/flaky",
        "hf/test-org/llama-a",
        "hf/test-org/llama-c",
        "hf/test-org/qwen-b",
    ]
    assert set(outcome.failed) == {"hf/test-org/gated", "hf/test-org/no-config", "hf/test-org/remote-code"}
    rows = _rows(url)
    assert "hf/other-org/llama-z" not in rows  # another author's repo is not listed
    registry = zoo.connect(url)
    a = registry.info("hf/test-org/llama-a")
    assert (a.status, a.downloads, a.likes, a.license, a.gated, a.task) == (
        "ok",
        1001,
        11,
        "apache-2.0",
        "false",
        "text-generation",
    )
    assert a.last_modified.isoformat().startswith("2025-03-04T05:06:07")
    assert a.hub_params == a.params == hub_total(state, "test-org/llama-a")  # tied embeddings stored once
    assert a.card["hub_params_check"] == "equal"
    q = registry.info("hf/test-org/qwen-b")
    assert q.status == "ok" and q.hub_params == q.params + 7  # the mismatch is recorded, not hidden
    assert q.card["hub_params_check"].startswith("differs") and "+7" in q.card["hub_params_check"]
    assert any("differs" in n for n in q.card["notes"])
    gated = registry.info("hf/test-org/gated")
    assert (gated.status, gated.gated, gated.card["failure"]) == ("error", "manual", "gated")
    assert "token" in gated.error
    nocfg = registry.info("hf/test-org/no-config")
    assert nocfg.status == "error" and "no config.json" in nocfg.error and nocfg.task == "text-to-image"
    remote = registry.info("hf/test-org/remote-code")
    assert remote.status == "error" and "remote code" in remote.error and remote.card["failure"] == "remote-code"
    files = {r.split()[-1] for r in state.requests if not r.startswith(("list ", "api "))}
    assert files == {"config.json"}  # config.json only, never weights or code


def hub_total(state, repo_id):
    return next(r["safetensors"]["total"] for r in state.repos if r["id"] == repo_id)


def test_search_filter_and_limit_reach_the_listing(hub, tmp_path):
    state, _, _ = hub
    url = f"sqlite:///{tmp_path / 'r.db'}"
    registry = zoo.connect(url)
    assert registry.index_hub(search="llama-").indexed == [
        "hf/test-org/llama-a",
        "hf/test-org/llama-c",
        "hf/other-org/llama-z",
    ]
    assert registry.index_hub(filter="chat", force=True).indexed == ["hf/test-org/llama-c"]
    limited = registry.index_hub(author="test-org", limit=3)
    assert len(limited.indexed) + len(limited.unchanged) + len(limited.failed) == 3
    with pytest.raises(zoo.InvalidArgument, match="author, search, filter or limit"):
        registry.index_hub()


@pytest.mark.slow  # 24 s
def test_a_rerun_skips_finished_repos_and_retries_transient_failures(hub, tmp_path):
    state, _, _ = hub
    url = f"sqlite:///{tmp_path / 'r.db'}"
    registry = zoo.connect(url)
    state.failing = {"test-org/flaky"}
    first = registry.index_hub(author="test-org")
    state.failing = set()
    assert "hub not reached" in first.failed["hf/test-org/flaky"]
    assert registry.info("hf/test-org/flaky").card["failure"] == "transient"
    stamps = {n: i.indexed_at for n, i in _rows(url).items()}
    state.requests.clear()
    second = registry.index_hub(author="test-org")
    assert second.indexed == ["hf/test-org/flaky"] and not second.failed  # only the transient failure is redone
    assert sorted(second.unchanged) == sorted(n for n in stamps if n != "hf/test-org/flaky")
    assert not any(r.startswith(("GET", "HEAD")) and "flaky" not in r for r in state.requests)
    assert all(_rows(url)[n].indexed_at == t for n, t in stamps.items() if n != "hf/test-org/flaky")
    state.repos[0]["sha"] = "f" * 40  # a new commit of llama-a: indexed again
    third = registry.index_hub(author="test-org")
    assert third.indexed == ["hf/test-org/llama-a"]


@pytest.mark.slow  # two `zoo index hf` processes, one killed: 11 s
def test_a_killed_run_resumes_without_redoing_finished_repos(hub, tmp_path):
    """`zoo index hf --author` killed (SIGKILL) while it waits on a repo's config.json; the rerun does the rest."""
    state, _, env = hub
    db_path = tmp_path / "r.db"
    env = {**env, "ZOO_REGISTRY": str(db_path)}
    state.hold = "test-org/qwen-b"
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "index", "hf", "--author", "test-org", "--json"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert state.held.wait(300), proc.communicate(timeout=5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    state.hold = None
    state.release.set()
    url = f"sqlite:///{db_path}"
    before = {n: i.indexed_at for n, i in _rows(url).items()}
    assert set(before) == {
        "hf/test-org/llama-a",
        "hf/test-org/gated",
        "hf/test-org/no-config",
        "hf/test-org/remote-code",
    }  # committed one by one before the kill
    out = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "index", "hf", "--author", "test-org", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(out.stdout)
    assert (result["indexed"], result["unchanged"]) == (3, 4), out.stderr
    assert result["failed"] == {}  # the recorded failures are final for their commit: not retried
    after = _rows(url)
    assert all(after[n].indexed_at == t for n, t in before.items())  # nothing finished was redone
    assert after["hf/test-org/qwen-b"].status == "ok"


def test_local_cache_indexes_every_cached_model_offline(models, tmp_path, monkeypatch):
    """A cache laid out as huggingface_hub lays it out: a complete safetensors checkpoint (its header counted),
    a config-only repo, a repo without config.json, and a dataset; HF_HUB_OFFLINE set, no server at all."""
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from tests.test_hf import populate_cache

    cache = tmp_path / "hub"
    llama_dir = tmp_path / "llama"
    llama_dir.mkdir()
    config, _ = models["llama"]
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL, tie_word_embeddings=True))
    (llama_dir / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(llama_dir / "model.safetensors"))
    populate_cache(cache, "cached-org/llama", llama_dir)
    only_config = tmp_path / "only"
    only_config.mkdir()
    (only_config / "config.json").write_text(json.dumps(models["qwen"][0]))
    populate_cache(cache, "cached-org/qwen-config-only", only_config)
    readme = tmp_path / "readme"
    readme.mkdir()
    (readme / "README.md").write_text("no config here")
    populate_cache(cache, "cached-org/no-config", readme)
    dataset = populate_cache(cache, "cached-org/data", only_config)
    dataset.rename(cache / "datasets--cached-org--data")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index_hub(local_cache=True)
    assert sorted(outcome.indexed) == ["hf/cached-org/llama", "hf/cached-org/qwen-config-only"]
    info = zoo.connect(url).info("hf/cached-org/llama")
    assert info.hub_params == sum(t.numel() for t in state.values()) == info.params
    assert info.card["origin"] == "local cache" and info.card["hub_params_check"] == "equal"
    only = zoo.connect(url).info("hf/cached-org/qwen-config-only")
    assert only.hub_params is None and "not checked" in only.card["notes"][0]
    assert zoo.connect(url).index_hub(local_cache=True).unchanged == sorted(outcome.indexed)
