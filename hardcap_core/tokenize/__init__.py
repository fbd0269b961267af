"""Counting a request's input per route: the cheap upper bound, and the tokenizer's count where
a route has one (``tokenizer:`` in the config; docs/config.md).

``heuristics.py`` counts text without a tokenizer: the output length heuristic and the input
upper bound by character class. ``counters.py`` holds one counter per kind of tokenizer (the
bound, a public BPE encoding, the calibrated bound for Anthropic's models); ``vocabularies.py``
the shipped BPE files, loaded on first use; ``count_api.py`` Anthropic's own count; ``routes.py``
what the gateway asks: a route's bound, and its count where that changes a decision.
"""
