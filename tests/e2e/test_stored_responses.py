"""Stored Responses, owned per tenant, with the official `openai` SDK as client against the
gateway and the mock upstream on real Valkey: `previous_response_id` turns (unary, streamed,
with a function call and its output) whose charged input is what the mock billed for the whole
conversation, the same as sending it inline; GET, DELETE, input_items and cancel for the owner
only (another tenant, or another user of the same tenant, gets 404 and nothing is charged);
store false, a route that keeps nothing, the size bound and the TTL."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest
import redis

from hardcap_core.local.mock_upstream import MockSettings
from hardcap_core.local.valkey import LocalValkey
from tests.e2e.test_responses_endpoint import KEY_ENV, WEATHER, claude
from tests.e2e.test_user_budgets import issuer, token, users_config
from tests.jwks_server import JwksServer
from tests.stack import KEYS, Mock, gateway, gateway_thread, mock_fixture
from tests.stack import openai_client as client

__all__ = ["issuer"]  # the identity provider's fixture, for the users' test

HI = "Say something about budgets. [mock:tokens=12]"


mock = mock_fixture(MockSettings(pace_ms=0.2, seed=29))


def tagged() -> dict[str, str]:
    """Metadata that gives the request its own record at the mock (what it billed for it)."""
    return {"hardcap_bench_id": uuid.uuid4().hex}


def billed(mock: Mock, metadata: dict[str, str]) -> dict[str, Any]:
    """What the mock billed for the request tagged with ``metadata``."""
    mock.truth("alpha")  # nothing in flight any more
    record: dict[str, Any] = mock.http.get("/mock/requests").json()[metadata["hardcap_bench_id"]]
    return record


def ledger(base: str, key: str = KEYS["alpha"]) -> dict[str, Any]:
    """The tenant's row of its first budget: used and reserved."""
    r = httpx.get(f"{base}/hardcap/usage", headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    row: dict[str, Any] = next(b for b in r.json()["budgets"] if b["level"] == "tenant")
    return row


def as_input(output: list[Any]) -> list[dict[str, Any]]:
    """A response's output items as the next request's input items, as a client sends them."""
    return [item.model_dump(exclude_none=True) for item in output]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
def test_a_second_turn_is_charged_the_whole_conversation(
    mock: Mock, flushed: LocalValkey, stream: bool
) -> None:
    """Turn 2 names turn 1: the mock bills turn 1's input and output again as its input, the
    gateway charges exactly that, and the same conversation sent inline bills the same."""
    with gateway(mock, flushed) as base:
        c = client(base)

        def create(**fields: Any) -> Any:
            if not stream:
                return c.responses.create(model="small", user="alpha", **fields)
            with c.responses.stream(model="small", user="alpha", **fields) as s:
                for _ in s:
                    pass
                return s.get_final_response()

        first_tag, second_tag, inline_tag = tagged(), tagged(), tagged()
        first = create(input=HI, metadata=first_tag)
        assert first.store is True and first.usage is not None
        follow = "And in one more sentence? [mock:tokens=5]"
        second = create(input=follow, previous_response_id=first.id, metadata=second_tag)
        assert second.previous_response_id == first.id and second.store is True
        assert second.usage is not None
        truth = billed(mock, second_tag)
        assert second.usage.input_tokens == truth["prompt_tokens"]
        # The provider billed turn 1's input and its output again: more than both together.
        assert truth["prompt_tokens"] > first.usage.input_tokens + first.usage.output_tokens
        conversation = [{"role": "user", "content": HI}, *as_input(first.output)]
        inline = create(input=[*conversation, {"role": "user", "content": follow}],
                        metadata=inline_tag)  # fmt: skip
        assert billed(mock, inline_tag)["prompt_tokens"] == truth["prompt_tokens"]
        assert inline.usage is not None
        assert inline.usage.input_tokens == second.usage.input_tokens
        row = ledger(base)
        assert row["used"] == mock.truth("alpha")["total_tokens"] and row["reserved"] == 0
        # What the gateway kept: the response as served, and the input of both turns.
        kept = c.responses.retrieve(second.id)
        assert kept.id == second.id and kept.output_text == second.output_text
        items = c.responses.input_items.list(second.id, order="asc")
        assert [i.type for i in items.data][:1] == ["message"]
        assert len(items.data) == 1 + len(first.output) + 1


def test_a_function_call_and_its_output_continue_the_response(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        with c.responses.stream(
            model="small", input="Weather in Paris?", tools=WEATHER, user="alpha"
        ) as s:
            for _ in s:
                pass
            first = s.get_final_response()
        calls = [item for item in first.output if item.type == "function_call"]
        assert calls and calls[0].name == "get_weather"
        result = [{"type": "function_call_output", "call_id": calls[0].call_id,
                   "output": "Sunny, 21 C"}]  # fmt: skip
        tag, inline_tag = tagged(), tagged()
        second = c.responses.create(
            model="small", input=result, previous_response_id=first.id, tools=WEATHER,
            tool_choice="none", user="alpha", metadata=tag,
        )  # fmt: skip
        assert second.status == "completed" and second.output_text
        inline = [{"role": "user", "content": "Weather in Paris?"}, *as_input(first.output),
                  *result]  # fmt: skip
        c.responses.create(model="small", input=inline, tools=WEATHER, tool_choice="none",
                           user="alpha", metadata=inline_tag)  # fmt: skip
        assert billed(mock, tag)["prompt_tokens"] == billed(mock, inline_tag)["prompt_tokens"]
        assert second.usage is not None
        assert second.usage.input_tokens == billed(mock, tag)["prompt_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "streamed"])
def test_an_anthropic_routes_signed_thinking_is_kept_for_the_next_turn(
    mock: Mock, flushed: LocalValkey, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Served by translation to Anthropic: the kept reasoning item holds the signed thinking
    Anthropic wants back ahead of the tool call's result, so the next turn by id is served."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-mock")
    ask = "Weather in Paris? [mock:tool_use=1] [mock:thinking=6] [mock:tokens=8]"
    fields: Any = {"model": "claude", "tools": WEATHER, "reasoning": {"effort": "low"},
                   "max_output_tokens": 3000, "user": "alpha"}  # fmt: skip
    with claude(mock, flushed) as base:
        c = client(base)
        if stream:
            with c.responses.stream(input=ask, **fields) as s:
                first = s.get_final_response()
        else:
            first = c.responses.create(input=ask, **fields)
        assert first.output[0].type == "reasoning" and first.output[0].encrypted_content
        call = next(item for item in first.output if item.type == "function_call")
        result = [{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}]
        again = c.responses.create(input=result, previous_response_id=first.id, **fields)
        assert again.status == "completed" and again.output
        # What the second turn sent again holds the signed thinking as the first served it.
        sent = c.responses.input_items.list(again.id, order="asc").data
        kept: Any = next(item for item in sent if item.type == "reasoning")
        assert kept.encrypted_content == first.output[0].encrypted_content
        assert ledger(base)["used"] == mock.truth("alpha")["total_tokens"]


def test_a_continued_turn_is_quoted_and_counted_with_its_conversation(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        made = c.responses.create(model="small", input=HI, user="alpha")
        ask = {"model": "small", "input": "More?", "user": "alpha"}
        alone = c.post("/hardcap/quote", body=ask, cast_to=httpx.Response).json()
        continued = c.post("/hardcap/quote", body={**ask, "previous_response_id": made.id},
                           cast_to=httpx.Response).json()  # fmt: skip
        assert continued["input_tokens"] > alone["input_tokens"]
        counted = c.responses.input_tokens.count(
            model="small", input="More?", previous_response_id=made.id
        )
        assert (
            counted.input_tokens
            > c.responses.input_tokens.count(model="small", input="More?").input_tokens
        )
        with pytest.raises(openai.NotFoundError):
            c.post("/hardcap/quote", body={**ask, "previous_response_id": "resp_x"},
                   cast_to=httpx.Response)  # fmt: skip
        requests = mock.truth("alpha")["requests"]
        assert requests == 1  # only the first turn went upstream


def test_another_tenant_cannot_read_delete_list_cancel_or_continue_it(
    mock: Mock, flushed: LocalValkey
) -> None:
    with gateway(mock, flushed) as base:
        alpha, beta = client(base), client(base, KEYS["beta"])
        made = alpha.responses.create(model="small", input=HI, user="alpha")
        before = ledger(base, KEYS["beta"])
        calls_before = mock.truth("beta").get("requests", 0)
        with pytest.raises(openai.NotFoundError) as read:
            beta.responses.retrieve(made.id)
        assert made.output_text not in str(read.value.body)
        with pytest.raises(openai.NotFoundError):
            beta.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            beta.responses.input_items.list(made.id)
        with pytest.raises(openai.NotFoundError):
            beta.responses.cancel(made.id)
        with pytest.raises(openai.NotFoundError) as continued:
            beta.responses.create(model="small", input=HI, previous_response_id=made.id,
                                  user="beta")  # fmt: skip
        error: Any = continued.value.body
        assert error == {
            "message": f"Previous response with id '{made.id}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
        # Nothing went upstream, nothing was charged or held.
        assert mock.truth("beta").get("requests", 0) == calls_before
        after = ledger(base, KEYS["beta"])
        assert (after["used"], after["reserved"]) == (before["used"], 0)
        # Alpha's response is untouched by beta's DELETE.
        assert alpha.responses.retrieve(made.id).output_text == made.output_text


def test_a_user_reads_only_their_own_responses(
    mock: Mock, flushed: LocalValkey, issuer: JwksServer
) -> None:
    with gateway_thread(users_config(mock, flushed, issuer.url)) as base:
        ada, bob = client(base, token("ada")), client(base, token("bob"))
        made = ada.responses.create(model="small", input=HI)
        assert ada.responses.retrieve(made.id).id == made.id
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.create(model="small", input=HI, previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(made.id)
        assert ada.responses.retrieve(made.id).id == made.id


def test_delete_then_get_unknown_ids_and_cancel(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        made = c.responses.create(model="small", input=HI, user="alpha")
        spent = ledger(base)["used"]
        requests = mock.truth("alpha")["requests"]
        with pytest.raises(openai.BadRequestError) as cancel:
            c.responses.cancel(made.id)  # not a background response
        assert "background" in cancel.value.message
        deleted = c.delete(f"/responses/{made.id}", cast_to=httpx.Response).json()
        assert deleted == {"id": made.id, "object": "response", "deleted": True}
        for unknown in (made.id, "resp_never", "../../x", "resp_" + "a" * 200):
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(unknown)
        with pytest.raises(openai.NotFoundError):
            c.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError) as unknown_previous:
            c.responses.create(model="small", input=HI, previous_response_id=made.id)
        assert unknown_previous.value.code == "previous_response_not_found"
        # No upstream call, no charge, for any of them.
        assert mock.truth("alpha")["requests"] == requests
        assert (ledger(base)["used"], ledger(base)["reserved"]) == (spent, 0)


def test_input_items_are_listed_as_the_api_pages_them(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed) as base:
        c = client(base)
        three = [{"role": "user", "content": f"Part {n}."} for n in range(3)]
        made = c.responses.create(model="small", input=three, user="alpha")
        newest = c.responses.input_items.list(made.id, limit=2)  # desc: the API's default
        assert [i.content for i in newest.data] == ["Part 2.", "Part 1."]  # type: ignore[union-attr]
        assert newest.has_more is True
        assert (newest.first_id, newest.last_id) == (newest.data[0].id, newest.data[1].id)
        rest = c.responses.input_items.list(made.id, limit=2, after=newest.last_id)
        assert [i.content for i in rest.data] == ["Part 0."]  # type: ignore[union-attr]
        assert rest.has_more is False
        with pytest.raises(openai.BadRequestError) as bad:
            c.get(f"/responses/{made.id}/input_items?limit=0", cast_to=httpx.Response)
        assert bad.value.param == "limit"
        with pytest.raises(openai.BadRequestError) as replay:
            c.get(f"/responses/{made.id}?stream=true", cast_to=httpx.Response)
        assert replay.value.param == "stream"


def test_store_false_and_a_route_that_keeps_nothing(mock: Mock, flushed: LocalValkey) -> None:
    with gateway(mock, flushed, **{"routes.1.store_responses": False}) as base:
        c = client(base)
        unkept = c.responses.create(model="small", input=HI, user="alpha", store=False)
        assert unkept.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(unkept.id)
        kept = c.responses.create(model="small", input=HI, user="alpha")
        # The route `reason` keeps none: served, not kept; continuing on it is refused.
        served = c.responses.create(model="reason", input=HI, user="alpha")
        assert served.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(served.id)
        requests = mock.truth("alpha")["requests"]
        with pytest.raises(openai.BadRequestError) as refused:
            c.responses.create(model="reason", input=HI, previous_response_id=kept.id)
        assert refused.value.param == "previous_response_id"
        with pytest.raises(openai.BadRequestError) as conversation:
            c.responses.create(model="small", input=HI, conversation="conv_1")
        assert conversation.value.param == "conversation"
        assert mock.truth("alpha")["requests"] == requests


def test_a_response_past_the_size_bound_is_served_not_kept_and_the_ttl_holds(
    mock: Mock, flushed: LocalValkey
) -> None:
    overrides = {"gateway.stored_response_max_bytes": 3_000,
                 "gateway.stored_response_ttl_seconds": 600}  # fmt: skip
    with gateway(mock, flushed, **overrides) as base:
        c = client(base)
        small = c.responses.create(model="small", input=HI, user="alpha")
        assert small.store is True
        big = "x " * 2_000 + "[mock:tokens=20]"  # past the bound by its input alone
        with c.responses.stream(model="small", input=big, user="alpha") as s:
            for _ in s:
                pass
            large = s.get_final_response()
        assert large.status == "completed" and large.store is False
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(large.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.create(model="small", input=HI, previous_response_id=large.id)
        with redis.Redis.from_url(flushed.url) as r:
            keys = [k for k in r.scan_iter(match=f"*:resp:alpha:{small.id}")]
            assert len(keys) == 1
            assert 0 < r.ttl(keys[0]) <= 600
            assert not list(r.scan_iter(match=f"*:resp:*:{large.id}"))
