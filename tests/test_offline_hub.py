"""An unreachable hub is found once, quickly, and said plainly: no retry loop.

The hub (HF_ENDPOINT) and a torch hub URL point at 127.0.0.1, where (a) nothing listens or (b) a blackhole
server accepts connections and never answers; the blackhole counts the connections it accepted."""

import http.server
import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT, run_cli
from zoo.errors import HubUnavailable


class Blackhole:
    """A socket that accepts every connection, counts it, and never says a word."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted, self.conns = 0, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture(params=["nothing listens", "blackhole"])
def dead_hub(request):
    """(endpoint URL, the blackhole or None)."""
    if request.param == "nothing listens":
        yield f"http://127.0.0.1:{_closed_port()}", None
        return
    hole = Blackhole()
    yield f"http://127.0.0.1:{hole.port}", hole
    hole.close()


def _env(endpoint: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}


def _said_unreachable(text: str, endpoint: str) -> None:
    assert "HubUnavailable" in text and f"{endpoint} could not be reached" in text, text
    assert "HF_HUB_OFFLINE=1" in text, text  # and how to use the cache without trying
    assert "Retrying" not in text, text


@pytest.mark.slow  # a process per hub: 11 s
def test_16_pretrained_timm_weights_with_the_hub_unreachable_fail_at_once(dead_hub, tmp_path):
    endpoint, hole = dead_hub
    code = "import zoo; zoo.get('timm/resnet18.a1_in1k', weights='pretrained')"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=_env(endpoint, tmp_path),
    )
    assert proc.returncode != 0
    _said_unreachable(proc.stderr, endpoint)
    if hole:
        assert hole.accepted == 1  # one probe, no retry loop


@pytest.mark.slow  # a process per hub: 8 s
def test_16_index_hf_repo_with_the_hub_unreachable_fails_at_once(dead_hub, tmp_path):
    endpoint, hole = dead_hub
    proc = run_cli(
        "index",
        "hf",
        "google-bert/bert-base-uncased",
        "--registry",
        str(tmp_path / "r.db"),
        "-q",
        check=False,
        timeout=180,
        env_extra=_env(endpoint, tmp_path),
        process=True,  # huggingface_hub reads HF_ENDPOINT and HF_HOME once, at import
    )
    assert proc.returncode == 1
    _said_unreachable(proc.stdout + proc.stderr, endpoint)
    if hole:
        assert hole.accepted == 1


def test_16_a_torch_hub_url_unreachable_fails_at_once(dead_hub, tmp_path, monkeypatch):
    from zoo.pretrained import torch_hub_file

    endpoint, hole = dead_hub
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    url = f"{endpoint}/models/resnet18-f37072fd.pth"
    with pytest.raises(HubUnavailable, match="could not be reached") as caught:
        torch_hub_file(url, progress=False)
    assert ".partial" not in str(caught.value)
    assert not (tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth").exists()
    if hole:
        assert hole.accepted == 1


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""  # what a GET answers: 503 when empty, else 200 with a Content-Length the body falls short of

    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def do_GET(self):
        if not self.body:
            self.send_error(503)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body) * 10))
        self.end_headers()
        self.wfile.write(self.body)  # then the connection closes early

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("body", [b"", b"x" * 100])
def test_16_a_failed_download_mentions_a_partial_file_only_when_one_is_kept(body, tmp_path):
    from zoo.weights.download import fetch

    handler = type("H", (_Handler,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dest = tmp_path / "w-abc.pth"
    try:
        with pytest.raises(HubUnavailable) as caught:
            fetch(f"http://127.0.0.1:{server.server_port}/w-abc.pth", dest, progress=False, retries=1)
    finally:
        server.shutdown()
        server.server_close()
    partial = dest.with_name(dest.name + ".partial")
    assert partial.exists() == bool(body)
    assert (str(partial) in str(caught.value)) == bool(body), caught.value
    assert not dest.exists()
