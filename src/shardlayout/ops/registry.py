"""The op-rule registry, keyed by short aten op name.

    >>> from shardlayout.ops.registry import RULES, load_rules
    >>> load_rules(); "view" in RULES
    True
"""

from __future__ import annotations

RULES: dict = {}


def register(*names):
    """Decorator: ``@register("view", "reshape")`` makes ``fn(name, inputs, **params)`` a rule."""

    def deco(fn):
        for n in names:
            RULES[n] = fn
        return fn

    return deco


def load_rules() -> None:
    """Import every rule module once (they register themselves)."""
    from . import families, view  # noqa: F401
