"""Two things an admit may be told. The config version its caller's live config is at
(lua/config_version.lua, admit.lua's ``cv``): an instance whose copy is older than what an admin
change published is told so by its next admit, which reserves nothing; on a 3-node cluster too
(each root in its own slot). And not to record a refusal (``nr``: a route that counts its input
asks again at once with the count)."""

from __future__ import annotations

from typing import Any

import pytest

from hardcap_core.budgets import Dimension, Level, LevelKind
from hardcap_core.errors import ConfigStale
from hardcap_core.ledger import Admitted, Ledger
from tests.conftest import ORG, TENANT, scope

OTHER = Level(LevelKind.TENANT, "solo")


def acme() -> Any:
    return scope((TENANT, Dimension.TOTAL_TOKENS, 1000, "day"))


async def test_an_admit_with_an_older_version_reserves_nothing_and_says_so(ledger: Ledger) -> None:
    s = acme()
    first = await ledger.admit(s, input_tokens=10, output_estimate=10, config_version=0)
    assert isinstance(first, Admitted)  # nothing published yet: any version is current
    await ledger.publish_config_version([ORG.tag], 3)
    with pytest.raises(ConfigStale) as stale:
        await ledger.admit(s, input_tokens=10, output_estimate=10, config_version=2)
    assert stale.value.version == 3
    usage = await ledger.usage(s)
    assert usage.rows[0].reserved == 20  # the first hold only: the stale admit held nothing
    again = await ledger.admit(s, input_tokens=10, output_estimate=10, config_version=3)
    assert isinstance(again, Admitted)
    # An admit that does not say its version (no live config) is never refused for it.
    assert isinstance(await ledger.admit(s, input_tokens=1, output_estimate=1), Admitted)


async def test_versions_only_move_forward_and_stay_in_their_hierarchy(ledger: Ledger) -> None:
    await ledger.publish_config_version([ORG.tag], 5)
    await ledger.publish_config_version([ORG.tag], 4)  # an older publish overtaken: no effect
    with pytest.raises(ConfigStale) as stale:
        await ledger.admit(acme(), input_tokens=1, output_estimate=1, config_version=4)
    assert stale.value.version == 5
    # Another hierarchy (another slot on a cluster) did not change.
    solo = scope((OTHER, Dimension.TOTAL_TOKENS, 100, "day"), levels=(OTHER,))
    result = await ledger.admit(solo, input_tokens=1, output_estimate=1, config_version=4)
    assert isinstance(result, Admitted)


async def test_a_refusal_asked_not_to_be_recorded_leaves_no_usage_record(
    ledger: Ledger, client: Any
) -> None:
    """A route that counts its input asks first with the bound and records no refusal for it:
    the count's answer, right after, is the request's one record."""
    from hardcap_core.ledger import Refused

    s = scope((TENANT, Dimension.TOTAL_TOKENS, 10, "day"))
    stream = ledger.keys.usage_stream(s.root)
    quiet = await ledger.admit(s, input_tokens=50, output_estimate=1, record_refusal=False)
    assert isinstance(quiet, Refused)
    assert await client.xlen(stream) == 0
    loud = await ledger.admit(s, input_tokens=50, output_estimate=1)
    assert isinstance(loud, Refused)
    assert await client.xlen(stream) == 1
