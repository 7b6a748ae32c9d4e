"""A real PostgreSQL server for the tests, started from the Debian package: initdb into a temp dir as the
unprivileged `postgres` user (initdb refuses root), 127.0.0.1 only, a free port, stopped at the end.
Databases use an ICU collation, so that an ORDER BY that leans on the server's collation shows.

The server is the starting process's own child, and ends with it however it ends: stop() at the end, a
SIGTERM handler that stops it first, SIGINT (pytest tears down; a script's exit stops it), and the parent's
death (PR_SET_PDEATHSIG, as zoo.indexing.indexer's workers do: a kill -9 runs nothing in the parent). The folder of a
server whose starter died so is removed by the next start."""

import atexit
import ctypes
import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
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
        raise Unavailable(
            f"no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/{name}): apt-get install postgresql"
        )
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _sweep() -> None:
    """Remove the folders of servers whose starter died without stopping them (their server went with it)."""
    for root in glob.glob(os.path.join(tempfile.gettempdir(), "zoo-pg-*")):
        try:
            with open(os.path.join(root, "starter")) as f:
                starter = int(f.read())
        except (OSError, ValueError):
            continue  # being made right now, or not one of these
        if not _alive(starter):
            shutil.rmtree(root, ignore_errors=True)


_running: list["Server"] = []


def _stop_all() -> None:
    for server in list(_running):
        server.stop()


atexit.register(_stop_all)  # a KeyboardInterrupt (SIGINT) that ends a script, too


def _on_sigterm(signum, frame) -> None:
    """Stop every server, then end as SIGTERM would have ended this process."""
    _stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class Server:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="zoo-pg-")
        with open(os.path.join(self.root, "starter"), "w") as f:
            f.write(str(os.getpid()))
        self.data = os.path.join(self.root, "data")
        self.process: subprocess.Popen | None = None
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            try:
                shutil.chown(self.root, "postgres", "postgres")
            except (LookupError, OSError) as e:
                raise Unavailable(
                    f"running as root and there is no `postgres` user to run the server as ({e})"
                ) from None
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.port = _free_port()
        self._names = itertools.count()

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = os.path.join(self.root, "log")
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            raise Unavailable(f"{os.path.basename(cmd[0])} failed: {proc.stderr.strip()[-2000:]}\n{tail}")

    def _as_server(self, parent: int) -> None:
        """In the server's process before it runs postgres: the postgres user if this is root, then the
        parent-death signal (a change of user clears it, so it comes after). SIGQUIT: immediate shutdown."""
        if self.as_user:
            import pwd

            user = pwd.getpwnam("postgres")
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGQUIT)  # PR_SET_PDEATHSIG (Linux)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    def start(self) -> "Server":
        self._run(
            _bin("initdb"),
            "-D",
            self.data,
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )
        options = ["-p", str(self.port)]
        for setting in (
            "listen_addresses=127.0.0.1",
            f"unix_socket_directories={self.root}",
            "max_connections=400",
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
        ):
            options += ["-c", setting]
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        parent = os.getpid()
        with open(os.path.join(self.root, "log"), "ab") as log:
            self.process = subprocess.Popen(
                [_bin("postgres"), "-D", self.data, *options],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=lambda: self._as_server(parent),
            )
        _running.append(self)
        deadline = time.monotonic() + 60
        while True:  # what pg_ctl -w did: wait until it takes connections
            try:
                self.admin().close()
                break
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    tail = open(os.path.join(self.root, "log")).read()[-2000:]
                    raise Unavailable(f"postgres did not start:\n{tail}") from None
                time.sleep(0.1)
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
            conn.execute(
                f"CREATE DATABASE {TEMPLATE} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                f"LOCALE 'C.UTF-8' ENCODING 'UTF8'"
            )
        return self

    def admin(self):
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def fresh(self) -> str:
        """The URL of a new empty database (a copy of the ICU template: milliseconds)."""
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.url(name)

    def stop(self) -> None:
        if self in _running:
            _running.remove(self)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # immediate shutdown: the data goes with the folder
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for _ in range(3):
            shutil.rmtree(self.root, ignore_errors=True)
            if not os.path.exists(self.root):
                break
            time.sleep(0.2)


def start() -> Server:
    _sweep()
    server = Server()
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise
