"""Op rules, one module per family, declared once each in the registry (``register_op``).

    >>> from shardlayout.ops import get_op
    >>> get_op("aten.mm.default").signature.text
    'a, b ; out_dtype: dtype? = None'
"""

from . import families, ragged, resize, view  # noqa: F401  (each family declares its ops)
from .registry import OpDef, get_op, parse_signature, register_op, registered
from .result import Propagation, canonical_op_name
from .strategy import FactorMap, factor_rule

__all__ = ["FactorMap", "OpDef", "Propagation", "canonical_op_name", "factor_rule", "get_op", "parse_signature",
           "register_op", "registered"]
