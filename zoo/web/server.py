"""How `zoo serve` runs the catalog: uvicorn's h11 server with bounds that a few clients cannot exhaust.

Uvicorn alone waits forever for a request's headers, and holds every connection it accepts: 1,100
half-open connections (slowloris) took every file descriptor of a 1,024-file process, and no client got in
again. Here a request's headers must be complete within HEADER_TIMEOUT_S of connecting (or of the last
answer on a kept-alive connection), however slowly they trickle; the process may open as many files as
its hard limit allows; and past the connection cap, a new connection closes the oldest one that has no
request under way, so a new client is answered while the attack's connections come and go.
"""

from __future__ import annotations

import resource

HEADER_TIMEOUT_S = 10
MAX_CONNECTIONS = 4096
FILES_RESERVED = 256  # descriptors kept for the registry's files, threads and logs
MAX_HEADER_BYTES = 16 * 1024  # h11's bound on an incomplete request (headers); more is a 400


def raise_file_limit(wanted: int = MAX_CONNECTIONS + FILES_RESERVED) -> int:
    """Raise this process's soft limit on open files toward `wanted` (within the hard limit); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def guarded_protocol(max_connections: int, header_timeout_s: float = HEADER_TIMEOUT_S) -> type:
    """uvicorn's h11 protocol with a deadline for headers and a connection cap that evicts idle connections."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Guarded(H11Protocol):
        deadline = None
        waiting_since = 0.0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.arm()
            if len(self.connections) > max_connections:
                idle = [
                    c
                    for c in self.connections
                    if isinstance(c, Guarded) and c is not self and c.idle() and not c.transport.is_closing()
                ]
                if idle:
                    min(idle, key=lambda c: c.waiting_since).transport.close()

        def idle(self) -> bool:
            """No request under way: connected, or between requests, without complete headers yet."""
            return self.cycle is None or self.cycle.response_complete

        def arm(self) -> None:
            self.disarm()
            self.waiting_since = self.loop.time()
            self.deadline = self.loop.call_later(header_timeout_s, self.expire)

        def disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def expire(self) -> None:
            if self.idle() and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if not self.idle():  # the headers are in: the request runs as long as it takes
                self.disarm()

        def on_response_complete(self) -> None:
            self.arm()  # before: a pipelined request that the parent starts here disarms it again
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self.disarm()
            super().connection_lost(exc)

    return Guarded


def config(app, host: str = "127.0.0.1", port: int = 8000, header_timeout_s: float = HEADER_TIMEOUT_S):
    """The uvicorn.Config `zoo serve` runs (the load bench too): the process's file limit raised first, and
    the connection cap set below it."""
    import uvicorn

    files = raise_file_limit()
    cap = max(16, min(MAX_CONNECTIONS, files - min(FILES_RESERVED, files // 4)))
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=guarded_protocol(cap, header_timeout_s),
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        backlog=2048,
        timeout_keep_alive=5,
    )
