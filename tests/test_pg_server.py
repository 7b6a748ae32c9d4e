"""The tests' PostgreSQL server (tests/pg.py) ends with the process that started it, however that ends:
SIGTERM, SIGINT, or SIGKILL, where nothing can clean up."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import pg
from tests.conftest import ROOT

pytestmark = pytest.mark.postgres  # starts servers of its own with tests/pg.py, not through pg_server

# A test run in miniature: start a server, say where it is, wait to be killed. SIGINT as a terminal's Ctrl-C
# delivers it: a starter spawned while the test process ignores or blocks it (a job started in the background
# of a non-interactive shell ignores it) would inherit that, and never see the signal this test sends.
STARTER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
from tests import pg
server = pg.start()
print(server.root, server.port, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie that PID 1 has not reaped is gone too
    except FileNotFoundError:
        return False


def _postmaster(root: str) -> int:
    with open(os.path.join(root, "data", "postmaster.pid")) as f:
        return int(f.readline())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_28_12_the_server_ends_with_the_process_that_started_it(signum):
    try:
        pg._bin("postgres")
    except pg.Unavailable as e:
        pytest.skip(str(e))
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = starter.stdout.readline().split()
        if not line:
            pytest.skip("the PostgreSQL server could not be started here")
        root, port = line[0], int(line[1])
        server = _postmaster(root)
        assert _alive(server)
        starter.send_signal(signum)
        starter.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), f"the server (pid {server}, port {port}) outlived its starter's {signum.name}"
        if signum != signal.SIGKILL:  # stopped by the starter itself: its folder goes too
            assert not os.path.exists(root)
        else:  # nothing ran in the starter: the next start removes what it left
            assert os.path.exists(root)
            pg.start().stop()
            assert not os.path.exists(root)
    finally:
        starter.kill()
        starter.wait()
