"""A request's input as each route counts it: the cheap bound first, the tokenizer's count when
it changes a decision.

Every request is reserved its upper bound first (:meth:`InputCounts.bound`: computed at parse,
no vocabulary). A route whose chain of targets all count better than the bound
(:meth:`InputCounts.counts_better`) gets :meth:`InputCounts.count` where it matters: when the
bound does not fit (admission answers busy, exceeded or queued, and the gateway asks again with
the count), on every request of a route with ``exact_count: always``, for ``count_tokens`` and
for the first usage event of an Anthropic stream. A chain is counted as its dearest target
bills: each target by its own tokenizer, its images and PDF page images by its model's rule
(:mod:`~hardcap_core.tokenize.images`), an Anthropic model (directly or on Bedrock) with what
else it bills beyond OpenAI's rules (:func:`~hardcap_core.wire.anthropic_count.
anthropic_extra_tokens`), the largest of them.

A vocabulary is loaded in a worker thread the first time a count needs it (hundreds of
milliseconds of CPU, :mod:`~hardcap_core.tokenize.vocabularies`), so streams in flight on the
same process are not held up. If it cannot be loaded (a file that is not the one tiktoken
pins), the error is logged and the request goes on with its bound, which is always safe.

The counters, the vocabularies and the count API are imported only when some route has a
tokenizer (or asks the count API): a config of bounds, most of them, never imports them, and a
process's cold start does not pay for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hardcap_core.chat import ANTHROPIC_MESSAGES, ChatRequest
from hardcap_core.config import Config, Route
from hardcap_core.errors import ConfigError
from hardcap_core.ledger import AdmitResult, Queued, Refused
from hardcap_core.logs import logger
from hardcap_core.tokenize.images import ImageInput, image_extra_tokens, images
from hardcap_core.wire.anthropic_count import anthropic_extra_tokens
from hardcap_core.wire.openai_input import Document

if TYPE_CHECKING:  # imported on first use, for the routes that count (see the docstring)
    from hardcap_core.tokenize.count_api import CountApi, Prefix
    from hardcap_core.tokenize.counters import InputCounter

ANTHROPIC_KINDS = ("anthropic", "bedrock")  # upstreams that bill by Anthropic's rules


def bound_short(result: AdmitResult) -> bool:
    """Whether an admission of the bound may go otherwise with a smaller input: it waits
    (queued or busy), the budget is spent (exceeded), or the tokens per minute are (not the
    requests per minute)."""
    if isinstance(result, Queued):
        return True
    return isinstance(result, Refused) and result.dimension != "requests"


class InputCounts:
    """Per route of ``config``: its counter, and the count API of its Anthropic upstream when
    it asks for one (``providers``: the gateway's, by kind; the Anthropic one's transport)."""

    def __init__(self, config: Config, providers: Mapping[str, Any] | None = None) -> None:
        self.chains = {name: config.chain(route) for name, route in config.routes.items()}
        self.counters = _counters(config)  # the routes with a tokenizer: the bound needs none
        transport = getattr((providers or {}).get("anthropic"), "client", None)
        self.api: CountApi | None = None
        if transport is not None and any(r.count_api for r in config.routes.values()):
            from hardcap_core.tokenize.count_api import CountApi

            self.api = CountApi(transport)

    def counts_better(self, route: Route) -> bool:
        """Whether every target of ``route``'s chain counts better than the bound (one that
        does not keeps the chain's count at the bound: nothing to gain)."""
        return all(t.name in self.counters for t in self.chains[route.name])

    def always(self, route: Route) -> bool:
        """Whether ``route`` reserves its count on every request, not only where it matters."""
        return route.exact_count == "always" and self.counts_better(route)

    def bound(self, route: Route, chat: ChatRequest) -> int:
        """The request's upper bound as the dearest-counting target of its chain bills it:
        each target's images and the image of each PDF page by its model's rule
        (:func:`~hardcap_core.tokenize.images.image_extra_tokens`), and an Anthropic model
        (directly or on Bedrock) its tool-use system prompt beyond what the OpenAI count of
        the body holds. (A request that came in Anthropic's format was counted with it
        already.)"""
        found = tuple(images(chat.body))  # read once for every target
        chain = self.chains[route.name]
        return chat.input_tokens + max(self._extra(t, chat, found) for t in chain)

    @staticmethod
    def _extra(target: Route, chat: ChatRequest, found: tuple[ImageInput | Document, ...]) -> int:
        """What ``target`` bills for ``chat`` beyond the parse's count of its body."""
        extra = image_extra_tokens(chat.body, target.image_rules, found)
        if chat.dialect != ANTHROPIC_MESSAGES and target.upstream.kind in ANTHROPIC_KINDS:
            extra += anthropic_extra_tokens(chat.body)
        return extra

    async def count(self, route: Route, chat: ChatRequest) -> int | None:
        """The chain's count by its tokenizers; None where it has none better than the bound,
        or a vocabulary could not be loaded (then the bound holds)."""
        if not self.counts_better(route):
            return None
        try:
            return max([await self._target(t, chat) for t in self.chains[route.name]])
        except ConfigError as e:
            logger.error("tokenizer unusable: the bound is reserved",
                         extra={"route": route.name, "error": str(e)})  # fmt: skip
            return None

    async def reserving(self, route: Route, chat: ChatRequest) -> Reserving:
        """What ``chat`` is reserved first: its count on a route that always wants it, else
        its bound (then counted if the bound does not fit: :meth:`Reserving.admit`)."""
        counted = await self.count(route, chat) if self.always(route) else None
        if counted is not None:
            return Reserving(self, route, chat, counted, counted, recount=False)
        return Reserving(
            self, route, chat, self.bound(route, chat), None, self.counts_better(route)
        )

    async def told(
        self, route: Route, chat: ChatRequest, counted: int | None, *, up_front: bool
    ) -> ChatRequest:
        """``chat`` with the input its client is told and a failed target is charged: what
        it was reserved if that was counted; the route's count if the client is told its
        input ``up_front`` (an Anthropic stream's message_start); else as parsed."""
        if counted is not None:
            return replace(chat, input_tokens=counted)
        if up_front:
            return replace(chat, input_tokens=await self.reported(route, chat))
        return chat

    async def reported(self, route: Route, chat: ChatRequest) -> int:
        """What the gateway tells a client its input counts (count_tokens, the first usage
        event): the route's count where it has one, else the bound."""
        counted = await self.count(route, chat)
        return self.bound(route, chat) if counted is None else counted

    async def _target(self, target: Route, chat: ChatRequest) -> int:
        from hardcap_core.tokenize.vocabularies import encoding, loaded  # imported by _counters

        counter = self.counters[target.name]
        if counter.vocabulary is not None and counter.vocabulary not in loaded():
            await asyncio.to_thread(encoding, counter.vocabulary)
        extra = image_extra_tokens(chat.body, target.image_rules)
        if target.upstream.kind in ANTHROPIC_KINDS:
            extra += anthropic_extra_tokens(chat.body)
        if target.count_api and self.api is not None:
            return await self._asked(target, chat, counter, extra)
        return counter.count(chat.body) + extra

    async def _asked(
        self, target: Route, chat: ChatRequest, counter: InputCounter, extra: int
    ) -> int:
        """The count API's answer (it bills everything, extras included), or the calibrated
        bound, through the longest prefix it has counted before."""
        assert self.api is not None
        answer = await self.api.count(target, chat)
        calibrated = counter.count(chat.body) + extra
        if isinstance(answer, int):
            if answer > calibrated:  # the calibration is an assumption: say where it is low
                logger.warning("calibrated bound below the count api",
                               extra={"route": target.name, "api": answer,
                                      "calibrated": calibrated})  # fmt: skip
            return answer
        if answer.tokens is None:
            return calibrated
        return min(calibrated, answer.tokens + self._rest(target, chat, answer))

    @staticmethod
    def _rest(target: Route, chat: ChatRequest, prefix: Prefix) -> int:
        """The calibrated bound of the messages after a counted prefix, with what Anthropic
        bills beyond OpenAI's rules for them (their images and PDF page images by ``target``'s
        rule)."""
        from hardcap_core.tokenize.counters import CalibratedCounter  # imported by _counters

        rest = {"messages": chat.body["messages"][prefix.messages :]}
        extra = image_extra_tokens(rest, target.image_rules) + anthropic_extra_tokens(rest)
        return CalibratedCounter().count(rest) + extra


def _counters(config: Config) -> dict[str, InputCounter]:
    """The counter of each route whose tokenizer is not the bound, importing the counters only
    if there is one. A build that left out a vocabulary some route uses fails here, at
    startup."""
    named = {name: r.tokenizer for name, r in config.routes.items() if r.tokenizer != "bound"}
    if not named:
        return {}
    from hardcap_core.tokenize.counters import counter_for
    from hardcap_core.tokenize.vocabularies import check_shipped

    counters = {name: counter_for(tokenizer) for name, tokenizer in named.items()}
    check_shipped({c.vocabulary for c in counters.values() if c.vocabulary})
    return counters


@dataclass(slots=True)
class Reserving:
    """The input one request is reserved: ``tokens``, its bound or its count (``counted``,
    once made). ``recount``: the bound is reserved and the route counts better."""

    counts: InputCounts
    route: Route
    chat: ChatRequest
    tokens: int
    counted: int | None
    recount: bool

    async def admit(self, reserve: Callable[[int, bool], Awaitable[AdmitResult]]) -> AdmitResult:
        """``reserve(tokens, record_refusal)``; where the bound is short, once, the count, and
        ``reserve`` again with it when it is less (a queued request then asks again with it).
        A refusal is recorded once per request: the bound's answer records none while a count
        may follow it, and a refusal that stands is asked for again with its record."""
        recorded = not self.recount
        result = await reserve(self.tokens, recorded)
        if self.recount and bound_short(result):
            self.recount = False
            self.counted = await self.counts.count(self.route, self.chat)
            if self.counted is not None and self.counted < self.tokens:
                self.tokens = self.counted
                return await reserve(self.tokens, True)
        if isinstance(result, Refused) and not recorded:
            result = await reserve(self.tokens, True)  # the refusal stands: its usage record
        return result

    @property
    def reserved_count(self) -> int | None:
        """The count, if it is what is reserved."""
        return self.counted if self.counted == self.tokens else None
