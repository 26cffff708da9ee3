"""Global settings, overridable per call and with a context manager.

    >>> from shardlayout.config import options, settings
    >>> with options(subaxes=False):
    ...     settings.subaxes
    False
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields


@dataclass
class Settings:
    """``subaxes``: may propagation bind pieces of mesh axes (Shardy-style sub-axes)?
    False restricts outputs to what DTensor placements can express."""

    subaxes: bool = True


settings = Settings()


@contextmanager
def options(**kwargs):
    """Temporarily change settings: ``with options(subaxes=False): ...``."""
    names = {f.name for f in fields(Settings)}
    bad = set(kwargs) - names
    if bad:
        raise TypeError(f"unknown setting(s) {sorted(bad)}; known: {sorted(names)}")
    old = {k: getattr(settings, k) for k in kwargs}
    for k, v in kwargs.items():
        setattr(settings, k, v)
    try:
        yield settings
    finally:
        for k, v in old.items():
            setattr(settings, k, v)
