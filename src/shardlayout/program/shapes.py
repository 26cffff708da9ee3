"""Output shapes of ops, from the op rules themselves (propagated on a one-device mesh).

    >>> shape_of("mm", [(4, 8), (8, 2)], {})
    [(4, 2)]
"""

from __future__ import annotations

from ..caches import register_clearer
from ..mesh import Mesh
from ..sharding import Sharding

_ONE = Mesh((1,), ("one",))


def shape_of(target: str, input_shapes: list, params: dict) -> list:
    """Output shapes of ``target`` on inputs of ``input_shapes`` (non-tuples are constants);
    memoised per (op, input shapes, params), so a repeated layer costs a dictionary probe."""
    _typed = _TYPED[0] if _TYPED else _load_typed()
    try:
        key = (target, tuple([s if type(s) is tuple and _ints(s) else _typed(s) for s in input_shapes]),
               _typed(params) if params else None)
        hit = _SHAPES.get(key)
    except TypeError:  # an unhashable param: computed every time
        return _shape_of(target, input_shapes, params)
    if hit is None:
        hit = _shape_memo(key, target, tuple(input_shapes), params)
    return list(hit)


def shapes_keyed(target: str, shapes_key: tuple, typed_params, input_shapes: list, params: dict) -> tuple:
    """:func:`shape_of` when the caller has the memo key's parts: ``shapes_key`` (each input's
    shape, a tuple of ints, or ``_typed`` of a constant) and ``typed_params`` (``_typed(params)``,
    None without params). Returns the memoised tuple of output shapes (do not mutate).
    ``shapes_keyed("mm", ((4, 8), (8, 2)), None, [(4, 8), (8, 2)], {}) -> ((4, 2),)``"""
    key = (target, shapes_key, typed_params)
    hit = _SHAPES.get(key)
    if hit is None:
        hit = _shape_memo(key, target, tuple(input_shapes), params)
    return hit


_TYPED: list = []  # ops.registry._typed, imported on first use (ops imports this package)


def _load_typed():
    from ..ops.registry import _typed

    _TYPED.append(_typed)
    return _typed


def _ints(shape: tuple) -> bool:
    for n in shape:
        if type(n) is not int:
            return False
    return True


def _shape_memo(key, target, input_shapes, params):
    hit = _SHAPES.get(key)
    if hit is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        hit = _SHAPES[key] = tuple(_shape_of(target, list(input_shapes), params))
    return hit


_SHAPES: dict = {}
_SHAPES_MAX = 1 << 14
register_clearer("shardlayout.program.shapes._SHAPES", _SHAPES.clear, _SHAPES.__len__)


def _shape_of(target: str, input_shapes: list, params: dict) -> list:
    from ..ops.registry import get_op
    from ..propagation import propagate

    ins = [Sharding(_ONE, tuple(s)) if isinstance(s, tuple) else s for s in input_shapes]
    kw = dict(params)
    if not any(isinstance(s, Sharding) for s in ins) and get_op(target).signature.param("mesh") is not None:
        kw["mesh"] = _ONE
    p = propagate(target, ins, **kw)
    return [o.shape for o in p.outputs]
