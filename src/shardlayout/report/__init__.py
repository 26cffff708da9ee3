"""Reports: terminal pictures and per-rank tables of shardings.

    >>> from shardlayout.report import ranks_text
    >>> ranks_text(0b1011)
    '0-1,3'
"""

from .cells import ranks_text
from .picture import holders, picture, rank_table

__all__ = ["holders", "picture", "rank_table", "ranks_text"]
