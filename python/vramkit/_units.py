"""The one byte formatter of vramkit (pure Python: the report and trace tools need no extension)."""
from __future__ import annotations

import math
from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: Any, exact: bool = False) -> str:
    """Bytes for people, in binary units with two decimals.

    ``1572864`` -> ``"1.50 MiB"``; with ``exact=True`` -> ``"1.50 MiB (1572864 bytes)"``, the form
    of the C++ core's messages (which print the same digits). Below 1 KiB: ``"512 B"``. ``None``
    and NaN give a dash.
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "\u2014"
    sign = "-" if n < 0 else ""
    v = abs(float(n))
    u = 0
    while v >= 1024.0 and u < len(_UNITS) - 1:
        v /= 1024.0
        u += 1
    if u == 0:
        return f"{sign}{int(round(v))} B"
    text = f"{sign}{v:.2f} {_UNITS[u]}"
    return f"{text} ({int(n)} bytes)" if exact else text
