"""What each field of an OpenAI Responses request (``POST /v1/responses``) does to the bill.

Every top-level field of the pinned openai SDK's ``ResponseCreateParams`` has an entry
(``tests/unit/test_responses_fields.py`` fails on one it lacks). The parser
(:mod:`hardcap_core.wire.openai_responses_request`) runs :data:`RESPONSES_FIELDS` first, on the
fields that are set (a JSON ``null`` is the API's "not given", and so is ``background: false``),
so a refused field costs the tenant nothing; what a field's value can make unbounded (a
hosted tool in ``tools``, an ``item_reference`` in ``input``) is refused there, naming it.

Served by translation into chat completions (the lingua franca of the providers), some fields
have no place upstream and are not sent: ``include``, ``store``, ``stream_options``,
``truncation``, ``top_logprobs``, ``image``, ``max_tool_calls``, ``prompt_cache_options``,
``client_metadata``.
None of them can raise the bill when left out.
"""

from __future__ import annotations

from hardcap_core.wire.field_policy import Effect, Field, FieldPolicy

PASS, COUNTED, PRICED = Effect.PASS, Effect.COUNTED, Effect.PRICED
BOUNDED, REFUSED = Effect.BOUNDED, Effect.REFUSED

# `conversation` names a Conversations API object, which this gateway does not keep: the
# provider would bill what it holds, which the gateway never saw.
CONVERSATION = (
    "a conversation object is kept by the provider, which would bill what it holds without "
    "this request carrying it, and this gateway keeps none of its own; continue with "
    "'previous_response_id' (kept by the gateway) or send the whole conversation in 'input'."
)

RESPONSES_FIELDS = FieldPolicy(
    "the Responses API",
    {
        "model": Field(PRICED, "names the route, whose price table prices the request"),
        "input": Field(COUNTED, "every item is billed as input and counted"),
        "instructions": Field(COUNTED, "billed as a system message and counted"),
        "tools": Field(
            COUNTED,
            "function tools are billed as input and counted; hosted tools (billed per call) "
            "are refused naming the tool",
        ),
        "tool_choice": Field(COUNTED, "a named tool is billed as input and counted"),
        "parallel_tool_calls": Field(PASS, "how many calls a turn may make, all in its output"),
        "max_output_tokens": Field(BOUNDED, "the output cap, at most the route's"),
        "max_tool_calls": Field(
            PASS, "limits built-in tool calls only, and built-in tools are refused"
        ),
        "reasoning": Field(
            BOUNDED,
            "reasoning tokens are output: max_output_tokens (or the route's cap) holds them",
        ),
        "text": Field(COUNTED, "a json_schema format is billed as input and counted"),
        "metadata": Field(PASS, "kept with the request; not billed"),
        # Not in the SDK's params: Codex CLI sends it (its installation and session ids).
        "client_metadata": Field(PASS, "the client's own ids; not billed, not sent upstream"),
        "user": Field(PASS, "an end-user id (also the end-user level of a tenant's budgets)"),
        "safety_identifier": Field(PASS, "an end-user id for the provider's abuse checks"),
        "prompt_cache_key": Field(PASS, "how the provider buckets its prompt cache"),
        "prompt_cache_retention": Field(PASS, "how long cached prefixes live; not billed apart"),
        "prompt_cache_options": Field(
            PRICED,
            "explicit cache breakpoints and lifetimes price cache writes; not sent by "
            "translation, so nothing is written",
        ),
        "service_tier": Field(PRICED, "the tier's price from the route's price table, or 400"),
        "include": Field(PASS, "extra output data the provider returns; not billed"),
        "store": Field(
            PASS,
            "whether the gateway keeps the response (the provider is never asked to); not billed",
        ),
        "stream": Field(PASS, "streamed or not, the same tokens"),
        "stream_options": Field(PASS, "obfuscation padding of stream events; not billed"),
        "temperature": Field(PASS, "a sampling knob"),
        "top_p": Field(PASS, "a sampling knob"),
        "top_logprobs": Field(PASS, "log probabilities of the output; not billed"),
        "truncation": Field(PASS, "'auto' drops input the model cannot hold: never more billed"),
        "image": Field(
            PASS, "how the provider compresses images; the estimate counts each at full size"
        ),
        "previous_response_id": Field(
            COUNTED,
            "the gateway loads the conversation it kept for this tenant (and user) and sends it "
            "in 'input', counted like the rest; no provider-side state is used",
        ),
        "conversation": Field(REFUSED, CONVERSATION),
        "prompt": Field(
            REFUSED,
            "a stored prompt template is billed as input this request does not carry, which "
            "the gateway cannot bound; send its text in 'instructions' and 'input' instead.",
        ),
        "background": Field(
            REFUSED,
            "a background response is billed after this request ends, outside any hold the "
            "gateway can keep; stream it instead (stream: true).",
        ),
        "background_options": Field(
            REFUSED, "background responses are not supported (see 'background')."
        ),
        "context_management": Field(
            REFUSED,
            "server-side compaction runs model work this request does not carry, which the "
            "gateway cannot bound; compact the conversation on the client instead.",
        ),
        "moderation": Field(
            REFUSED,
            "a moderation model run on the input and output is billed apart from the "
            "response's tokens, which the gateway cannot price yet.",
        ),
        "access_programs": Field(
            REFUSED,
            "an access program changes what serves the request and what it bills, which the "
            "gateway does not know.",
        ),
    },
)

# What `POST /v1/responses/input_tokens` takes: the input fields, with the same effects.
COUNTED_FIELDS = (
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "reasoning", "text", "truncation", "conversation", "previous_response_id",
)  # fmt: skip
RESPONSES_COUNT_FIELDS = FieldPolicy(
    "the Responses API's input_tokens",
    {name: RESPONSES_FIELDS.fields[name] for name in COUNTED_FIELDS},
)

# Tool types of the Responses API billed per call or run by the provider (hosted tools):
# each is refused naming it until a route prices it.
HOSTED_TOOLS = frozenset(
    {
        "web_search", "web_search_preview", "web_search_2025_08_26",
        "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation",
        "mcp", "computer", "computer_use_preview", "local_shell", "shell",
        "apply_patch", "tool_search", "programmatic_tool_calling",
    }
)  # fmt: skip
