"""The provider interface: send a chat request to an upstream, get normalized events back.

One implementation per kind of upstream, each its own module here: OpenAI-compatible
(``openai_compat.py``), Anthropic Messages (``anthropic.py``) and Bedrock Converse
(``bedrock.py``), found through ``registry.py``. A provider translates its upstream's errors into
:class:`~hardcap_core.errors.GatewayError` at its own boundary, so the gateway never sees a
transport exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from hardcap_core.chat import OPENAI_EMBEDDINGS, ChatRequest
from hardcap_core.config import Route
from hardcap_core.errors import InvalidRequest
from hardcap_core.events import Completion, Read


class Provider(Protocol):
    """Sends a :class:`ChatRequest` to a route's upstream model."""

    #: What ``Event.raw`` looks like: a wire format of the same dialect may forward it.
    dialect: str

    async def complete(self, route: Route, request: ChatRequest, max_tokens: int) -> Completion:
        """A whole reply of at most ``max_tokens`` output tokens (for an embeddings request,
        its vectors: a provider without an embeddings endpoint calls :func:`no_embeddings`)."""
        ...

    def stream(
        self, route: Route, request: ChatRequest, max_tokens: int
    ) -> AbstractAsyncContextManager[AsyncIterator[Read]]:
        """An open stream: entering it connects and checks the status (raising the error a
        client gets if the upstream refuses); it yields the events of one network read at a
        time; leaving it closes the connection, so the upstream stops generating."""
        ...


def no_embeddings(request: ChatRequest) -> None:
    """Refuse an embeddings request on a provider that has no embeddings endpoint, before
    anything is sent (a 400 naming the model: the route is the wrong one)."""
    if request.dialect == OPENAI_EMBEDDINGS:
        raise InvalidRequest(
            f"The model '{request.model}' cannot make embeddings: its provider has no "
            "embeddings endpoint.",
            param="model",
        )
