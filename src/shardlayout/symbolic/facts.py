"""Guards (assumptions on symbols) and a ``FactBase`` that decides divisibility, equality and order.

Every decision is *sound*: True only when it holds for every binding that satisfies the facts (every
symbol >= 1 plus the assumed guards), False only when it fails for every such binding, None otherwise.

    >>> facts = FactBase().assume("batch % 2 == 0").assume("2 <= seq <= 64")
    >>> facts.divides(4, "2*batch"), facts.le("seq", 64), facts.bounds("seq + 1"), facts.equal("seq", 100)
    (True, True, (3, 65), False)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from ..errors import SymbolError
from .expr import (
    _CEIL,
    _FLOOR,
    _MAX,
    _MIN,
    _MOD,
    _SYM,
    Expr,
    _Atom,
    _coerce,
    _single_atom,
    _tokenize,
    _wrap,
    parse,
)

__all__ = ["Guard", "FactBase"]

_KINDS = ("divisible", "range", "eq")
_INF = math.inf
_GUARD_HINT = "write guards like 'batch % 2 == 0', '2 <= seq <= 1024', 'seq >= 8', 'seq == 128'"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Guard:
    """One assumption on symbols: ``Guard.divisible('batch', 2)`` is ``batch % 2 == 0``.

    Kinds: ``divisible`` (``expr % modulus == 0``), ``range`` (``lo <= expr <= hi``, one bound may be
    None), ``eq`` (``expr == value``)."""

    kind: str
    expr: Expr
    modulus: int | None = None
    lo: int | None = None
    hi: int | None = None
    value: int | None = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise SymbolError(f"Guard kind {self.kind!r}: expected one of {_KINDS}")
        expr = _coerce(self.expr, "Guard")
        object.__setattr__(self, "expr", expr)
        for field in ("modulus", "lo", "hi", "value"):
            v = getattr(self, field)
            if v is not None and not _is_int(v):
                raise SymbolError(f"Guard {field}={v!r}: expected an int")
        if self.kind == "divisible":
            if self.modulus is None or self.modulus < 1 or (self.lo, self.hi, self.value) != (None,) * 3:
                raise SymbolError(f"Guard.divisible({expr}, {self.modulus!r}): give only a positive int modulus")
        elif self.kind == "range":
            if (self.lo is None and self.hi is None) or self.modulus is not None or self.value is not None:
                raise SymbolError(f"Guard.range({expr}): give lo and/or hi, e.g. Guard.range('seq', 1, 1024)")
            if self.lo is not None and self.hi is not None and self.lo > self.hi:
                raise SymbolError(f"Guard.range({expr}, {self.lo}, {self.hi}): lo > hi; swap the bounds")
        else:
            if self.value is None or (self.modulus, self.lo, self.hi) != (None,) * 3:
                raise SymbolError(f"Guard.eq({expr}, ...): give only an int value, e.g. Guard.eq('seq', 128)")
            atom = _single_atom(expr)
            if self.value == 0 and atom is not None and atom.kind == _MOD:
                m = atom.args[1].constant_value
                if m is not None:  # `x % m == 0` is a divisibility guard
                    object.__setattr__(self, "kind", "divisible")
                    object.__setattr__(self, "expr", atom.args[0])
                    object.__setattr__(self, "modulus", m)
                    object.__setattr__(self, "value", None)

    @classmethod
    def divisible(cls, expr, modulus: int) -> "Guard":
        """``expr % modulus == 0``: ``str(Guard.divisible('batch', 2)) -> 'batch % 2 == 0'``."""
        return cls("divisible", expr, modulus=modulus)

    @classmethod
    def range(cls, expr, lo: int | None = None, hi: int | None = None) -> "Guard":
        """``lo <= expr <= hi``: ``str(Guard.range('seq', 2, 1024)) -> '2 <= seq <= 1024'``."""
        return cls("range", expr, lo=lo, hi=hi)

    @classmethod
    def eq(cls, expr, value: int) -> "Guard":
        """``expr == value``: ``str(Guard.eq('seq', 128)) -> 'seq == 128'``."""
        return cls("eq", expr, value=value)

    def __repr__(self):
        return f"Guard.parse({str(self)!r})"

    def __str__(self):
        if self.kind == "divisible":
            return f"{_wrap(self.expr)} % {self.modulus} == 0"
        if self.kind == "eq":
            return f"{self.expr} == {self.value}"
        if self.lo is not None and self.hi is not None:
            return f"{self.lo} <= {self.expr} <= {self.hi}"
        if self.lo is not None:
            return f"{self.expr} >= {self.lo}"
        return f"{self.expr} <= {self.hi}"

    @property
    def free_symbols(self) -> frozenset:
        """Symbols the guard constrains: ``Guard.parse('a*b % 2 == 0').free_symbols -> {'a', 'b'}``."""
        return self.expr.free_symbols

    def holds(self, bindings: Mapping) -> bool:
        """Whether the guard holds at ``bindings``: ``Guard.parse('n % 4 == 0').holds({'n': 8}) -> True``."""
        v = self.expr.evaluate(bindings)
        if self.kind == "divisible":
            return v % self.modulus == 0
        if self.kind == "eq":
            return v == self.value
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)

    @staticmethod
    def parse(text: str) -> "Guard":
        """Read a guard: ``Guard.parse('2 <= batch <= 1024') -> Guard.range(batch, 2, 1024)``."""
        if isinstance(text, Guard):
            return text
        if not isinstance(text, str):
            raise SymbolError(f"Guard.parse({text!r}): expected text; {_GUARD_HINT}")
        toks = _tokenize(text)
        depth, cmps = 0, []
        for kind, val, pos in toks:
            if kind == "op":
                depth += val == "("
                depth -= val == ")"
                if depth == 0 and val in ("==", "<=", ">=", "<", ">"):
                    cmps.append((val, pos))
        if not cmps or len(cmps) > 2:
            raise SymbolError(f"cannot parse guard {text!r}: expected one comparison (==, <=, >=, <, >) or "
                              f"lo <= expr <= hi, found {len(cmps)}; {_GUARD_HINT}")
        cuts = [0] + [p for _, p in cmps] + [len(text)]
        pieces = []
        for i in range(len(cuts) - 1):
            start = cuts[i] + (len(cmps[i - 1][0]) if i else 0)
            pieces.append(text[start:cuts[i + 1]])
        ops = [op for op, _ in cmps]
        if len(ops) == 1:
            op = ops[0]
            if op == "==" and pieces[1].strip() == "0":
                div = _divisible_form(pieces[0])
                if div is not None:
                    return Guard.divisible(*div)
            left, right = _parse_piece(text, pieces[0]), _parse_piece(text, pieces[1])
            lv, rv = left.constant_value, right.constant_value
            if rv is not None:
                expr, c, op = left, rv, op
            elif lv is not None:
                expr, c, op = right, lv, {"==": "==", "<=": ">=", ">=": "<=", "<": ">", ">": "<"}[op]
            else:
                raise SymbolError(f"cannot parse guard {text!r}: one side of {op!r} must be an int; {_GUARD_HINT}")
            if op == "==":
                return Guard.eq(expr, c)
            bound = {"<=": ("hi", c), "<": ("hi", c - 1), ">=": ("lo", c), ">": ("lo", c + 1)}[op]
            return Guard.range(expr, **{bound[0]: bound[1]})
        a, e, b = (_parse_piece(text, p) for p in pieces)
        av, bv = a.constant_value, b.constant_value
        if av is None or bv is None or e.is_constant:
            raise SymbolError(f"cannot parse guard {text!r}: a chained comparison is int <= expr <= int; "
                              f"{_GUARD_HINT}")
        if all(op in ("<=", "<") for op in ops):
            return Guard.range(e, av + (ops[0] == "<"), bv - (ops[1] == "<"))
        if all(op in (">=", ">") for op in ops):
            return Guard.range(e, bv + (ops[1] == ">"), av - (ops[0] == ">"))
        raise SymbolError(f"cannot parse guard {text!r}: mix of {ops[0]!r} and {ops[1]!r}; {_GUARD_HINT}")


def _parse_piece(text: str, piece: str) -> Expr:
    try:
        return parse(piece)
    except SymbolError as err:
        raise SymbolError(f"cannot parse guard {text!r}: {err}") from None


def _divisible_form(piece: str):
    """``(expr, m)`` when ``piece`` is ``<expr> % <int>`` at the top level, else None."""
    toks = _tokenize(piece)[:-1]
    if len(toks) < 3 or toks[-1][0] != "int" or toks[-2][:2] != ("op", "%"):
        return None
    depth, prev = 0, None
    for kind, val, _ in toks[:-2]:
        if kind == "op":
            if depth == 0 and val in ("+", "-") and prev is not None and (prev[0] != "op" or prev[1] == ")"):
                return None  # a binary + or - at the top level: % binds only its right operand
            depth += val == "("
            depth -= val == ")"
        prev = (kind, val)
    if toks[-1][1] < 1:
        return None
    return _parse_piece(piece, piece[: toks[-2][2]]), toks[-1][1]


# -- extended-integer intervals (math.inf for unbounded ends) -------------------------------------


def _xadd(a, b):
    if isinstance(a, float):
        return a
    if isinstance(b, float):
        return b
    return a + b


def _xmul(a, b):
    if a == 0 or b == 0:
        return 0
    if isinstance(a, float) or isinstance(b, float):
        return _INF if (a > 0) == (b > 0) else -_INF
    return a * b


def _iv_add(x, y):
    return (_xadd(x[0], y[0]), _xadd(x[1], y[1]))


def _iv_mul(x, y):
    ps = [_xmul(a, b) for a in x for b in y]
    return (min(ps), max(ps))


def _iv_pow(x, p):
    if p == 1:
        return x
    lo, hi = x

    def pw(v):
        return v if isinstance(v, float) and p % 2 else (_INF if isinstance(v, float) else v**p)

    if lo >= 0:
        return (pw(lo), pw(hi))
    if hi <= 0:
        return (pw(hi), pw(lo)) if p % 2 == 0 else (pw(lo), pw(hi))
    return (0, max(pw(lo), pw(hi))) if p % 2 == 0 else (pw(lo), pw(hi))


def _iv_meet(x, y):
    return (max(x[0], y[0]), min(x[1], y[1]))


def _div_corner(a, b):
    """``a / b`` for ``b > 0`` (b may be inf); None when undefined (inf/inf)."""
    if isinstance(b, float):
        return None if isinstance(a, float) else 0
    if isinstance(a, float):
        return a
    return Fraction(a, b)


def _iv_div(x, y, rounding):
    if y[0] < 1:
        return (-_INF, _INF)
    corners = [c for c in (_div_corner(a, b) for a in x for b in y) if c is not None]
    lo, hi = min(corners), max(corners)
    return (lo if isinstance(lo, float) else rounding(lo), hi if isinstance(hi, float) else rounding(hi))


def _linear(e: Expr):
    """``(name, c, d)`` when ``e == c*name + d`` for one symbol, else None."""
    terms = e._terms
    if not terms or len(terms) > 2 or (len(terms) == 2 and terms[1][0]):
        return None
    mono, c = terms[0]
    if len(mono) != 1 or mono[0][1] != 1 or mono[0][0].kind != _SYM:
        return None
    return mono[0][0].name, c, (terms[1][1] if len(terms) == 2 else 0)


def _match(e: Expr, g: Expr):
    """``(k, rest)`` with ``e == k*g + rest`` and k != 0 taken from g's leading term, else None."""
    if g.is_constant:
        return None
    mono, cg = g._terms[0]
    ce = dict(e._terms).get(mono, 0)
    if ce == 0 or ce % cg:
        return None
    k = ce // cg
    return k, e - k * g


@dataclass(frozen=True)
class _SymInfo:
    lo: dict
    hi: dict
    mod: dict
    fixed: dict
    compound: tuple  # guards not reduced to one symbol's facts, with fixed symbols substituted


@dataclass(frozen=True)
class FactBase:
    """Guards assumed on symbols, plus "every symbol >= 1": ``FactBase().assume('seq % 4 == 0')``."""

    guards: tuple = ()

    def __post_init__(self):
        if isinstance(self.guards, (str, Guard)) or not isinstance(self.guards, Iterable):
            raise SymbolError(f"FactBase({self.guards!r}): expected a tuple of guards, e.g. "
                              "FactBase(('batch % 2 == 0',))")
        gs = {str(g): g for g in (Guard.parse(g) for g in self.guards)}
        object.__setattr__(self, "guards", tuple(gs[k] for k in sorted(gs)))

    def __str__(self):
        return "{" + ", ".join(str(g) for g in self.guards) + "}"

    def assume(self, guard) -> "FactBase":
        """A new FactBase with one more guard: ``FactBase().assume('batch % 2 == 0')``."""
        return FactBase(self.guards + (Guard.parse(guard),))

    @property
    def free_symbols(self) -> frozenset:
        """Symbols named by the guards: ``FactBase(('a % 2 == 0',)).free_symbols -> {'a'}``."""
        out: frozenset = frozenset()
        for g in self.guards:
            out |= g.free_symbols
        return out

    # -- derived per-symbol facts -----------------------------------------------------------------
    @cached_property
    def _info(self) -> _SymInfo:
        lo: dict = {}
        hi: dict = {}
        mod: dict = {}
        compound = []
        for g in self.guards:
            lin = _linear(g.expr)
            if lin is None:
                compound.append(g)
                continue
            name, c, d = lin
            lo.setdefault(name, 1)
            if g.kind == "divisible":
                if d == 0:
                    mod[name] = math.lcm(mod.get(name, 1), g.modulus // math.gcd(c, g.modulus))
                else:
                    compound.append(g)
                continue
            if g.kind == "eq":
                glo = ghi = g.value
            else:
                glo = -_INF if g.lo is None else g.lo
                ghi = _INF if g.hi is None else g.hi
            # glo <= c*s + d <= ghi
            a, b = _xadd(glo, -d), _xadd(ghi, -d)
            if c < 0:
                a, b, c = -b, -a, -c
            if not isinstance(a, float):
                lo[name] = max(lo[name], -(-a // c))
            if not isinstance(b, float):
                hi[name] = min(hi.get(name, _INF), b // c)
        for name in set(lo) | set(mod):
            m = mod.get(name, 1)
            lo[name] = -(-lo.get(name, 1) // m) * m
            if name in hi:
                hi[name] = (hi[name] // m) * m
        fixed = {n: lo[n] for n in hi if lo[n] == hi[n]}
        if fixed:
            compound = [_subs_guard(g, fixed) for g in compound]
        return _SymInfo(lo, hi, mod, fixed, tuple(g for g in compound if g is not None))

    def modulus(self, name: str) -> int:
        """The known modulus of one symbol: with ``seq % 4 == 0`` assumed, ``modulus('seq') -> 4``."""
        return self._info.mod.get(name, 1)

    def _prep(self, e, where: str) -> Expr:
        e = _coerce(e, where)
        fixed = self._info.fixed
        if fixed and e.free_symbols & fixed.keys():
            try:
                return e.subs(fixed)
            except SymbolError:
                return e
        return e

    # -- divisibility -----------------------------------------------------------------------------
    def _expr_mod(self, e: Expr) -> int:
        """M with ``e % M == 0`` always (0: e is always 0)."""
        g, c = self._residue(e)
        return math.gcd(g, c)

    def _atom_mod(self, atom: _Atom) -> int:
        k = atom.kind
        if k == _SYM:
            return self._info.mod.get(atom.name, 1)
        if k in (_MAX, _MIN):
            out = 0
            for a in atom.args:
                out = math.gcd(out, self._expr_mod(a))
            return out
        a, b = atom.args
        bv = b.constant_value
        ma = self._expr_mod(a)
        if k in (_FLOOR, _CEIL):
            return ma // bv if bv is not None and ma % bv == 0 else 1
        if bv is not None and ma % bv == 0:
            return 0
        return math.gcd(ma, bv if bv is not None else self._expr_mod(b))

    def _residue(self, e: Expr):
        """``(G, c)`` with ``e % G == c % G`` for every binding (G == 0: e == c)."""
        g, c0 = 0, 0
        for mono, c in e._terms:
            if not mono:
                c0 = c
                continue
            eff = abs(c)
            for atom, p in mono:
                eff *= self._atom_mod(atom) ** p
            g = math.gcd(g, eff)
        return g, c0

    def _residues(self, e: Expr) -> list:
        out = [self._residue(e)]
        for guard in self._info.compound:
            if guard.kind == "divisible":
                hit = _match(e, guard.expr)
                if hit is not None:
                    k, rest = hit
                    g, c = self._residue(rest)
                    out.append((math.gcd(g, abs(k) * guard.modulus), c))
        return out

    def divides(self, m: int, e) -> bool | None:
        """Decide ``e % m == 0``: with ``batch % 2 == 0``, ``divides(4, '2*batch') -> True``; None if undecided."""
        if not _is_int(m) or m < 1:
            raise SymbolError(f"divides({m!r}, ...): the modulus must be a positive int")
        e = self._prep(e, "divides")
        cands = self._residues(e)
        for g, c in cands:
            if g % m == 0 and c % m == 0:
                return True
        for g, c in cands:
            if c % math.gcd(g, m):
                return False
        return None

    # -- bounds and order -------------------------------------------------------------------------
    def _atom_iv(self, atom: _Atom, memo: dict):
        if atom in memo:
            return memo[atom]
        k = atom.kind
        if k == _SYM:
            info = self._info
            iv = (info.lo.get(atom.name, 1), info.hi.get(atom.name, _INF))
        elif k in (_MAX, _MIN):
            ivs = [self._iv(a, memo) for a in atom.args]
            f = max if k == _MAX else min
            iv = (f(i[0] for i in ivs), f(i[1] for i in ivs))
        else:
            ia, ib = (self._iv(a, memo) for a in atom.args)
            if k == _FLOOR:
                iv = _iv_div(ia, ib, math.floor)
            elif k == _CEIL:
                iv = _iv_div(ia, ib, math.ceil)
            elif ib[0] < 1:
                iv = (-_INF, _INF)
            elif ia[0] >= 0 and ia[1] < ib[0]:
                iv = ia
            else:
                iv = (0, min(_xadd(ib[1], -1), ia[1] if ia[0] >= 0 else _INF))
        memo[atom] = iv
        return iv

    def _poly_iv(self, terms: list, memo: dict):
        if not terms:
            return (0, 0)
        naive = (0, 0)
        for mono, c in terms:
            t = (c, c)
            for atom, p in mono:
                t = _iv_mul(t, _iv_pow(self._atom_iv(atom, memo), p))
            naive = _iv_add(naive, t)
        if len(terms) == 1:
            return naive
        counts: dict = {}
        for mono, _ in terms:
            for atom, _ in mono:
                counts[atom] = counts.get(atom, 0) + 1
        if not counts:
            return naive
        best = min(counts, key=lambda a: (-counts[a], a.key))
        if counts[best] < 2:
            return naive
        inner, rest = [], []
        for mono, c in terms:
            powers = dict(mono)
            if best in powers:
                powers[best] -= 1
                if not powers[best]:
                    del powers[best]
                inner.append((tuple(sorted(powers.items(), key=lambda ap: ap[0].key)), c))
            else:
                rest.append((mono, c))
        grouped = _iv_add(_iv_mul(self._atom_iv(best, memo), self._poly_iv(inner, memo)), self._poly_iv(rest, memo))
        return _iv_meet(naive, grouped)

    def _iv(self, e: Expr, memo: dict):
        return self._poly_iv(list(e._terms), memo)

    def _bounds(self, e: Expr):
        memo: dict = {}
        iv = self._iv(e, memo)
        for guard in self._info.compound:
            if guard.kind == "divisible":
                continue
            hit = _match(e, guard.expr)
            if hit is None:
                continue
            k, rest = hit
            g_iv = (guard.value, guard.value) if guard.kind == "eq" else (
                -_INF if guard.lo is None else guard.lo, _INF if guard.hi is None else guard.hi)
            g_iv = _iv_meet(g_iv, self._iv(guard.expr, memo))
            iv = _iv_meet(iv, _iv_add(_iv_mul((k, k), g_iv), self._iv(rest, memo)))
        return iv

    def bounds(self, e) -> tuple:
        """``(lo, hi)`` with ``lo <= e <= hi`` for every binding; None for unbounded: ``bounds('n') -> (1, None)``."""
        lo, hi = self._bounds(self._prep(e, "bounds"))
        return (None if isinstance(lo, float) else lo, None if isinstance(hi, float) else hi)

    def _diff(self, a, b, where: str) -> Expr:
        return self._prep(_coerce(a, where) - _coerce(b, where), where)

    def le(self, a, b) -> bool | None:
        """Decide ``a <= b``: ``FactBase().le('seq', '2*seq') -> True``; None if undecided."""
        lo, hi = self._bounds(self._diff(b, a, "le"))
        return True if lo >= 0 else False if hi < 0 else None

    def lt(self, a, b) -> bool | None:
        """Decide ``a < b``: ``FactBase().lt('seq', 'seq + 1') -> True``; None if undecided."""
        lo, hi = self._bounds(self._diff(b, a, "lt"))
        return True if lo >= 1 else False if hi <= 0 else None

    def ge(self, a, b) -> bool | None:
        """Decide ``a >= b``: ``FactBase().ge('seq', 1) -> True``; None if undecided."""
        return self.le(b, a)

    def gt(self, a, b) -> bool | None:
        """Decide ``a > b``: ``FactBase().gt('seq', 0) -> True``; None if undecided."""
        return self.lt(b, a)

    def equal(self, a, b) -> bool | None:
        """Decide ``a == b``: ``FactBase().equal('2*s + 1', '2*t') -> False`` (parity); None if undecided."""
        d = self._diff(a, b, "equal")
        if d == 0:
            return True
        lo, hi = self._bounds(d)
        if lo == hi == 0:
            return True
        if lo > 0 or hi < 0:
            return False
        if any(c % g for g, c in self._residues(d) if g):
            return False
        return None

    # -- guards -----------------------------------------------------------------------------------
    def implies(self, guard) -> bool:
        """Whether the facts prove ``guard``: with ``batch % 2 == 0`` and ``seq % 4 == 0``,
        ``implies('batch*seq % 8 == 0') -> True``; False means "not proved"."""
        g = Guard.parse(guard)
        if g in self.guards:
            return True
        if g.kind == "divisible":
            return self.divides(g.modulus, g.expr) is True
        if g.kind == "eq":
            return self.equal(g.expr, g.value) is True
        lo, hi = self._bounds(self._prep(g.expr, "implies"))
        return (g.lo is None or lo >= g.lo) and (g.hi is None or hi <= g.hi)

    def minimal(self, guards) -> tuple:
        """``guards`` without those the others imply, given these facts as background (a guard these
        facts already prove is dropped too): ``FactBase().minimal(['n % 4 == 0', 'n % 2 == 0'])``
        -> ``(Guard.parse('n % 4 == 0'),)``. Deterministic: guards are tried in text order."""
        gs = FactBase(tuple(guards)).guards
        kept = list(gs)
        for g in gs:
            rest = tuple(h for h in kept if h != g)
            if FactBase(self.guards + rest).implies(g):
                kept.remove(g)
        return tuple(kept)

    # -- concrete sizes ---------------------------------------------------------------------------
    def sample(self, k: int, seed: int = 0, lo: int = 1, hi: int = 64, symbols=()) -> list:
        """``k`` bindings (dicts) of the symbols in ``lo..hi`` satisfying every guard, distinct where
        possible and deterministic given ``seed``: ``FactBase().assume('n % 4 == 0').sample(2, 0)``."""
        for name, v in (("k", k), ("seed", seed), ("lo", lo), ("hi", hi)):
            if not _is_int(v):
                raise SymbolError(f"sample: {name}={v!r} must be an int")
        if k < 0 or hi < lo:
            raise SymbolError(f"sample(k={k}, lo={lo}, hi={hi}): need k >= 0 and lo <= hi")
        names = set(self.free_symbols)
        for s in (symbols,) if isinstance(symbols, (str, Expr)) else symbols:
            names |= _coerce(s, "sample").free_symbols
        names = sorted(names)
        info = self._info
        domains = {}
        for n in names:
            m = info.mod.get(n, 1)
            a = max(lo, info.lo.get(n, 1))
            b = min(hi, info.hi.get(n, hi))
            a, b = -(-a // m) * m, (b // m) * m
            if a > b:
                mine = [str(g) for g in self.guards if n in g.free_symbols]
                raise SymbolError(f"sample: no value of {n!r} in {lo}..{hi} satisfies {mine or 'symbol >= 1'}; "
                                  f"raise hi (now {hi}) or relax the guards")
            domains[n] = range(a, b + 1, m)
        rng = random.Random(seed)
        out: list = []
        seen: set = set()

        def ok(b: dict) -> bool:
            try:
                return all(g.holds(b) for g in self.guards)
            except SymbolError:
                return False

        tries = 0
        while len(out) < k and tries < 200 * k + 1000:
            tries += 1
            b = {n: rng.choice(domains[n]) for n in names}
            key = tuple(b[n] for n in names)
            if key not in seen and ok(b):
                seen.add(key)
                out.append(b)
        if len(out) < k:
            total = math.prod(len(d) for d in domains.values())
            if total <= 200_000:
                every = [dict(zip(names, vals)) for vals in itertools.product(*(domains[n] for n in names))]
                every = [b for b in every if ok(b)]
                if not every:
                    raise SymbolError(f"sample: no binding of {names} in {lo}..{hi} satisfies {self}; "
                                      f"relax the guards or raise hi (now {hi})")
                rng.shuffle(every)
                out += [b for b in every if tuple(b[n] for n in names) not in seen][: k - len(out)]
            elif not out:
                raise SymbolError(f"sample: found no binding of {names} in {lo}..{hi} satisfying {self} after "
                                  f"{tries} random tries; narrow lo..hi or simplify the guards")
            distinct = list(out)
            while len(out) < k:  # fewer distinct bindings than asked: repeat them in order
                out.append(dict(distinct[len(out) % len(distinct)]))
        return out


def _subs_guard(g: Guard, fixed: dict):
    if not g.expr.free_symbols & fixed.keys():
        return g
    try:
        e = g.expr.subs(fixed)
    except SymbolError:
        return g
    if e.is_constant:
        return None
    return Guard(g.kind, e, g.modulus, g.lo, g.hi, g.value)
