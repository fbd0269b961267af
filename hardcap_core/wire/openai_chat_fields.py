"""OpenAI chat completions' request fields and what each does to the bill
(``POST /v1/chat/completions``).

Every field of the pinned ``openai`` SDK's ``CompletionCreateParams`` has an entry;
``tests/unit/test_field_policies.py`` fails when an SDK upgrade brings one without. Unlike
Anthropic's format, a field this table does not list is forwarded, and counted as input
(:mod:`hardcap_core.wire.openai_input` counts every field it does not know as text): the
OpenAI-compatible upstreams (vLLM, OpenRouter, Groq, ...) take fields of their own, which a
closed list would break, and counting them keeps the estimate at or above what is billed.
"""

from __future__ import annotations

from hardcap_core.wire.field_policy import Effect, Field, FieldPolicy

P, C, PR, B, R = Effect.PASS, Effect.COUNTED, Effect.PRICED, Effect.BOUNDED, Effect.REFUSED

CHAT_FIELDS = FieldPolicy(
    "OpenAI chat completions",
    {
        "model": Field(PR, "Names the route, whose price table prices the request."),
        "messages": Field(C, "Counted as input: text, images, audio, files, tool calls."),
        "max_completion_tokens": Field(B, "The output cap (reasoning included): held in full."),
        "max_tokens": Field(B, "The output cap (older name): held in full."),
        "n": Field(B, "Only 1: each choice would need a hold of its own."),
        "tools": Field(C, "Counted as input."),
        "tool_choice": Field(C, "Counted as input."),
        "functions": Field(C, "Counted as input (the older tools)."),
        "function_call": Field(C, "Counted as input (the older tool_choice)."),
        "parallel_tool_calls": Field(P, "Only changes how calls are grouped."),
        "response_format": Field(C, "A JSON schema is counted as input."),
        "prediction": Field(
            C,
            "Counted as input; its rejected tokens are billed as output, which the provider's "
            "final usage charges.",
        ),
        "reasoning_effort": Field(
            B, "Reasoning is billed as output, bounded by the cap (unseen_output)."
        ),
        "verbosity": Field(B, "Changes how much output, within the cap."),
        "modalities": Field(B, "Audio output is counted by its bytes, within the cap."),
        "audio": Field(B, "The voice and format of audio output, within the cap."),
        "service_tier": Field(
            PR, "Priced by the route's service_tiers; a tier it does not list is a 400."
        ),
        "stream": Field(P, "How the reply is sent, not what it bills."),
        "stream_options": Field(P, "Usage is always asked upstream; the client sees it if asked."),
        "stop": Field(P, "Only ends the reply sooner."),
        "temperature": Field(P, "A sampling knob."),
        "top_p": Field(P, "A sampling knob."),
        "frequency_penalty": Field(P, "A sampling knob."),
        "presence_penalty": Field(P, "A sampling knob."),
        "logit_bias": Field(P, "A sampling knob."),
        "seed": Field(P, "A sampling knob."),
        "logprobs": Field(P, "Log probabilities of the output tokens: not billed."),
        "top_logprobs": Field(P, "Log probabilities of the output tokens: not billed."),
        "user": Field(P, "The end user (a user budget)."),
        "safety_identifier": Field(P, "The end user (a user budget)."),
        "metadata": Field(P, "Stored with the completion, not shown to the model."),
        "store": Field(P, "Stores the completion; storage is not billed."),
        "prompt_cache_key": Field(P, "Routes the prompt cache: reads priced as cached input."),
        "prompt_cache_retention": Field(
            P, "How long cached prefixes are kept: reads priced as cached input."
        ),
        "prompt_cache_options": Field(
            P, "How long cached prefixes are kept: reads priced as cached input."
        ),
        "moderation": Field(
            C, "Moderation of input and output; its configuration is counted as input."
        ),
        "web_search_options": Field(
            R,
            "web search is billed per call, which no route prices here; search with a tool "
            "of your own.",
        ),
    },
)
