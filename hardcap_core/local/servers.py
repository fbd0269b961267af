"""Servers for local runs, tests and benchmarks: uvicorn in a background thread.

Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import threading
import time
from typing import Any

# Keep idle client connections longer than clients' pools do (uvicorn's default is 5 s): a
# client that reuses a connection the server just closed sees a bare read error.
UVICORN_OPTIONS: dict[str, Any] = {
    "log_level": "warning",
    "lifespan": "on",
    "timeout_keep_alive": 75,
}


class ThreadServer:
    """A uvicorn server in a background thread (demo, tests, benchmarks)."""

    def __init__(self, app: Any, port: int, host: str = "127.0.0.1") -> None:
        import uvicorn

        cfg = uvicorn.Config(app, **UVICORN_OPTIONS, host=host, port=port)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{host}:{port}"

    def start(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
