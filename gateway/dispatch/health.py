"""A dispatch worker's liveness, for a probe (`isthmus worker --health-port`; the Helm chart).

``isthmus worker`` serves no API. A worker that hangs without crashing (a loop stuck in a
call that never returns) would hold its pods' place and do nothing; a liveness probe must see
it. Each of the worker's loops (dispatch, reconcile) notes when it last began a pass
(:class:`Beats`); ``GET /healthz`` answers 200 while every loop began one within ``stale_s``,
else 503 naming the loop. A pass that fails (a database outage, a pool down) still counts: the
loop is alive and retrying, and restarting the process would not help (docs/operations.md).
Served by the standard library's HTTP server on its own thread: no framework for one path.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Beats:
    """When each loop last began a pass (monotonic seconds)."""

    def __init__(self, *names: str) -> None:
        now = time.monotonic()
        self._at = dict.fromkeys(names, now)

    def beat(self, name: str) -> None:
        self._at[name] = time.monotonic()

    def ages(self) -> dict[str, float]:
        now = time.monotonic()
        return {name: round(now - at, 3) for name, at in self._at.items()}


def verdict(beats: Beats, stale_s: float) -> tuple[int, dict]:
    """(HTTP status, body) of the probe: 503 when a loop has not begun a pass for ``stale_s``."""
    ages = beats.ages()
    stuck = sorted(name for name, age in ages.items() if age > stale_s)
    body = {"status": "stuck" if stuck else "ok", "loops_s_since_pass": ages, "stale_after_s": stale_s}
    if stuck:
        body["stuck"] = stuck
    return (503 if stuck else 200), body


def serve(beats: Beats, *, host: str, port: int, stale_s: float) -> ThreadingHTTPServer:
    """Answer ``GET /healthz`` on ``host:port`` from a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the standard library's name for it
            if self.path.split("?", 1)[0] != "/healthz":
                self.send_error(404)
                return
            status, body = verdict(beats, stale_s)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:  # probes every few seconds: not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="isthmus-worker-health", daemon=True).start()
    return server
