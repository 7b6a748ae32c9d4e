"""A registry shared by long-lived processes and CLI writers loses nothing and is never damaged.

The sequence that damaged it: a process writes in-process (the file goes to WAL, its pooled connection stays
open), then reads through the fast reader; if anything in that process opens and closes the file other than
through SQLite, POSIX drops every lock the process holds on it; the next CLI writer to exit then finds no
other user, checkpoints and deletes the WAL under the first process, whose reads then fail as "malformed"
and whose later writes are lost or written back over the file. Then a soak: several such processes, CLI
writers and `zoo serve` under requests for about a minute, on SQLite and on PostgreSQL.
"""

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from safetensors.torch import save_file

import zoo
from tests.builders import conv_net
from tests.conftest import ROOT, run_cli

BROKEN = ("malformed", "disk I/O error", "database disk image")
# Every `zoo` here runs as a process of its own (process=True): the damage came from a writer process exiting,
# the last user of the file it saw, which checkpoints and deletes the WAL; an in-process run never exits.


@pytest.fixture
def shared_registry(tmp_path) -> str:
    """A writable copy of the shipped registry (a rollback journal, as shipped; 20 MB), made with SQLite's backup
    API: this process may hold connections to the original, whose locks a copy through open() would drop."""
    path = tmp_path / "r.db"
    source = sqlite3.connect(f"file:{ROOT / 'registry.db'}?mode=ro", uri=True)
    target = sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return str(path)


def _integrity(path: str) -> list:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA integrity_check").fetchall()
    finally:
        con.close()


def _names_seen_by_a_fresh_process(path: str) -> set[str]:
    out = run_cli("search", "", "--limit", "0", "--json", registry=path, process=True).stdout
    return {row["name"] for row in json.loads(out)}


@pytest.mark.slow  # CLI writer processes: 5 s
def test_a_long_lived_process_reads_every_write_of_two_cli_writers(shared_registry):
    Z = zoo.connect(shared_registry)
    Z.remove("torchvision/mobilenet_v3_small")  # an in-process write: the file is in WAL, the connection pooled
    assert Z.info("timm/resnet18").name == "timm/resnet18"  # the fast reader
    for i in range(2):  # each exits and may be the last user of the file it sees
        run_cli(
            "index", "builder", "tests.builders:tied_net", "--name", f"w{i}", registry=shared_registry, process=True
        )
    assert {r.name for r in Z.search("family=user")} == {"user/w0", "user/w1"}
    assert [Z.info(f"user/w{i}").name for i in range(2)] == ["user/w0", "user/w1"]
    with pytest.raises(zoo.ModelNotFound):  # through the SQLAlchemy path: its did-you-mean
        Z.info("torchvision/mobilenet_v3_smal")
    with pytest.raises(zoo.ModelNotFound):
        Z.info("torchvision/mobilenet_v3_small")


@pytest.mark.slow  # CLI writer processes: 7 s
def test_a_write_after_the_cli_writers_reaches_the_file_intact(shared_registry):
    Z = zoo.connect(shared_registry)
    Z.remove("torchvision/mobilenet_v3_small")
    Z.info("timm/resnet18")
    for i in range(2):
        run_cli(
            "index", "builder", "tests.builders:tied_net", "--name", f"w{i}", registry=shared_registry, process=True
        )
    assert Z.remove("timm/efficientnet_b0") == "timm/efficientnet_b0"
    zoo.cache_clear()  # closes this process's connections: a stale WAL would be written back now
    assert _integrity(shared_registry) == [("ok",)]
    seen = _names_seen_by_a_fresh_process(shared_registry)
    assert {"user/w0", "user/w1", "timm/resnet18"} <= seen
    assert not {"timm/efficientnet_b0", "torchvision/mobilenet_v3_small"} & seen


# A plain sqlite3 read of how many runs a model has: closing last, it checkpoints and deletes the WAL, as any tool may.
RUNS = """import sqlite3, sys
con = sqlite3.connect(sys.argv[1], timeout=60)
print(con.execute("SELECT count(*) FROM measurements JOIN models ON models.id = measurements.model_id "
                  "WHERE models.name = ?", [sys.argv[2]]).fetchone()[0])
con.close()
"""


@pytest.mark.slow  # a bench search with processes beside it
def test_each_run_of_a_bench_search_is_seen_by_other_processes_as_it_goes(shared_registry):
    """A bench search (long-running: a write per model, reads between) while, after each model, a misspelt
    `zoo show` (its did-you-mean) and a plain sqlite3 reader run beside it, as the issue found them: each sees
    the run the bench has just reported, and the file is intact at the end."""
    from zoo.throughput import benchmark

    search = "name~'timm/resnet1*' and kind=architecture and params<2e7"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen = []

    def report(name, done, total, result):
        typo = run_cli("show", "timm/resnt18", registry=shared_registry, check=False, process=True)
        runs = subprocess.run(
            [sys.executable, "-c", RUNS, shared_registry, name], capture_output=True, text=True, env=env, timeout=60
        )
        seen.append((name, result.get("error"), typo.returncode, runs.stdout.strip(), typo.stderr + runs.stderr))

    results = benchmark.run_search(zoo.connect(shared_registry), search, report=report, steps=1, warmup=0)
    assert len(results) >= 4
    assert [s for s in seen if s[1:4] != (None, 1, "1") or any(word in s[4] for word in BROKEN)] == []
    zoo.cache_clear()
    assert _integrity(shared_registry) == [("ok",)]


# --- the soak ---------------------------------------------------------------------------------------------

SOAK_S = 45  # the mixed load; start-up (imports) and the checks come on top: about a minute per backend
CLIENTS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli_writer(url: str, until: float, acked: list, problems: list) -> None:
    """CLI writers, one after another: index, remove, and a misspelt `show` (its did-you-mean)."""
    i = 0
    while time.time() < until:
        i += 1
        name = f"user/cli-{i}"
        proc = run_cli(
            "--registry",
            url,
            "index",
            "builder",
            "tests.builders:conv_net",
            "--name",
            name,
            "--input",
            "1,3,32,32",
            check=False,
            process=True,
        )
        if proc.returncode == 0:
            acked.append(["present", name])
        else:
            problems.append(f"zoo index builder exited {proc.returncode}: {proc.stderr[-500:]}")
        if i % 2 == 0:
            gone = f"user/cli-{i - 1}"
            proc = run_cli("--registry", url, "rm", gone, check=False, process=True)
            (
                acked.append(["absent", gone])
                if proc.returncode == 0
                else problems.append(f"zoo rm exited {proc.returncode}: {proc.stderr[-500:]}")
            )
        proc = run_cli("--registry", url, "show", "user/cli-typo", check=False, process=True)
        if proc.returncode == 0 or any(word in proc.stderr for word in BROKEN):
            problems.append(f"zoo show of a misspelt name exited {proc.returncode}: {proc.stderr[-500:]}")


def _requests(base: str, until: float, statuses: dict, problems: list) -> None:
    paths = [
        "/api/search?q=family%3Duser",
        "/",
        "/api/models/user/cli-1",
        "/api/search?q=params%3E0&sort=-params",
        "/model/timm/resnet18",
    ]
    while time.time() < until:
        for path in paths:
            try:
                with urllib.request.urlopen(base + path, timeout=30) as response:
                    status = response.status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError as e:
                problems.append(f"GET {path}: {e}")
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                problems.append(f"GET {path}: {status}")
        time.sleep(0.05)


def _sqlite_reader(path: str, until: float, problems: list) -> None:
    """A plain sqlite3 reader, as any tool may be; it connects for each read, so that it does not keep a lock
    that would hide the others' lost ones (a writer that exits deletes the WAL only when it is alone)."""
    while time.time() < until:
        con = sqlite3.connect(path, timeout=60)
        try:
            con.execute("SELECT count(*) FROM models").fetchone()
        except sqlite3.Error as e:
            problems.append(f"sqlite3 reader: {e}")
        finally:
            con.close()
        time.sleep(0.2)


def _expected(logs: list[list]) -> dict:
    """The state every acknowledged write leaves: name -> {"tags", "runs"} (a removed model takes its weights
    and runs with it). Each name is written by one process only, so each log's order is the name's order."""
    out = {}
    for log in logs:
        for kind, name, *rest in log:
            if kind == "present":
                out[name] = {"tags": [], "runs": 0}
            elif kind == "absent":
                del out[name]
            elif kind == "weights":
                out[name]["tags"].append(rest[0])
            else:
                out[name]["runs"] += 1
    return {name: {**s, "tags": sorted(s["tags"])} for name, s in out.items()}


@pytest.mark.slow
def test_soak_long_lived_processes_cli_writers_and_a_server(backend_url, tmp_path, monkeypatch):
    """For about a minute: CLIENTS processes each with a long-lived Zoo (writes and reads in-process), CLI
    writers, `zoo serve` under requests and (SQLite) a plain sqlite3 reader. Afterwards the file passes
    integrity_check, a fresh process sees every acknowledged write and nothing removed, no process saw a
    damaged registry and the server never answered 500."""
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    url = backend_url
    Z = zoo.connect(url)
    Z.index_builder("tests.builders:conv_net", "seed", inputs=[{"shape": [1, 3, 32, 32]}])
    Z.index("timm", ["resnet18"])
    zoo.cache_clear()  # this process holds no connection: a lock of its own would hide the others' lost ones
    weights = tmp_path / "conv.safetensors"
    save_file({k: v.contiguous() for k, v in conv_net().state_dict().items()}, weights)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "--registry", url, "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    until = time.time() + 20 + SOAK_S  # the clients import torch first
    clients = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.soak_client", "client", url, f"c{k}", str(until), str(weights)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(CLIENTS)
    ]
    cli_acked, problems, statuses = [], [], {}
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/api/search?q=family%3Duser", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "zoo serve did not start"
                time.sleep(0.2)
        threads = [
            threading.Thread(target=_cli_writer, args=(url, until, cli_acked, problems)),
            threading.Thread(target=_requests, args=(base, until, statuses, problems)),
        ]
        if url.startswith("sqlite"):
            threads.append(
                threading.Thread(target=_sqlite_reader, args=(url.removeprefix("sqlite:///"), until, problems))
            )
        for t in threads:
            t.start()
        results = []
        for c in clients:
            out, err = c.communicate(timeout=SOAK_S + 300)
            assert c.returncode == 0, err[-3000:]
            results.append(json.loads(out))
        for t in threads:
            t.join(300)
    finally:
        for c in clients:
            c.kill()
        server.terminate()
        _, server_log = server.communicate(timeout=30)
    errors = [e for r in results for e in r["errors"]]
    assert not errors, errors[:10]
    assert not problems, problems[:10]
    assert not any(word in server_log for word in BROKEN), server_log[-3000:]
    assert statuses.get(200, 0) > 20 and not any(s >= 500 for s in statuses), statuses
    assert all(r["ops"] > 5 for r in results), [r["ops"] for r in results]  # the load really ran
    if url.startswith("sqlite"):
        assert _integrity(url.removeprefix("sqlite:///")) == [("ok",)]
    seen = json.loads(
        subprocess.run(
            [sys.executable, "-m", "tests.soak_client", "state", url],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    )
    expected = _expected([r["acked"] for r in results] + [cli_acked])
    expected["user/seed"] = {"tags": [], "runs": 0}
    assert seen == expected
    writes = sum(len(r["acked"]) for r in results) + len(cli_acked)
    print(
        f"soak on {url.split(':')[0]}: {sum(r['ops'] for r in results)} client operations, {writes} acknowledged "
        f"writes ({len(cli_acked)} by the CLI), {sum(statuses.values())} requests {statuses}"
    )
