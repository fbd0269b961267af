"""What each candidate HTTP client costs a cold start, to import and to build
(bench/coldstart/coldstart_transports.py's result), generated so docs/coldstart.md cannot drift
from bench/results/coldstart-transports.json."""

from __future__ import annotations

from typing import Any

# The page's label per candidate, with the versions the result recorded; a candidate not named
# here is shown by the statement it timed.
LABELS = {
    "httpx": "httpx {httpx}",
    "httpx2": "httpx2 {httpx2}",
    "httpx_aiohttp": "httpx + aiohttp transport (httpx-aiohttp {httpx-aiohttp}, aiohttp {aiohttp})",
    "aiohttp": "aiohttp {aiohttp} (its default TLS context is made at import)",
    "hardcap_transport": "the gateway's transport (`providers/aiohttp_transport.py`, aiohttp)",
    "hardcap_http11": "the gateway's former HTTP/1.1 transport (removed since; TLS context made "
    "as its first HTTPS connection makes it)",
}


def _ms(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def _label(name: str, c: dict[str, Any], versions: dict[str, str]) -> str:
    try:
        return LABELS[name].format(**versions)
    except KeyError:
        return f"`{c.get('statement', name)}`"


def coldstart_transports_table(data: dict[str, Any]) -> str:
    versions = data.get("versions") or {}
    rows = [
        "| client | import | build the client (TLS context included) | total |",
        "|---|---:|---:|---:|",
    ]
    for name, c in data["candidates"].items():
        med, low = c["median_ms"], c["min_ms"]
        rows.append(
            f"| {_label(name, c, versions)} | {_ms(med['import_ms'])} ({_ms(low['import_ms'])}) "
            f"| {_ms(med['client_ms'])} ({_ms(low['client_ms'])}) "
            f"| {_ms(med['import_ms'] + med['client_ms'])} |"
        )
    rows += [
        "",
        f"Median (fastest) of {data['parameters']['runs']} runs, ms, each on top of a fresh "
        "interpreter that has imported asyncio and ssl.",
    ]
    return "\n".join(rows)
