"""Op rules, one module per family, registered by aten op name (see ``registry``).

    >>> from shardlayout.ops.registry import RULES, load_rules
    >>> load_rules(); "view" in RULES and "mm" in RULES
    True
"""
