"""Reading pool option strings as the pool does."""
from __future__ import annotations


def plans_steps(conf: str) -> bool:
    """Whether a ``VRAMKIT_ALLOC_CONF``-style string (``upstream=`` items allowed) turns the pool
    option ``plan_steps`` on, read by the pool's own parser (its last mention counts). A string
    the pool would refuse: False (building the pool says why)."""
    from . import _vramkit
    items = [x for x in conf.split(",") if x.strip() and not x.strip().startswith("upstream=")]
    try:
        return "plan_steps:true" in _vramkit.parse_options(",".join(items)).split(",")
    except ValueError:
        return False
