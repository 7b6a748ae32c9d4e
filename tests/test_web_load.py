"""The web catalog under load, without timing anything: heavy requests (scan, estimate) past a bound are
refused at once with 503 and Retry-After while the cheap routes keep answering, and half-open connections
(slowloris) past the server's file descriptors neither lock new clients out nor stay open forever.
The figures (latencies under 200 clients, 2,000 half-open connections) are bench/web_load.py's."""

import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.web_support import serving_app
from zoo.api import Zoo
from zoo.web import app as web_app

HEAVY = 50  # more than Starlette's 40 worker threads: before the bound, they starved every other route


@pytest.fixture
def gated(tmp_path, monkeypatch):
    """A registry whose user/gated model builds only once the gate file is removed."""
    monkeypatch.setenv("ZOO_TRUSTED_MODULES", "tests")
    url = f"sqlite:///{tmp_path / 'gated.db'}"
    gate, started = tmp_path / "gate", tmp_path / "started"
    Zoo(url).index_builder(
        "tests.builders:gated_net", "gated", {"gate": str(gate), "started": str(started)}, inputs="1,3,32,32"
    )
    started.unlink()
    gate.touch()
    yield url, gate, started
    gate.unlink(missing_ok=True)


def fetch(url: str, timeout: float = 120):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def wait_for(condition, what: str, limit_s: float = 60):
    """A guard against hanging, not a timing check: what the server should do at once, given a minute."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.slow  # 6 s
def test_heavy_requests_past_the_bound_get_503_and_cheap_ones_are_still_answered(gated):
    url, gate, started = gated
    answers: list[tuple] = []
    with serving_app(web_app.create_app(url)) as base:

        def estimate():
            answers.append(fetch(base + "/api/estimate/user/gated?batch=2"))

        first = threading.Thread(target=estimate)
        first.start()
        wait_for(started.exists, "the first estimate did not start building")  # it holds the heavy slot
        rest = [threading.Thread(target=estimate) for _ in range(HEAVY - 1)]
        for t in rest:
            t.start()
        admitted = 1 + web_app.HEAVY_QUEUE  # one running, HEAVY_QUEUE waiting
        wait_for(lambda: len(answers) >= HEAVY - admitted, "heavy requests past the bound were not refused")
        refused = list(answers)
        assert len(refused) == HEAVY - admitted
        assert all(status == 503 and int(headers["Retry-After"]) > 0 for status, headers, _ in refused), refused
        status, _, _ = fetch(base + "/api/search?q=family%3Duser", timeout=60)  # while every heavy slot is held
        assert status == 200 and len(answers) == HEAVY - admitted
        gate.unlink()
        for t in [first, *rest]:
            t.join(300)
    assert sorted(status for status, _, _ in answers) == [200] * admitted + [503] * (HEAVY - admitted)


@pytest.mark.slow  # a server process: 5 s
def test_headers_that_trickle_in_past_the_deadline_end_the_connection(small_registry):
    from zoo.web.server import guarded_protocol

    with serving_app(web_app.create_app(small_registry), http=guarded_protocol(64, header_timeout_s=1)) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=60) as slow:
            slow.sendall(b"GET /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            deadline = time.monotonic() + 60  # a guard: the server should close it after 1 s
            with pytest.raises(OSError):  # a byte every 0.1 s never ends the headers: the server closes
                while time.monotonic() < deadline:
                    slow.sendall(b"X")
                    time.sleep(0.1)
                    slow.setblocking(False)
                    try:
                        if slow.recv(1024) == b"":
                            raise ConnectionResetError("closed by the server")
                    except BlockingIOError:
                        pass
                    slow.setblocking(True)
        # a request whose headers are complete runs as long as it takes, and the connection lives on after it
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(3):
            client.request("GET", "/api/search")
            assert client.getresponse().read() and client.sock is not None  # kept alive
            time.sleep(0.5)  # under the keep-alive and header timeouts
        client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _few_files():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow  # a server process: 4 s
def test_half_open_connections_past_the_file_limit_neither_lock_clients_out_nor_stay(small_registry, tmp_path):
    port = _free_port()
    # its log to a file: asyncio logs each accept() that finds no file left, and a full pipe would block it
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "serve", "--registry", small_registry, "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_few_files,
    )  # 256 files: the server cannot hold what the attack opens
    base, half_open = f"http://127.0.0.1:{port}", []
    try:
        wait_for(lambda: proc.poll() is None and _answers(base), "zoo serve did not start")
        for _ in range(400):  # each sends part of a request's headers and then nothing
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(b"GET /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            half_open.append(s)
        status, _, body = fetch(base + "/api/search?q=family%3Dtimm", timeout=60)  # a new client
        assert status == 200 and b'"total":4' in body
        assert half_open[0].recv(1024) == b""  # the server closed the oldest half-open connection
    finally:
        for s in half_open:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _answers(base: str) -> bool:
    try:
        return fetch(base + "/api/search", timeout=5)[0] == 200
    except OSError:
        return False


def _pid_written(path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip(), "the heavy request did not start building")
    return int(path.read_text())


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an unreaped one has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _held_estimate(base: str, started, answers: list) -> tuple[threading.Thread, int]:
    """An estimate of user/gated sent in a thread, held in its worker until the test removes the gate file:
    the thread (its answer goes to `answers`) and the worker's pid once the build has started."""
    heavy = threading.Thread(target=lambda: answers.append(fetch(base + "/api/estimate/user/gated?batch=2")))
    heavy.start()
    return heavy, _pid_written(started)


def test_heavy_work_runs_in_a_worker_process_that_a_cheap_request_does_not_wait_for(gated):
    url, gate, started = gated
    answers: list[tuple] = []
    with serving_app(web_app.create_app(url)) as base:
        heavy, worker = _held_estimate(base, started, answers)
        assert worker != os.getpid() and _alive(worker)  # built in another process than the server's
        assert fetch(base + "/api/search?q=family%3Duser", timeout=60)[0] == 200 and not answers
        gate.unlink()
        heavy.join(300)
        assert [status for status, _, _ in answers] == [200]
        status, _, body = fetch(base + "/api/scan/user/gated")  # the same worker, which still holds the build
        assert status == 200 and json.loads(body)["name"] == "user/gated"
        assert _alive(worker)
    wait_for(lambda: not _alive(worker), "the worker outlived the server")


@pytest.mark.slow  # 4 s
def test_a_worker_killed_mid_request_is_a_clear_500_and_the_next_heavy_request_gets_a_new_one(gated):
    url, gate, started = gated
    answers: list[tuple] = []
    with serving_app(web_app.create_app(url)) as base:
        heavy, worker = _held_estimate(base, started, answers)
        started.unlink()
        os.kill(worker, signal.SIGKILL)
        heavy.join(300)
        [(status, _, body)] = answers
        assert status == 500, body
        failure = json.loads(body)
        assert failure["error"] == "WorkerFailed" and "killed by signal 9" in failure["message"], failure
        gate.unlink()
        status, _, body = fetch(base + "/api/estimate/user/gated?batch=2")
        assert status == 200 and json.loads(body)["name"] == "user/gated", body
        assert _pid_written(started) not in (worker, os.getpid())


def test_the_worker_ends_when_zoo_serve_is_killed(gated, tmp_path):
    url, gate, started = gated
    port, log = _free_port(), (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "serve", "--registry", url, "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base, worker = f"http://127.0.0.1:{port}", None
    try:
        wait_for(lambda: proc.poll() is None and _answers(base), "zoo serve did not start")
        threading.Thread(target=fetch, args=(base + "/api/estimate/user/gated",), daemon=True).start()
        worker = _pid_written(started)
        assert worker != proc.pid and _alive(worker)
        proc.kill()  # SIGKILL: nothing runs in the server, the worker must end by itself
        proc.wait(timeout=30)
        wait_for(lambda: not _alive(worker), "the worker outlived a killed zoo serve")
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
