"""Anthropic Messages' request fields and what each does to the bill (``POST /v1/messages``,
with or without ``?beta=true``, and ``POST /v1/messages/count_tokens``).

Every field of the pinned ``anthropic`` SDK's ``MessageCreateParams`` (and of its beta
namespace's, which Claude Code sends) has an entry; ``tests/unit/test_field_policies.py``
fails when an SDK upgrade brings one without. Fields the SDK sends as headers
(``betas``, ``workspace_id``, ``user_profile_id``) are listed with their header: in a body
they are a 400 naming the header. What a field's value may be is checked by the parser
(:mod:`hardcap_core.wire.anthropic_request`), which refuses the values the ``why`` names.

An Anthropic upstream is sent the body as the client wrote it. An OpenAI-compatible or Bedrock
upstream is sent the translation, which leaves out what only Anthropic takes
(``context_management``, ``output_config``, ``service_tier``, ``cache_control``, the betas):
each of those only lowers the bill or is bounded by the output cap, and the estimate counted
the request as sent, so leaving them out cannot take a request past its hold.
"""

from __future__ import annotations

from hardcap_core.wire.field_policy import Effect, Field, FieldPolicy

P, C, PR, B, R = Effect.PASS, Effect.COUNTED, Effect.PRICED, Effect.BOUNDED, Effect.REFUSED

# Server tools (Anthropic runs them and bills each use, not in tokens), by the prefix of their
# `type`. Those a route may price per use (its price table's web_search_per_1000,
# web_fetch_per_1000) are held for max_uses uses and the input their results add
# (hardcap_core/gateway/money.py, tool_hold); the others are refused naming the tool: code
# execution is billed per container-hour with no bound a request can set, tool search and MCP
# toolsets bring results the gateway cannot bound.
SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search", "mcp_toolset",
                "advisor")  # fmt: skip
PRICED_SERVER_TOOLS = ("web_search", "web_fetch")
# anthropic-beta values a Bedrock route sends, in Converse's additionalModelRequestFields as
# anthropic_beta (Bedrock's Claude request parameters list them, and they act on what the
# translation sends). Any other is not sent: Bedrock refuses a beta it does not take, and the
# fields the others enable are not translated (providers/bedrock_request.py).
BEDROCK_BETAS = frozenset(
    {"interleaved-thinking-2025-05-14", "token-efficient-tools-2025-02-19",
     "output-128k-2025-02-19", "context-1m-2025-08-07", "computer-use-2025-01-24"}
)  # fmt: skip
# context_management edits that only drop content from what is billed (older tool results,
# older thinking). Any other edit (compact_*: a summarizing call billed as its own
# iteration) is refused naming it.
LOWERING_EDITS = frozenset({"clear_tool_uses_20250919", "clear_thinking_20251015"})

_FIELDS: dict[str, Field] = {
    "model": Field(PR, "Names the route, whose price table prices the request."),
    "max_tokens": Field(B, "The output cap: held in full (lowered to the budget's room)."),
    "messages": Field(C, "Counted as input, every block (cache marks kept byte for byte)."),
    "system": Field(C, "Counted as input."),
    "tools": Field(
        C,
        "Custom tools counted as input, with Anthropic's tool-use system prompt. Web search "
        "and web fetch are priced per use from the route's price table, held for max_uses "
        "uses (the route's server_tool_max_uses sent when unset) and the input their results "
        "add, charged per use reported; a 400 naming the tool on a route without the price "
        "or not served by Anthropic. Other server tools (code execution, tool search, MCP "
        "toolsets, ...) and Anthropic-defined client tools (bash, text editor, computer, "
        "memory), which add a system prompt of their own: a 400 naming the tool.",
    ),
    "tool_choice": Field(C, "Counted: it changes the tool-use system prompt."),
    "stop_sequences": Field(P, "Only ends the reply sooner."),
    "temperature": Field(P, "A sampling knob."),
    "top_p": Field(P, "A sampling knob."),
    "top_k": Field(P, "A sampling knob."),
    "stream": Field(P, "How the reply is sent, not what it bills."),
    "thinking": Field(
        B,
        "Thinking tokens count toward max_tokens. enabled, adaptive and between_tools are "
        "reserved as summarized thinking (billed in full, streamed as a summary) unless the "
        "route declares unseen_output: none; disabled thinks not.",
    ),
    "metadata": Field(P, "user_id is the end user (a user budget); nothing else is allowed."),
    "service_tier": Field(
        PR,
        "auto may be served at priority prices: held at the dearest tier the route lists, "
        "charged at the tier Anthropic reports.",
    ),
    "context_management": Field(
        P,
        "Its clear_tool_uses and clear_thinking edits only remove content from what is "
        "billed; the estimate counts the request as sent. Other edits (compact_*) run a "
        "billed summarizing call: a 400 naming the edit.",
    ),
    "output_config": Field(
        B,
        "effort changes how many tokens the model spends, within max_tokens; a format's "
        "schema and the config are counted as input.",
    ),
    "cache_control": Field(
        PR,
        "Marks the last cacheable block: cache writes priced at the route's write price "
        "(ttl 1h at its hour price), reads at its cached-input price.",
    ),
    "speed": Field(
        PR,
        "standard passes; fast is billed at a premium no route prices: a 400 naming the field.",
    ),
    "inference_geo": Field(
        PR,
        "global passes; pinning a region is billed at a premium no route prices: a 400 "
        "naming the field.",
    ),
    "diagnostics": Field(P, "Asks the reply to explain a prompt-cache miss; bills nothing."),
    "fallback_credit_token": Field(
        P, "Only lowers the bill: a refused request's warm prefix read at the cache price."
    ),
    "container": Field(
        R,
        "a code-execution container is billed per container-hour, which no route prices here.",
    ),
    "mcp_servers": Field(
        R,
        "MCP servers are called by the provider, and their results billed as input the "
        "gateway cannot count before the call.",
    ),
    "fallbacks": Field(
        R,
        "server-side fallbacks are served and billed by other models, whose prices this "
        "route does not hold.",
    ),
    "thread": Field(
        R,
        "a server-held thread bills input the request does not carry, which the gateway "
        "cannot count before the call.",
    ),
    "compaction": Field(
        R,
        "a compaction request bills a summarizing call the gateway cannot bound; compact "
        "on the client, or send the compaction block it returned.",
    ),
    "billing_policy": Field(
        R,
        "this gateway's upstream key is billed for every request it forwards; billing "
        "another organization is not supported.",
    ),
    "betas": Field(
        PR,
        "Forwarded to an Anthropic upstream as the anthropic-beta header. A 1M-context beta "
        "needs the route's long_context prices (a 400 naming the header without them); "
        "other betas only enable fields, which this table decides.",
        header="anthropic-beta",
    ),
    "workspace_id": Field(
        R,
        "the workspace is the gateway's upstream key's, not the client's.",
        header="anthropic-workspace-id",
    ),
    "user_profile_id": Field(
        R,
        "requests on behalf of another party's profile are not supported; use "
        "metadata.user_id for the end user.",
        header="anthropic-user-profile-id",
    ),
}

MESSAGES_FIELDS = FieldPolicy("Anthropic Messages", _FIELDS)

# count_tokens bills nothing, but it counts what a message would bill: the same fields, less
# the ones that only shape a reply, so a count agrees with the message it stands for.
_COUNT_ONLY = frozenset(
    {
        "model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
        "cache_control", "context_management", "mcp_servers", "speed", "betas",
        "workspace_id", "user_profile_id", "billing_policy",
    }
)  # fmt: skip
COUNT_FIELDS = FieldPolicy(
    "Anthropic count_tokens",
    {
        **{name: field for name, field in _FIELDS.items() if name in _COUNT_ONLY},
        "compaction": Field(P, "count_tokens ignores it: the count is of messages as sent."),
    },
)
