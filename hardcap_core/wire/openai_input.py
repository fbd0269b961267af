"""The estimate of an OpenAI chat body's billed input: an upper bound, counted before admission.

Everything a provider may bill is counted, and anything not known to be free counts by its
serialized length: a field Hardcap has never heard of is a field a provider may put in the
prompt. What is free is listed (:data:`FREE_PARAMETERS`): sampling and output parameters, ids
and labels that steer the call but are not part of the prompt. Text counts by
:func:`hardcap_core.tokenize.heuristics.input_text_tokens`, an upper bound by character class;
images and audio by :mod:`hardcap_core.wire.media`; PDFs by their pages, read with a real parser
(:mod:`hardcap_core.wire.pdf`), each page's text bound plus GPT-4o's image of it (each route
target replaces it by its model's: :func:`hardcap_core.tokenize.images.image_extra_tokens`); any
other file by its bytes, a token each.

Two things cannot be bounded from the request, and are refused: a file referenced by
``file_id`` and earlier audio referenced by ``audio.id`` (their size is on the provider).

A route with a public tokenizer gets :func:`exact_input_tokens`: the same walk, with the text
of the fields the chat format is known to render (roles, contents and text parts, names, tool
calls, tool definitions, tool choice, response format, prediction) counted by that tokenizer
and OpenAI's chat format (the cookbook "How to count tokens with tiktoken": 3 tokens per
message, 1 per name, 3 to prime the reply, a function's frame) plus a stated margin; what the
tokenizer cannot see keeps its bound term (images, audio, files, fields Hardcap does not know).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hardcap_core.errors import InvalidRequest
from hardcap_core.tokenize.heuristics import input_text_tokens
from hardcap_core.wire.media import (
    IMAGE_BOUND_TOKENS,
    audio_bound_tokens,
    base64_bytes,
    data_url_payload,
    decoded_size,
    url_image_tokens,
)
from hardcap_core.wire.openai_tools import tool_call_tokens, tool_definition_tokens
from hardcap_core.wire.pdf import (
    PARSE_PAGE_IMAGE_TOKENS,
    Allowance,
    PdfCost,
    is_declared_pdf,
    pdf_cost,
)

# OpenAI's chat format: 3 tokens around each message and 1 more for a name (the cookbook's
# "How to count tokens"); one more here for any other chat template's separators.
PER_MESSAGE_OVERHEAD = 4
NAME_OVERHEAD = 1
ROLE_TOKENS = 2  # a role is one of a few words the parser checked: a token or two
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>
# A function definition costs its text plus a frame (the cookbook's 7 + 12 for GPT-4o).
PER_FUNCTION_OVERHEAD = 19
# Exact counts (exact_input_tokens). The cookbook's rule gives the API's own count on its
# examples (tests/unit/test_tokenizers.py: 124 prompt tokens for gpt-4o, 129 for gpt-4); the
# margin is for what the examples do not show: 1 token per message for another template's
# separators, and 1 per content part for the separator its text may be joined with.
EXACT_MESSAGE_TOKENS = 3 + 1
EXACT_PART_MARGIN = 1
# Each enum value of a function's parameters: the cookbook's enum_item, 3 tokens besides its
# text (its JSON has fewer: the definition's JSON alone could be low on long enums).
ENUM_ITEM_TOKENS = 3
# Message and body fields whose text the chat format renders, counted by the tokenizer: any
# other field keeps its bound term.
EXACT_MESSAGE_FIELDS = frozenset({"tool_calls", "function_call", "tool_call_id", "refusal"})
EXACT_BODY_FIELDS = frozenset({"tool_choice", "function_call", "response_format", "prediction"})

# Body fields that are parameters of the call, not text of the prompt. Anything else counts.
FREE_PARAMETERS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "seed",
        "stop",  # matched against the output, never sent to the model as text
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",  # stored with the completion, not shown to the model
        "store",
        "service_tier",
        "parallel_tool_calls",
        "reasoning_effort",
        "verbosity",
        "modalities",
        "audio",  # the voice and format of audio output
    }
)


TextCount = Callable[[str], int]


def input_tokens(body: dict[str, Any]) -> int:
    """An upper bound on the prompt tokens ``body`` will be billed; corrected at settlement by
    the provider's count. Raise :class:`InvalidRequest` for input that cannot be bounded."""
    return _Count(None).body(body)


def exact_input_tokens(body: dict[str, Any], text: TextCount, *, openai_tools: bool = False) -> int:
    """The prompt tokens ``body`` is billed by a provider whose tokenizer ``text`` counts
    exactly (never below: the chat format's overhead with its margin, and every part the
    tokenizer cannot see at its bound). ``openai_tools``: the provider renders tools, tool
    calls and results as OpenAI does (:mod:`~hardcap_core.wire.openai_tools`); else they count
    by their JSON, as a provider that puts the JSON in the prompt bills them. Raise
    :class:`InvalidRequest` as :func:`input_tokens`."""
    return _Count(text, openai_tools=openai_tools).body(body)


class _Count:
    """One walk over a body. ``exact``: the tokenizer for the text the chat format renders;
    None for the bound everywhere."""

    def __init__(self, exact: TextCount | None, *, openai_tools: bool = False) -> None:
        self.exact = exact
        self.rendered = openai_tools and exact is not None
        self.documents = Allowance()  # what this request's PDFs may make the gateway read

    def body(self, body: dict[str, Any]) -> int:
        total = REPLY_PRIMING
        for i, message in enumerate(body.get("messages") or ()):
            total += self._message(message, f"messages[{i}]")
        for field, value in body.items():
            if field == "messages" or field in FREE_PARAMETERS or value is None:
                continue
            if field in ("tools", "functions") and isinstance(value, list):
                if self.rendered and self.exact is not None:
                    total += tool_definition_tokens(value, self.exact)
                else:
                    total += sum(PER_FUNCTION_OVERHEAD + self._function(item) for item in value)
            elif field in EXACT_BODY_FIELDS:
                total += self._known(value)
            else:
                total += self._unknown(value)
        return total

    def _known(self, value: Any) -> int:
        """A value the chat format renders: by the tokenizer when there is one."""
        if self.exact is None or value is None:
            return _value(value)
        return self.exact(value if isinstance(value, str) else _json(value))

    def _unknown(self, value: Any) -> int:
        """A value whose rendering is not known: its bound (which was measured against
        cl100k_base), and never less than its tokens in this tokenizer."""
        bound = _value(value)
        if self.exact is None or value is None:
            return bound
        return max(bound, self.exact(value if isinstance(value, str) else _json(value)))

    def _function(self, item: Any) -> int:
        if self.exact is None:
            return _value(item)
        return self._known(item) + ENUM_ITEM_TOKENS * _enum_items(item)

    def _message(self, message: dict[str, Any], where: str) -> int:
        exact = self.exact is not None
        total = EXACT_MESSAGE_TOKENS if exact else PER_MESSAGE_OVERHEAD
        for field, value in message.items():
            if value is None:
                continue
            if field == "role" and isinstance(value, str):
                total += self._known(value) if exact else ROLE_TOKENS
            elif field == "content":
                total += self._content(value, f"{where}.content")
            elif field == "name":
                total += NAME_OVERHEAD + self._known(value)
            elif field == "audio":
                total += _assistant_audio(value, f"{where}.audio")
            elif (
                field in ("tool_calls", "function_call")
                and self.rendered
                and self.exact is not None
            ):
                total += tool_call_tokens(value, self.exact)
            elif field in EXACT_MESSAGE_FIELDS:
                total += self._known(value)
            else:
                total += self._unknown(value)  # thinking blocks, and whatever else
        return total

    def _content(self, content: Any, where: str) -> int:
        if not isinstance(content, list):
            return self._known(content)
        return sum(self._part(part, f"{where}[{j}]") for j, part in enumerate(content))

    def _part(self, part: Any, where: str) -> int:
        if not isinstance(part, dict):
            return self._unknown(part)
        kind = part.get("type")
        total = 0 if self.exact is None else EXACT_PART_MARGIN
        for field, value in part.items():
            if field == "type" or value is None:
                continue
            if field == "image_url" and kind in ("image_url", None):
                total += _image(value)
            elif field == "input_audio" and kind in ("input_audio", None):
                total += _input_audio(value)
            elif field == "file" and kind in ("file", None):
                total += _file(value, f"{where}.file", self.documents)
            elif field == kind and field in ("text", "refusal"):
                total += self._known(value)
            else:
                # a part type Hardcap does not know, cache_control, ...: by its text.
                total += self._unknown(value)
        return total


def _json(value: Any) -> str:
    # Non-ASCII as itself (a token per byte at most); escaped, it would count more.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _value(value: Any) -> int:
    """A value as the provider may see it: a string as its text, anything else serialized."""
    if value is None:
        return 0
    if isinstance(value, str):
        return input_text_tokens(value)
    return input_text_tokens(_json(value))


def _enum_items(value: Any) -> int:
    """How many enum values a function definition's JSON Schema lists, at any depth."""
    if isinstance(value, list):
        return sum(_enum_items(item) for item in value)
    if not isinstance(value, dict):
        return 0
    enum = value.get("enum")
    own = len(enum) if isinstance(enum, list) else 0
    return own + sum(_enum_items(v) for k, v in value.items() if k != "enum")


def _image(image: Any) -> int:
    """An image part: by OpenAI's tile rule, with its size when a data URL carries it."""
    if isinstance(image, str):  # some clients send the URL alone
        return url_image_tokens(image, None)
    if not isinstance(image, dict):
        return IMAGE_BOUND_TOKENS + _value(image)
    url, detail = image.get("url"), image.get("detail")
    if isinstance(url, str):
        tokens = url_image_tokens(url, detail if isinstance(detail, str) else None)
    else:
        tokens = IMAGE_BOUND_TOKENS + _value(url)
    extra = {k: v for k, v in image.items() if k not in ("url", "detail")}
    return tokens + (_value(extra) if extra else 0)


def _input_audio(audio: Any) -> int:
    """Input audio by its duration at 20 tokens a second (see :mod:`media`)."""
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        return _value(audio)
    extra = {k: v for k, v in audio.items() if k not in ("data", "format")}
    return audio_bound_tokens(audio["data"]) + (_value(extra) if extra else 0)


def _file(file: Any, where: str, documents: Allowance) -> int:
    """A file part: its data (:func:`_file_data`) and its other fields, such as its name."""
    if not isinstance(file, dict):
        return _value(file)
    if file.get("file_id") is not None:
        raise InvalidRequest(
            f"'{where}.file_id': a file sent by id cannot be counted before the call, so the "
            "budget cannot hold it; send its contents as file_data.",
            param=f"{where}.file_id",
        )
    total = 0
    for field, value in file.items():
        if field == "file_data" and isinstance(value, str):
            filename = file.get("filename")
            total += _file_data(value, filename, f"{where}.file_data", documents)
        else:
            total += _value(value)
    return total


def _file_data(url: str, filename: Any, where: str, documents: Allowance) -> int:
    """A file's data as OpenAI bills it: a PDF as the text bound of its pages plus an image of
    each (:meth:`Document.tokens`); any other file by its bytes, a token each (the bound for
    text)."""
    payload = data_url_payload(url)
    if payload is None:
        return _value(url)  # not a data URL: the provider gets this text
    document = _document(url, payload, filename, where, documents)
    return decoded_size(payload) if document is None else document.tokens()


@dataclass(frozen=True, slots=True)
class Document:
    """A PDF of a request's file parts: where its data is, what it costs (:class:`PdfCost`),
    and ``floor``: for a file that does not say it is a PDF but reads as one, its decoded bytes
    (it may be taken for either, so it counts the larger), else 0."""

    where: str
    cost: PdfCost
    floor: int

    def tokens(self, page_image: int = PARSE_PAGE_IMAGE_TOKENS) -> int:
        """The file's bound with an image of each page costing at most ``page_image`` (the
        parse's: GPT-4o's largest image; a route's: its model's,
        :func:`hardcap_core.tokenize.images.image_extra_tokens`)."""
        return max(self.cost.tokens(page_image), self.floor)

    @property
    def counted(self) -> int:
        """What the parse counted for the file."""
        return self.tokens()


def file_document(file: Any, where: str, documents: Allowance) -> Document | None:
    """The PDF a ``file`` part's value holds in its ``file_data`` (``where``: the part's path),
    if any, charged to ``documents``."""
    url = file.get("file_data") if isinstance(file, dict) else None
    payload = data_url_payload(url) if isinstance(url, str) else None
    if not isinstance(file, dict) or not isinstance(url, str) or payload is None:
        return None
    return _document(url, payload, file.get("filename"), f"{where}.file.file_data", documents)


def pdf_documents(body: dict[str, Any]) -> Iterator[Document]:
    """Each PDF in ``body``'s file parts: where its data is and what it costs (read once for
    the request, see :mod:`~hardcap_core.wire.pdf`), so how many pages it has."""
    documents = Allowance()
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or part.get("type") not in ("file", None):
                continue
            document = file_document(part.get("file"), f"messages[{i}].content[{j}]", documents)
            if document is not None:
                yield document


def _document(
    url: str, payload: str, filename: Any, where: str, documents: Allowance
) -> Document | None:
    """The PDF a file's data holds, if any (see :class:`Document`)."""
    data = base64_bytes(payload)
    declared = is_declared_pdf(url, filename, data)
    cost = pdf_cost(data, where, documents, declared=declared)
    if cost is None:
        return None
    return Document(where, cost, 0 if declared else decoded_size(payload))


def check_pdf_pages(body: dict[str, Any], limit: int | None) -> None:
    """Refuse ``body`` (a 400 naming the document that passes it) when its PDFs have more
    pages than a route's ``max_pdf_pages``; None: no cap but the gateway's."""
    if limit is None:
        return
    pages = 0
    for document in pdf_documents(body):
        pages += document.cost.pages
        where = document.where
        if pages > limit:
            raise InvalidRequest(
                f"'{where}': this request's documents have at least {pages} pages; the most "
                f"this model allows here is {limit} (max_pdf_pages).",
                param=where,
            )


def _assistant_audio(audio: Any, where: str) -> int:
    """An assistant's earlier audio, which the provider bills again from its id."""
    if isinstance(audio, dict) and audio.get("id") is not None:
        raise InvalidRequest(
            f"'{where}.id': earlier audio sent by id cannot be counted before the call, so "
            "the budget cannot hold it; send its transcript as the message's content.",
            param=f"{where}.id",
        )
    return _value(audio)
