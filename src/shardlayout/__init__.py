"""shardlayout: plan, verify and run tensor shardings as CuTe layouts.

    >>> from shardlayout import Layout
    >>> Layout((4, 2)).size()
    8
"""

from .errors import LayoutError, ShardingError
from .layout import Layout

__version__ = "0.1.0"

__all__ = ["Layout", "LayoutError", "ShardingError", "__version__"]
