"""Every memo of the package in one place: bounded, listed, and clearable by the user.

Everything memoised is pure (immutable arguments in, immutable results out), so a plan is the same
with warm caches, cold caches or none (``tests/test_caches.py`` checks it byte for byte).

    >>> from shardlayout.caches import clear_caches, cache_stats
    >>> clear_caches(); all(s["size"] == 0 for s in cache_stats().values())
    True
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from functools import lru_cache

_MEMOS: dict = {}
_CLEARERS: dict = {}


def memo(maxsize: int = 1 << 14):
    """``@memo(4096)``: an ``lru_cache`` of at most ``maxsize`` entries, registered so that
    :func:`clear_caches` clears it and :func:`cache_stats` reports it."""
    if not isinstance(maxsize, int) or maxsize < 1:
        raise ValueError(f"memo: maxsize must be a positive int, got {maxsize!r}")

    def wrap(fn):
        cached = lru_cache(maxsize=maxsize)(fn)
        _MEMOS[f"{fn.__module__}.{fn.__qualname__}"] = cached
        return cached

    return wrap


def register_clearer(name: str, clear, size) -> None:
    """Register a cache that is not an ``lru_cache`` (a plain dict on a hot path): ``clear()``
    empties it, ``size()`` counts its entries."""
    _CLEARERS[name] = (clear, size)


def clear_caches() -> None:
    """Empty every memo of the package (layout algebra, shards, propagation, moves, shapes).
    ``clear_caches()``"""
    for f in _MEMOS.values():
        f.cache_clear()
    for clear, _ in _CLEARERS.values():
        clear()


def cache_stats() -> dict:
    """``{name: {"size", "maxsize", "hits", "misses"}}`` for every registered memo (hits and misses
    are None for plain-dict caches). ``cache_stats()["shardlayout.ops.strategy._build"]["hits"]``"""
    out = {}
    for name, f in sorted(_MEMOS.items()):
        info = f.cache_info()
        out[name] = {"size": info.currsize, "maxsize": info.maxsize, "hits": info.hits, "misses": info.misses}
    for name, (_, size) in sorted(_CLEARERS.items()):
        out[name] = {"size": size(), "maxsize": None, "hits": None, "misses": None}
    return out


@contextmanager
def paused_gc():
    """Pause Python's cyclic garbage collector for a burst of allocation that makes no cycles
    worth collecting (planning a model allocates ~10**5 small immutable records; the collector's
    passes over a growing heap cost a third of the time). Restored on exit, exceptions included.
    ``with paused_gc(): ...``"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["cache_stats", "clear_caches", "memo", "paused_gc", "register_clearer"]
