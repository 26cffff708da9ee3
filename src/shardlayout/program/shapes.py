"""Output shapes of ops, from the op rules themselves (propagated on a one-device mesh).

    >>> shape_of("mm", [(4, 8), (8, 2)], {})
    [(4, 2)]
"""

from __future__ import annotations

from ..mesh import Mesh
from ..sharding import Sharding

_ONE = Mesh((1,), ("one",))


def shape_of(target: str, input_shapes: list, params: dict) -> list:
    """Output shapes of ``target`` on inputs of ``input_shapes`` (non-tuples are constants)."""
    from ..ops.registry import get_op
    from ..propagation import propagate

    ins = [Sharding(_ONE, tuple(s)) if isinstance(s, tuple) else s for s in input_shapes]
    kw = dict(params)
    if not any(isinstance(s, Sharding) for s in ins) and get_op(target).signature.param("mesh") is not None:
        kw["mesh"] = _ONE
    p = propagate(target, ins, **kw)
    return [o.shape for o in p.outputs]
