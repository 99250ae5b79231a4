"""What model calls cost: tokens at the prices of AGENTRUN_LLM_PRICES (per million tokens).

    AGENTRUN_LLM_PRICES='{"gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.075}}'

A step's cost is computed when its decision is made, at the prices of that moment, and
added to its run's; a model without a price costs nothing known (the step's cost is null).
Cached input tokens (the provider's prompt cache) are part of the input tokens, at the
cached price (the input price when none is given).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PER = 1_000_000


@lru_cache(maxsize=4)
def _parse(text: str) -> dict[str, dict[str, float]]:
    try:
        table = json.loads(text or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"AGENTRUN_LLM_PRICES is not JSON: {exc}") from None
    if not isinstance(table, dict):
        raise ImproperlyConfigured("AGENTRUN_LLM_PRICES must be an object: model → prices")
    out: dict[str, dict[str, float]] = {}
    for model, prices in table.items():
        if not isinstance(prices, dict) or not {"input", "output"} <= set(prices):
            raise ImproperlyConfigured(
                f"AGENTRUN_LLM_PRICES[{model!r}] needs input and output prices per million tokens"
            )
        unknown = set(prices) - {"input", "output", "cached_input"}
        if unknown:
            raise ImproperlyConfigured(
                f"AGENTRUN_LLM_PRICES[{model!r}]: unknown {', '.join(sorted(unknown))}"
            )
        for name, value in prices.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ImproperlyConfigured(
                    f"AGENTRUN_LLM_PRICES[{model!r}][{name!r}] must be a number, 0 or more"
                )
        out[model] = {k: float(v) for k, v in prices.items()}
    return out


def prices() -> dict[str, dict[str, float]]:
    return _parse(settings.AGENTRUN_LLM_PRICES)


def cost(model: str, tokens_in: int, tokens_out: int, cached: int = 0) -> float | None:
    """US dollars for one call, or None when the model has no price."""
    price: Any = prices().get(model)
    if price is None:
        return None
    cached = min(max(cached, 0), tokens_in)
    fresh = tokens_in - cached
    cached_price = price.get("cached_input", price["input"])
    return (fresh * price["input"] + cached * cached_price + tokens_out * price["output"]) / PER
