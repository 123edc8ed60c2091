"""Counted nouns (``plural``: "1 node", "2 nodes"): the one piece of wording the model's
own summary shares with the renderings (``cells``, ``text``, ``html``), below all of them."""
from __future__ import annotations

from typing import Optional


def plural(n: int, noun: str, nouns: Optional[str] = None) -> str:
    """``1 node``, ``2 nodes``, ``0 nodes`` (``nouns``: an irregular plural)."""
    return f"{n} {noun}" if n == 1 else f"{n} {nouns or noun + 's'}"
