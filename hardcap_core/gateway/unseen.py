"""Output a provider bills without streaming it: what a request on such a route reserves and what
the meter adds to its live count; the least a stream that ended without its bill is charged for
it is :func:`.money.unseen_billed`.

A route says what its provider does (``unseen_output`` in the config; by default by the model's
family, :data:`hardcap_core.config.schema.UNSEEN_OUTPUT_BY_MODEL`):

- ``none``: it streams every output token it bills; the meter counts them all.
- ``summarized_thinking`` (Claude 4 models): with extended thinking on, it bills the full
  thinking and streams a summary of it (about one token in twenty). The request's thinking
  budget is the most the model may think ("this limit applies to full thinking tokens, and not
  to the summarized output"), so it bounds what is billed unseen: admission reserves it as
  output on top of the least output, and the meter counts it as generated from the start, so
  the live count of what streams (the summary, the text) extends and cuts on top of it and
  never brings the hold below it. Thinking on without a budget (``adaptive``, or a budget at
  or past the cap) may spend the whole cap: as the next.
- ``silent_reasoning`` (OpenAI's o-series and GPT-5): it bills reasoning it never streams, and
  nothing but the output cap bounds it. A reply the gateway cannot see it cannot cut, so it
  is held as a whole reply is: admission reserves ``max_tokens`` (shrunk to what is left at
  the tail of a budget) and the provider is asked for no more than that hold.

A stream on such a route that ends without the provider's final report (cut, failed, or
incomplete) is charged at least its hold, no more than the provider was asked for: the
provider billed the thinking the gateway could not see. A final report is the bill, as ever.
So, as long as the provider keeps to the thinking budget and the cap it was sent (as it
documents), the ledger is never below its bill, and the bill passes the budget by no more than
on a route that streams everything (docs/design.md, "Ways past the cap").
"""

from __future__ import annotations

from dataclasses import dataclass

from hardcap_core.chat import ChatRequest
from hardcap_core.config import Route


@dataclass(frozen=True, slots=True)
class Unseen:
    """What of a request's output its provider may bill without streaming it."""

    tokens: int = 0  # at most this many on top of what streams (a thinking budget)
    whole: bool = False  # any of it: nothing bounds it but the output cap

    @property
    def any(self) -> bool:
        return self.whole or self.tokens > 0

    def hold(self, estimate: int, cap: int, least_output: int) -> int:
        """The output a stream with ``estimate`` and a cap of ``cap`` reserves: the thinking
        budget and ``least_output`` more, or the whole cap when nothing else bounds it."""
        if self.whole:
            return cap
        return max(estimate, min(self.tokens + least_output, cap)) if self.tokens else estimate

    def least(self, least_output: int, cap: int) -> int:
        """The smallest hold a stream may be admitted with at the tail of a budget: never less
        than its thinking budget and ``least_output`` (a hold the thinking alone would pass is
        no hold); a whole reply shrinks with the hold, since the provider is asked for it."""
        return min(self.tokens + least_output, cap) if self.tokens else least_output


SEEN = Unseen()


def unseen_output(route: Route, chat: ChatRequest, cap: int) -> Unseen:
    """What of ``chat``'s output, capped at ``cap`` tokens, ``route``'s provider may bill
    without streaming it."""
    kind = route.unseen_output
    if kind == "silent_reasoning" and chat.reasons:
        return Unseen(whole=True)
    if kind == "summarized_thinking" and chat.thinks:
        budget = chat.thinking_budget
        return Unseen(whole=True) if budget is None or budget >= cap else Unseen(tokens=budget)
    return SEEN
