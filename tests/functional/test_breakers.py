"""The shared circuit breakers (``ledger/breakers.py``, ``lua/breaker.lua``) against a real
standalone server and a 3-master cluster: one tenant's failures never open an upstream's
breaker while another tenant uses it, a real outage still does, a deployment with one tenant
still can, and a deploy that mixes this version with the one before keeps working both ways."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hardcap_core.config.settings import BreakerSettings
from hardcap_core.ledger import Ledger
from hardcap_core.ledger import breakers as breakers_module
from hardcap_core.ledger.breakers import PROBE_TTL_MS, Breakers, BreakerState

S = BreakerSettings(failures=3, cooldown_seconds=0.3, half_open_probes=1)
UP = "primary"
A, B = "t:alpha", "t:beta"
COOLDOWN_PASSED_S = 0.4

# lua/breaker.lua as version 1 shipped it (before tenants counted): what an instance not yet
# updated still runs during a deploy. Kept verbatim.
V1_SCRIPT = r"""
-- breaker.lua: one upstream's circuit breaker, shared by every gateway instance.
--
-- KEYS[1]  hc:{brk:<upstream>}  hash  s: state (c closed | o open | h half-open),
--                                     f: consecutive failures, t: when it opened (ms),
--                                     p: probes in flight, pt: when the last probe began (ms)
--
-- ARGV[1]  op: 'check' (may a request go to this upstream now?), 'ok' (one succeeded),
--          'fail' (one failed: 429, 5xx, timeout, connection error)
-- ARGV[2]  failures that open it
-- ARGV[3]  cooldown, ms: how long it stays open before it lets probes through
-- ARGV[4]  probes let through at once while half-open
-- ARGV[5]  ms after which a probe that never reported is forgotten (its instance died)
--
-- Units: times in epoch ms from the server's TIME.
--
-- Reply: {allowed (1|0; 1 for 'ok' and 'fail'), state after ('closed'|'open'|'half_open'),
--         consecutive failures, ms until it may be probed (0 unless open)}
--
-- Closed: every request goes; `failures` consecutive failures open it. Open: nothing goes
-- until the cooldown has passed; then half-open: up to `probes` requests at once go, one
-- success closes it, one failure opens it again for another cooldown.

local op = ARGV[1]
local threshold, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_probes, probe_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 's', 'f', 't', 'p', 'pt')
local state, fails = f[1] or 'c', tonumber(f[2] or '0')
local opened, probes, probe_at = tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(f[5] or '0')
local names = {c = 'closed', o = 'open', h = 'half_open'}

if state == 'o' and now - opened >= cooldown then
  state, probes = 'h', 0
end
if state == 'h' and probes > 0 and now - probe_at >= probe_ttl then
  probes = 0  -- the probes in flight never reported: their instances are gone
end

local allowed = 1
if op == 'check' then
  if state == 'o' then
    allowed = 0
  elseif state == 'h' then
    if probes < max_probes then
      probes, probe_at = probes + 1, now
    else
      allowed = 0
    end
  end
elseif op == 'ok' then
  state, fails, probes = 'c', 0, 0
elseif op == 'fail' then
  fails = fails + 1
  if state == 'h' or (state == 'c' and fails >= threshold) then
    state, opened, probes = 'o', now, 0
  end
end

redis.call('HSET', KEYS[1], 's', state, 'f', fails, 't', opened, 'p', probes, 'pt', probe_at)
-- A breaker nobody touched for a day is forgotten (closed).
redis.call('PEXPIRE', KEYS[1], 86400000)
local wait = 0
if state == 'o' then wait = math.max(opened + cooldown - now, 0) end
return {allowed, names[state], fails, wait}
"""


@pytest.fixture(autouse=True)
def every_check_asks_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """No check answered from the process's memory of a clean breaker: each one is seen."""
    monkeypatch.setattr(breakers_module, "LOCAL_CLOSED_S", 0.0)


@pytest.fixture
def breakers(ledger: Ledger) -> Breakers:
    return Breakers(ledger.client, ledger.scripts, ledger.keys)


async def fail(breakers: Breakers, tenant: str | None, times: int) -> BreakerState:
    state = None
    for _ in range(times):
        state = await breakers.failed(UP, S, tenant)
    assert state is not None
    return state


async def v1(ledger: Ledger, op: str) -> list[Any]:
    """One call of version 1's script, as a gateway not yet updated makes it."""
    script = ledger.client.register_script(V1_SCRIPT)
    args = [op, S.failures, int(S.cooldown_seconds * 1000), S.half_open_probes, PROBE_TTL_MS]
    reply = await script(keys=[ledger.keys.breaker(UP)], args=args)
    return [r.decode() if isinstance(r, bytes) else int(r) for r in reply]


def summary(state: BreakerState) -> tuple[str, int, int, int]:
    return state.state, state.failures, state.tenants, state.needed


async def test_one_tenants_failures_never_open_it_while_another_uses_the_upstream(
    breakers: Breakers,
) -> None:
    assert (await breakers.check(UP, S, B)).allowed  # beta uses the upstream
    assert summary(await fail(breakers, A, 10)) == ("closed", 10, 1, 2)
    assert (await breakers.check(UP, S, B)).allowed
    # A real outage: beta's requests fail too, and that opens it for everyone.
    assert summary(await breakers.failed(UP, S, B)) == ("open", 11, 0, 2)
    assert not (await breakers.check(UP, S, A)).allowed
    assert not (await breakers.check(UP, S, B)).allowed


async def test_many_concurrent_failures_of_one_tenant_never_open_it(breakers: Breakers) -> None:
    await breakers.check(UP, S, B)
    await asyncio.gather(*(breakers.failed(UP, S, A) for _ in range(50)))
    state = await breakers.check(UP, S, B)
    assert state.allowed and summary(state) == ("closed", 50, 1, 2)


async def test_a_deployment_with_one_tenant_opens_it_on_that_tenants_failures(
    breakers: Breakers,
) -> None:
    assert (await breakers.check(UP, S, A)).allowed
    assert summary(await fail(breakers, A, 2)) == ("closed", 2, 1, 1)
    assert summary(await breakers.failed(UP, S, A)) == ("open", 3, 0, 1)
    assert not (await breakers.check(UP, S, A)).allowed


async def test_a_tenant_not_seen_for_the_horizon_no_longer_counts_as_using_it(
    breakers: Breakers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(breakers_module, "SEEN_FOR_MS", 300)
    await breakers.check(UP, S, B)
    assert (await fail(breakers, A, 3)).state == "closed"
    await asyncio.sleep(0.35)  # beta has not used the upstream since
    assert summary(await breakers.failed(UP, S, A)) == ("open", 4, 0, 1)


async def test_a_failure_no_tenant_shaped_is_evidence_alone(breakers: Breakers) -> None:
    await breakers.check(UP, S, B)
    assert (await fail(breakers, A, 2)).state == "closed"
    assert (await breakers.failed(UP, S, None)).state == "open"


async def test_a_success_ends_the_run_and_its_tenants(breakers: Breakers) -> None:
    await breakers.check(UP, S, A)
    await breakers.failed(UP, S, B)  # beta's failure, then a success: a new run begins
    before = await breakers.check(UP, S, A)
    assert before.failures == 1
    await breakers.succeeded(UP, S, before, A)
    assert summary(await fail(breakers, A, 5)) == ("closed", 5, 1, 2)


async def test_half_open_one_tenants_failed_probes_free_their_slot_until_a_second_tenant_fails(
    breakers: Breakers,
) -> None:
    await breakers.check(UP, S, B)
    await fail(breakers, A, 3)
    assert (await breakers.failed(UP, S, B)).state == "open"
    await asyncio.sleep(COOLDOWN_PASSED_S)
    probe = await breakers.check(UP, S, A)
    assert probe.allowed and probe.state == "half_open"
    assert not (await breakers.check(UP, S, B)).allowed  # one probe at a time
    assert summary(await breakers.failed(UP, S, A)) == ("half_open", 5, 1, 2)
    probe = await breakers.check(UP, S, B)  # alpha's failed probe freed the slot
    assert probe.allowed
    assert (await breakers.failed(UP, S, B)).state == "open"  # two tenants: open again
    await asyncio.sleep(COOLDOWN_PASSED_S)
    probe = await breakers.check(UP, S, B)
    await breakers.succeeded(UP, S, probe, B)
    assert summary(await breakers.check(UP, S, A)) == ("closed", 0, 0, 2)


async def test_a_probe_that_says_nothing_of_the_upstream_frees_its_slot(
    breakers: Breakers,
) -> None:
    await fail(breakers, None, 3)
    await asyncio.sleep(COOLDOWN_PASSED_S)
    probe = await breakers.check(UP, S, A)
    assert probe.allowed and probe.state == "half_open"
    assert not (await breakers.check(UP, S, B)).allowed
    await breakers.released(UP, S, probe, A)  # alpha's probe got a 413: its own fault
    assert (await breakers.check(UP, S, B)).allowed


# -- a deploy that mixes version 1 (old gateways) and version 2 ----------------------------------


async def test_an_old_gateway_reads_and_writes_the_new_state(
    ledger: Ledger, breakers: Breakers
) -> None:
    await breakers.check(UP, S, B)
    await fail(breakers, A, 2)
    assert await v1(ledger, "check") == [1, "closed", 2, 0]
    # Version 1 opens it on anyone's third failure, as it always did.
    assert (await v1(ledger, "fail"))[:3] == [1, "open", 3]
    assert not (await breakers.check(UP, S, A)).allowed
    await asyncio.sleep(COOLDOWN_PASSED_S)
    probe = await breakers.check(UP, S, A)
    assert probe.allowed and probe.state == "half_open"
    assert await v1(ledger, "check") == [0, "half_open", 3, 0]  # the slot is taken
    await breakers.succeeded(UP, S, probe, A)
    assert await v1(ledger, "check") == [1, "closed", 0, 0]


async def test_a_new_gateway_reads_the_old_state_and_counts_no_tenant_for_its_failures(
    ledger: Ledger, breakers: Breakers
) -> None:
    await v1(ledger, "fail")
    await v1(ledger, "fail")
    await breakers.check(UP, S, B)
    # Version 1's failures name no tenant: alpha's one is the only one known.
    assert summary(await breakers.failed(UP, S, A)) == ("closed", 3, 1, 2)
    assert summary(await breakers.failed(UP, S, B)) == ("open", 4, 0, 2)


async def test_an_old_gateways_success_ends_the_run_the_new_one_knew(
    ledger: Ledger, breakers: Breakers
) -> None:
    await breakers.check(UP, S, B)
    await breakers.failed(UP, S, A)
    await breakers.failed(UP, S, B)  # two tenants' failures in this run
    await v1(ledger, "ok")  # an old gateway's success ends it
    assert summary(await fail(breakers, A, 3)) == ("closed", 3, 1, 2)


async def test_after_an_old_gateways_failure_the_runs_tenants_are_unknown(
    ledger: Ledger, breakers: Breakers
) -> None:
    """It may have ended the run (a success) before it failed: what the new script knew of
    the run is dropped, and only the failures reported since name tenants."""
    await breakers.check(UP, S, B)
    await breakers.failed(UP, S, A)
    await v1(ledger, "fail")
    assert summary(await breakers.failed(UP, S, B)) == ("closed", 3, 1, 2)
    assert summary(await breakers.failed(UP, S, A)) == ("open", 4, 0, 2)
