"""Scans and estimates of `zoo serve` in a process of their own, so that they take neither the server's GIL
nor, at a lower priority, its CPU time: the cheap routes keep their latency while an estimate runs.

The server (zoo.web.app) starts one worker at its first heavy request and sends it one request at a time.
The worker (`python -m zoo.web.worker`) reads the registry's URL and then requests as JSON lines on stdin,
and answers each with a line `STATUS LENGTH` and the JSON body on what was its stdout (its own stdout goes
to stderr: a builder that prints cannot garble an answer); zoo's typed errors become their HTTP statuses
there (views.error). It keeps torch imported, the templates it has built and the last module trees; it
dies with the server (PR_SET_PDEATHSIG) and ends when its stdin closes. A worker that ends during a request
makes that request a WorkerFailed (500), and the next heavy request starts a new one.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import OrderedDict

from zoo.errors import WorkerFailed, ZooError

NICE = 10  # the worker's priority below the server's: cheap routes first when the CPUs are busy
TREE_CACHE_SIZE = 32
log = logging.getLogger("zoo.web")


class Worker:
    """The server's side: start() on the thread that lives as long as the server (the event loop's: the
    parent-death signal follows the thread that started the child), call() one request at a time."""

    def __init__(self, url: str):
        self.url = url
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """A new worker unless one is running; it imports what the server imports (its sys.path)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zoo.web.worker", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None  # stdin=PIPE
        self.proc.stdin.write(self.url.encode() + b"\n")  # not an argument: ps would show a password
        self.proc.stdin.flush()

    def call(self, kind: str, name: str, params: dict) -> tuple[int, bytes]:
        """(HTTP status, JSON body) of a scan or an estimate; WorkerFailed when the worker ends meanwhile."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None  # start(): both pipes
        try:
            proc.stdin.write(json.dumps({"kind": kind, "name": name, "params": params}).encode() + b"\n")
            proc.stdin.flush()
            status, length = map(int, proc.stdout.readline().split())
            body = proc.stdout.read(length)
            if len(body) == length:
                return status, body
        except (OSError, ValueError):  # a broken pipe, an empty or garbled line: the worker is gone
            pass
        proc.kill()
        code = proc.wait()
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        raise WorkerFailed(
            f"the process running scans and estimates ended during this request ({how}); "
            "the next request starts a new one"
        )

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                assert pipe is not None  # start() made both pipes
                pipe.close()


class Heavy:
    """The worker's side: scans (their trees cached by model and indexing time) and estimates over one Zoo."""

    def __init__(self, url: str):
        from zoo.api import Zoo

        self.zoo = Zoo(url)
        self.trees: OrderedDict = OrderedDict()

    def answer(self, kind: str, name: str, params: dict) -> tuple[int, bytes]:
        from zoo.web import views

        try:
            status, body = 200, self.tree(name) if kind == "scan" else views.estimate(self.zoo, name, params)
        except ZooError as e:
            status, body = views.error(e)
            if status >= 500:  # the client's message leaves out where the registry is; the log says it all
                log.error("%s: %s", type(e).__name__, e)
        except Exception:  # a bug, not the request: the traceback to the server's log, a 500 to the client
            log.exception("%s of %s", kind, name)
            status, body = 500, {"error": "InternalError", "message": f"the {kind} failed: the server's log says why"}
        # as Starlette's JSONResponse writes it
        return status, json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()

    def tree(self, name: str) -> dict:
        from zoo.web import views

        info = self.zoo.info(name)
        key = (info.name, info.indexed_at)  # a re-indexed model is scanned again
        if key not in self.trees:
            self.trees[key] = views.tree(self.zoo, info.name)
            while len(self.trees) > TREE_CACHE_SIZE:
                self.trees.popitem(last=False)
        self.trees.move_to_end(key)
        return self.trees[key]


def main(parent: int) -> None:
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal stops the server, which ends this
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # not Linux: the worker ends when the server's end closes its stdin
    if os.getppid() != parent:  # the server ended before the line above took effect
        return
    os.nice(NICE)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    heavy = Heavy(sys.stdin.buffer.readline().decode().strip())
    for line in sys.stdin.buffer:
        request = json.loads(line)
        status, body = heavy.answer(request["kind"], request["name"], request["params"])
        answers.write(b"%d %d\n" % (status, len(body)) + body)
        answers.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]))
