"""A norm of each head run head by head, read as one norm with a per-head weight.

StableLM's ``qk_layernorm`` keeps one LayerNorm per head and runs it on each head split off q
(``[batch, heads, seq, head_dim]``), then joins them again:

    split(q, 1, dim=1) -> H x native_layer_norm(q_h, [hd], w_h, b_h) -> cat(dim=1)

Op by op, a one-head piece is held by one rank only when q's heads are cut on tp, so q had to stay
whole. The H norms are one LayerNorm over the head dim whose weight (and bias) differ per head:

    native_layer_norm(q, [hd]) * cat(w).view(H, 1, hd) + cat(b).view(H, 1, hd)

— a norm over the last dim alone (local to each head) and products with a ``[H, 1, hd]`` tensor that
a cut of the heads slices for free: Megatron cuts q's heads on tp and each rank norms its own.
A program without the pattern is returned as it is; the per-head parameters stay what they are.

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); q = b.input("q", (2, 2, 3, 4)); ws = [b.param(f"w{h}", (4,)) for h in (0, 1)]
    >>> parts = b.op("split_with_sizes", [q], name="split", n_out=2, split_sizes=(1, 1), dim=1)
    >>> normed = [b.op("native_layer_norm", [x, w], name=f"n{h}", n_out=3, normalized_shape=(4,), eps=1e-5)[0]
    ...           for h, (x, w) in enumerate(zip(parts, ws))]
    >>> b.output(b.op("cat", normed, name="out", dim=1))
    >>> [op.target for op in merge_head_norms(b.build()).ops]
    ['native_layer_norm', 'cat', 'view', 'mul']
"""

from __future__ import annotations

from ..ops.result import canonical_op_name
from . import Program, ProgramBuilder
from .rewrite import readers, rebuilt

SPLITS = ("split", "split_with_sizes")
LAYER_NORMS = ("native_layer_norm", "layer_norm")


def merge_head_norms(prog: Program) -> Program:
    """``prog`` with every split -> norm per piece -> cat of one-element pieces (module docstring)
    read as one norm with a per-head weight; ``prog`` itself when it has none."""
    if prog.is_symbolic:
        return prog
    users = readers(prog)
    found = {}  # index of the split -> (indices of its norms, index of the cat)
    for k, op in enumerate(prog.ops):
        got = _pattern(prog, k, op, users)
        if got is not None:
            found[k] = got
    if not found:
        return prog
    dropped = {i for norms, cat in found.values() for i in (*norms, cat)}
    emit = {k: (lambda b, k=k, norms=norms, cat=cat: _emit(prog, prog.ops[k], [prog.ops[i] for i in norms],
                                                           prog.ops[cat], b))
            for k, (norms, cat) in found.items()}
    return rebuilt(prog, emit, dropped)


def _pattern(prog: Program, k: int, op, users: dict):
    """``(norm op indices, cat op index)`` when op ``k`` splits a tensor into one-element pieces along
    a dim before the last, each piece read by one LayerNorm over the last dim alone (a 1-D parameter
    weight, and bias or none, alike in every norm) whose statistics nobody reads, and the normed
    pieces joined in order by one ``cat`` along the same dim; else None."""
    if canonical_op_name(op.target) not in SPLITS or not op.inputs or not isinstance(op.inputs[0], str):
        return None
    t = prog.tensors
    shape = t[op.inputs[0]].shape
    kw = op.kwargs()
    dim = kw.get("dim", 0)
    dim = dim + len(shape) if isinstance(dim, int) and dim < 0 else dim
    if not isinstance(dim, int) or not 0 <= dim < len(shape) - 1 or len(op.outputs) < 2:
        return None
    if any(t[o].shape[dim] != 1 for o in op.outputs):
        return None
    norms = []
    for o in op.outputs:
        (n, *more) = users.get(o, [None])
        if n is None or n < 0 or more or not _head_norm(prog, prog.ops[n], o, shape[-1], users):
            return None
        norms.append(n)
    arity = {len(prog.ops[n].inputs) for n in norms}
    cats = {tuple(users.get(prog.ops[n].outputs[0], ())) for n in norms}
    if len(arity) != 1 or len(cats) != 1 or len(next(iter(cats))) != 1:
        return None
    cat = prog.ops[next(iter(cats))[0]]
    cat_dim = cat.kwargs().get("dim", 0)
    if canonical_op_name(cat.target) != "cat" or cat_dim not in (dim, dim - len(shape)) or \
            list(cat.inputs) != [prog.ops[n].outputs[0] for n in norms]:
        return None
    return tuple(norms), next(iter(cats))[0]


def _head_norm(prog: Program, op, x: str, features: int, users: dict) -> bool:
    """Is ``op`` a LayerNorm of ``x`` over its last dim alone, scaled (and shifted) by 1-D parameters,
    with only its normed output read?"""
    if canonical_op_name(op.target) not in LAYER_NORMS or op.inputs[0] != x:
        return False
    if tuple(op.kwargs().get("normalized_shape") or ()) != (features,):
        return False
    t = prog.tensors
    if not all(isinstance(p, str) and t[p].kind == "param" and t[p].shape == (features,) for p in op.inputs[1:]):
        return False
    return not any(users.get(o) for o in op.outputs[1:])


def _emit(prog: Program, split, norms: list, cat, b: ProgramBuilder) -> None:
    """The merged norm, named after the split's module, its result named as the cat's output."""
    t = prog.tensors
    x = split.inputs[0]
    shape = t[x].shape
    dim = split.kwargs().get("dim", 0) % len(shape)
    heads, features = shape[dim], shape[-1]
    scale = (heads,) + (1,) * (len(shape) - 2 - dim) + (features,)  # broadcast over the dims after the heads
    base = split.name.rpartition(".")[0] or split.name
    first = norms[0]
    normed = b._op(first.target, [x], f"{base}.norm", len(first.outputs), [t[o].dtype for o in first.outputs],
                   {k: v for k, v in first.kwargs().items()})
    normed = normed[0] if isinstance(normed, tuple) else normed
    out = cat.outputs[0]
    for which in range(1, len(first.inputs)):  # the weights, then the biases: one [H, 1, hd] tensor each
        part = "weight" if which == 1 else "bias"
        stacked = b.op("cat", [op.inputs[which] for op in norms], name=f"{base}.{part}s", dim=0)  # [H * hd]
        view = b.op("view", [stacked], name=f"{base}.{part}s_view", size=scale)
        last = which == len(first.inputs) - 1
        normed = b.op("mul" if which == 1 else "add", [normed, view], name=out if last else f"{base}.scaled",
                      dtypes=[t[out].dtype])
    if len(first.inputs) == 1:  # no affine parameters: the norm alone, under the cat's name
        b.op("alias", [normed], name=out)


__all__ = ["merge_head_norms"]
