"""Symbolic extents in programs: shapes of ints and ``Expr``s, their values at a binding of the
symbols, and the symbolic output shapes of an op.

A symbolic program keeps two views of every extent: the *example* (an int: the extent at the
example binding of the symbols, what the planner decides on) and the extent itself (an int or an
``Expr``). ``evaluate_shape`` turns the second into the first at any binding.

**How an op's symbolic output shape is found** (``infer_shapes``). The op rules compute shapes on
ints only (``shapes.shape_of`` propagates on a one-device mesh), so the output extents are found
by *interpolation*, not by running the rule on symbols: the rule runs at the example binding and
at other bindings the program's facts allow (drawn with ``FactBase.sample``), and each output
extent is fitted exactly (rational Gaussian elimination) by an integer polynomial of total degree
<= 3 in the op's symbols, with 3 more bindings than unknowns, all of which must agree. A fit with
rational coefficients becomes ``FloorDiv(L*q, L)`` (exact wherever it was sampled). When no
polynomial fits, ``FloorDiv(P + r, k)`` forms (``ceil_div`` when ``r == k - 1``) are tried for
k = 2..8: on bindings congruent to the example modulo k (and the facts' moduli) the extent is
the polynomial ``(P - c)/k``, which is fitted, then each shift r is checked on the general
bindings. When nothing fits, the extent is *specialised*: it keeps its example value, and every
symbol the op reads is fixed to its example by an explicit guard ``sym == value`` (returned, and
recorded as a fact of the program: never silent). This is a decision from finitely many
bindings, not a proof: a degree > 3 polynomial or a floor with k > 8 that agrees at every sampled
binding would be accepted wrongly. ``Program.at`` re-runs every rule at the bindings it is asked
for and raises when a fitted extent disagrees, and ``Plan.verify`` does so at bindings other than
the example.

    >>> from shardlayout.symbolic import sym
    >>> out, fixed = infer_shapes("view", [(sym("b"), sym("s"), 8)], {"size": (8, 8)},
    ...                           {"size": (sym("b") * sym("s"), 8)}, {"b": 2, "s": 4}, ())
    >>> [str(x) for x in out[0]], fixed
    (['b*s', '8'], ())
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from fractions import Fraction

from ..errors import ShardingError, SymbolError
from ..symbolic import Expr, FactBase, Guard, as_extent, ceil_div, is_symbolic, parse, sym
from . import ProgramError  # defined before ``program`` imports this module

FIT_DEGREE = 3  # highest total degree of a fitted polynomial
EXTRA = 3  # bindings beyond the unknowns that must agree with a fit
FLOOR_DIVISORS = tuple(range(2, 9))  # k tried in FloorDiv(P + r, k)
_SIZE_TYPES = ("int", "ints", "shape")  # op params whose strings are extents


class SymbolicShapeError(ProgramError):
    """A symbolic extent that is malformed, names an unknown symbol, or fails at a binding."""


# ------------------------------------------------------------------------------------------
# extents and shapes
# ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Expr:
    return parse(text)


def to_extent(x, symbols: Mapping, where: str):
    """An int or an ``Expr`` over known ``symbols``: ``to_extent("2*seq", {"seq": 8}, "x") -> Expr('2*seq')``."""
    if isinstance(x, bool):
        raise SymbolicShapeError(f"{where}: extent {x!r} is a bool; give an int, a symbol name or an expression")
    try:
        e = as_extent(_parse(x) if isinstance(x, str) else x)
    except SymbolError as err:
        raise SymbolicShapeError(f"{where}: {err}") from None
    if isinstance(e, Expr):
        unknown = sorted(e.free_symbols - set(symbols))
        if unknown:
            known = ", ".join(sorted(symbols)) or "none"
            raise SymbolicShapeError(
                f"{where}: extent {e} names unknown symbol {unknown[0]!r} (known: {known}); declare it, e.g. "
                f"ProgramBuilder(symbols={{{unknown[0]!r}: 16}})")
    return e


def to_shape(shape, symbols: Mapping, where: str) -> tuple:
    """A shape of ints and Exprs: ``to_shape(("batch", 64), {"batch": 4}, "x") -> (Expr('batch'), 64)``."""
    if isinstance(shape, (str, Expr)) or not hasattr(shape, "__iter__"):
        raise SymbolicShapeError(f"{where}: shape {shape!r} must be a tuple of extents, e.g. ('batch', 'seq', 64)")
    return tuple(to_extent(x, symbols, f"{where}: dim {d}") for d, x in enumerate(shape))


def is_symbolic_shape(shape) -> bool:
    """True when some extent is an Expr with symbols: ``is_symbolic_shape((sym('b'), 4)) -> True``."""
    return isinstance(shape, tuple) and any(is_symbolic(x) for x in shape)


def evaluate(x, bindings: Mapping) -> int:
    """The int value of an extent: ``evaluate(sym('b') * 2, {'b': 3}) -> 6``; ints pass through."""
    if isinstance(x, Expr):
        return x.evaluate(bindings)
    if isinstance(x, str):
        return _parse(x).evaluate(bindings)
    return x


def evaluate_shape(shape, bindings: Mapping) -> tuple:
    """A concrete shape: ``evaluate_shape((sym('b'), 4), {'b': 2}) -> (2, 4)``."""
    return tuple(evaluate(x, bindings) for x in shape)


def shape_text(shape) -> list:
    """JSON form, ints stay ints and Exprs become text: ``shape_text((sym('b'), 4)) -> ['b', 4]``."""
    return [str(x) if isinstance(x, Expr) else x for x in shape]


def free_symbols(v) -> frozenset:
    """Symbols named anywhere in a shape or param value: ``free_symbols((sym('b'), 4)) -> {'b'}``."""
    if isinstance(v, Expr):
        return v.free_symbols
    if isinstance(v, (list, tuple)):
        out: frozenset = frozenset()
        for x in v:
            out |= free_symbols(x)
        return out
    return frozenset()


# ------------------------------------------------------------------------------------------
# op params that hold extents
# ------------------------------------------------------------------------------------------


def has_extent(v) -> bool:
    """True when a param value holds a symbolic Expr: ``has_extent((sym('b'), 16)) -> True``."""
    t = type(v)
    if t is tuple or t is list:
        for x in v:
            tx = type(x)
            if tx is Expr or ((tx is tuple or tx is list) and has_extent(x)):
                if tx is not Expr or not x.is_constant:
                    return True
        return False
    return t is Expr and not v.is_constant


def param_extents(target: str, params: dict, symbols: Mapping) -> dict:
    """The params of a call that hold symbolic extents, as Exprs: an Expr anywhere, or a string in
    a size param (type int, ints or shape) of the op's signature.
    ``param_extents("view", {"size": ("b*s", 8)}, {"b": 2, "s": 4}) -> {"size": (Expr('b*s'), 8)}``"""
    from ..ops.registry import get_op

    sig = None
    out = {}
    for k, v in params.items():
        if has_extent(v):
            out[k] = _convert(v, symbols, f"op {target}: param {k}", strings=False)
            continue
        if _has_str(v):
            sig = sig or get_op(target).signature
            p = sig.param(k)
            if p is not None and p.type in _SIZE_TYPES:
                conv = _convert(v, symbols, f"op {target}: param {k}", strings=True)
                if has_extent(conv):
                    out[k] = conv
    return out


def _has_str(v) -> bool:
    return isinstance(v, str) or (isinstance(v, (list, tuple)) and any(_has_str(x) for x in v))


def _convert(v, symbols, where, strings: bool):
    if isinstance(v, Expr) or (strings and isinstance(v, str)):
        return to_extent(v, symbols, where)
    if isinstance(v, (list, tuple)):
        return tuple(_convert(x, symbols, where, strings) for x in v)
    return v


def params_text(v):
    """A param value with Exprs as text (JSON-able, hashable): ``params_text((sym('b'), 8)) -> ('b', 8)``."""
    if isinstance(v, Expr):
        c = v.constant_value
        return c if c is not None else str(v)
    if isinstance(v, (list, tuple)):
        return tuple(params_text(x) for x in v)
    return v


def evaluate_params(v, bindings: Mapping):
    """A param value with every extent (Expr or, in stored symbolic params, text) evaluated:
    ``evaluate_params(('b*s', 8), {'b': 2, 's': 4}) -> (8, 8)``."""
    if isinstance(v, (Expr, str)):
        return evaluate(v, bindings)
    if isinstance(v, (list, tuple)):
        return tuple(evaluate_params(x, bindings) for x in v)
    return v


def params_exprs(v):
    """Stored symbolic params (text) back to Exprs: ``params_exprs(('b*s', 8)) -> (Expr('b*s'), 8)``."""
    if isinstance(v, str):
        return as_extent(_parse(v))
    if isinstance(v, (list, tuple)):
        return tuple(params_exprs(x) for x in v)
    return v


# ------------------------------------------------------------------------------------------
# bindings
# ------------------------------------------------------------------------------------------


def bindings_text(b: Mapping) -> str:
    """``bindings_text({'seq': 16, 'batch': 4}) -> 'batch=4, seq=16'``."""
    return ", ".join(f"{k}={b[k]}" for k in sorted(b))


def check_bindings(symbols: tuple, facts: tuple, bindings: Mapping, where: str = "Program.at") -> dict:
    """The full binding (the example, updated with ``bindings``), checked against every fact:
    ``check_bindings((("b", 4),), (), {"b": 6}) -> {"b": 6}``."""
    example = dict(symbols)
    if not isinstance(bindings, Mapping):
        raise SymbolicShapeError(f"{where}({bindings!r}): give a dict of symbol -> int, e.g. {{'batch': 8}}")
    for k, v in bindings.items():
        if k not in example:
            known = ", ".join(sorted(example)) or "none"
            raise SymbolicShapeError(f"{where}: {k!r} is not a symbol of the program (its symbols: {known}); "
                                     "bind only those")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SymbolicShapeError(f"{where}: {k}={v!r}; a symbol's value is an int >= 1")
    full = {**example, **bindings}
    for g in facts:
        if not g.holds(full):
            raise SymbolicShapeError(f"{where}({bindings_text(bindings)}): violates the fact {g}; give sizes that "
                                     "satisfy every fact of the program")
    return full


def fixed_symbols(facts) -> dict:
    """Symbols the facts pin to one value: ``fixed_symbols([Guard.eq('n', 4)]) -> {'n': 4}``."""
    return {g.expr.name: g.value for g in facts if g.kind == "eq" and g.expr.name is not None}


# ------------------------------------------------------------------------------------------
# symbolic output shapes by interpolation
# ------------------------------------------------------------------------------------------


def _monomials(k: int, degree: int) -> list:
    """Exponent tuples of total degree <= ``degree`` in k variables, lowest degree first."""
    out = [e for e in itertools.product(range(degree + 1), repeat=k) if sum(e) <= degree]
    return sorted(out, key=lambda e: (sum(e), tuple(-x for x in e)))


def _row(point: tuple, mons: list) -> list:
    return [math.prod(v**p for v, p in zip(point, e)) for e in mons]


def _solve(rows: list, columns: list) -> list | None:
    """Exact solutions of ``rows @ x == column`` for each column (None where inconsistent), or
    None when ``rows`` does not have full column rank."""
    m = len(rows[0])
    a = [[Fraction(x) for x in r] + [Fraction(c[i]) for c in columns] for i, r in enumerate(rows)]
    for col in range(m):
        piv = next((i for i in range(col, len(a)) if a[i][col] != 0), None)
        if piv is None:
            return None
        a[col], a[piv] = a[piv], a[col]
        pr = a[col]
        inv = 1 / pr[col]
        pr[:] = [x * inv for x in pr]
        for i in range(len(a)):
            if i != col and a[i][col] != 0:
                f = a[i][col]
                a[i] = [x - f * y for x, y in zip(a[i], pr)]
    out = []
    for j in range(len(columns)):
        consistent = all(a[i][m + j] == 0 for i in range(m, len(a)))
        out.append([a[i][m + j] for i in range(m)] if consistent else None)
    return out


def _poly_expr(names: list, mons: list, coeffs: list) -> Expr:
    e = Expr(0)
    for mono, c in zip(mons, coeffs):
        if c:
            term = Expr(int(c))
            for n, p in zip(names, mono):
                if p:
                    term = term * sym(n) ** p
            e = e + term
    return e


def _as_expr(names: list, mons: list, coeffs: list):
    """An Expr from rational coefficients: a polynomial, or ``(L*q) // L``."""
    den = 1
    for c in coeffs:
        den = math.lcm(den, c.denominator)
    scaled = _poly_expr(names, mons, [c * den for c in coeffs])
    return as_extent(scaled if den == 1 else scaled // den)


class _Structure(Exception):
    """The op's number of outputs or their ranks change with the sizes: no extent-wise fit."""


class _Sampler:
    """The op's shape rule evaluated at bindings, memoised; raises naming the failing binding."""

    def __init__(self, target, in_shapes, params, sym_params, names, where, structure):
        self.target, self.in_shapes, self.params, self.sym_params = target, in_shapes, params, sym_params
        self.names, self.where, self.structure = names, where, structure
        self.memo: dict = {}

    def __call__(self, point: tuple) -> tuple:
        hit = self.memo.get(point)
        if hit is None:
            from .shapes import shape_of

            b = dict(zip(self.names, point))
            shapes = [evaluate_shape(s, b) if isinstance(s, tuple) else s for s in self.in_shapes]
            params = {**self.params, **{k: evaluate_params(v, b) for k, v in self.sym_params.items()}}
            try:
                if any(x < 0 for s in shapes if isinstance(s, tuple) for x in s):
                    raise SymbolicShapeError("an input extent is negative")
                hit = tuple(tuple(s) for s in shape_of(self.target, shapes, params))
            except ShardingError as e:
                raise SymbolicShapeError(
                    f"{self.where}: the op fails at {bindings_text(b)}, sizes the program's facts allow ({e}); "
                    "state the condition it needs as a fact, e.g. ProgramBuilder(..., facts=['seq % 2 == 0'])"
                ) from None
            if [len(x) for x in hit] != self.structure:
                raise _Structure()
            self.memo[point] = hit
        return hit


def _points(facts: FactBase, names: list, example: dict, count: int, seed: int = 0) -> list:
    """``count`` distinct bindings (tuples over ``names``) the facts allow: the example first, then
    random bindings alternating with neighbours of the example (one symbol moved by 1, 2, 3 of its
    modulus), so that small remainders vary even when the random ones happen to share them."""
    ex = tuple(example[n] for n in names)
    out, seen = [ex], {ex}
    try:
        rand = [tuple(b[n] for n in names)
                for b in facts.sample(count * 2 + 8, seed, 1, max(64, 4 * max(ex)), symbols=names)]
    except SymbolError:
        rand = []
    near = []
    for step in (1, 2, 3, -1):
        for i, n in enumerate(names):
            v = ex[i] + step * facts.modulus(n)
            if v >= 1:
                p = ex[:i] + (v,) + ex[i + 1:]
                if all(g.holds(dict(zip(names, p))) for g in facts.guards if g.free_symbols <= set(names)):
                    near.append(p)
    for p in itertools.chain.from_iterable(itertools.zip_longest(rand, near)):
        if p is not None and p not in seen:
            seen.add(p)
            out.append(p)
        if len(out) >= count:
            break
    return out


def _lattice(facts: FactBase, names: list, example: dict, count: int, modulus: dict, seed: int) -> list:
    """Like ``_points``, but every symbol congruent to its example modulo ``modulus[name]``."""
    import random

    ex = tuple(example[n] for n in names)
    hi = max(64, 4 * max(ex))
    doms = [range(example[n] % modulus[n] or modulus[n], hi + 1, modulus[n]) for n in names]
    rng = random.Random(seed)
    out, seen = [ex], {ex}
    for _ in range(count * 60):
        if len(out) >= count:
            break
        p = tuple(rng.choice(d) for d in doms)
        if p not in seen and all(g.holds(dict(zip(names, p))) for g in facts.guards if g.free_symbols <= set(names)):
            seen.add(p)
            out.append(p)
    return out


def _coefficients(sampler, points: list, names: list, j: int, d: int):
    """``(monomials, rational coefficients)`` of the lowest-degree polynomial through output j's
    dim d at the first bindings (EXTRA more than unknowns, all agreeing); None when none fits."""
    values: list = []
    for deg in range(FIT_DEGREE + 1):
        mons = _monomials(len(names), deg)
        need = len(mons) + EXTRA
        if need > len(points):
            return None
        while len(values) < need:
            values.append(sampler(points[len(values)])[j][d])
        sol = _solve([_row(p, mons) for p in points[:need]], [values[:need]])
        if sol is not None and sol[0] is not None:
            return mons, sol[0]
    return None


def _fit(sampler, points: list, names: list, j: int, d: int):
    """The extent of output j's dim d as a fitted polynomial (or ``(L*q)//L``), else None."""
    got = _coefficients(sampler, points, names, j, d)
    return None if got is None else _as_expr(names, *got)


def _fit_floor(sampler, facts: FactBase, names: list, example: dict, points: list, j: int, d: int):
    """``(P + r) // k`` (in the form ``_floor_form`` writes) for k in FLOOR_DIVISORS:
    on bindings congruent to the example modulo k, P's remainder is a constant c and the extent
    is the polynomial (P - c)/k, which is fitted; each shift r is then checked on ``points``."""
    general = [(dict(zip(names, p)), sampler(p)[j][d]) for p in points]
    need = len(_monomials(len(names), FIT_DEGREE)) + EXTRA
    for k in FLOOR_DIVISORS:
        modulus = {n: math.lcm(k, facts.modulus(n)) for n in names}
        got = _coefficients(sampler, _lattice(facts, names, example, need, modulus, k), names, j, d)
        if got is None:
            continue
        mons, coeffs = got
        scaled = [c * k for c in coeffs]
        if any(c.denominator != 1 for c in scaled) or all(c == 0 for c, e in zip(scaled, mons) if any(e)):
            continue
        base = _poly_expr(names, mons, scaled)
        c0 = base.evaluate(dict.fromkeys(names, 0))  # its constant term
        for r in range(k):
            cand = _floor_form(base - c0, c0 + r, k)
            if all(evaluate(cand, b) == v for b, v in general):
                return cand
    return None


def _floor_form(p: Expr, t: int, k: int):
    """``(p + t) // k`` written with the remainder of t taken out: ``q + p//k``, ``q + ceil(p/k)``
    (t = qk + k - 1) or ``q + (p + t')//k``: ``_floor_form(sym('n'), 1, 2) -> ceil(n/2)``."""
    q, t = divmod(t, k)
    body = p // k if t == 0 else ceil_div(p, k) if t == k - 1 else (p + t) // k
    return as_extent(body + q)


def infer_shapes(target: str, in_shapes: list, params: dict, sym_params: dict, example: Mapping,
                 facts, where: str = "") -> tuple:
    """``(output shapes of ints and Exprs, specialisations)`` of one op call whose input shapes
    (tuples of ints and Exprs; non-tuples are constants) or ``sym_params`` (Exprs) hold symbols;
    ``params`` are the concrete params at the example. Specialisations are ``sym == value`` guards
    for extents no fitted form explains (see the module docstring for the method).
    ``infer_shapes("mm", [(sym("b"), 8), (8, 2)], {}, {}, {"b": 4}, ())[0] -> [(Expr('b'), 2)]``"""
    from .shapes import shape_of

    where = where or f"op {target}"
    facts = tuple(facts)
    fixed = fixed_symbols(facts)
    if fixed:  # symbols the facts pin are constants here
        in_shapes = [tuple(as_extent(x.subs(fixed)) if isinstance(x, Expr) else x for x in s)
                     if isinstance(s, tuple) else s for s in in_shapes]
        sym_params = {k: _subs_params(v, fixed) for k, v in sym_params.items()}
    names = sorted(free_symbols([s for s in in_shapes if isinstance(s, tuple)])
                   | free_symbols(list(sym_params.values())))
    concrete = [evaluate_shape(s, example) if isinstance(s, tuple) else s for s in in_shapes]
    base = [tuple(s) for s in shape_of(target, concrete, {**params, **{k: evaluate_params(v, example)
                                                                        for k, v in sym_params.items()}})]
    if not names:
        return base, ()
    fb = FactBase(facts)
    sampler = _Sampler(target, in_shapes, params, sym_params, names, where, [len(x) for x in base])
    points = _points(fb, names, example, len(_monomials(len(names), FIT_DEGREE)) + EXTRA)
    out = []
    try:
        for j, shp in enumerate(base):
            dims = []
            for d in range(len(shp)):
                e = _checked(_fit(sampler, points, names, j, d), sampler, points, names, j, d)
                if e is None:
                    e = _checked(_fit_floor(sampler, fb, names, example, points, j, d), sampler, points, names, j, d)
                if e is None:
                    return base, _specialise(names, example)
                dims.append(e)
            out.append(tuple(dims))
    except _Structure:
        return base, _specialise(names, example)
    return out, _valid_from(out, sampler, fb, names, example)


def _valid_from(shapes, sampler, fb: FactBase, names: list, example: Mapping) -> tuple:
    """Range guards ``sym >= L``: for each symbol, walking down from its example (the others at
    theirs), the smallest value from which the fitted shapes still equal the rule's at every
    value up to the example — a fit made at larger sizes (``x[:5]`` is 5 only from 5 on, a
    ``chunk(2)`` has two pieces only from 2 on) is claimed only there, and that is stated."""
    out = []
    ex = tuple(example[n] for n in names)
    for i, n in enumerate(names):
        lo = fb.bounds(sym(n))[0] or 1
        # every value up to 64 and a few larger ones below the example, largest first
        tries = sorted({v for v in range(lo, min(ex[i], 65))} | {ex[i] - k for k in (1, 2, 3)}
                       | {ex[i] // k for k in (2, 3, 4, 8)}, reverse=True)
        good = ex[i]
        for v in (v for v in tries if lo <= v < ex[i]):
            p = ex[:i] + (v,) + ex[i + 1:]
            if not all(g.holds(dict(zip(names, p))) for g in fb.guards if g.free_symbols <= set(names)):
                continue
            try:
                got = sampler(p)
            except (SymbolicShapeError, _Structure):
                break
            b = dict(zip(names, p))
            if any(evaluate(e, b) != x for shp, row in zip(shapes, got) for e, x in zip(shp, row)):
                break
            good = v
        if good > lo:
            out.append(Guard.range(sym(n), good, None))
    return tuple(out)


def _checked(e, sampler, points, names, j, d):
    """``e`` when it agrees with the rule at every binding of ``points``, else None."""
    if e is None:
        return None
    for p in points:
        if evaluate(e, dict(zip(names, p))) != sampler(p)[j][d]:
            return None
    return e


def _subs_params(v, fixed):
    if isinstance(v, Expr):
        return as_extent(v.subs(fixed))
    if isinstance(v, (list, tuple)):
        return tuple(_subs_params(x, fixed) for x in v)
    return v


def _specialise(names, example) -> tuple:
    return tuple(Guard.eq(n, example[n]) for n in names)


__all__ = [
    "SymbolicShapeError",
    "bindings_text",
    "check_bindings",
    "evaluate",
    "evaluate_params",
    "evaluate_shape",
    "fixed_symbols",
    "free_symbols",
    "has_extent",
    "infer_shapes",
    "is_symbolic_shape",
    "param_extents",
    "params_exprs",
    "params_text",
    "shape_text",
    "to_extent",
    "to_shape",
]
