"""The `zoo serve` HTTP server: the search and model pages and the JSON API, read-only, over one Zoo.

Every route is GET (HEAD follows); any other method gets 405 before reaching zoo, and zoo is only
asked to search, read, scan and estimate, which open the registry for reading. Pages are HTML
shells with their first answer embedded as JSON, so one request draws a page; the scripts and
the style are files of the package (no CDN), and the Content-Security-Policy allows nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from html import escape
from pathlib import Path
from string import Template

import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from zoo.api import Zoo
from zoo.errors import ZooError
from zoo.web import views
from zoo.web.worker import Worker

HERE = Path(__file__).resolve().parent
STATIC, TEMPLATES = HERE / "static", HERE / "templates"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
RETRY_AFTER_S = 5  # what a 503 (a locked registry, a full heavy queue) tells the client to wait
HEAVY_QUEUE = 8  # scans and estimates that may wait behind the one running; more are refused at once (503)
log = logging.getLogger("zoo.web")


def template(name: str) -> Template:
    return Template((TEMPLATES / name).read_text())


def page(name: str, title: str, root: str, data: dict) -> str:
    """An HTML shell with its data as a JSON block (<, >, & escaped so no string can close the tag). Strict JSON:
    the page's JSON.parse refuses NaN and Infinity (readers give None for a stored value that is no number)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    home = root or "index.html"  # the search page: "/" served, index.html as files
    return template(name).substitute(title=escape(title), root=root, home=home, data=text)


class Catalog:
    """The routes over one registry. Scans and estimates build models and run meta forwards: they run one
    at a time (a bound on the CPU one client can take, and templates are built once) in a worker process
    (zoo.web.worker: neither this process's GIL nor, at its lower priority, its CPU time), at most
    HEAVY_QUEUE waiting on the event loop. Everything else runs in Starlette's thread pool."""

    def __init__(self, url: str | None = None, heavy_queue: int = HEAVY_QUEUE):
        self.zoo = Zoo(url)
        self.heavy_queue = heavy_queue
        self.heavy_admitted = 0  # running or waiting; counted on the event loop's thread only
        self.heavy_lane: anyio.Lock | None = None  # made on the event loop
        self.worker = Worker(self.zoo.url)

    def answer(self, run, html: tuple[str, str] | None = None) -> Response:
        """JSON of run(), or an HTML page embedding it; a zoo error becomes its typed status and body.
        Server-Timing says how long the answer took here (bench/web_search.py reads it)."""
        start = time.perf_counter()
        try:
            status, body = 200, run()
        except ZooError as e:
            status, body = self.failure(e)
            body = {"failure": body} if html else body
        response: Response
        if html is None:
            response = JSONResponse(body, status_code=status, headers=HEADERS)
        else:
            name, title = html
            response = HTMLResponse(
                page(name, title, "/", {"mode": "server", **body}), status_code=status, headers=HEADERS
            )
        return self.timed(response, start)

    @staticmethod
    def failure(e: ZooError) -> tuple[int, dict]:
        status, body = views.error(e)
        if status >= 500:  # the client's message leaves out where the registry is; the log says it all
            log.error("%s: %s", type(e).__name__, e)
        return status, body

    @staticmethod
    def timed(response: Response, start: float) -> Response:
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - start) * 1000:.1f}"
        if response.status_code == 503:
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response

    # --- pages ---

    def search_page(self, request: Request) -> Response:
        return self.answer(
            lambda: {"search": views.search(self.zoo, request.query_params)}, ("search.html", "zoo catalog")
        )

    def model_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        return self.answer(
            lambda: {"model": views.model(self.zoo, name, request.query_params)},
            ("model.html", f"{name} - zoo catalog"),
        )

    # --- JSON API: Zoo.search, Zoo.info, Zoo.scan, Zoo.estimate ---

    def api_search(self, request: Request) -> Response:
        return self.answer(lambda: views.search(self.zoo, request.query_params))

    def api_model(self, request: Request) -> Response:
        return self.answer(lambda: views.model(self.zoo, request.path_params["name"], request.query_params))

    async def api_scan(self, request: Request) -> Response:
        return await self.heavy("scan", request)

    async def api_estimate(self, request: Request) -> Response:
        return await self.heavy("estimate", request)

    async def heavy(self, kind: str, request: Request) -> Response:
        """The worker's answer, or a 503 at once when HEAVY_QUEUE requests wait already. They wait on the
        event loop: waiting in a thread would hold one of the 40 that every other route needs (41 estimates
        stalled a search); the one running holds one thread, which waits for the worker's answer."""
        if self.heavy_admitted > self.heavy_queue:
            return JSONResponse(
                {
                    "error": "Busy",
                    "message": f"{self.heavy_admitted} scans and estimates are running "
                    f"or waiting: try again in {RETRY_AFTER_S} s",
                },
                status_code=503,
                headers={**HEADERS, "Retry-After": str(RETRY_AFTER_S)},
            )
        self.heavy_lane = self.heavy_lane or anyio.Lock()
        self.heavy_admitted += 1
        try:
            async with self.heavy_lane:
                start = time.perf_counter()
                self.worker.start()  # on the event loop's thread, which lives as long as the server
                try:
                    status, body = await anyio.to_thread.run_sync(
                        self.worker.call, kind, request.path_params["name"], dict(request.query_params)
                    )
                    response = Response(body, status, HEADERS, "application/json")
                except ZooError as e:  # the worker ended (WorkerFailed)
                    status, failure = self.failure(e)
                    response = JSONResponse(failure, status, HEADERS)
                return self.timed(response, start)
        finally:
            self.heavy_admitted -= 1

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        yield
        self.worker.close()

    async def not_found(self, request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse(
            {"error": "HTTPError", "message": f"{status}: {request.method} {request.url.path}"},
            status_code=status,
            headers=HEADERS,
        )


LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]


def create_app(url: str | None = None, hosts: list[str] | None = None, heavy_queue: int = HEAVY_QUEUE) -> Starlette:
    """The ASGI app over the registry at `url` (None: $ZOO_REGISTRY or the shipped registry.db);
    `hosts`: the Host headers it answers (None: any); `heavy_queue`: scans and estimates that may wait."""
    c = Catalog(url, heavy_queue)
    # plain (sync) endpoints run in Starlette's thread pool, scans and estimates in their own lane
    routes = [
        Route("/", c.search_page),
        Route("/model/{name:path}", c.model_page),
        Route("/api/search", c.api_search),
        Route("/api/models/{name:path}", c.api_model),
        Route("/api/scan/{name:path}", c.api_scan),
        Route("/api/estimate/{name:path}", c.api_estimate),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(GZipMiddleware, minimum_size=2048, compresslevel=5)]
    if hosts is not None:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=hosts))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={404: c.not_found, 405: c.not_found},
        lifespan=c.lifespan,
    )
    app.state.catalog = c
    return app


def serve(url: str | None = None, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the catalog until interrupted; the registry is opened first, so a wrong one fails at once."""
    import uvicorn

    from zoo.web.server import config

    # Bound to this machine, answer only its own names: a web page elsewhere that rebinds its domain
    # to 127.0.0.1 (DNS rebinding) would otherwise read the registry through the visitor's browser.
    loopback = host in ("127.0.0.1", "localhost", "::1")
    app = create_app(url, hosts=LOOPBACK_HOSTS if loopback else None)
    app.state.catalog.zoo.search(None, limit=1)
    print(f"zoo catalog of {app.state.catalog.zoo} at http://{host}:{port}/ (read-only; Ctrl-C stops)", flush=True)
    uvicorn.Server(config(app, host, port)).run()
