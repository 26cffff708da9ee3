"""The ID graph: which IterDomains of a program are the same, and why.

A program is a tuple of ``Op`` records over ``TensorDomain``s (build them with ``set_op``,
``add_op``, ``sum_op``, ``matmul_op``, ``linear_op``, ``reshape_op``, ``slice_op``, ``pad_op``,
``cat_op``, ``scatter_op``, ``permute_op``, ``select_op``).
An op ties IDs of its tensors *exactly* (the same logical dim seen by two tensors):

    set / add      input logical k   == output logical k  (broadcast IDs are not tied)
    sum            input logical k   == output logical k  (the reduced ones are reduction IDs)
    matmul         x [.., M, K], y [.., K, N] -> z [.., M, N, rK]
    linear         x [.., M, K], w [N, K] (, bias [N]) -> z [.., M, N, rK]
    scatter(dim)   self logical k == output logical k (index and src are not tied)
    permute(perm)  input logical perm[k] == output logical k
    select(dim)    the other dims as set; the selected dim is tied to nothing
    reshape/slice  input logical k   == output root k; root -> logical by split / merge / resize
    cat(dim)       other dims as set; input k's cat ID is the slice [off_k, off_k + n_k) of
                   the output's (a Resize from the output's ID to the input's)

``IdGraph.mapped(a, b)`` decides whether two IDs (typically device-parallel loop IDs) index
every element both tensors hold the same way: it writes each ID's index as a mixed-radix
normal form over the IDs it is derived from (``((x + offset) // stride) mod modulus`` per
digit) and rewrites it only by the theorems of ``theorems.py``, which it cites::

    case 1 of nvFuser #3987 (split reshape):   in  [h]  loop [d, h/d]        d = h // (h/d)
                                               out [h] -> [a, h/a], a /\\ d   d = h // ((h/a)*(a/d))
    mapped iff the strides agree (h % a == 0 and a % d == 0 suffice)

``is_resharding`` applies nvFuser's rule to one op, and ``propagate`` carries device splits
from inputs to outputs (nvFuser's sharding propagation pass, forward only; the whole pass,
backward and Stream included, is ``stream.propagate_shardings``).

    >>> x = TensorDomain.create("x", (8,)).outer_split(0, 2).parallelize(0, ParallelType.device("d"))
    >>> op = reshape_op(x, (4, 2), "y")
    >>> y = op.output.outer_split(0, 2).parallelize(0, ParallelType.device("d"))
    >>> bool(is_resharding([x], y, "view"))
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property

from ..errors import DomainError
from .iterdomain import (
    IterDomain,
    Merge,
    ParallelType,
    Resize,
    Split,
    TensorDomain,
    _add,
    _as_int,
    _ceil_div,
    _div_exact,
    _is_int,
    _le,
    _mul,
    cat,
    divides,
    equal,
    merge,
    resize,
    split,
)
from .theorems import (
    Justification,
    Precondition,
    divmod_commute,
    inner_split_slice,
    outer_split_of_merge,
    split_of_merge,
    split_split_commute,
)

# ------------------------------------------------------------------------------------------
# ops
# ------------------------------------------------------------------------------------------


class OpKind(Enum):
    """How an op ties its tensors' dims (see the module docstring). ``OpKind("view") -> OpKind.VIEW``"""

    SET = "set"
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    LINEAR = "linear"
    VIEW = "view"
    CAT = "cat"
    SCATTER = "scatter"
    FACTORY = "factory"
    PERMUTE = "permute"
    SELECT = "select"


def _dims(td: TensorDomain) -> tuple:
    """Logical IDs without reductions and pending partial sums (what a consumer sees of a producer)."""
    return tuple(i for i in td.logical if not (i.is_reduction or i.is_partial))


@dataclass(frozen=True)
class Op:
    """One step of a program: ``Op(OpKind.SET, (x,), y)``; ``dim`` is a cat's (or a select's) dim,
    ``perm`` a permute's order (output dim k is input dim ``perm[k]``). Only a factory
    (``uniform(shape)``, ``full``) has no tensor input."""

    kind: OpKind
    inputs: tuple
    output: TensorDomain
    dim: int | None = None
    perm: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "kind", OpKind(self.kind))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not all(isinstance(t, TensorDomain) for t in self.inputs + (self.output,)):
            raise DomainError(f"{self.kind.value} op: inputs and output must be TensorDomains")
        if bool(self.inputs) == (self.kind is OpKind.FACTORY):
            raise DomainError(f"{self.kind.value} op {self.output.name}: " + (
                "a factory has no tensor input (it makes its output from a shape)" if self.inputs else
                "needs at least one input; an op with none is a factory (factory_op)"))
        _CHECKS[self.kind](self)

    def with_domains(self, *domains: TensorDomain) -> "Op":
        """The same op with tensors replaced by name (same logical IDs, other loop domains).
        ``op.with_domains(op.output.outer_split(0, 2))``"""
        by_name = {t.name: t for t in domains}

        def swap(t):
            new = by_name.get(t.name, t)
            if tuple(i.id for i in new.logical) != tuple(i.id for i in t.logical):
                raise DomainError(f"{self.kind.value} op: the new {t.name} has logical IDs "
                                  f"{[i.id for i in new.logical]}, not {[i.id for i in t.logical]}; "
                                  "replace a tensor only by a re-split of the same logical domain")
            return new

        return replace(self, inputs=tuple(swap(t) for t in self.inputs), output=swap(self.output))


def _same_rank(op: Op, ranks) -> None:
    for t in op.inputs:
        if len(_dims(t)) != len(ranks):
            raise DomainError(f"{op.kind.value} op {op.output.name}: input {t.name} has {len(_dims(t))} dims, "
                              f"the output {len(ranks)}; give inputs of the output's rank (unsqueeze first)")


def _check_pointwise(op: Op, inputs=None) -> None:
    out = _dims(op.output)
    inputs = op.inputs if inputs is None else inputs
    _same_rank(op, out)
    for t in inputs:
        for i, o in zip(_dims(t), out):
            if not (i.is_broadcast or equal(i.extent, 1) is True) and equal(i.extent, o.extent) is False:
                raise DomainError(f"{op.kind.value} op {op.output.name}: {t.name}'s {i} does not match {o}")


def _check_reduction(op: Op) -> None:
    (inp,) = op.inputs
    if len(_dims(inp)) != len(op.output.logical):
        raise DomainError(f"sum {op.output.name}: the output keeps every input dim ({len(_dims(inp))}), reduced "
                          f"ones as reduction IDs; it has {len(op.output.logical)}")
    for i, o in zip(_dims(inp), op.output.logical):
        if equal(i.extent, o.extent) is False:
            raise DomainError(f"sum {op.output.name}: {i} and {o} differ in extent")


def _check_matmul(op: Op) -> None:
    if len(op.inputs) != 2:
        raise DomainError(f"matmul {op.output.name}: needs two inputs, got {len(op.inputs)}")
    x, y = (_dims(t) for t in op.inputs)
    z = op.output.logical
    if len(x) < 2 or len(x) != len(y) or len(z) != len(x) + 1 or not z[-1].is_reduction:
        raise DomainError(f"matmul {op.output.name}: expects x [.., M, K], y [.., K, N] -> z [.., M, N, rK]")
    for a, b in _matmul_pairs(op):
        if equal(a.extent, b.extent) is False:
            raise DomainError(f"matmul {op.output.name}: {a} and {b} should be the same dim but differ in extent")


def _check_linear(op: Op) -> None:
    if len(op.inputs) not in (2, 3):
        raise DomainError(f"linear {op.output.name}: needs x, w (and a bias), got {len(op.inputs)} inputs")
    x, w = _dims(op.inputs[0]), _dims(op.inputs[1])
    z = op.output.logical
    if len(x) < 2 or len(w) != 2 or len(z) != len(x) + 1 or not z[-1].is_reduction:
        raise DomainError(f"linear {op.output.name}: expects x [.., M, K], w [N, K] -> z [.., M, N, rK]")
    if len(op.inputs) == 3 and len(_dims(op.inputs[2])) != 1:
        raise DomainError(f"linear {op.output.name}: the bias has {len(_dims(op.inputs[2]))} dims; give a bias [N]")
    for a, b in _linear_pairs(op):
        if equal(a.extent, b.extent) is False:
            raise DomainError(f"linear {op.output.name}: {a} and {b} should be the same dim but differ in extent")


def _check_scatter(op: Op) -> None:
    if len(op.inputs) != 3 or op.dim is None:
        raise DomainError(f"scatter {op.output.name}: needs (self, index, src) and a dim")
    self_, index, src = (_dims(t) for t in op.inputs)
    if not 0 <= op.dim < len(self_) or len(index) != len(self_) or len(src) != len(self_):
        raise DomainError(f"scatter {op.output.name}: dim {op.dim} and ranks {len(self_)}, {len(index)}, "
                          f"{len(src)}; give same-rank self, index, src and a dim of self")
    if any(equal(a.extent, b.extent) is False for a, b in zip(index, src)):
        raise DomainError(f"scatter {op.output.name}: index and src differ in shape; give src the index's shape")
    _check_pointwise(op, op.inputs[:1])


def _check_view(op: Op) -> None:
    (inp,) = op.inputs
    if len(_dims(inp)) != len(op.output.root):
        raise DomainError(f"view {op.output.name}: its root must copy {inp.name}'s {len(_dims(inp))} dims")
    for i, r in zip(_dims(inp), op.output.root):
        if equal(i.extent, r.extent) is False:
            raise DomainError(f"view {op.output.name}: root {r} does not copy {i}")


def _check_cat(op: Op) -> None:
    out = op.output.logical
    _same_rank(op, out)
    if op.dim is None or not 0 <= op.dim < len(out):
        raise DomainError(f"cat {op.output.name}: dim {op.dim!r} is not one of its {len(out)} dims")
    for t in op.inputs:
        for k, (i, o) in enumerate(zip(_dims(t), out)):
            if k != op.dim and equal(i.extent, o.extent) is False:
                raise DomainError(f"cat {op.output.name}: {t.name}'s {i} differs from {o} off the cat dim")
    cat([_dims(t)[op.dim] for t in op.inputs], out[op.dim])  # checks the extents add up


def _check_permute(op: Op) -> None:
    (inp,) = op.inputs
    n = len(_dims(inp))
    perm = op.perm
    if perm is None or sorted(perm) != list(range(n)) or len(op.output.logical) != n:
        raise DomainError(f"permute {op.output.name}: order {perm!r} is no permutation of {inp.name}'s {n} dims; "
                          f"give each of 0..{n - 1} once")
    for a, b in _permute_pairs(op):
        if equal(a.extent, b.extent) is False:
            raise DomainError(f"permute {op.output.name}: {a} and {b} should be the same dim but differ in extent")


def _check_select(op: Op) -> None:
    (inp,) = op.inputs
    n = len(_dims(inp))
    if op.dim is None or not 0 <= op.dim < n or len(op.output.logical) != n - 1:
        raise DomainError(f"select {op.output.name}: dim {op.dim!r} of {inp.name}'s {n} dims, output of "
                          f"{len(op.output.logical)}; the output keeps every dim but the selected one")
    for a, b in _select_pairs(op):
        if equal(a.extent, b.extent) is False:
            raise DomainError(f"select {op.output.name}: {a} and {b} differ in extent")


def _check_factory(op: Op) -> None:
    if any(i.is_reduction or i.is_partial for i in op.output.logical):
        raise DomainError(f"factory {op.output.name}: a factory's output has plain dims only, no reduction or "
                          "partial IDs")


_CHECKS = {
    OpKind.FACTORY: _check_factory,
    OpKind.SET: _check_pointwise,
    OpKind.POINTWISE: _check_pointwise,
    OpKind.REDUCTION: _check_reduction,
    OpKind.MATMUL: _check_matmul,
    OpKind.LINEAR: _check_linear,
    OpKind.VIEW: _check_view,
    OpKind.CAT: _check_cat,
    OpKind.SCATTER: _check_scatter,
    OpKind.PERMUTE: _check_permute,
    OpKind.SELECT: _check_select,
}


def _matmul_pairs(op: Op) -> list:
    x, y = (_dims(t) for t in op.inputs)
    z = op.output.logical
    b = len(x) - 2
    pairs = [(x[k], z[k]) for k in range(b)] + [(y[k], z[k]) for k in range(b)]
    return pairs + [(x[b], z[b]), (y[b + 1], z[b + 1]), (x[b + 1], z[b + 2]), (y[b], z[b + 2])]


def _linear_pairs(op: Op) -> list:
    x, w = _dims(op.inputs[0]), _dims(op.inputs[1])
    z = op.output.logical
    pairs = [(x[k], z[k]) for k in range(len(x) - 1)] + [(w[0], z[-2]), (x[-1], z[-1]), (w[1], z[-1])]
    return pairs + [(_dims(op.inputs[2])[0], z[-2])] if len(op.inputs) == 3 else pairs


def _permute_pairs(op: Op) -> list:
    x = _dims(op.inputs[0])
    return [(x[p], o) for p, o in zip(op.perm, op.output.logical)]


def _select_pairs(op: Op) -> list:
    """The kept dims; the selected one (one index of it) is tied to nothing."""
    x = _dims(op.inputs[0])
    return list(zip(x[: op.dim] + x[op.dim + 1 :], op.output.logical))


def _pairs(op: Op) -> list:
    """(input ID, output ID) the op ties exactly (output ID: logical, or root for a view)."""
    if op.kind is OpKind.PERMUTE:
        return _permute_pairs(op)
    if op.kind is OpKind.SELECT:
        return _select_pairs(op)
    if op.kind is OpKind.MATMUL:
        return _matmul_pairs(op)
    if op.kind is OpKind.LINEAR:
        return _linear_pairs(op)
    if op.kind is OpKind.SCATTER:  # only self is tied: index and src are read along another extent
        return list(zip(_dims(op.inputs[0]), op.output.logical))
    if op.kind is OpKind.VIEW:
        return list(zip(_dims(op.inputs[0]), op.output.root))
    out = op.output.logical
    pairs = []
    for t in op.inputs:
        for k, (i, o) in enumerate(zip(_dims(t), out)):
            if op.kind is OpKind.CAT and k == op.dim:
                continue
            if i.is_broadcast or (equal(i.extent, 1) is True and equal(o.extent, 1) is not True):
                continue
            pairs.append((i, o))
    return pairs


def _copy(name: str, ids, mesh=None, reductions=()) -> TensorDomain:
    ids = tuple(IterDomain(f"{name}.{k}", i.extent, is_broadcast=i.is_broadcast, is_reduction=k in reductions)
                for k, i in enumerate(ids))
    return TensorDomain(name, ids, ids, ids, mesh=mesh)


def factory_op(shape, name: str, mesh=None) -> Op:
    """``name = uniform(shape)`` (or ``full``, ``zeros``): no tensor input, so its sharding comes by
    backward propagation from its users (nvFuser's ResidualAdd). ``factory_op((4, 6), "u").inputs -> ()``"""
    return Op(OpKind.FACTORY, (), TensorDomain.create(name, shape, mesh=mesh))


def set_op(inp: TensorDomain, name: str) -> Op:
    """``name = set(inp)``, an unsharded copy as output. ``set_op(x, "y").output.shape == x.shape``."""
    return Op(OpKind.SET, (inp,), _copy(name, _dims(inp)))


def add_op(inputs, name: str) -> Op:
    """A pointwise op of same-rank inputs (extent-1 dims broadcast). ``add_op([a, b], "c")``."""
    inputs = tuple(inputs)
    dims = [_dims(t) for t in inputs]
    if len({len(d) for d in dims}) != 1:
        raise DomainError(f"add {name}: inputs of ranks {[len(d) for d in dims]}; give same-rank inputs")
    out = []
    for col in zip(*dims):
        real = [i for i in col if not (i.is_broadcast or equal(i.extent, 1) is True)]
        out.append(real[0] if real else col[0])
    return Op(OpKind.POINTWISE, inputs, _copy(name, out))


def sum_op(inp: TensorDomain, dims, name: str) -> Op:
    """Sum over ``dims``: the output keeps them as reduction IDs. ``sum_op(x, [0], "s")``."""
    n = len(_dims(inp))
    red = {d % n for d in ([dims] if isinstance(dims, int) else dims)}
    return Op(OpKind.REDUCTION, (inp,), _copy(name, _dims(inp), reductions=red))


def matmul_op(x: TensorDomain, y: TensorDomain, name: str) -> Op:
    """``z [.., M, N, rK] = x [.., M, K] @ y [.., K, N]``. ``matmul_op(x, y, "z")``."""
    xd, yd = _dims(x), _dims(y)
    if len(xd) < 2 or len(yd) != len(xd):
        raise DomainError(f"matmul {name}: x and y need the same rank >= 2, got {len(xd)} and {len(yd)}")
    z = _copy(name, xd[:-1] + (yd[-1], xd[-1]), reductions={len(xd)})
    return Op(OpKind.MATMUL, (x, y), z)


def linear_op(x: TensorDomain, w: TensorDomain, name: str, bias: TensorDomain | None = None) -> Op:
    """``z [.., M, N, rK] = x [.., M, K] @ w [N, K]^T (+ bias [N])``, torch's linear. ``linear_op(x, w, "z")``."""
    xd, wd = _dims(x), _dims(w)
    if len(xd) < 2 or len(wd) != 2:
        raise DomainError(f"linear {name}: x needs rank >= 2 and w rank 2 ([N, K]), got {len(xd)} and {len(wd)}")
    z = _copy(name, xd[:-1] + (wd[0], xd[-1]), reductions={len(xd)})
    return Op(OpKind.LINEAR, (x, w) if bias is None else (x, w, bias), z)


def permute_op(inp: TensorDomain, perm, name: str) -> Op:
    """``inp.permute(perm)``: output dim ``k`` is input dim ``perm[k]`` (a transpose is a permute
    of two dims). ``permute_op(x, (1, 0), "xt")``"""
    perm = tuple(perm)
    x = _dims(inp)
    if sorted(perm) != list(range(len(x))):
        raise DomainError(f"permute {name}: order {perm} is no permutation of {inp.name}'s {len(x)} dims; give "
                          f"each of 0..{len(x) - 1} once")
    return Op(OpKind.PERMUTE, (inp,), _copy(name, tuple(x[p] for p in perm)), perm=perm)


def select_op(inp: TensorDomain, dim: int, name: str) -> Op:
    """``inp.select(dim, index)``: one index of ``dim``, the dim dropped (which index does not matter
    to sharding). ``select_op(x, 0, "x0")``"""
    x = _dims(inp)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim < len(x):
        raise DomainError(f"select {name}: dim {dim!r} is not one of {inp.name}'s {len(x)} dims")
    return Op(OpKind.SELECT, (inp,), _copy(name, x[:dim] + x[dim + 1 :]), dim)


def scatter_op(inp: TensorDomain, dim: int, index: TensorDomain, src: TensorDomain, name: str) -> Op:
    """``inp.scatter(dim, index, src)``: the output has ``inp``'s shape. ``scatter_op(x, 0, i, s, "y")``."""
    return Op(OpKind.SCATTER, (inp, index, src), _copy(name, _dims(inp)), dim)


def _view_root(inp: TensorDomain, name: str) -> tuple:
    return tuple(IterDomain(f"{name}.{k}", i.extent) for k, i in enumerate(_dims(inp)))


def _reshape_groups(src, dst) -> list:
    groups, ins, outs, pi, po, i, j = [], [], [], 1, 1, 0, 0
    while True:
        if ins and outs and pi == po:
            groups.append((ins, outs))
            ins, outs, pi, po = [], [], 1, 1
        if i == len(src) and j == len(dst):
            break
        if j == len(dst) or (i < len(src) and pi <= po):
            ins.append(i)
            pi *= src[i]
            i += 1
        else:
            outs.append(j)
            po *= dst[j]
            j += 1
    if ins or outs:
        if not groups or pi != po:
            raise DomainError(f"reshape: {tuple(src)} and {tuple(dst)} have different numbers of elements")
        groups[-1] = (groups[-1][0] + ins, groups[-1][1] + outs)
    return groups


def reshape_op(inp: TensorDomain, shape, name: str) -> Op:
    """Reshape as merges then outer splits of the root (a copy of ``inp``'s logical dims).
    ``reshape_op(x, (4, 2), "y")`` on ``x`` of shape (8,)."""
    root = _view_root(inp, name)
    src = [_as_int(i.extent, str(i)) for i in root]
    dst = [int(s) for s in shape]
    if any(s < 1 for s in dst) or _prod(src) != _prod(dst):
        raise DomainError(f"reshape {name}: {tuple(src)} -> {tuple(dst)} changes the number of elements "
                          "(or has a size < 1); give a shape of the same product")
    exprs, logical = [], []
    for ins, outs in _reshape_groups(src, dst):
        cur = root[ins[0]]
        for k in ins[1:]:
            m = merge(cur, root[k])
            exprs.append(m)
            cur = m.output
        for k in outs[:-1]:
            s = split(cur, dst[k], inner=False)
            exprs.append(s)
            logical.append(s.outer)
            cur = s.inner
        logical.append(cur)
    return Op(OpKind.VIEW, (inp,), TensorDomain(name, root, tuple(logical), tuple(logical), tuple(exprs), ()))


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _resized(inp: TensorDomain, dim: int, left, right, kind: str, name: str) -> Op:
    root = _view_root(inp, name)
    if not 0 <= dim < len(root):
        raise DomainError(f"{kind} {name}: dim {dim} is not one of {inp.name}'s {len(root)} dims")
    r = resize(root[dim], left, right, kind)
    logical = root[:dim] + (r.output,) + root[dim + 1 :]
    return Op(OpKind.VIEW, (inp,), TensorDomain(name, root, logical, logical, (r,), ()))


def slice_op(inp: TensorDomain, dim: int, start, end, name: str) -> Op:
    """``inp[..., start:end, ...]`` along ``dim``. ``slice_op(x, 2, 0, 96, "q")``."""
    n = _dims(inp)[dim].extent if 0 <= dim < len(_dims(inp)) else None
    if _is_int(start) and _is_int(end) and _is_int(n) and not 0 <= start < end <= n:
        raise DomainError(f"slice {name}: [{start}, {end}) is not a non-empty range of {n}")
    return _resized(inp, dim, _mul(-1, start), _add(end, _mul(-1, n)), "slice", name)


def pad_op(inp: TensorDomain, dim: int, left, right, name: str) -> Op:
    """Pad ``dim`` with ``left`` / ``right`` new elements. ``pad_op(x, 0, 1, 1, "p")``."""
    return _resized(inp, dim, left, right, "pad", name)


def cat_op(inputs, dim: int, name: str) -> Op:
    """Concatenate along ``dim``. ``cat_op([q, k, v], 2, "qkv")``."""
    inputs = tuple(inputs)
    first = _dims(inputs[0])
    if not 0 <= dim < len(first):
        raise DomainError(f"cat {name}: dim {dim} is not one of {len(first)} dims")
    total = first[dim].extent
    for t in inputs[1:]:
        total = _add(total, _dims(t)[dim].extent)
    ids = list(first)
    ids[dim] = IterDomain("tmp", total)
    return Op(OpKind.CAT, inputs, _copy(name, ids), dim)


# ------------------------------------------------------------------------------------------
# index normal forms
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Digit:
    """``((x + offset) // stride) mod modulus`` of the index x of class ``base``."""

    base: str
    offset: object
    stride: object
    modulus: object = None
    via: str = field(default="", compare=False)  # the resize kind that made the offset


@dataclass(frozen=True)
class _Form:
    """An ID's index as mixed radix over digits, outer first: ``pieces = ((digit, radix), ...)``;
    the first radix is None (read from the ID's extent when needed)."""

    pieces: tuple
    proof: tuple = field(default=(), compare=False)


_MAX_FORMS = 32


def _cite(proof: tuple, j: Justification) -> tuple:
    return proof if j in proof else proof + (j,)


def _split_digit(dg: _Digit, q, proof: tuple, facts):
    """(dg // q, dg mod q, proof) or None when the digit does not split by q."""
    if dg.modulus is None:
        if equal(dg.stride, 1, facts) is not True:
            proof = _cite(proof, split_split_commute(None, dg.stride, q))
        return (replace(dg, stride=_mul(dg.stride, q)), replace(dg, modulus=q), proof)
    j = divmod_commute(dg.modulus, q, facts)
    if j.holds is not True:
        return None
    proof = _cite(proof, j)
    return (replace(dg, stride=_mul(dg.stride, q), modulus=_div_exact(dg.modulus, q)), replace(dg, modulus=q), proof)


def _split_form(f: _Form, e, factor, inner: bool, facts):
    """(outer form, inner form) of a split of an ID of extent ``e`` whose index is ``f``."""
    c = factor if inner else _ceil_div(e, factor)
    if equal(c, 1, facts) is True:  # blocks of one: the outer part is the whole index, the inner 0
        return f, _Form((), f.proof)
    pieces = f.pieces
    R = 1
    for k in reversed(range(len(pieces))):
        if divides(R, c, facts) is not True:
            return None
        q = _div_exact(c, R)
        dg, r = pieces[k]
        if equal(q, 1, facts) is True:
            return None if k == len(pieces) - 1 else _cut(f, k + 1, e, factor, inner, R, c, facts)
        if k > 0 and not (divides(q, r, facts) is True and equal(q, r, facts) is not True):
            if divides(r, q, facts) is not True:
                return None
            R = _mul(R, r)
            continue
        parts = _split_digit(dg, q, f.proof, facts)
        if parts is None:
            return None
        hi, lo, proof = parts
        if k < len(pieces) - 1:
            proof = _cite(proof, _merge_theorem(e, factor, inner, R, c, facts))
        radix = None if k == 0 else _div_exact(r, q)
        outer = _Form(pieces[:k] + ((hi, radix),), proof)
        inner_form = _Form(((lo, None),) + pieces[k + 1 :], proof)
        return outer, inner_form
    return None


def _cut(f: _Form, k: int, e, factor, inner: bool, R, c, facts):
    proof = _cite(f.proof, _merge_theorem(e, factor, inner, R, c, facts))
    dg, r = f.pieces[k]
    return _Form(f.pieces[:k], proof), _Form(((dg, None),) + f.pieces[k + 1 :], proof)


def _merge_theorem(e, factor, inner: bool, R, c, facts) -> Justification:
    if not inner and divides(R, e, facts) is True:
        return outer_split_of_merge(_div_exact(e, R), R, factor, facts=facts)
    return split_of_merge(_ceil_div(e, R), R, c, facts)


def _merge_form(fo: _Form, fi: _Form, ei, facts):
    rest = 1
    for _, r in fi.pieces[1:]:
        rest = _mul(rest, r)
    if not fi.pieces or not fo.pieces or divides(rest, ei, facts) is not True:
        return None
    dg, _ = fi.pieces[0]
    r0 = _div_exact(ei, rest)
    if dg.modulus is None:
        dg = replace(dg, modulus=r0)
    return _Form(fo.pieces + ((dg, r0),) + fi.pieces[1:], fo.proof + tuple(j for j in fi.proof if j not in fo.proof))


def _resize_form(f: _Form, left, kind: str):
    if len(f.pieces) != 1 or f.pieces[0][0].modulus is not None:
        return None
    dg = f.pieces[0][0]
    return _Form(((replace(dg, offset=_add(dg.offset, _mul(left, dg.stride)), via=kind), None),), f.proof)


def _normal(f: _Form, base_extent: dict, facts):
    """Fuse contiguous digits, reduce periodic offsets, drop constant digits. -> (pieces, proof)."""
    pieces, proof = list(f.pieces), f.proof
    out: list = []
    for dg, r in pieces:
        if out:
            if dg.modulus is None:
                dg = replace(dg, modulus=r)
            if equal(r, 1, facts) is True:
                continue
            pd, pr = out[-1]
            if (pd.base == dg.base and equal(pd.offset, dg.offset, facts) is True
                    and equal(dg.modulus, r, facts) is True
                    and equal(pd.stride, _mul(dg.stride, r), facts) is True):
                out[-1] = (replace(dg, modulus=None if pd.modulus is None else _mul(pd.modulus, r)),
                           None if pr is None else _mul(pr, r))
                continue
        out.append((dg, r))
    final = []
    for dg, r in out:
        if dg.modulus is not None and equal(dg.offset, 0, facts) is not True:
            period = _mul(dg.stride, dg.modulus)
            if divides(period, dg.offset, facts) is True:  # a slice (or a cat input) on a shard boundary
                proof = _cite(proof, inner_split_slice(period, _mul(-1, dg.offset), even=False, facts=facts))
                dg = replace(dg, offset=0)
            elif _is_int(dg.offset) and _is_int(period):
                dg = replace(dg, offset=dg.offset % period)  # ((x + o) // s) mod m has period s*m in o
        final.append((dg, r))
    if final:
        dg, r = final[0]
        n = base_extent.get(dg.base)
        if (dg.modulus is not None and equal(dg.offset, 0, facts) is True and n is not None
                and _le(_ceil_div(n, dg.stride), dg.modulus, facts) is True):
            final[0] = (replace(dg, modulus=None), r)
        final[0] = (final[0][0], None)
    return tuple(final), proof


def _same(a: tuple, b: tuple, facts) -> bool:
    if len(a) != len(b):
        return False
    for (da, ra), (db, rb) in zip(a, b):
        if da.base != db.base:
            return False
        for x, y in ((da.offset, db.offset), (da.stride, db.stride), (ra, rb), (da.modulus, db.modulus)):
            if (x is None) != (y is None) or (x is not None and equal(x, y, facts) is not True):
                return False
    return True


def _fmt(pieces: tuple) -> str:
    if not pieces:
        return "0"
    parts = []
    for dg, r in pieces:
        t = dg.base if equal(dg.offset, 0) is True else f"({dg.base} + {dg.offset})"
        if equal(dg.stride, 1) is not True:
            t = f"{t} // {dg.stride}"
        if dg.modulus is not None:
            t = f"{t} mod {dg.modulus}"
        parts.append((t, r))
    text = parts[0][0]
    for t, r in parts[1:]:
        text = f"({text}) * {r} + {t}"
    return text


# ------------------------------------------------------------------------------------------
# the graph
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdGraph:
    """The IDs of a program and how they relate. ``IdGraph((op,)).mapped(x.loop[0], y.loop[0])``."""

    ops: tuple
    facts: object = None

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(self.ops))
        if not all(isinstance(op, Op) for op in self.ops):
            raise DomainError("IdGraph: every step must be an Op (set_op, add_op, reshape_op, ...)")
        self._tables  # noqa: B018 (validate now: clashing names fail at construction)

    @staticmethod
    def of(ops, *domains: TensorDomain, facts=None) -> "IdGraph":
        """The graph of ``ops`` with tensors replaced by the given (re-split) domains.
        ``IdGraph.of([op], op.output.outer_split(0, 2))``"""
        return IdGraph(tuple(op.with_domains(*domains) for op in ops), facts)

    @cached_property
    def domains(self) -> dict:
        """Tensor name -> TensorDomain (one per name). ``IdGraph((op,)).domains["y"]``"""
        out: dict = {}
        for op in self.ops:
            for t in op.inputs + (op.output,):
                if out.setdefault(t.name, t) != t:
                    raise DomainError(f"IdGraph: two different tensors are named {t.name!r}; give each tensor one "
                                      "name and one domain (re-split it with Op.with_domains / IdGraph.of)")
        return out

    @cached_property
    def _tables(self):
        owner: dict = {}
        ids: dict = {}
        for td in self.domains.values():
            mine = {i.id: i for i in td.root + td.logical}
            for e in td.logical_exprs + td.loop_exprs:
                mine.update({i.id: i for i in e.inputs + e.outputs})
            mine.update({i.id: i for i in td.loop})
            for k, i in mine.items():
                if owner.setdefault(k, td.name) != td.name:
                    raise DomainError(f"IdGraph: ID {k!r} appears in {owner[k]} and {td.name}; IDs are named after "
                                      "their tensor, so give the tensors distinct names")
                ids[k] = i
        parent = {k: k for k in ids}
        order = {k: n for n, k in enumerate(ids)}

        def find(k):
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        defs: dict = {}
        for td in self.domains.values():
            for e in td.logical_exprs + td.loop_exprs:
                for o in e.outputs:
                    defs.setdefault(o.id, []).append(e)
        for op in self.ops:
            for a, b in _pairs(op):
                if equal(a.extent, b.extent, self.facts) is False:
                    raise DomainError(f"{op.kind.value} op {op.output.name}: {a} and {b} differ in extent")
                ra, rb = find(a.id), find(b.id)
                if ra != rb:  # the ID seen first stays the representative
                    parent[max(ra, rb, key=order.get)] = min(ra, rb, key=order.get)
            if op.kind is OpKind.CAT:
                out_id = op.output.logical[op.dim]
                for r in cat([_dims(t)[op.dim] for t in op.inputs], out_id):
                    defs.setdefault(r.output.id, []).append(r)
        cls = {k: find(k) for k in ids}
        cdefs: dict = {}
        for k, es in defs.items():
            cdefs.setdefault(cls[k], []).extend((e, k) for e in es)
        return ids, owner, cls, cdefs

    def _id(self, x) -> IterDomain:
        ids = self._tables[0]
        key = x.id if isinstance(x, IterDomain) else x
        if key not in ids:
            raise DomainError(f"IdGraph: no ID {key!r} in the program's tensors ({', '.join(self.domains)})")
        return ids[key]

    def cls(self, x) -> str:
        """The exact class (representative id) of an ID: IDs the ops tie are one class.
        ``IdGraph((set_op(x, "y"),)).cls("y.0") -> "x.0"``"""
        return self._tables[2][self._id(x).id]

    @cached_property
    def _forms(self) -> dict:
        """Memo of ``forms``: class -> its normal forms (filled on demand; the graph is immutable)."""
        return {}

    @cached_property
    def _base_extents(self) -> dict:
        ids, _, cls, _ = self._tables
        return {c: ids[c].extent for c in set(cls.values())}

    def forms(self, c: str) -> tuple:
        """The index normal forms of class ``c`` (itself as a base, and through each definition).
        ``len(g.forms(g.cls("y.0.o")))`` -> 2 when y.0.o is a split of a mapped ID"""
        memo = self._forms
        if c in memo:
            return memo[c] or ()
        memo[c] = None  # in progress: a cycle contributes nothing
        ids, _, cls, cdefs = self._tables
        out = [_Form(((_Digit(c, 0, 1), None),))]
        for e, k in cdefs.get(c, []):
            for f in self._through(e, k, cls):
                if f is not None and f not in out and len(out) < _MAX_FORMS:
                    out.append(f)
        memo[c] = tuple(out)
        return memo[c]

    def _through(self, e, k: str, cls: dict):
        facts = self.facts
        if isinstance(e, Split):
            for f in self.forms(cls[e.input.id]):
                parts = _split_form(f, e.input.extent, e.factor, e.inner_split, facts)
                if parts is not None:
                    yield parts[0] if k == e.outer.id else parts[1]
        elif isinstance(e, Merge):
            for fo in self.forms(cls[e.outer.id]):
                for fi in self.forms(cls[e.inner.id]):
                    yield _merge_form(fo, fi, e.inner.extent, facts)
        elif isinstance(e, Resize):
            for f in self.forms(cls[e.input.id]):
                yield _resize_form(f, e.left, e.kind)

    def mapped(self, a, b) -> Justification | None:
        """A Justification when IDs ``a`` and ``b`` have equal extents and index every element
        both tensors hold the same way (so, on one mesh axis, put it on the same device); None
        when that is not shown. ``IdGraph((op,)).mapped(x.loop[0], y.loop[0])``."""
        ia, ib = self._id(a), self._id(b)
        ext = equal(ia.extent, ib.extent, self.facts)
        if ext is not True:
            return None
        same_ext = Precondition("extents equal", True, f"{ia.extent} == {ib.extent}")
        if self.cls(ia) == self.cls(ib):
            return Justification("exact", ((ia.id, ib.id),), (same_ext,),
                                 f"{ia.id} and {ib.id} are one ID through the ops' dim maps")
        base = self._base_extents
        fa = [(_normal(f, base, self.facts)) for f in self.forms(self.cls(ia))]
        fb = [(_normal(f, base, self.facts)) for f in self.forms(self.cls(ib))]
        for pa, ja in fa:
            for pb, jb in fb:
                if _same(pa, pb, self.facts):
                    proof = ja + tuple(j for j in jb if j not in ja)
                    names = list(dict.fromkeys(j.theorem for j in proof)) or ["same_transforms"]
                    text = _fmt(pa)
                    pres = tuple(p for j in proof for p in j.preconditions) + (
                        same_ext, Precondition("same index", True, text))
                    return Justification(" + ".join(names), ((ia.id, ib.id),), pres,
                                         f"{ia.id} and {ib.id} both index {text} (by {', '.join(names)})")
        return None

    def logical_of(self, x) -> tuple:
        """The logical IDs of its tensor that ID ``x`` is derived from (walking loop transforms up).
        ``g.logical_of("x.0.o") -> (IterDomain("x.0", ...),)``"""
        i = self._id(x)
        td = self.domains[self._tables[1][i.id]]
        producer = {o.id: e for e in td.loop_exprs for o in e.outputs}
        logical = {j.id for j in td.logical}
        todo, out = [i.id], []
        while todo:
            k = todo.pop()
            if k in logical:
                out.append(td.current(k))
            elif k in producer:
                todo.extend(j.id for j in producer[k].inputs)
        return tuple(out)


# ------------------------------------------------------------------------------------------
# resharding
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resharding:
    """Whether an op moves data between devices, and why: truthy when it does.
    ``bool(is_resharding([x], y, "set"))``."""

    resharding: bool
    reasons: tuple = ()

    def __bool__(self) -> bool:
        return self.resharding


def _ancestors(td: TensorDomain, iid: IterDomain, stop) -> set:
    """IDs in ``stop`` that ``iid`` is derived from (walking loop and logical transforms up)."""
    producer = {o.id: e for e in td.logical_exprs + td.loop_exprs for o in e.outputs}
    todo, out = [iid.id], set()
    while todo:
        k = todo.pop()
        if k in stop:
            out.add(k)
        elif k in producer:
            todo.extend(j.id for j in producer[k].inputs)
    return out


def _device(ids) -> list:
    return [i for i in ids if i.ptype.is_device and not i.is_reduction and not i.is_broadcast]


def is_resharding(inputs, output: TensorDomain | None = None, kind=None, *, dim: int | None = None,
                  facts=None) -> Resharding:
    """nvFuser's rule for one op: resharding when an output device ID is not mapped to an ID of the
    same parallel type of every input that the op ties to it (a factory's output needs none), when
    an input device ID is lost (no output ID of its type maps
    to it; reduced: an allreduce), or when the meshes differ. Broadcast and reduction IDs are
    ignored. ``is_resharding([x], y, "set")`` or ``is_resharding(op)``."""
    op = inputs if isinstance(inputs, Op) else Op(OpKind(kind), tuple(inputs), output, dim)
    g = IdGraph((op,), facts)
    out = op.output
    reasons = []
    meshes = [t.mesh for t in op.inputs + (out,) if t.mesh is not None]
    if any(m != meshes[0] for m in meshes):
        reasons.append(f"the tensors are on different meshes ({', '.join(sorted(set(map(str, meshes))))})")
    outs = _device(out.loop)
    ins = [(t, i) for t in op.inputs for i in _device(t.loop)]
    tied: dict = {}  # output ID the op ties -> the inputs tying it (an input must be sharded alike: nvFuser
    for t in op.inputs:  # compares each producer with the consumer, so slicing replicated data reshards too)
        mine = {i.id for i in _dims(t)}
        for a, b in _pairs(op):
            if a.id in mine:
                tied.setdefault(b.id, []).append(t)
    for o in outs:
        if op.kind is OpKind.FACTORY:
            continue  # made in place, each device its own piece
        if not any(i.ptype == o.ptype and g.mapped(i, o) for _, i in ins):
            reasons.append(f"{out.name}'s {o} is not mapped to an input ID on {o.ptype}")
            continue
        for t in dict.fromkeys(t for k in _ancestors(out, o, tied) for t in tied[k]):
            if not any(i.ptype == o.ptype and g.mapped(i, o) for i in _device(t.loop)):
                reasons.append(f"{t.name} is not sharded on {o.ptype} where {out.name}'s {o} is: each device "
                               f"slices {t.name} (nvFuser counts it as resharding)")
    reduced = {g.cls(i) for i in out.logical if i.is_reduction}
    for t, i in ins:
        if any(o.ptype == i.ptype and g.mapped(i, o) for o in outs):
            continue
        if i.is_partial:
            reasons.append(f"{t.name}'s {i} holds partial sums over {i.ptype} that the op needs summed: an "
                           f"allreduce over {i.ptype}")
        elif any(g.cls(lid) in reduced for lid in g.logical_of(i)):
            reasons.append(f"{t.name}'s {i} is reduced by the op: an allreduce over {i.ptype}")
        else:
            reasons.append(f"{t.name}'s {i} on {i.ptype} is lost: no output ID on {i.ptype} maps to it")
    return Resharding(bool(reasons), tuple(reasons))


# ------------------------------------------------------------------------------------------
# propagation
# ------------------------------------------------------------------------------------------


def split_chain(td: TensorDomain, iid: IterDomain):
    """(logical ID, the Split exprs from it down to ``iid``, outer first), or None when a merge is
    on the way (shared by the graph's propagation and the Stream rules)."""
    producer = {o.id: e for e in td.loop_exprs for o in e.outputs}
    logical = {i.id for i in td.logical}
    splits, k = [], iid.id
    while k not in logical:
        e = producer.get(k)
        if not isinstance(e, Split):
            return None
        splits.append(e)
        k = e.input.id
    return td.current(k), tuple(reversed(splits))


def _split_chain(td: TensorDomain, dev: IterDomain):
    """(logical ID, splits from it down to ``dev`` as (factor, inner, side)) or None (a merge)."""
    got = split_chain(td, dev)
    if got is None:
        return None
    lid, splits = got
    below = [x.input.id for x in splits[1:]] + [dev.id]  # the ID each split leads to, outer first
    return lid, tuple((e.factor, e.inner_split, "outer" if k == e.outer.id else "inner")
                      for e, k in zip(splits, below))


def _down_to_logical(out: TensorDomain, root: IterDomain, n, lid: IterDomain) -> IterDomain:
    """The logical ID of view output ``out`` that an outer split by ``n`` of its root ID ``root``
    (tied to the input's ``lid``) lands on: the outer side of each split, the output of a merge
    entered by its outer input; raises (with the failed theorem) when the split does not survive."""
    consumer = {i.id: e for e in out.logical_exprs for i in e.inputs}
    logical = {i.id for i in out.logical}
    cur = root
    while cur.id not in logical:
        e = consumer[cur.id]
        if isinstance(e, Split):
            j = outer_split_of_merge(e.outer.extent, e.inner.extent, n)
            if j.holds is not True:
                raise DomainError(
                    f"{out.name}: the device split by {n} of {lid} would go to the outer reshaped ID {e.outer} of "
                    f"{cur} = merge({e.outer}, {e.inner}), but {j.reason} (nvFuser: require the sharded ID to be "
                    f"divisible by the split factor); shard a dim whose outer part {n} divides")
            cur = e.outer
        elif isinstance(e, Merge):
            if cur.id == e.inner.id:
                j = outer_split_of_merge(e.outer.extent, e.inner.extent, n, side="inner")
                if j.holds is not True:
                    raise DomainError(
                        f"{out.name}: the device ID of {lid} is on the inner input of merge({e.outer}, {e.inner}); "
                        f"{j.reason} (nvFuser: expected the sharding to be on the outer reshaped ID); shard "
                        f"{e.outer} instead, or keep the dims apart")
            else:
                j = outer_split_of_merge(e.outer.extent, e.inner.extent, n)
                if j.holds is not True:
                    raise DomainError(f"{out.name}: the device split by {n} of {lid} does not survive merge("
                                      f"{e.outer}, {e.inner}): {j.reason}; make {n} divide {e.outer.extent}")
            cur = e.output
        else:
            cur = e.output
    return cur


def _up_to_root(td: TensorDomain, lid: IterDomain, n) -> IterDomain:
    """The root ID of view output ``td`` whose outer split by ``n`` is the outer split by ``n`` of
    its logical ID ``lid`` (backward through a reshape: a split's outer side goes to the split
    input, a merge to its outer input, each by the theorem); raises when there is none."""
    producer = {o.id: e for e in td.logical_exprs for o in e.outputs}
    root = {i.id for i in td.root}
    cur = lid
    while cur.id not in root:
        e = producer[cur.id]
        if isinstance(e, Resize):
            cur = e.input
            continue
        if isinstance(e, Split) and cur.id != e.outer.id:
            raise DomainError(f"{td.name}: the sharded {lid} is the inner part of split({e.input}) of a reshape; "
                              "only the outer reshaped ID carries a split back: shard the outer one")
        j = outer_split_of_merge(e.outer.extent, e.inner.extent, n)  # a split is a merge read backwards
        if j.holds is not True:
            raise DomainError(f"{td.name}: a split by {n} of {lid} is no split of the reshape's input: {j.reason}; "
                              f"make {n} divide {e.outer.extent}")
        cur = e.input if isinstance(e, Split) else e.outer
    return cur


def _through_view(op: Op, lid: IterDomain, steps: tuple):
    """The output logical ID a device split of input ID ``lid`` lands on through a reshape /
    slice, and the split to replay there (nvFuser: outer splits only, checked by theorem)."""
    out = op.output
    root = dict((a.id, b) for a, b in _pairs(op))[lid.id]
    if steps and (len(steps) != 1 or steps[0][1:] != (False, "outer")):
        raise DomainError(f"{out.name}: {op.inputs[0].name}'s device ID comes from {lid} by {steps}; only an outer "
                          "split (or the whole ID) carries a device through a reshape: outer_split it instead")
    n = steps[0][0] if steps else lid.extent
    cur = _down_to_logical(out, root, n, lid)
    if not steps and equal(cur.extent, n) is True:
        return cur, ()
    return cur, ((n, False, "outer"),)


def _replay(td: TensorDomain, target: str, steps: tuple, ptype: ParallelType) -> TensorDomain:
    pos = td.position(target)
    for factor, inner, side in steps:
        td = td.split(pos, factor, inner)
        pos = pos if side == "outer" else pos + 1
    return td.parallelize(pos, ptype)


def _reference_order(op: Op) -> tuple:
    """nvFuser's reference inputs: matmul / linear take B (and the bias) before A; other ops the
    inputs with more device IDs first, then larger meshes, ties in input order."""
    if op.kind in (OpKind.MATMUL, OpKind.LINEAR):
        return op.inputs[1:] + op.inputs[:1]
    return tuple(sorted(op.inputs, key=lambda t: (-len(_device(t.loop)), -(t.mesh.ndim if t.mesh else 0))))


def _propagate_into(op: Op) -> TensorDomain:
    out = op.output
    if out.mesh is None:
        out = out.with_mesh(next((t.mesh for t in op.inputs if t.mesh is not None), None))
    used = {i.ptype for i in _device(out.loop)}  # r{DIDx} is reduced: it does not block DIDx (reduce-scatter)
    pairs = {a.id: b for a, b in _pairs(op)}
    order = _reference_order(op)
    for inp in order:
        for dev in _device(inp.loop):
            if dev.ptype in used:
                continue
            chain = _split_chain(inp, dev)
            if chain is None:
                continue
            lid, steps = chain
            if op.kind is OpKind.VIEW:
                target, steps = _through_view(op, lid, steps)
            elif op.kind is OpKind.CAT and lid.id == _dims(inp)[op.dim].id:
                target = out.logical[op.dim]
            elif lid.id in pairs:
                target = pairs[lid.id]
            else:
                continue
            if target.id not in {i.id for i in out.loop}:
                continue  # already split by an earlier input: never overwrite
            out = _replay(out, target.id, steps, dev.ptype)
            if not target.is_reduction:
                used.add(dev.ptype)
    return out


def propagate(ops) -> tuple:
    """Forward sharding propagation (nvFuser's pass, forward only): each op's output, unless
    already sharded or placed on a mesh (user-sharded), takes the device splits of its inputs
    (matmul / linear: B and the bias before A; other ops: inputs with more device IDs first, ties
    in input order), one ID per parallel type (``r{DIDx}`` does not count), never on a logical ID
    already split. Returns the ops with updated tensors. ``propagate([op])``."""
    cur: dict = {}
    out = []
    for op in ops:
        op = op.with_domains(*(cur[t.name] for t in op.inputs + (op.output,) if t.name in cur))
        o = op.output
        if o.mesh is None and not _device(o.loop):
            o = _propagate_into(op)
        cur[o.name] = o
        out.append(op.with_domains(o))
    return tuple(out)


def sharded_logical_axis(td: TensorDomain, ptype: ParallelType) -> int | None:
    """nvFuser's ``getShardedLogicalAxis``: the tensor axis (its position among the logical IDs that are
    dims, reductions and partial sums skipped) whose loop descendants include a non-reduction ID on
    ``ptype``; None when there is none (``r{DIDx}`` is reduced: no axis is sharded by it).
    ``sharded_logical_axis(td, ParallelType.device("x")) -> 0``"""
    consumer = {i.id: e for e in td.loop_exprs for i in e.inputs}
    loop = {i.id: i for i in td.loop if not i.is_reduction}
    for pos, lid in enumerate(_dims(td)):
        todo = [lid.id]
        while todo:
            k = todo.pop()
            if k in loop and loop[k].ptype == ptype:
                return pos
            if k in consumer:
                todo.extend(o.id for o in consumer[k].outputs)
    return None
