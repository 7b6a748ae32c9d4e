"""For the web tests: the catalog (or a folder of files) served on a free port of 127.0.0.1 in a thread,
and headless Chromium from the Debian package driven by Selenium through the Debian chromedriver."""

import contextlib
import functools
import os
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Without the background-networking flags Chromium keeps dialling out, and on a closed network its
# connections are refused; a new profile per run keeps runs apart.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1700,1100",
]


def screenshots_dir() -> Path:
    """Where the browser tests write their screenshots: $ZOO_SCREENSHOTS, else /tmp/zoo-screenshots."""
    path = Path(os.environ.get("ZOO_SCREENSHOTS") or "/tmp/zoo-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def serving_app(app, **options):
    """Run an ASGI app with uvicorn in a thread on a free port (options: uvicorn.Config's); yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


@contextlib.contextmanager
def serving_files(directory):
    """A plain static file server over `directory` (what hosting the exported catalog looks like)."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chromium(profile_dir):
    """A Selenium driver on headless Debian Chromium. Missing Chromium fails in CI and skips elsewhere."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = (
            f"{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install -y chromium chromium-driver "
            "(`make test` does it as root)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for drivers online
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile_dir}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    return driver
