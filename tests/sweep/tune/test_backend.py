"""A server whose engine died (a tensor-parallel rank, say) answers /health with 503: the trial is infeasible."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sweep.tune.backend import engine_dead_behind_server


@contextmanager
def health_server(status: int) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_503_on_health_means_the_engine_is_dead() -> None:
    with health_server(503) as port:
        assert engine_dead_behind_server("127.0.0.1", port)
    with health_server(200) as port:
        assert not engine_dead_behind_server("127.0.0.1", port)
    with health_server(404) as port:  # an external server without /health
        assert not engine_dead_behind_server("127.0.0.1", port)
    assert not engine_dead_behind_server("127.0.0.1", port)  # nothing listens any more: the process check decides
