"""Guards and the FactBase: every decision is checked sound against brute force over a box of
bindings (hypothesis), plus the worked examples and errors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout.errors import SymbolError
from shardlayout.symbolic import Expr, FactBase, Guard, ceil_div, max_, sym

from .test_expr import as_expr, build_expr, trees

N = settings.default.max_examples
SYMS = ("a", "b")
BOX = range(1, 19)  # brute force: every (a, b) in BOX x BOX
ENVS = [dict(zip(SYMS, v)) for v in itertools.product(BOX, repeat=len(SYMS))]

a, b = sym("a"), sym("b")
sym_exprs = st.sampled_from(SYMS).map(sym)
linear = st.builds(lambda c, x, d: c * x + d, st.sampled_from([1, 1, 2, 3, -1]), sym_exprs, st.integers(-3, 3))
targets = st.one_of(sym_exprs, sym_exprs, linear, st.sampled_from([a * b, a + b, 2 * a - b, a * b + a]))


def _range(e, lo, width):
    return Guard.range(e, lo, None if width is None else lo + width)


guards = st.one_of(
    st.builds(Guard.divisible, targets, st.integers(1, 6)),
    st.builds(Guard.divisible, targets, st.integers(1, 6)),
    st.builds(_range, targets, st.integers(-4, 20), st.one_of(st.none(), st.integers(0, 24))),
    st.builds(lambda e, hi: Guard.range(e, None, hi), targets, st.integers(1, 40)),
    st.builds(Guard.eq, targets, st.integers(-2, 24)),
)
guard_sets = st.lists(guards, max_size=3)


def satisfying(gs):
    return [env for env in ENVS if all(g.holds(env) for g in gs)]


def query_exprs(gs):
    """Random expressions, and ones built from the guards' expressions (so decisions are often decided)."""
    built = st.builds(
        lambda g, k, d, extra: k * g.expr + d + extra,
        st.sampled_from(gs),
        st.integers(-3, 4),
        st.integers(-3, 3),
        st.sampled_from([0, 0, a, 2 * b, a * b]),
    ) if gs else st.nothing()
    random_trees = trees(SYMS, max_leaves=6).map(lambda t: as_expr(build_expr(t)))
    products = st.builds(lambda i, j, c: c * a**i * b**j, st.integers(0, 2), st.integers(0, 2), st.integers(-3, 4))
    return st.one_of(built, random_trees, products)


def check_divides(facts, e, vals):
    for m in range(1, 9):
        r = facts.divides(m, e)
        if r is True:
            assert all(v % m == 0 for v in vals), (str(facts), m, str(e))
        elif r is False:
            assert all(v % m for v in vals), (str(facts), m, str(e))


def check_bounds(facts, e, vals):
    lo, hi = facts.bounds(e)
    assert lo is None or all(v >= lo for v in vals), (str(facts), str(e), lo)
    assert hi is None or all(v <= hi for v in vals), (str(facts), str(e), hi)


def check_order(facts, x, y, xs, ys):
    pairs = list(zip(xs, ys))
    oracle = {
        "equal": lambda p, q: p == q,
        "le": lambda p, q: p <= q,
        "lt": lambda p, q: p < q,
        "ge": lambda p, q: p >= q,
        "gt": lambda p, q: p > q,
    }
    for name, op in oracle.items():
        r = getattr(facts, name)(x, y)
        if r is True:
            assert all(op(p, q) for p, q in pairs), (str(facts), name, str(x), str(y))
        elif r is False:
            assert not any(op(p, q) for p, q in pairs), (str(facts), name, str(x), str(y))


@settings(max_examples=N)
@given(st.data())
def test_decisions_are_sound(data):
    gs = data.draw(guard_sets)
    facts = FactBase(tuple(gs))
    sat = satisfying(gs)
    qs = data.draw(st.lists(query_exprs(gs), min_size=2, max_size=4))
    vals = [[q.evaluate(env) for env in sat] for q in qs]
    for q, vs in zip(qs, vals):
        check_divides(facts, q, vs)
        check_bounds(facts, q, vs)
    for (x, xs), (y, ys) in itertools.combinations(list(zip(qs, vals)), 2):
        check_order(facts, x, y, xs, ys)
    c = data.draw(st.integers(-2, 30))
    check_order(facts, qs[0], c, vals[0], [c] * len(sat))


@settings(max_examples=N)
@given(guard_sets, st.lists(guards, min_size=1, max_size=4), guard_sets)
def test_implies_and_minimal_are_sound(gs, asked, background):
    facts = FactBase(tuple(gs))
    sat = satisfying(gs)
    for g in asked:
        if facts.implies(g):
            assert all(g.holds(env) for env in sat), (str(facts), str(g))
    assert all(facts.implies(g) for g in gs)
    base = FactBase(tuple(background))
    kept = base.minimal(asked)
    assert set(kept) <= set(asked) and kept == base.minimal(list(reversed(asked)))
    for env in satisfying(tuple(background) + kept):
        assert all(g.holds(env) for g in asked), (str(base), [str(g) for g in kept], [str(g) for g in asked])


@settings(max_examples=max(30, N // 2))
@given(guard_sets, st.integers(0, 3), st.integers(0, 2**16))
def test_sample_satisfies_or_refuses(gs, k, seed):
    facts = FactBase(tuple(gs))
    sat = satisfying(gs)
    try:
        got = facts.sample(k, seed, hi=BOX[-1], symbols=SYMS)
    except SymbolError:
        assert not sat, (str(facts), sat[:3])
        return
    assert len(got) == k and got == facts.sample(k, seed, hi=BOX[-1], symbols=SYMS)
    for env in got:
        assert set(env) == set(SYMS) and env in ENVS and all(g.holds(env) for g in gs)
    if k <= len(sat):
        assert len({tuple(sorted(env.items())) for env in got}) == k


@given(guards)
def test_guard_text_round_trip(g):
    back = Guard.parse(str(g))
    assert back == g, (str(g), str(back))
    assert eval(repr(g), {"Guard": Guard}) == g
    for env in ENVS[:40]:
        assert back.holds(env) == g.holds(env)


# -- worked examples ---------------------------------------------------------------------------------

batch, seq = sym("batch"), sym("seq")
BS = FactBase().assume("batch % 2 == 0").assume("seq % 4 == 0")


def test_divides_examples():
    assert BS.divides(8, batch * seq) is True
    assert BS.divides(8, "batch*seq + 16*seq") is True
    assert BS.divides(8, seq) is None
    assert FactBase().divides(2, 2 * seq) is True
    assert FactBase().divides(2, seq) is None
    assert FactBase().divides(2, seq + 1) is None
    assert FactBase().divides(2, 2 * seq + 1) is False
    assert FactBase().divides(4, 2 * seq + 1) is False
    assert FactBase().divides(3, 7) is False and FactBase().divides(1, seq) is True
    assert BS.divides(2, seq // 2) is True and BS.divides(2, max_(batch, seq)) is True
    assert BS.divides(4, "(batch*seq) % 4") is True
    compound = FactBase().assume("(a + b) % 6 == 0")
    assert compound.divides(3, "2*a + 2*b") is True and compound.divides(3, "2*a + 2*b + 1") is False
    assert FactBase().assume("seq == 12").divides(4, seq) is True


def test_order_examples():
    f = FactBase()
    assert f.equal(2 * seq + seq, 3 * seq) is True
    assert f.equal(seq, seq + 1) is False and f.equal("2*s + 1", "2*t") is False
    assert f.equal(batch, seq) is None
    assert f.le(seq, batch * seq) is True and f.lt(seq, batch * seq) is None
    assert f.lt(seq, seq + 1) is True and f.gt(seq, 0) is True and f.ge(seq, 1) is True
    assert f.le(seq + 1, seq) is False and f.lt(0, seq) is True
    g = FactBase().assume("2 <= seq <= 64")
    assert g.le(seq, 64) is True and g.lt(seq, 64) is None and g.gt(seq, 64) is False
    assert g.le(ceil_div(seq, 4), 16) is True


def test_bounds_examples():
    f = FactBase().assume("2 <= seq <= 64").assume("batch % 4 == 0")
    assert f.bounds("seq + 1") == (3, 65)
    assert f.bounds("batch") == (4, None)
    assert f.bounds("-seq") == (-64, -2)
    assert f.bounds("seq // 4") == (0, 16) and f.bounds("ceil(seq/4)") == (1, 16)
    assert f.bounds("seq % 8") == (0, 7) and f.bounds("max(seq, batch)") == (4, None)
    assert FactBase().bounds("a*b - a") == (0, None)
    assert FactBase().assume("a*b <= 12").bounds("a*b + 1") == (2, 13)
    assert FactBase().assume("3*s + 1 == 13").bounds("s") == (4, 4)


def test_implies_and_minimal_examples():
    assert BS.implies("batch*seq % 8 == 0") and BS.implies(Guard.divisible(batch * seq, 8))
    assert not BS.implies("batch*seq % 16 == 0")
    assert FactBase().implies("seq >= 1") and not FactBase().implies("seq >= 2")
    kept = FactBase().minimal(["n % 4 == 0", "n % 2 == 0", "n % 4 == 0"])
    assert kept == (Guard.parse("n % 4 == 0"),)
    kept = FactBase().minimal(["batch*seq % 8 == 0", "batch % 2 == 0", "seq % 4 == 0"])
    assert kept == (Guard.parse("batch % 2 == 0"), Guard.parse("seq % 4 == 0"))
    assert BS.minimal(["batch*seq % 8 == 0", "n >= 2"]) == (Guard.parse("n >= 2"),)


def test_guards_text_and_kinds():
    assert str(Guard.divisible("batch", 2)) == "batch % 2 == 0"
    assert str(Guard.range("batch", 2, 1024)) == "2 <= batch <= 1024"
    assert str(Guard.eq("seq", 128)) == "seq == 128"
    assert str(Guard.range("seq", lo=8)) == "seq >= 8" and str(Guard.range("seq", hi=8)) == "seq <= 8"
    assert str(Guard.divisible("a + b", 4)) == "(a + b) % 4 == 0"
    assert Guard.parse("10 > n > 2") == Guard.range("n", 3, 9)
    assert Guard.parse("8 <= n") == Guard.range("n", lo=8)
    assert Guard.parse("0 == n % 4") == Guard.divisible("n", 4)
    assert Guard.parse("n % 4 == 1") == Guard.eq(Expr("n % 4"), 1)
    assert Guard.parse("a + 1 % 4 == 0") == Guard.eq("a + 1", 0)
    assert Guard.parse("n % 4 == 0").holds({"n": 8}) and not Guard.parse("n < 4").holds({"n": 4})
    assert BS.guards == (Guard.parse("batch % 2 == 0"), Guard.parse("seq % 4 == 0"))
    assert BS == FactBase(("seq % 4 == 0", "batch % 2 == 0")) and hash(BS) == hash(FactBase(BS.guards[::-1]))
    assert BS.assume("batch % 2 == 0") == BS and BS.modulus("seq") == 4 and BS.modulus("x") == 1
    assert BS.free_symbols == {"batch", "seq"}


def test_sample_examples():
    got = BS.sample(3, seed=7)
    assert got == BS.sample(3, seed=7) and len({tuple(sorted(d.items())) for d in got}) == 3
    assert all(d["batch"] % 2 == 0 and d["seq"] % 4 == 0 and 1 <= d["seq"] <= 64 for d in got)
    assert FactBase().assume("seq == 128").sample(2, 0, hi=200) == [{"seq": 128}, {"seq": 128}]
    assert FactBase().sample(1, 0, symbols=("n",))[0].keys() == {"n"}
    assert FactBase().assume("a + b == 5").sample(2, 3, hi=4)[0]["a"] in range(1, 5)


def test_errors():
    with pytest.raises(SymbolError, match="no value of 'seq'"):
        FactBase().assume("seq % 128 == 0").sample(2, 0)
    with pytest.raises(SymbolError, match="no binding"):
        FactBase().assume("a + b == 40").sample(1, 0, hi=10)
    with pytest.raises(SymbolError, match="position"):
        Guard.parse("n % == 0")
    with pytest.raises(SymbolError, match="one comparison"):
        Guard.parse("n + 1")
    with pytest.raises(SymbolError, match="must be an int"):
        Guard.parse("a <= b")
    with pytest.raises(SymbolError, match="lo > hi"):
        Guard.range("n", 5, 2)
    with pytest.raises(SymbolError, match="positive int modulus"):
        Guard.divisible("n", 0)
    with pytest.raises(SymbolError, match="positive int"):
        FactBase().divides(0, "n")
    with pytest.raises(SymbolError, match="tuple of guards"):
        FactBase("n % 2 == 0")
