"""Reading an Anthropic Messages body: 400s that name the field, the translation into a body
the OpenAI chat parser accepts, and an input estimate that counts what Anthropic bills."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import pytest

from hardcap_core.errors import InvalidRequest
from hardcap_core.local.mock_anthropic import anthropic_prompt_tokens
from hardcap_core.tokenize.images import image_extra_tokens, rules_for
from hardcap_core.wire.anthropic_count import TOOL_SYSTEM_PROMPT_TOKENS, count_tokens_reply
from hardcap_core.wire.anthropic_request import parse_messages_request
from hardcap_core.wire.openai_input import input_tokens
from hardcap_core.wire.openai_request import parse_chat_request
from hardcap_core.wire.pdf import PARSE_PAGE_IMAGE_TOKENS
from tests.pdf_samples import attacks, pages_pdf, text_content

HI = [{"role": "user", "content": "hello"}]


def parse(**body: Any) -> Any:
    return parse_messages_request(json.dumps({"model": "small", **body}).encode())


def refused(body: dict[str, Any], *, counting: bool = False) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse_messages_request(json.dumps(body).encode(), counting=counting)
    return e.value


def png(width: int, height: int) -> str:
    header = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(header + b"\x08\x02\x00\x00\x00").decode()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "small", "messages": HI}, "max_tokens"),
        ({"model": "small", "max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"model": "small", "max_tokens": "5", "messages": HI}, "max_tokens"),
        ({"max_tokens": 5, "messages": HI}, "model"),
        ({"model": "small", "max_tokens": 5}, "messages"),
        ({"model": "small", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "small", "max_tokens": 5, "messages": HI, "speed": "fast"}, "speed"),
        ({"model": "small", "max_tokens": 5, "messages": HI, "stream": "yes"}, "stream"),
        (
            {"model": "small", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].role",
        ),
        (
            {"model": "small", "max_tokens": 5,
             "messages": [{"role": "system", "content": [{"type": "image"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"model": "small", "max_tokens": 5, "messages": HI, "tools": [{"type": "web_search"}]},
            "tools[0].type",
        ),
        (
            {"model": "small", "max_tokens": 5, "messages": HI, "tools": [{"name": "f"}]},
            "tools[0].input_schema",
        ),
        (
            {"model": "small", "max_tokens": 5, "messages": HI, "tool_choice": {"type": "x"}},
            "tool_choice.type",
        ),
        (
            {"model": "small", "max_tokens": 5, "messages": HI, "tool_choice": {"type": "tool"}},
            "tool_choice.name",
        ),
        (
            {
                "model": "small",
                "max_tokens": 2000,
                "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 100},
            },
            "thinking.budget_tokens",
        ),
        (
            {
                "model": "small",
                "max_tokens": 1024,
                "messages": HI,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            },
            "max_tokens",
        ),
        ({"model": "small", "max_tokens": 5, "messages": HI, "metadata": {"x": 1}}, "metadata.x"),
        (
            {
                "model": "small",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "file", "file_id": "f_1"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].source.type",
        ),
        (
            {
                "model": "small",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "url", "url": "https://x"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].source",
        ),
        (
            {
                "model": "small",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t"}]}],
            },
            "messages[0].content[0].type",
        ),
    ],
)
def test_bad_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_a_system_message_between_the_turns_is_kept_in_place_and_counted() -> None:
    # As Claude Code 2.1 sends it.
    note = [{"type": "text", "text": "The user has changed the working directory."}]
    turns = [*HI, {"role": "assistant", "content": "hi"}, {"role": "system", "content": note}]
    request = parse(max_tokens=5, messages=[*turns, *HI])
    assert [m["role"] for m in request.body["messages"]] == [
        "user", "assistant", "system", "user",
    ]  # fmt: skip
    without = parse(max_tokens=5, messages=[*turns[:2], *HI])
    assert request.input_tokens > without.input_tokens


def test_missing_max_tokens_says_it_is_required() -> None:
    error = refused({"model": "small", "messages": HI})
    assert error.message.startswith("'max_tokens' is required")


def test_count_tokens_bodies_have_no_max_tokens_or_stream() -> None:
    counted = parse_messages_request(
        json.dumps({"model": "small", "messages": HI}).encode(), counting=True
    )
    assert count_tokens_reply(counted) == {"input_tokens": counted.input_tokens}
    assert counted.max_tokens is None
    body = {"model": "small", "messages": HI, "max_tokens": 5}
    assert refused(body, counting=True).param == "max_tokens"


def test_a_full_conversation_translates_to_openai_chat() -> None:
    image = {"type": "base64", "media_type": "image/png", "data": png(100, 100)}
    request = parse(
        max_tokens=3000,
        stream=True,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "sig"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"c": "L"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "no data"},
                            {"type": "image", "source": image},
                        ],
                    },
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        tools=[{"name": "w", "input_schema": {"type": "object"}, "description": "weather"}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0.5,
        top_k=5,
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "u-1"},
    )
    body = request.body
    assert request.dialect == "anthropic_messages" and request.stream and request.include_usage
    assert request.max_tokens == 3000 and request.max_tokens_field == "max_tokens"
    assert body["stream_options"] == {"include_usage": True}
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert messages[0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assistant = messages[2]
    assert assistant["content"] == "Checking."
    assert assistant["tool_calls"][1] == {
        "id": "toolu_2",
        "type": "function",
        "function": {"name": "w", "arguments": '{"c": "L"}'},
    }
    assert assistant["thinking_blocks"] == [
        {"type": "thinking", "thinking": "call it", "signature": "sig"}
    ]
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}
    assert messages[4]["tool_call_id"] == "toolu_2"
    assert messages[4]["content"] == "Error:\nno data"
    # The tool result's image follows the tool messages, with the user's text.
    last = messages[5]["content"]
    assert last[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert last[1] == {"type": "text", "text": "Thanks"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "parameters": {"type": "object"}, "description": "weather"},
        }
    ]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["stop"] == ["END"] and body["user"] == "u-1" and body["top_k"] == 5
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    # What an OpenAI-compatible provider is sent is a body the OpenAI chat parser accepts.
    assert parse_chat_request(json.dumps(body).encode()).messages == messages


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "w"}, {"type": "function", "function": {"name": "w"}}),
    ],
)
def test_tool_choices(choice: dict[str, Any], expected: Any) -> None:
    tools = [{"name": "w", "input_schema": {"type": "object"}}]
    body = parse(max_tokens=5, messages=HI, tools=tools, tool_choice=choice).body
    assert body["tool_choice"] == expected and "parallel_tool_calls" not in body


def test_the_estimate_is_the_openai_estimate_of_the_translation_plus_anthropics_extras() -> None:
    plain = parse(max_tokens=5, messages=HI)
    assert plain.input_tokens == input_tokens(plain.body)
    tools = [{"name": "w", "input_schema": {"type": "object", "properties": {}}}]
    with_tools = parse(max_tokens=5, messages=HI, tools=tools)
    assert with_tools.input_tokens == input_tokens(with_tools.body) + TOOL_SYSTEM_PROMPT_TOKENS


def test_images_count_by_the_route_s_model_not_at_parse() -> None:
    def image(source: dict[str, Any]) -> Any:
        content = [{"type": "image", "source": source}]
        return parse(max_tokens=5, messages=[{"role": "user", "content": content}])

    # The parse does not know the route: OpenAI's tile rule, the route's rule added after it
    # (tokenize/routes.py), here Claude Sonnet 4.5's.
    claude = rules_for("claude-sonnet-4-5")
    remote = image({"type": "url", "url": "https://example.com/cat.png"})
    assert remote.input_tokens == input_tokens(remote.body)
    assert image_extra_tokens(remote.body, claude) == 1640 - 1445
    # 1092 x 1092: OpenAI's rule says 765 tokens, Anthropic's 1590.
    square = image({"type": "base64", "media_type": "image/png", "data": png(1092, 1092)})
    assert image_extra_tokens(square.body, claude) == 1590 - 765
    # 200 x 200: 64 patches of 28 px at Anthropic, fewer than OpenAI's 255: the route's count
    # replaces the parse's.
    small = image({"type": "base64", "media_type": "image/png", "data": png(200, 200)})
    assert small.input_tokens == input_tokens(small.body)
    assert image_extra_tokens(small.body, claude) == 64 - 255


def document(data: bytes, **block: Any) -> Any:
    source = {
        "type": "base64",
        "media_type": "application/pdf",
        "data": base64.b64encode(data).decode(),
    }
    return {"type": "document", "source": source, **block}


def test_a_pdf_counts_its_pages_text_bound_and_the_route_model_s_image_of_each_page() -> None:
    content = [document(pages_pdf([text_content("Quarterly figures.")] * 3), title="report.pdf")]
    request = parse(max_tokens=5, messages=[{"role": "user", "content": content}])
    part = request.body["messages"][0]["content"][-1]
    assert part["type"] == "file" and part["file"]["filename"] == "report.pdf"
    # The parse counts GPT-4o's largest image for each page, as it counts images; the route's
    # model replaces it (tokenize/routes.py): Claude up to 4.6 1,600, Claude Opus 4.7 4,784.
    assert request.input_tokens == input_tokens(request.body)
    assert input_tokens(request.body) > 3 * PARSE_PAGE_IMAGE_TOKENS
    sonnet, opus = rules_for("claude-sonnet-4-5"), rules_for("claude-opus-4-7")
    assert image_extra_tokens(request.body, sonnet) == 3 * (1_640 - PARSE_PAGE_IMAGE_TOKENS)
    assert image_extra_tokens(request.body, opus) == 3 * (4_784 - PARSE_PAGE_IMAGE_TOKENS)


# The ways past the cap with an Anthropic document block (tests/pdf_samples.py); the
# two encrypted or pypdf-written ones hold a "#" byte, which the regex read as 100 pages.
ATTACKS = {
    name: data
    for name, data in attacks().items()
    if name.startswith(("120 KB", "100 pages", "40 pages", "150 pages in"))
}


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-opus-4-7", "small"])
@pytest.mark.parametrize("name", ATTACKS)
def test_a_document_is_never_estimated_below_what_anthropic_bills(name: str, model: str) -> None:
    content = [document(ATTACKS[name]), {"type": "text", "text": "Summarize the report."}]
    body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    billed = anthropic_prompt_tokens(body)  # pypdf's text of each page, and its image
    request = parse(**body)
    # What a route on the model holds: the parse's count, the pages' images by its rule.
    held = request.input_tokens + image_extra_tokens(request.body, rules_for(model, "anthropic"))
    assert held >= billed > 10_000


def test_a_document_that_is_not_a_pdf_is_a_400_naming_the_field() -> None:
    content = [{"type": "text", "text": "Read this."}, document(b"%PDF-1.7 and nothing else")]
    with pytest.raises(InvalidRequest, match="cannot be read as a PDF") as caught:
        parse(max_tokens=5, messages=[{"role": "user", "content": content}])
    assert caught.value.param == "messages[0].content[1].file.file_data"


def test_text_and_content_documents_become_text_parts() -> None:
    docs = [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "A"}},
        {
            "type": "document",
            "source": {"type": "content", "content": [{"type": "text", "text": "B"}]},
            "context": "C",
        },
    ]
    body = parse(max_tokens=5, messages=[{"role": "user", "content": docs}]).body
    texts = [p["text"] for p in body["messages"][0]["content"]]
    assert texts == ["A", "C", "B"]


def test_an_openai_upstream_is_not_sent_what_only_anthropic_takes() -> None:
    """thinking, top_k, thinking blocks and cache marks are kept for an Anthropic upstream;
    an OpenAI-compatible API rejects them as unknown fields."""
    from hardcap_core.config import parse_config
    from hardcap_core.providers.openai_compat import OpenAICompatible
    from hardcap_core.wire.anthropic_request import parse_messages_request

    raw = {
        "model": "m", "max_tokens": 2000, "top_k": 5,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "f", "input_schema": {"type": "object"},
                   "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
    }  # fmt: skip
    request = parse_messages_request(json.dumps(raw).encode())
    config = parse_config({
        "upstreams": [{"name": "u", "base_url": "http://127.0.0.1:9/v1"}],
        "routes": [{"name": "m", "upstream": "u"}], "tenants": [],
    })  # fmt: skip
    body = OpenAICompatible(None)._body(config.routes["m"], request, 100, stream=True)  # type: ignore[arg-type]
    text = json.dumps(body)
    assert "thinking" not in text and "top_k" not in text and "cache_control" not in text
    assert (
        body["messages"][-1]["content"][0]["text"] == "hi"
        and body["tools"][0]["function"]["name"] == "f"
    )
