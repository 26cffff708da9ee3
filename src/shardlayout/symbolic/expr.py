"""Symbolic integer extents: ``Expr``, a polynomial with int coefficients over *atoms*.

An atom is a symbol (``seq``) or ``FloorDiv(a, b)``, ``CeilDiv(a, b)``, ``Mod(a, b)``,
``Max(a, ...)``, ``Min(a, ...)`` of Exprs. Two Exprs that are the same polynomial are equal and hash
equal however they were built; the text form is round-trippable by :func:`parse`, which also reads
what torch prints for SymInt expressions (sympy ``str``).

    >>> n = sym("n"); str((4 * n) // 2), str(ceil_div(n + 1, 4)), (n // 4).evaluate({"n": 9})
    ('2*n', 'ceil((n + 1)/4)', 2)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ..errors import SymbolError

__all__ = ["Expr", "sym", "const", "parse", "ceil_div", "max_", "min_", "as_extent", "is_symbolic"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_TERMS = 4096  # a polynomial with more terms is refused (e.g. (a + b + c + d)**64)
MAX_POWER = 64  # largest exponent accepted by ** and by parse
MAX_DEPTH = 100  # deepest nesting accepted by parse

_SYM, _FLOOR, _CEIL, _MOD, _MAX, _MIN = "sym", "floordiv", "ceildiv", "mod", "max", "min"
_KIND_ORDER = {_SYM: 0, _FLOOR: 1, _CEIL: 2, _MOD: 3, _MAX: 4, _MIN: 5}
_HINT = "write extents like '2*seq', 'batch*seq + 1', 'n//4', 'ceil(n/4)', 'n % 4', 'max(a, b)'"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Atom:
    """One atom: a symbol (``name``) or an op ``kind`` over ``args`` (Exprs). Compared by ``key``."""

    __slots__ = ("kind", "name", "args", "key", "_hash")

    def __init__(self, kind: str, name: str = "", args: tuple = ()):
        self.kind, self.name, self.args = kind, name, args
        self.key = (_KIND_ORDER[kind], name, tuple(a._key for a in args))
        self._hash = hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Atom) and self.key == other.key

    def __hash__(self):
        return self._hash


def _mono_key(mono: tuple) -> tuple:
    return tuple((a.key, p) for a, p in mono)


def _term_order(item) -> tuple:
    mono, _ = item
    return (-sum(p for _, p in mono), _mono_key(mono))


class Expr:
    """An immutable integer expression, e.g. ``Expr('2*seq + 1')``; build with ``sym``, ints and ``+ - * // %``."""

    __slots__ = ("_terms", "_key", "_hash", "_free", "_str")

    def __init__(self, value=0):
        if isinstance(value, Expr):
            terms = value._terms
        elif isinstance(value, str):
            terms = parse(value)._terms
        elif _is_int(value):
            terms = (((), value),) if value else ()
        else:
            raise SymbolError(f"Expr({value!r}): expected an int, an Expr or expression text; {_HINT}")
        _init(self, terms)

    # -- identity ---------------------------------------------------------------------------------
    def __setattr__(self, name, value):
        raise AttributeError(f"Expr is immutable: cannot set {name!r}; build a new Expr with + - * // %")

    def __reduce__(self):
        return (Expr, (str(self),))

    def __eq__(self, other):
        if isinstance(other, Expr):
            return self._key == other._key
        if _is_int(other):
            return self.constant_value == other
        return NotImplemented

    def __hash__(self):
        return self._hash

    def __str__(self):
        if self._str is None:
            object.__setattr__(self, "_str", _format(self._terms))
        return self._str

    def __repr__(self):
        return f"Expr({str(self)!r})"

    def __bool__(self):
        raise SymbolError(f"the truth value of {self} is undecided without facts; use FactBase.equal / le / divides")

    def __int__(self):
        v = self.constant_value
        if v is None:
            raise SymbolError(f"int({self}): the expression has free symbols {sorted(self.free_symbols)}; "
                              "evaluate(bindings) it or subs() the symbols first")
        return v

    # -- accessors --------------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        """True when no symbol occurs: ``(sym('n') - sym('n')).is_constant -> True``."""
        return not self._terms or (len(self._terms) == 1 and not self._terms[0][0])

    @property
    def constant_value(self):
        """The int value of a constant Expr, else None: ``const(4).constant_value -> 4``."""
        if not self._terms:
            return 0
        if len(self._terms) == 1 and not self._terms[0][0]:
            return self._terms[0][1]
        return None

    @property
    def free_symbols(self) -> frozenset:
        """Names of the symbols that occur: ``(sym('a') * sym('b')).free_symbols -> {'a', 'b'}``."""
        if self._free is None:
            names = set()
            for mono, _ in self._terms:
                for atom, _ in mono:
                    names |= _atom_free(atom)
            object.__setattr__(self, "_free", frozenset(names))
        return self._free

    @property
    def coefficients(self) -> tuple:
        """Terms as ``(monomial, coefficient)`` pairs, the constant under ``Expr(1)``:
        ``Expr('2*n + 1').coefficients -> ((Expr('n'), 2), (Expr('1'), 1))``."""
        return tuple((_from_terms((((mono, 1),))), c) for mono, c in self._terms)

    @property
    def is_monomial(self) -> bool:
        """One term (a coefficient times a product of atoms; a nonzero constant counts): ``Expr('2*a*b')``."""
        return len(self._terms) == 1

    @property
    def name(self):
        """The symbol's name when this Expr is one bare symbol, else None: ``sym('seq').name -> 'seq'``."""
        if len(self._terms) == 1:
            mono, c = self._terms[0]
            if c == 1 and len(mono) == 1 and mono[0][1] == 1 and mono[0][0].kind == _SYM:
                return mono[0][0].name
        return None

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, bindings: Mapping) -> int:
        """The int value at ``bindings`` (Python floor semantics): ``Expr('n//4').evaluate({'n': 9}) -> 2``."""
        if not isinstance(bindings, Mapping):
            raise SymbolError(f"evaluate({bindings!r}): expected a dict of symbol name -> int, e.g. {{'seq': 128}}")
        return _eval_terms(self, self._terms, bindings)

    def subs(self, mapping: Mapping) -> "Expr":
        """Replace symbols by ints or Exprs: ``Expr('2*n').subs({'n': Expr('m + 1')}) -> Expr('2*m + 2')``."""
        if not isinstance(mapping, Mapping):
            raise SymbolError(f"subs({mapping!r}): expected a dict of symbol name -> int or Expr")
        clean = {}
        for k, v in mapping.items():
            key = k.name if isinstance(k, Expr) else k
            if not isinstance(key, str) or not _NAME.match(key):
                raise SymbolError(f"subs: key {k!r} is not a symbol name; use names like 'seq' or sym('seq')")
            clean[key] = _coerce(v, "subs")
        if not clean or not (self.free_symbols & clean.keys()):
            return self
        return _subs_terms(self._terms, clean)

    # -- arithmetic -------------------------------------------------------------------------------
    def __add__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _add(self, o)

    __radd__ = __add__

    def __sub__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _add(self, _scale(o, -1))

    def __rsub__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _add(o, _scale(self, -1))

    def __mul__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _mul(self, o)

    __rmul__ = __mul__

    def __neg__(self):
        return _scale(self, -1)

    def __pos__(self):
        return self

    def __pow__(self, exponent):
        if not _is_int(exponent) or not 0 <= exponent <= MAX_POWER:
            raise SymbolError(f"({self})**{exponent!r}: the exponent must be an int in 0..{MAX_POWER}")
        out = Expr(1)
        for _ in range(exponent):
            out = _mul(out, self)
        return out

    def __floordiv__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _floordiv(self, o)

    def __rfloordiv__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _floordiv(o, self)

    def __mod__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _mod(self, o)

    def __rmod__(self, other):
        o = _maybe(other)
        return NotImplemented if o is None else _mod(o, self)

    def __truediv__(self, other):
        raise SymbolError(f"({self}) / ({other}): extents are ints; use // for floor division or ceil_div(a, b)")

    __rtruediv__ = __truediv__


def _init(e: Expr, terms: tuple) -> None:
    object.__setattr__(e, "_terms", terms)
    key = tuple((_mono_key(m), c) for m, c in terms)
    object.__setattr__(e, "_key", key)
    const_value = e.constant_value
    object.__setattr__(e, "_hash", hash(const_value) if const_value is not None else hash(key))
    object.__setattr__(e, "_free", None)
    object.__setattr__(e, "_str", None)


def _from_terms(terms) -> Expr:
    e = Expr.__new__(Expr)
    _init(e, tuple(terms))
    return e


def _from_poly(poly: dict) -> Expr:
    items = [(m, c) for m, c in poly.items() if c]
    if len(items) > MAX_TERMS:
        raise SymbolError(f"too many terms: the expression has {len(items)}, more than the {MAX_TERMS} allowed; "
                          "expand less (e.g. keep a product of sums as a smaller extent)")
    items.sort(key=_term_order)
    return _from_terms(items)


def _atom_expr(atom: _Atom) -> Expr:
    return _from_terms(((((atom, 1),), 1),))


def _maybe(x):
    if isinstance(x, Expr):
        return x
    if _is_int(x):
        return Expr(x)
    return None


def _coerce(x, where: str) -> Expr:
    if isinstance(x, str):
        return parse(x)
    e = _maybe(x)
    if e is None:
        raise SymbolError(f"{where}: {x!r} is not an int, an Expr or expression text; {_HINT}")
    return e


def _add(a: Expr, b: Expr) -> Expr:
    if not b._terms:
        return a
    if not a._terms:
        return b
    poly = dict(a._terms)
    for m, c in b._terms:
        poly[m] = poly.get(m, 0) + c
    return _from_poly(poly)


def _scale(a: Expr, k: int) -> Expr:
    if k == 1:
        return a
    if k == 0:
        return Expr(0)
    return _from_terms(tuple((m, c * k) for m, c in a._terms))


def _mono_mul(m1: tuple, m2: tuple) -> tuple:
    if not m1:
        return m2
    if not m2:
        return m1
    powers = dict(m1)
    for a, p in m2:
        powers[a] = powers.get(a, 0) + p
    return tuple(sorted(powers.items(), key=lambda ap: ap[0].key))


def _mul(a: Expr, b: Expr) -> Expr:
    if len(a._terms) * len(b._terms) > MAX_TERMS * 4:
        raise SymbolError(f"({a}) * ({b}) would have too many terms (more than {MAX_TERMS}); "
                          "keep extents small polynomials")
    poly: dict = {}
    for m1, c1 in a._terms:
        for m2, c2 in b._terms:
            m = _mono_mul(m1, m2)
            poly[m] = poly.get(m, 0) + c1 * c2
    return _from_poly(poly)


def _content(a: Expr) -> int:
    g = 0
    for _, c in a._terms:
        g = math.gcd(g, c)
    return g


def _exact_div(a: Expr, k: int) -> Expr:
    return _from_terms(tuple((m, c // k) for m, c in a._terms))


def _positive_divisor(a: Expr, b: Expr, op: str) -> int | None:
    bv = b.constant_value
    if bv is not None and bv <= 0:
        raise SymbolError(f"({a}) {op} ({b}): the divisor must be positive (extents are >= 0); got {bv}")
    return bv


def _floordiv(a: Expr, b: Expr) -> Expr:
    bv = _positive_divisor(a, b, "//")
    if bv is not None:
        av = a.constant_value
        if av is not None:
            return Expr(av // bv)
        g = math.gcd(_content(a), bv)
        a, bv = _exact_div(a, g), bv // g
        if bv == 1:
            return a
        b = Expr(bv)
    return _atom_expr(_Atom(_FLOOR, args=(a, b)))


def _ceildiv(a: Expr, b: Expr) -> Expr:
    bv = _positive_divisor(a, b, "ceil_div")
    if bv is not None:
        av = a.constant_value
        if av is not None:
            return Expr(-(-av // bv))
        g = math.gcd(_content(a), bv)
        a, bv = _exact_div(a, g), bv // g
        if bv == 1:
            return a
        b = Expr(bv)
    return _atom_expr(_Atom(_CEIL, args=(a, b)))


def _mod(a: Expr, b: Expr) -> Expr:
    bv = _positive_divisor(a, b, "%")
    if bv is not None:
        av = a.constant_value
        if av is not None:
            return Expr(av % bv)
        g = math.gcd(_content(a), bv)
        if g == bv:
            return Expr(0)
        if g > 1:  # (g*a') % (g*b') == g * (a' % b')
            return _scale(_mod(_exact_div(a, g), Expr(bv // g)), g)
    return _atom_expr(_Atom(_MOD, args=(a, b)))


def _single_atom(e: Expr):
    if len(e._terms) == 1:
        mono, c = e._terms[0]
        if c == 1 and len(mono) == 1 and mono[0][1] == 1:
            return mono[0][0]
    return None


def _maxmin(kind: str, args) -> Expr:
    flat = []
    for e in args:
        atom = _single_atom(e)
        flat.extend(atom.args if atom is not None and atom.kind == kind else (e,))
    kept: list = []
    for e in flat:
        for i, f in enumerate(kept):
            d = _add(e, _scale(f, -1)).constant_value
            if d is not None:  # e and f differ by a constant: one of them always wins
                if (d > 0) if kind == _MAX else (d < 0):
                    kept[i] = e
                break
        else:
            kept.append(e)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=lambda e: e._key)
    return _atom_expr(_Atom(kind, args=tuple(kept)))


def _atom_free(atom: _Atom) -> frozenset:
    if atom.kind == _SYM:
        return frozenset((atom.name,))
    out: frozenset = frozenset()
    for a in atom.args:
        out |= a.free_symbols
    return out


# -- evaluation and substitution ------------------------------------------------------------------


def _eval_atom(root: Expr, atom: _Atom, b: Mapping) -> int:
    k = atom.kind
    if k == _SYM:
        try:
            v = b[atom.name]
        except KeyError:
            raise SymbolError(
                f"cannot evaluate {root}: symbol {atom.name!r} is unbound; pass a value for it, e.g. "
                f"evaluate({{{', '.join(repr(s) + ': ...' for s in sorted(root.free_symbols))}}})"
            ) from None
        if not _is_int(v):
            raise SymbolError(f"cannot evaluate {root}: symbol {atom.name!r} is bound to {v!r}; bind it to an int")
        return v
    vals = [_eval_terms(root, a._terms, b) for a in atom.args]
    if k == _MAX:
        return max(vals)
    if k == _MIN:
        return min(vals)
    x, y = vals
    if y == 0:
        raise SymbolError(f"cannot evaluate {root}: divisor {atom.args[1]} is 0 at {dict(b)}; "
                          "bind the symbols so that every divisor is positive")
    if k == _FLOOR:
        return x // y
    if k == _CEIL:
        return -(-x // y)
    return x % y


def _eval_terms(root: Expr, terms: tuple, b: Mapping) -> int:
    total = 0
    for mono, c in terms:
        v = c
        for atom, p in mono:
            v *= _eval_atom(root, atom, b) ** p
        total += v
    return total


def _subs_atom(atom: _Atom, m: dict) -> Expr:
    if atom.kind == _SYM:
        return m[atom.name] if atom.name in m else _atom_expr(atom)
    args = tuple(a if not (a.free_symbols & m.keys()) else _subs_terms(a._terms, m) for a in atom.args)
    return _rebuild(atom.kind, args)


def _rebuild(kind: str, args: tuple) -> Expr:
    if kind == _FLOOR:
        return _floordiv(*args)
    if kind == _CEIL:
        return _ceildiv(*args)
    if kind == _MOD:
        return _mod(*args)
    return _maxmin(kind, args)


def _subs_terms(terms: tuple, m: dict) -> Expr:
    out = Expr(0)
    for mono, c in terms:
        t = Expr(c)
        for atom, p in mono:
            t = _mul(t, _subs_atom(atom, m) ** p)
        out = _add(out, t)
    return out


# -- text form ------------------------------------------------------------------------------------


def _simple(e: Expr) -> bool:
    v = e.constant_value
    if v is not None:
        return v >= 0
    atom = _single_atom(e)
    return atom is not None and atom.kind in (_SYM, _CEIL, _MAX, _MIN)


def _wrap(e: Expr) -> str:
    return str(e) if _simple(e) else f"({e})"


def _atom_str(atom: _Atom) -> str:
    k = atom.kind
    if k == _SYM:
        return atom.name
    if k in (_MAX, _MIN):
        return f"{k}({', '.join(str(a) for a in atom.args)})"
    a, b = atom.args
    if k == _FLOOR:
        return f"{_wrap(a)}//{_wrap(b)}"
    if k == _MOD:
        return f"{_wrap(a)} % {_wrap(b)}"
    return f"ceil({_wrap(a)}/{_wrap(b)})"


def _format(terms: tuple) -> str:
    if not terms:
        return "0"
    parts = []
    for i, (mono, c) in enumerate(terms):
        neg, mag = c < 0, abs(c)
        if not mono:
            body = str(mag)
        else:
            wrap = mag != 1 or len(mono) > 1 or mono[0][1] != 1 or (neg and i == 0)
            factors = []
            for atom, p in mono:
                s = _atom_str(atom)
                if wrap and atom.kind in (_FLOOR, _MOD):
                    s = f"({s})"
                factors.append(s if p == 1 else f"{s}**{p}")
            body = "*".join(factors) if mag == 1 else f"{mag}*" + "*".join(factors)
        if i == 0:
            parts.append("-" + body if neg else body)
        else:
            parts.append((" - " if neg else " + ") + body)
    return "".join(parts)


# -- public constructors --------------------------------------------------------------------------


def sym(name: str) -> Expr:
    """A symbol: ``sym("batch") * 2 -> Expr('2*batch')``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SymbolError(f"sym({name!r}): a symbol name is an identifier like 'batch' or 's0'")
    return _atom_expr(_Atom(_SYM, name))


def const(value: int) -> Expr:
    """A constant: ``const(4) + 1 -> Expr('5')``."""
    if not _is_int(value):
        raise SymbolError(f"const({value!r}): a constant is an int (extents are integers)")
    return Expr(value)


def ceil_div(a, b) -> Expr:
    """Ceiling division: ``ceil_div(sym('n'), 4) -> Expr('ceil(n/4)')``; ``ceil_div(x, 1) -> x``."""
    return _ceildiv(_coerce(a, "ceil_div"), _coerce(b, "ceil_div"))


def max_(*args) -> Expr:
    """Maximum: ``max_(sym('a'), sym('b')) -> Expr('max(a, b)')``; ``max_(n + 1, n) -> n + 1``."""
    if not args:
        raise SymbolError("max_(): give at least one expression, e.g. max_(sym('a'), sym('b'))")
    return _maxmin(_MAX, [_coerce(a, "max_") for a in args])


def min_(*args) -> Expr:
    """Minimum: ``min_(sym('a'), 4) -> Expr('min(4, a)')``."""
    if not args:
        raise SymbolError("min_(): give at least one expression, e.g. min_(sym('a'), sym('b'))")
    return _maxmin(_MIN, [_coerce(a, "min_") for a in args])


def as_extent(x):
    """An extent as an int when constant, else an Expr: ``as_extent('2*4') -> 8``, ``as_extent('n')``."""
    if _is_int(x):
        if x < 0:
            raise SymbolError(f"extent {x}: extents are >= 0; give a non-negative int")
        return x
    if isinstance(x, str):
        x = parse(x)
    if isinstance(x, Expr):
        v = x.constant_value
        if v is None:
            return x
        return as_extent(v)
    raise SymbolError(f"extent {x!r} ({type(x).__name__}): expected an int >= 0, an Expr or text; {_HINT}")


def is_symbolic(x) -> bool:
    """True for a non-constant Expr: ``is_symbolic(sym('n')) -> True``, ``is_symbolic(4) -> False``."""
    return isinstance(x, Expr) and not x.is_constant


# -- parser ---------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|//|==|<=|>=|[-+*/%(),<>]))")


def _tokenize(text: str) -> list:
    """Tokens ``(kind, value, position)``; kind is 'int', 'name' or 'op'; ends with ('end', '', len)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        m = _TOKEN.match(text, i)
        if m is None:
            raise SymbolError(f"cannot parse {text!r}: unexpected character {text[i]!r} at position {i}; {_HINT}")
        start = m.start(m.lastindex)
        if m.group(1) is not None:
            out.append(("int", int(m.group(1)), start))
        elif m.group(2) is not None:
            out.append(("name", m.group(2), start))
        else:
            out.append(("op", m.group(3), start))
        i = m.end()
    out.append(("end", "", n))
    return out


class _Q:
    """A rational ``num/den`` met inside ceil()/floor(); ``pos`` is where its '/' was."""

    __slots__ = ("num", "den", "pos")

    def __init__(self, num: Expr, den: Expr, pos: int | None = None):
        self.num, self.den, self.pos = num, den, pos


class _Parser:
    _CEILS = ("ceil", "ceiling", "CeilToInt")
    _FLOORS = ("floor", "FloorToInt")

    def __init__(self, text: str, tokens: list):
        self.text, self.toks, self.i, self.depth = text, tokens, 0, 0

    # helpers
    def peek(self):
        return self.toks[self.i]

    def take(self):
        t = self.toks[self.i]
        self.i += 1
        return t

    def error(self, expected: str, tok=None):
        tok = tok or self.peek()
        found = "the end of the text" if tok[0] == "end" else repr(str(tok[1]))
        raise SymbolError(f"cannot parse {self.text!r} at position {tok[2]}: expected {expected} but found {found}; "
                          f"{_HINT}")

    def expect(self, op: str):
        t = self.peek()
        if t[0] != "op" or t[1] != op:
            self.error(repr(op))
        return self.take()

    def is_op(self, *ops) -> bool:
        t = self.peek()
        return t[0] == "op" and t[1] in ops

    def integer(self, q: _Q) -> Expr:
        if q.pos is not None:
            raise SymbolError(f"cannot parse {self.text!r} at position {q.pos}: '/' is true division, allowed only "
                              "inside ceil()/floor(); use '//' for floor division or ceil(a/b)")
        return q.num

    def make_q(self, num: Expr, den: Expr, pos) -> _Q:
        dv = den.constant_value
        if dv is not None:
            if dv == 0:
                raise SymbolError(f"cannot parse {self.text!r} at position {pos}: division by zero")
            if dv < 0:
                num, dv = -num, -dv
            g = math.gcd(_content(num), dv)
            num, dv = _exact_div(num, g), dv // g
            if dv == 1:
                return _Q(num, Expr(1))
            den = Expr(dv)
        return _Q(num, den, pos)

    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SymbolError(f"cannot parse {self.text!r} at position {self.peek()[2]}: nested more than "
                              f"{MAX_DEPTH} deep; write a flatter expression")

    # grammar
    def expr(self) -> _Q:
        q = self.term()
        while self.is_op("+", "-"):
            op = self.take()[1]
            r = self.term()
            if op == "-":
                r = _Q(-r.num, r.den, r.pos)
            if q.den == r.den:
                q = self.make_q(q.num + r.num, q.den, q.pos if q.pos is not None else r.pos)
            else:
                q = self.make_q(q.num * r.den + r.num * q.den, q.den * r.den, q.pos if q.pos is not None else r.pos)
        return q

    def term(self) -> _Q:
        q = self.unary()
        while self.is_op("*", "/", "//", "%"):
            tok = self.take()
            op, pos = tok[1], tok[2]
            r = self.unary()
            if op == "*":
                q = self.make_q(q.num * r.num, q.den * r.den, q.pos if q.pos is not None else r.pos)
            elif op == "/":
                q = self.make_q(q.num * r.den, q.den * r.num, pos)
            else:
                a, b = self.integer(q), self.integer(r)
                if b.constant_value is not None and b.constant_value <= 0:
                    raise SymbolError(f"cannot parse {self.text!r} at position {pos}: the divisor of {op!r} must be "
                                      f"positive, got {b}")
                q = _Q(_floordiv(a, b) if op == "//" else _mod(a, b), Expr(1))
        return q

    def unary(self) -> _Q:
        if self.is_op("-", "+"):
            op = self.take()[1]
            self.enter()
            q = self.unary()
            self.depth -= 1
            return _Q(-q.num, q.den, q.pos) if op == "-" else q
        return self.power()

    def power(self) -> _Q:
        q = self.primary()
        if self.is_op("**"):
            tok = self.take()
            self.enter()
            e = self.unary()
            self.depth -= 1
            k = e.num.constant_value if e.pos is None else None
            if k is None or not 0 <= k <= MAX_POWER:
                raise SymbolError(f"cannot parse {self.text!r} at position {tok[2]}: the exponent after '**' must be "
                                  f"an int in 0..{MAX_POWER}")
            q = self.make_q(q.num**k, q.den**k, q.pos)
        return q

    def primary(self) -> _Q:
        t = self.peek()
        if t[0] == "int":
            self.take()
            return _Q(Expr(t[1]), Expr(1))
        if t[0] == "name":
            self.take()
            if self.is_op("("):
                return self.call(t)
            return _Q(sym(t[1]), Expr(1))
        if self.is_op("("):
            self.take()
            self.enter()
            q = self.expr()
            self.depth -= 1
            self.expect(")")
            return q
        self.error("a number, a symbol or '('")

    def call(self, name_tok) -> _Q:
        name, pos = name_tok[1], name_tok[2]
        self.take()  # '('
        self.enter()
        args = [self.expr()]
        while self.is_op(","):
            self.take()
            args.append(self.expr())
        self.expect(")")
        self.depth -= 1

        def arity(n):
            if len(args) != n:
                raise SymbolError(f"cannot parse {self.text!r} at position {pos}: {name}() takes {n} argument(s), "
                                  f"got {len(args)}")

        if name in self._CEILS or name in self._FLOORS:
            arity(1)
            q = args[0]
            if q.den.constant_value == 1:
                return _Q(q.num, Expr(1))
            fn = _ceildiv if name in self._CEILS else _floordiv
            return _Q(fn(q.num, q.den), Expr(1))
        if name in ("IntTrueDiv", "FloatTrueDiv"):
            arity(2)
            a, b = (self.integer(q) for q in args)
            return self.make_q(a, b, pos)
        ints = [self.integer(q) for q in args]
        if name in ("Identity",):
            arity(1)
            return _Q(ints[0], Expr(1))
        if name in ("FloorDiv", "CleanDiv", "CeilDiv", "Mod", "PythonMod"):
            arity(2)
            a, b = ints
            if b.constant_value is not None and b.constant_value <= 0:
                raise SymbolError(f"cannot parse {self.text!r} at position {pos}: the divisor of {name}() must be "
                                  f"positive, got {b}")
            fn = {"FloorDiv": _floordiv, "CleanDiv": _floordiv, "CeilDiv": _ceildiv}.get(name, _mod)
            return _Q(fn(a, b), Expr(1))
        if name in ("Max", "max", "Min", "min"):
            return _Q(_maxmin(_MAX if name.lower() == "max" else _MIN, ints), Expr(1))
        raise SymbolError(f"cannot parse {self.text!r} at position {pos}: unknown function {name!r}; known: ceil, "
                          "ceiling, floor, max, min, FloorDiv, CeilDiv, Mod, PythonMod, CleanDiv, Max, Min, CeilToInt, "
                          "FloorToInt, IntTrueDiv, Identity")


def parse(text: str) -> Expr:
    """Read an extent, ours or torch's (sympy) text: ``parse("ceiling(s0/2) + 1") -> Expr('ceil(s0/2) + 1')``."""
    if not isinstance(text, str):
        raise SymbolError(f"parse({text!r}): expected expression text; {_HINT}")
    p = _Parser(text, _tokenize(text))
    if p.peek()[0] == "end":
        raise SymbolError(f"cannot parse {text!r}: the text is empty; {_HINT}")
    q = p.expr()
    if p.peek()[0] != "end":
        p.error("an operator (+ - * // % **) or the end")
    return p.integer(q)
