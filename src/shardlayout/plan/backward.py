"""Where the backward pass reduces gradients: planned from the forward plan, Megatron's way.

Pure (no torch): the runner (``run``) executes it and the auto-sharding estimate prices it.

Convention: every rank holds the *complete* gradient of each value it holds (a replicated
tensor's gradient is replicated, not a partial sum). A local op leaves the gradient of an input
*partial* over the mesh axes that shard the op's other operands or outputs but not that input
(a replicated ``z`` feeding a column-parallel matmul: each rank's ``grad z`` is its weight
shard's contribution). Those partial gradients are summed by one ``all_reduce`` per consumed
value and set of axes — all the consumers whose contributions arrive partial over exactly those
axes together, and no other: for a Llama block that is Megatron's "f" (one all-reduce for q, k
and v together), and for a weight replicated on a data-parallel axis it is the gradient sync. A
consumer whose contribution is already complete (a residual add beside the column matmul, a
tied weight's transpose whose output is reduced further on) reads the value before the sum: an
all-reduce of a complete gradient would multiply it by the group's size. The forward
collectives' adjoints follow the same convention: an all-reduce's and an all-gather's need no
communication, a reduce-scatter's is an all-gather, an all-to-all's the reverse all-to-all, and
a local slice's completes the gradient over the axes it sliced on (one all-reduce).

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program.models import llama, style_pins
    >>> prog = llama(layers=1); m = Mesh.parse("tp=2")
    >>> bw = gradient_reductions(plan(prog, m, style_pins(prog, m, "megatron")))
    >>> sorted((name, [p.axis for p in axes], len(readers)) for (name, _, axes), readers in bw.items())
    [('layers.0.attn_in', ['tp'], 3), ('layers.0.mlp_in', ['tp'], 2)]
"""

from __future__ import annotations

from ..ops.result import canonical_op_name
from ..sharding.collective import AxisPiece

# outputs that carry no gradient (integer / boolean results, fresh tensors): op -> output indices
# (None: all of them)
_NO_GRAD = {**{n: None for n in ("eq", "ne", "le", "lt", "ge", "gt", "logical_and", "logical_or", "logical_not",
                                 "bitwise_not", "argsort", "one_hot", "histc", "bincount", "nonzero", "argwhere",
                                 "unique", "_unique2", "arange", "full", "zeros", "ones", "scalar_tensor", "empty",
                                 "empty_permuted",
                                 "rand", "randn", "new_zeros", "new_ones", "new_full", "new_empty", "zeros_like",
                                 "ones_like", "full_like", "empty_like")},
            "topk": (1,), "sort": (1,)}


def grad_tensors(program) -> set:
    """Tensors whose gradient the backward pass computes: they depend on a parameter and a
    program output depends on them, through ops that carry gradients."""

    def carries(op, k):
        cut = _NO_GRAD.get(canonical_op_name(op.target), ())
        return not (cut is None or k in cut)

    needs = set(program.inputs("param"))
    for op in program.ops:
        if any(isinstance(i, str) and i in needs for i in op.inputs):
            needs |= {o for k, o in enumerate(op.outputs) if carries(op, k)}
    reach = set(program.outputs)
    for op in reversed(program.ops):
        if any(o in reach and carries(op, k) for k, o in enumerate(op.outputs)):
            reach |= {i for i in op.inputs if isinstance(i, str)}
    return needs & reach


def _axes_of(s) -> set:
    """Mesh axes a sharding uses, to shard a dim or to hold partial values."""
    return {f.axis for fs in s.dims for f in fs if getattr(f, "axis", None)} | {a for a, _ in s.partial}


def gradient_reductions(plan, needs=None) -> dict:
    """``{(tensor, target, pieces): readers}``: one gradient all-reduce over the axis ``pieces``
    (whole axes, mesh order) for the consumers ``readers`` (``(op index, input position)``
    pairs) that read ``tensor`` at ``target`` and leave its gradient partial over exactly those
    axes; only for tensors in ``needs`` (default: ``grad_tensors``, those whose gradient the
    backward computes). A consumer in no entry reads the value as it is (its gradient complete)."""
    needs = grad_tensors(plan.program) if needs is None else needs
    order = {a: i for i, a in enumerate(plan.mesh.names)}
    out: dict = {}
    for i, (op, po) in enumerate(zip(plan.program.ops, plan.ops)):
        for k, name, t, partial in _partial_inputs(op.inputs, po.input_targets, po.outputs, needs):
            pieces = tuple(AxisPiece(a, plan.mesh.axis_size(a)) for a in sorted(partial, key=order.get))
            out.setdefault((name, t, pieces), []).append((i, k))
    return {key: tuple(readers) for key, readers in out.items()}


def reduction_at(reductions: dict) -> dict:
    """``{(op index, input position): (tensor, target, pieces)}``: which gradient reduction of
    ``gradient_reductions`` each consumer reads its input through."""
    return {reader: key for key, readers in reductions.items() for reader in readers}


def op_reductions(inputs, input_targets, outputs, needs) -> tuple:
    """One op's share of ``gradient_reductions``: ``(tensor, target, axes)`` for every input in
    ``needs`` whose gradient this op leaves partial over ``axes`` (a frozenset of axis names):
    the axes that shard the op's other operands or outputs, or hold them partial (a replicated
    operand of a partial one — ``partial * w`` — gets a partial gradient), but not that input.
    ``op_reductions(("x",), (s,), (s,), {"x"}) -> ()`` when nothing else is sharded."""
    return tuple((name, t, axes) for _, name, t, axes in _partial_inputs(inputs, input_targets, outputs, needs))


def _partial_inputs(inputs, input_targets, outputs, needs):
    """``op_reductions`` with each input's position: ``(k, tensor, target, axes)``."""
    shards = set()
    for t in input_targets:
        if hasattr(t, "dims"):
            shards |= _axes_of(t)
    for o in outputs:
        shards |= _axes_of(o)
    for k, (name, t) in enumerate(zip(inputs, input_targets)):
        if isinstance(name, str) and name in needs:
            partial = shards - _axes_of(t)
            if partial:
                yield k, name, t, frozenset(partial)


def slice_completions(c) -> tuple:
    """The axis pieces a local step adds (its target shards on them, its source did not): its
    adjoint all-reduces the zero-filled gradient over them."""
    have = {(f.axis, f.pre, f.size) for fs in c.src.dims for f in fs if getattr(f, "axis", None)}
    new = [(f.axis, f.pre, f.size) for fs in c.dst.dims for f in fs
           if getattr(f, "axis", None) and (f.axis, f.pre, f.size) not in have]
    return tuple(AxisPiece(a, s, p) for a, p, s in sorted(new))


def training_pieces(plan, reductions: dict) -> set:
    """Axis-piece tuples the backward pass reduces over (gradient sums, local slices' completions)."""
    from ..sharding.collective import CollectiveKind

    out = {pieces for _, _, pieces in reductions}
    for moves in plan.moves.values():
        out |= {slice_completions(c) for c in moves if c.kind is CollectiveKind.LOCAL}
    return {p for p in out if p}


__all__ = ["grad_tensors", "gradient_reductions", "op_reductions", "reduction_at", "slice_completions",
           "training_pieces"]
