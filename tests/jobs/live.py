"""Serve an app over real HTTP (uvicorn in a thread), for streaming responses.

Starlette's TestClient returns a response only once the app has finished sending it, so a
stream that stays open (server-sent events, ``follow``) needs a real server. The app is
already started by the test's TestClient (its lifespan ran), hence ``lifespan="off"``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(app, port: int | None = None) -> Iterator[str]:
    """``port``: one the caller chose (e.g. already in the app's settings), else a free one."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning", http="h11",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = True  # open streams would hold a graceful shutdown
        thread.join(20)
