"""An OpenAI-shaped chat body as Converse parameters (providers/bedrock_request.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route, parse_config
from hardcap_core.errors import InvalidRequest
from hardcap_core.local.bedrock_fake import BETAS_BEDROCK_TAKES
from hardcap_core.providers.bedrock_request import converse_params
from hardcap_core.wire.anthropic_request import parse_messages_request, with_headers
from hardcap_core.wire.openai_request import parse_chat_request
from tests.pdf_samples import pages_pdf

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def route() -> Route:
    data = {
        "gateway": {"redis_url": "redis://127.0.0.1:1"},
        "upstreams": [{"name": "br", "kind": "bedrock", "region": "eu-west-1"}],
        "routes": [
            {
                "name": "r",
                "upstream": "br",
                "model": "anthropic.claude-sonnet-4-20250514-v1:0",
                "price": {"input_per_million": 1.0, "output_per_million": 1.0},
                "max_output_tokens": 999,
            }
        ],
    }
    return parse_config(data).routes["r"]


def request(messages: list[Any], **extra: Any) -> ChatRequest:
    return parse_chat_request(json.dumps({"model": "r", "messages": messages, **extra}).encode())


def params(messages: list[Any], cap: int = 100, **extra: Any) -> dict[str, Any]:
    return converse_params(route(), request(messages, **extra), cap)


def test_system_and_developer_become_system_blocks_and_roles_alternate() -> None:
    got = params(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "developer", "content": [{"type": "text", "text": "No jokes."}]},
            {"role": "user", "content": [{"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "ok"},
        ]
    )
    assert got["modelId"] == "anthropic.claude-sonnet-4-20250514-v1:0"
    assert got["system"] == [{"text": "Be brief."}, {"text": "No jokes."}]
    assert got["messages"] == [
        {"role": "user", "content": [{"text": "one"}, {"text": "two"}]},
        {"role": "assistant", "content": [{"text": "ok"}]},
    ]


def test_the_gateway_cap_is_maxtokens_whatever_the_client_asked() -> None:
    got = params(
        [{"role": "user", "content": "hi"}],
        cap=42,
        max_tokens=500,
        temperature=0.2,
        top_p=0.9,
        stop="END",
    )
    assert got["inferenceConfig"] == {
        "maxTokens": 42,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert params([{"role": "user", "content": "hi"}], stop=["a", "b"])["inferenceConfig"][
        "stopSequences"
    ] == ["a", "b"]


def test_tool_calls_and_results_become_tool_use_and_tool_result_blocks() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    got = params(
        [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "thanks"},
        ],
        tools=[TOOL],
        tool_choice="none",
    )
    assert got["messages"][1] == {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "call_1", "name": "get_weather", "input": {"city": "Paris"}}}
        ],
    }
    # The tool's answer and the next user text are one user turn.
    assert got["messages"][2] == {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "call_1", "content": [{"text": "sunny"}]}},
            {"text": "thanks"},
        ],
    }
    # "none" has no Converse equivalent; tool blocks need the tools, so they stay, unchosen.
    assert got["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": "Weather now.",
                    "inputSchema": {"json": TOOL["function"]["parameters"]},  # type: ignore[index]
                }
            }
        ]
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"tool": {"name": "get_weather"}},
        ),
        (None, None),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    extra = {"tools": [TOOL]} | ({} if choice is None else {"tool_choice": choice})
    got = params([{"role": "user", "content": "hi"}], **extra)
    assert got["toolConfig"].get("toolChoice") == expected


def test_tool_choice_none_without_tool_blocks_sends_no_tools() -> None:
    got = params([{"role": "user", "content": "hi"}], tools=[TOOL], tool_choice="none")
    assert "toolConfig" not in got


def test_images_and_documents_go_as_bytes() -> None:
    png = "data:image/png;base64," + base64.b64encode(PNG).decode()
    document = pages_pdf([b""])  # a PDF the input estimate can read (an unreadable one: a 400)
    pdf = "data:application/pdf;base64," + base64.b64encode(document).decode()
    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": png}},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": pdf}},
    ]
    blocks = params([{"role": "user", "content": content}])["messages"][0]["content"]
    assert blocks[1] == {"image": {"format": "png", "source": {"bytes": PNG}}}
    assert blocks[2] == {
        "document": {"format": "pdf", "name": "report-pdf", "source": {"bytes": document}}
    }


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_what_converse_cannot_take_is_a_400_naming_the_part(part: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as raised:
        params([{"role": "user", "content": [part]}])
    assert raised.value.param == "messages[0].content[0]"


def test_reasoning_settings_pass_and_nothing_else_reaches_the_model_fields() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    got = params(
        [{"role": "user", "content": "hi"}],
        thinking=thinking,
        reasoning_effort="high",
        additionalModelRequestFields={"max_tokens": 100_000},
    )
    assert got["additionalModelRequestFields"] == {
        "thinking": thinking,
        "reasoning_effort": "high",
    }
    assert "additionalModelRequestFields" not in params([{"role": "user", "content": "hi"}])


def test_user_and_metadata_become_request_metadata_within_its_limits() -> None:
    got = params(
        [{"role": "user", "content": "hi"}],
        user="alpha",
        metadata={"hardcap_bench_id": "run-1", "bad": 'quote"d', "n": "x" * 300},
    )
    assert got["requestMetadata"] == {"user": "alpha", "hardcap_bench_id": "run-1"}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "function", "name": "f", "content": "x"},
        {"role": "tool", "content": "no id"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
            ],
        },
    ],
)
def test_messages_converse_cannot_express_are_a_400(message: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        params([{"role": "user", "content": "hi"}, message])


def test_only_the_betas_bedrock_takes_are_sent() -> None:
    """Claude Code's defaults on a Bedrock route: those Bedrock takes go in anthropic_beta,
    the others (Bedrock answers them "invalid beta flag") are not sent."""
    body = {"model": "r", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    chat = with_headers(
        parse_messages_request(json.dumps(body).encode()),
        {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                           "context-management-2025-06-27,prompt-caching-scope-2026-01-05"},
    )  # fmt: skip
    sent = converse_params(route(), chat, 10)["additionalModelRequestFields"]["anthropic_beta"]
    assert sent == ["interleaved-thinking-2025-05-14"]
    assert all(beta in BETAS_BEDROCK_TAKES for beta in sent)
