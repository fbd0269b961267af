"""An image on a gpt-4o-mini route, through the openai SDK: held what gpt-4o-mini bills.

gpt-4o-mini bills an image 2,833 + 5,667 per tile, 33 times GPT-4o's 85 + 170; the mock bills
it so (hardcap_core/local/mock_billing.py, by the model's family). The gateway used to hold
every image at GPT-4o's rule: a 1024 x 1024 image was held 765 tokens and billed 25,501, so a
tenant with 30,000 tokens had two such requests admitted and was billed 51,000. Held by the
route's model, the first is held (and billed) ~25,600 and the second is refused.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hardcap_core.local.valkey import LocalValkey
from tests.input_shapes import png
from tests.load.harness import reserved_left
from tests.stack import KEYS, Mock, config_data, gateway_thread

BUDGET = 30_000
IMAGE = "data:image/png;base64," + base64.b64encode(png(1024, 1024)).decode()
MESSAGES: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture? [mock:tokens=5]"},
            {"type": "image_url", "image_url": {"url": IMAGE, "detail": "high"}},
        ],
    }
]


@pytest.fixture
def gateway(flushed: LocalValkey, mock: Mock) -> Iterator[str]:
    """A gateway with a route `vision` on gpt-4o-mini; tenant alpha has 30,000 tokens a day."""
    data = config_data(mock.url, flushed.url)
    data["routes"].append(
        {
            "name": "vision",
            "upstream": "mock",
            "model": "gpt-4o-mini",
            "price": {"input_per_million": 0.15, "output_per_million": 0.6},
            "max_output_tokens": 64,
        }
    )
    data["tenants"][0]["budgets"] = [
        {"dimension": "total_tokens", "limit": BUDGET, "window": "day"}
    ]
    mock.reset()
    with gateway_thread(data) as url:
        yield url


def test_an_image_on_gpt_4o_mini_is_held_what_it_bills(gateway: str, mock: Mock) -> None:
    client = openai.OpenAI(base_url=gateway, api_key=KEYS["alpha"], max_retries=0, timeout=30)
    quoted = httpx.post(
        f"{gateway}/hardcap/quote",
        json={"model": "vision", "messages": MESSAGES, "max_tokens": 8, "user": "alpha"},
        headers={"authorization": f"Bearer {KEYS['alpha']}"},
    ).json()
    first = client.chat.completions.create(
        model="vision", messages=MESSAGES, max_tokens=8, user="alpha"
    )
    billed = first.usage.prompt_tokens if first.usage else 0
    assert billed > 2833 + 4 * 5667  # the mock bills gpt-4o-mini's rule
    assert quoted["input_tokens"] >= billed  # the hold covers the image
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(
            model="vision", messages=MESSAGES, max_tokens=8, user="alpha"
        )
    assert refused.value.code == "budget_exceeded"
    truth = mock.truth("alpha")
    assert truth["prompt_tokens"] + truth["completion_tokens"] <= BUDGET
    assert reserved_left(gateway, KEYS["alpha"]) == 0
