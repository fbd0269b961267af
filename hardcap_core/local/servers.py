"""Servers for local runs, tests and benchmarks: uvicorn in a background thread, and SIGTERM
handled the way Ctrl-C is.

Not shipped to Lambda (the artifact leaves ``hardcap_core/local/`` out).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

# Keep idle client connections longer than clients' pools do (uvicorn's default is 5 s): a
# client that reuses a connection the server just closed sees a bare read error.
UVICORN_OPTIONS: dict[str, Any] = {
    "log_level": "warning",
    "lifespan": "on",
    "timeout_keep_alive": 75,
    # The gateway reads no client address: uvicorn's X-Forwarded-For middleware is one more
    # layer every request and every streamed piece passes through (as in run.sh).
    "proxy_headers": False,
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


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised in the main thread by the handler :func:`stop_on_sigterm` sets.

    A KeyboardInterrupt, so whatever already unwinds cleanly on Ctrl-C (``uvicorn.run``, the
    demo's wait, every ``finally`` that stops an embedded Valkey) does the same on SIGTERM.
    """


def stop_on_sigterm() -> None:
    """Make SIGTERM (what a process manager sends) stop this process as Ctrl-C does.

    Without a handler, SIGTERM kills Python before any ``finally`` runs; uvicorn, which catches
    it for a graceful shutdown, raises it again afterwards, with the handler it found. Either way
    an embedded Valkey (a process of its own session) and server threads were left running.
    Does nothing outside the main thread, where Python allows no signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def _raise(signum: int, frame: FrameType | None) -> None:
        # Once: a second SIGTERM must not cut short the unwinding that stops the servers; a
        # process manager that runs out of patience sends SIGKILL.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    signal.signal(signal.SIGTERM, _raise)
