"""A real PostgreSQL server for the tests, started from the Debian package: initdb into a temp dir as the
unprivileged `postgres` user (initdb refuses root), 127.0.0.1 only, a free port, stopped at the end.
Databases use an ICU collation, so that an ORDER BY that leans on the server's collation shows."""

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time

import psycopg

# A password in every URL, so that tests can check it never shows (the server trusts 127.0.0.1 anyway).
USER, PASSWORD = "zoo", "s3cret-pw"
TEMPLATE = "zoo_icu"


class Unavailable(RuntimeError):
    """The server cannot be started here (no binaries, no postgres user, ...)."""


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise Unavailable(f"no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/{name}): "
                          f"apt-get install postgresql")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="zoo-pg-")
        self.data = os.path.join(self.root, "data")
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            try:
                shutil.chown(self.root, "postgres", "postgres")
            except (LookupError, OSError) as e:
                raise Unavailable(f"running as root and there is no `postgres` user to run the server as ({e})")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        self._names = itertools.count()

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = os.path.join(self.root, "log")
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            raise Unavailable(f"{os.path.basename(cmd[0])} failed: {proc.stderr.strip()[-2000:]}\n{tail}")

    def start(self) -> "Server":
        self._run(_bin("initdb"), "-D", self.data, "--auth=trust", "--username=postgres", "--encoding=UTF8",
                  "--locale=C.UTF-8")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                   f"-c max_connections=400 -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run(_bin("pg_ctl"), "-D", self.data, "-o", options, "-l", os.path.join(self.root, "log"), "-w",
                  "-t", "60", "start")
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
            conn.execute(f"CREATE DATABASE {TEMPLATE} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                         f"LOCALE 'C.UTF-8' ENCODING 'UTF8'")
        return self

    def admin(self):
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                               autocommit=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def fresh(self) -> str:
        """The URL of a new empty database (a copy of the ICU template: milliseconds)."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.url(name)

    def stop(self) -> None:
        try:
            subprocess.run([*self.as_user, _bin("pg_ctl"), "-D", self.data, "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
        except Unavailable:
            pass
        for _ in range(3):
            shutil.rmtree(self.root, ignore_errors=True)
            if not os.path.exists(self.root):
                break
            time.sleep(0.2)


def start() -> Server:
    server = Server()
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise
