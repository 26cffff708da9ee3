"""Op rules, one module per family, registered by aten op name (see ``registry``).

    >>> from shardlayout.ops.registry import RULES, load_rules
    >>> load_rules(); sorted(RULES)[:3]
    ['_reshape_alias', '_unsafe_view', 'alias']
"""
