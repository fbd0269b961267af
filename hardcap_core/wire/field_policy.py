"""What each request field of a wire format does to the bill, as data.

One :class:`FieldPolicy` per wire format (OpenAI chat, OpenAI Responses, embeddings, Anthropic
Messages) lists every top-level field the provider documents with its :class:`Effect`:

- ``PASS``: cannot change the bill (sampling knobs, metadata): forwarded unchanged;
- ``COUNTED``: its content is billed as input and the input estimate counts it;
- ``PRICED``: it changes the price (a tier, a cache TTL, a per-use tool): the route's price
  table prices it, or the parser refuses it naming the field;
- ``BOUNDED``: it changes how much output may be billed, and the output cap bounds it;
- ``REFUSED``: the gateway cannot bound what it bills; the parser answers 400 with ``reason``.

A field the table does not list is refused with a 400 naming it, unless the wire format
forwards unknown fields (``forward_unknown``: OpenAI chat does, as OpenAI-compatible upstreams
take fields of their own; they are then counted as input, never free).
``tests/unit/test_field_policies.py`` enumerates the pinned SDKs' own request types and fails
when one of their fields has no entry here, so an SDK upgrade names what is new.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from hardcap_core.errors import InvalidRequest


class Effect(StrEnum):
    PASS = "pass"
    COUNTED = "counted"
    PRICED = "priced"
    BOUNDED = "bounded"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: its effect on the bill and, in words, why (shown in docs/config.md;
    for ``REFUSED``, the message a client gets)."""

    effect: Effect
    why: str
    # The header an SDK sends it as (Anthropic's ``betas`` is ``anthropic-beta``): the table
    # decides it, and in a body it is a 400 naming the header.
    header: str | None = None


@dataclass(frozen=True, slots=True)
class FieldPolicy:
    """The fields of one wire format (``name``: as the error messages call it)."""

    name: str
    fields: Mapping[str, Field]

    def check(self, body: Mapping[str, object], *, forward_unknown: bool = False) -> None:
        """Raise :class:`InvalidRequest` naming the first field of ``body`` that is refused, or
        unknown while ``forward_unknown`` is off. Runs before admission: a refusal costs
        nothing."""
        for name in body:
            rule = self.fields.get(name)
            if rule is None:
                if forward_unknown:
                    continue
                raise InvalidRequest(
                    f"'{name}': this field is not supported here: the gateway does not know "
                    f"what it does to the bill of {self.name} requests.",
                    param=name,
                )
            if rule.header is not None:
                raise InvalidRequest(
                    f"'{name}' is sent as the '{rule.header}' header, not in the body.",
                    param=name,
                )
            if rule.effect is Effect.REFUSED:
                raise InvalidRequest(f"'{name}': {rule.why}", param=name)

    def names(self, *effects: Effect) -> frozenset[str]:
        """The fields with one of ``effects`` (all of them without arguments)."""
        return frozenset(n for n, f in self.fields.items() if not effects or f.effect in effects)

    def markdown(self) -> str:
        """The table as docs/config.md shows it: one row per field, in the table's order."""
        rows = ["| field | effect | why |", "|---|---|---|"]
        for name, field in self.fields.items():
            shown = f"`{name}`" + (f" (header `{field.header}`)" if field.header else "")
            why = field.why[0].upper() + field.why[1:]
            rows.append(f"| {shown} | {field.effect} | {why} |")
        return "\n".join(rows) + "\n"

    def missing(self, documented: Iterable[str]) -> list[str]:
        """The names in ``documented`` (an SDK's request type) that this table has no entry
        for."""
        return sorted(set(documented) - set(self.fields))
