"""Axis ticks for the inline SVG charts (HTML report, monitor recordings)."""
from __future__ import annotations

import math


def nice_step(span: float, target: int = 5) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about ``target`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag
