"""The child of :mod:`bench.coldstart.coldstart_phases`: one cold start of the streaming entry,
split into
phases, each timed in-process.

It does what ``functions/gateway/run.sh`` does (``python -m uvicorn --factory
hardcap_core.gateway.app:app_from_env --loop uvloop --http httptools --lifespan on``), one step
at a time, then sends itself the first chat completion and a second one over a raw socket, and
prints one JSON line: the phases in milliseconds, ``time.monotonic()`` at its first statement
(the parent subtracts its own spawn time: the interpreter's start), and the modules each phase
imported. Run with the interpreter and ``PYTHONPATH`` under test; it imports nothing from
``bench`` (an artifact has no such package) and only the standard library before it starts.

    python bench/coldstart/coldstart_probe.py EVENT.json [LOOP HTTP]
"""

import time

STARTED = time.monotonic()
_T0 = time.perf_counter()

import asyncio  # noqa: E402  (the first statement's time is the point)
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

phases: dict[str, float] = {"probe_stdlib": (time.perf_counter() - _T0) * 1e3}
imported: dict[str, list[str]] = {}


def step(name: str, work: Callable[[], Any]) -> Any:
    """Run ``work`` as phase ``name``: its time and the top-level packages it imported."""
    before = {m.split(".")[0] for m in sys.modules}
    t = time.perf_counter()
    out = work()
    phases[name] = (time.perf_counter() - t) * 1e3
    imported[name] = sorted({m.split(".")[0] for m in sys.modules} - before)
    return out


async def astep(name: str, work: Any) -> Any:
    before = {m.split(".")[0] for m in sys.modules}
    t = time.perf_counter()
    out = await work
    phases[name] = (time.perf_counter() - t) * 1e3
    imported[name] = sorted({m.split(".")[0] for m in sys.modules} - before)
    return out


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to add its time (sync or awaited) to phase ``name``."""

    if asyncio.iscoroutinefunction(fn):

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + (time.perf_counter() - t) * 1e3

        return wrapped_async

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + (time.perf_counter() - t) * 1e3

    return wrapped


async def post(port: int, event: dict[str, Any]) -> tuple[int, bytes]:
    """One request over a fresh connection (``Connection: close``): status and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = event["body"].encode()
    headers = {k: v for k, v in event["headers"].items() if k.lower() not in ("host",)}
    head = f"POST {event['rawPath']} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "content-length")
    head += f"content-length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    status = int(raw.split(b" ", 2)[1])
    return status, raw.partition(b"\r\n\r\n")[2]


def main() -> None:
    with open(sys.argv[1]) as f:
        event = json.load(f)
    loop_name, http_name = sys.argv[2:4] if len(sys.argv) > 3 else ("uvloop", "httptools")
    port = int(os.environ.get("AWS_LWA_PORT", "8080"))

    # What `python -m uvicorn` imports before it reads its options: uvicorn, its CLI (click).
    step("import_uvicorn", lambda: __import__("uvicorn.main"))
    import uvicorn

    app_module = step("import_app", lambda: __import__("hardcap_core.gateway.app", fromlist=["x"]))
    # The pieces the first request builds (Runtime._build), timed where the app calls them.
    # (The HTTP client's factory has had two names: make_http_client, make_transport.)
    for name, phase in [
        ("connect", "cache_connect"),
        ("make_http_client", "http_client"),
        ("make_transport", "http_client"),
        ("providers_for", "providers"),
        ("_ledger", "ledger"),
    ]:
        if hasattr(app_module, name):
            setattr(app_module, name, timed(f"first_request.{phase}", getattr(app_module, name)))

    path = os.environ["HARDCAP_CONFIG"]
    config = step("config_load", lambda: app_module.load_config(path))
    app = step("app_build", lambda: app_module.create_app(config))

    server_config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop=loop_name, http=http_name, lifespan="on",
        timeout_keep_alive=75, access_log=False, server_header=False, log_level="warning",
    )  # fmt: skip
    step("uvicorn_config", server_config.load)
    loop_factory = step("event_loop_import", server_config.get_loop_factory)
    server = uvicorn.Server(server_config)

    async def run() -> None:
        server.lifespan = server_config.lifespan_class(server_config)
        await astep("server_startup", server.startup())
        # The first request: the cache client, Lua scripts, HTTP client, providers, upstream.
        status, body = await astep("first_request", post(port, event))
        if status != 200:
            raise SystemExit(f"first request answered {status}: {body[:500]!r}")
        status, _ = await astep("second_request", post(port, event))
        if status != 200:
            raise SystemExit(f"second request answered {status}")
        server.should_exit = True
        await server.shutdown()

    loop = loop_factory() if loop_factory is not None else asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    print(
        json.dumps(
            {
                "started_monotonic": STARTED,
                "phases_ms": {k: round(v, 2) for k, v in phases.items()},
                "imported": imported,
                "modules": len(sys.modules),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
