"""A Lambda function's handler as Lambda runs it, for the event-driven tests: the sample events
in ``events/`` loaded by one helper, and the handler module loaded once, from its file, in one
worker thread. Mangum drives that thread's own event loop, the one the handler's clients stay
bound to between invocations, as in a warm execution environment.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
DEMO_CONFIG = ROOT / "hardcap_core" / "local" / "demo.yaml"
T = TypeVar("T")


def load_event(name: str) -> dict[str, Any]:
    """A sample event from events/, as a fresh dict (handlers may change what they get)."""
    event: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return event


def demo_config(folder: Path, upstream_url: str) -> tuple[Path, dict[str, Any]]:
    """The demo config (hardcap_core/local/demo.yaml) with its upstream at ``upstream_url``,
    written to ``folder``: its path and its data."""
    config = yaml.safe_load(DEMO_CONFIG.read_text())
    config["upstreams"][0]["base_url"] = f"{upstream_url}/v1"
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


class LambdaHandler:
    """A handler module loaded in its worker thread; ``invoke`` runs one event through it."""

    def __init__(self, module: ModuleType, worker: ThreadPoolExecutor, context: Any) -> None:
        self.module = module
        self.worker = worker
        self.context = context  # the Lambda context object each invocation is given

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the handler's thread."""
        return self.worker.submit(fn, *args).result(timeout=60)

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = self.run(self.module.handler, event, self.context())
        return response

    def close_gateway(self) -> None:
        """Close the gateway app's clients on the loop they were made on, then the loop."""
        loop = self.run(asyncio.get_event_loop)
        self.run(loop.run_until_complete, self.module._asgi.app.state.runtime.aclose())
        self.run(loop.close)


@contextmanager
def lambda_handler(path: Path, name: str, context: Callable[[], Any]) -> Iterator[LambdaHandler]:
    """The handler module at ``path``, imported as ``name`` in a new worker thread (the
    environment is read then: set it first); the thread is shut down on exit."""

    def load() -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lambda")
    try:
        yield LambdaHandler(worker.submit(load).result(timeout=60), worker, context)
    finally:
        worker.shutdown()
