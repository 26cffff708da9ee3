"""Symbolic extents: canonical form, evaluation against Python ints (hypothesis), text round trip,
torch's printed SymInt expressions, and errors."""

from __future__ import annotations

import doctest
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardlayout.symbolic as symbolic_pkg
from shardlayout.errors import ShardingError, SymbolError
from shardlayout.symbolic import Expr, as_extent, ceil_div, const, is_symbolic, max_, min_, parse, sym
from shardlayout.symbolic import expr as expr_mod
from shardlayout.symbolic import facts as facts_mod

N = settings.default.max_examples

# -- random expression trees, evaluated two ways ---------------------------------------------------

NAMES = ("a", "b", "c")


def positive_trees(names=NAMES):
    """Divisors: positive whenever every symbol is >= 1."""
    leaves = st.one_of(st.integers(1, 6).map(lambda v: ("int", v)), st.sampled_from(names).map(lambda n: ("sym", n)))
    return st.recursive(
        leaves,
        lambda kids: st.tuples(st.sampled_from(["+", "*"]), kids, kids),
        max_leaves=3,
    )


def trees(names=NAMES, max_leaves=8):
    leaves = st.one_of(st.integers(-4, 6).map(lambda v: ("int", v)), st.sampled_from(names).map(lambda n: ("sym", n)))
    divisors = positive_trees(names)

    def extend(kids):
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*", "max", "min"]), kids, kids),
            st.tuples(st.sampled_from(["//", "ceil", "%"]), kids, divisors),
            st.tuples(st.just("neg"), kids),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves)


def build_expr(t, swap=False):
    k = t[0]
    if k == "int":
        return t[1]  # a plain int: exercises __radd__ and friends
    if k == "sym":
        return sym(t[1])
    if k == "neg":
        return -as_expr(build_expr(t[1], swap))
    a, b = build_expr(t[1], swap), build_expr(t[2], swap)
    if swap and k in ("+", "*", "max", "min"):
        a, b = b, a
    if k == "+":
        return a + b
    if k == "-":
        return a - b
    if k == "*":
        return a * b
    if k == "//":
        return a // b if isinstance(a, Expr) or isinstance(b, Expr) else Expr(a) // b
    if k == "ceil":
        return ceil_div(a, b)
    if k == "%":
        return a % b if isinstance(a, Expr) or isinstance(b, Expr) else Expr(a) % b
    return (max_ if k == "max" else min_)(a, b)


def build_int(t, env):
    k = t[0]
    if k == "int":
        return t[1]
    if k == "sym":
        return env[t[1]]
    if k == "neg":
        return -build_int(t[1], env)
    a, b = build_int(t[1], env), build_int(t[2], env)
    return {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "//": lambda: a // b,
        "ceil": lambda: -(-a // b),
        "%": lambda: a % b,
        "max": lambda: max(a, b),
        "min": lambda: min(a, b),
    }[k]()


def as_expr(x):
    return x if isinstance(x, Expr) else const(x)


bindings = st.fixed_dictionaries({n: st.integers(1, 30) for n in NAMES})


@given(trees(), st.lists(bindings, min_size=1, max_size=4))
def test_evaluate_matches_python_int_arithmetic(t, envs):
    e = as_expr(build_expr(t))
    for env in envs:
        assert e.evaluate(env) == build_int(t, env), (t, str(e), env)


@given(trees())
def test_text_round_trip_and_canonical_hash(t):
    e = as_expr(build_expr(t))
    back = parse(str(e))
    assert back == e and hash(back) == hash(e), (str(e), str(back))
    assert Expr(str(e)) == e
    assert eval(repr(e), {"Expr": Expr}) == e
    assert pickle.loads(pickle.dumps(e)) == e


@given(trees(), bindings)
def test_equal_however_built(t, env):
    e = as_expr(build_expr(t))
    swapped = as_expr(build_expr(t, swap=True))
    assert swapped == e and hash(swapped) == hash(e), (str(e), str(swapped))
    assert e + e == 2 * e and e - e == 0 and 1 * e == e and e * 0 == 0
    assert (e + 1) * (e - 1) == e * e - 1
    assert (e * 4) // 2 == 2 * e and (e * 4) % 2 == 0 and e // 1 == e and ceil_div(e, 1) == e
    assert str(e + sym("a")) == str(sym("a") + e)


@given(trees(), bindings, st.sampled_from(NAMES), trees(max_leaves=3))
def test_subs_agrees_with_evaluation(t, env, name, t2):
    e, repl = as_expr(build_expr(t)), as_expr(build_expr(t2))
    v = repl.evaluate(env)
    if v < 1:  # divisors in e are positive only for symbols >= 1
        repl, v = repl * repl + 1, v * v + 1
    env2 = dict(env, **{name: v})
    assert e.subs({name: repl}).evaluate(env) == e.evaluate(env2)
    assert e.subs(env).constant_value == e.evaluate(env)
    assert e.subs({}) is e


@given(trees())
def test_free_symbols_and_constants(t):
    e = as_expr(build_expr(t))
    assert e.free_symbols <= set(NAMES)
    if e.is_constant:
        assert e.constant_value == e.evaluate({}) and not is_symbolic(e)
    else:
        assert e.constant_value is None and is_symbolic(e) and e.free_symbols
        with pytest.raises(SymbolError, match="unbound"):
            e.evaluate({})
    total = sum((m * c for m, c in e.coefficients), const(0))
    assert total == e


# -- canonical form and simplification --------------------------------------------------------------

s, b, n = sym("s"), sym("b"), sym("n")


def test_canonical_examples():
    assert 2 * s + s == 3 * s and hash(2 * s + s) == hash(3 * s)
    assert b * s == s * b and str(s * b) == "b*s"
    assert const(2) + 2 == 4 and hash(const(4)) == hash(4) and const(4) == 4
    assert s - s == 0 and (s - s).is_constant
    assert 1 - s == -(s - 1)


def test_simplification_rules():
    assert (4 * s) // 2 == 2 * s
    assert (4 * s) % 2 == 0
    assert (6 * s) // 4 in (Expr("(6*s)//4"), Expr("(3*s)//2"))
    assert str((6 * s) // 4) == "(3*s)//2"
    assert s // 1 == s and ceil_div(s, 1) == s and s % 1 == 0
    assert (4 * s + 8) // 4 == s + 2 and ceil_div(4 * s + 8, 4) == s + 2
    assert const(7) // 2 == 3 and ceil_div(7, 2) == 4 and const(-7) // 2 == -4 and const(-7) % 3 == 2
    assert max_(s + 1, s) == s + 1 and min_(s + 1, s) == s and max_(3, 5) == 5
    assert max_(b, max_(s, n)) == max_(n, s, b)
    assert (6 * s) % 4 == 2 * ((3 * s) % 2) and ((6 * s) % 4).evaluate({"s": 3}) == 2
    assert (s + 1) ** 2 == s * s + 2 * s + 1


@pytest.mark.parametrize(
    "e, text",
    [
        (2 * sym("seq"), "2*seq"),
        (sym("batch") * sym("seq"), "batch*seq"),
        (sym("seq") + 1, "seq + 1"),
        (sym("seq") - 1, "seq - 1"),
        (ceil_div(n, 4), "ceil(n/4)"),
        (n // 4, "n//4"),
        ((n + 1) // 4, "(n + 1)//4"),
        (n % 4, "n % 4"),
        ((n + 1) % 4, "(n + 1) % 4"),
        (max_(sym("a"), sym("b")), "max(a, b)"),
        (min_(sym("a"), sym("b")), "min(a, b)"),
        (-(n // 4), "-(n//4)"),
        (3 * (n // 4) + 1, "3*(n//4) + 1"),
        (n * n * s - 2 * n + 5, "n**2*s - 2*n + 5"),
        (ceil_div(n + 1, b * s), "ceil((n + 1)/(b*s))"),
        (const(0), "0"),
        (const(-3), "-3"),
    ],
)
def test_text_form(e, text):
    assert str(e) == text and parse(text) == e and repr(e) == f"Expr({text!r})"


# -- torch / sympy text ------------------------------------------------------------------------------

s0, s1 = sym("s0"), sym("s1")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("s0*s1", s0 * s1),
        ("2*s1", 2 * s1),
        ("s0 + 1", s0 + 1),
        ("s0**2", s0 * s0),
        ("FloorDiv(s0, 2)", s0 // 2),
        ("CeilDiv(s0, 2)", ceil_div(s0, 2)),
        ("Mod(s0, 2)", s0 % 2),
        ("PythonMod(s0 + 1, s1)", (s0 + 1) % s1),
        ("(s0 + 1)//2", (s0 + 1) // 2),
        ("((s0 + 1)//2)", (s0 + 1) // 2),
        ("(s0//(2*s1))", s0 // (2 * s1)),
        ("2*((s0//2))", 2 * (s0 // 2)),
        ("ceiling(s0/2)", ceil_div(s0, 2)),
        ("floor(s0/2)", s0 // 2),
        ("floor(s0/2 + 1/2)", (s0 + 1) // 2),
        ("CeilToInt(IntTrueDiv(s0, 2))", ceil_div(s0, 2)),
        ("FloorToInt(IntTrueDiv(s0 + 1, 4))", (s0 + 1) // 4),
        ("Max(s0, s1)", max_(s0, s1)),
        ("Min(3, s0)", min_(s0, 3)),
        ("Max(1, s0, s1)", max_(1, s0, s1)),
        ("-s0", -s0),
        ("-s0**2", -(s0 * s0)),
        ("(s0)", s0),
        ("s0*s1 + 2*s1 - 1", s0 * s1 + 2 * s1 - 1),
        ("  7  ", const(7)),
    ],
)
def test_parse_torch_text(text, expected):
    assert parse(text) == expected


def test_parse_what_torch_prints():
    """Differential: the strings torch 2.x prints for its own sympy functions, evaluated by sympy."""
    sympy = pytest.importorskip("sympy")
    fns = pytest.importorskip("torch.utils._sympy.functions")
    a, c = sympy.symbols("s0 s1", integer=True, positive=True)
    exprs = [
        fns.FloorDiv(a, 2),
        fns.FloorDiv(a + 1, 2),
        fns.FloorDiv(a, 2 * c),
        fns.CeilToInt(fns.IntTrueDiv(a, 2)),
        fns.FloorToInt(fns.IntTrueDiv(a + 1, 4)),
        fns.PythonMod(a, 2),
        fns.PythonMod(a + 1, c),
        fns.Mod(a, 2),
        sympy.ceiling(a / 2),
        sympy.floor((a + 1) / 2),
        fns.Max(a, c),
        fns.Min(a, 3),
        2 * fns.FloorDiv(a, 2),
        -fns.FloorDiv(-a, 2),
        a * c + 2 * c - 1,
        a**2,
    ]
    for e in exprs:
        ours = parse(str(e))
        for v0, v1 in ((1, 1), (5, 3), (8, 2), (13, 7)):
            assert ours.evaluate({"s0": v0, "s1": v1}) == int(e.subs({a: v0, c: v1})), str(e)


# -- accessors ---------------------------------------------------------------------------------------


def test_accessors():
    e = Expr("2*n*s + 3*n + 1")
    assert e.free_symbols == {"n", "s"}
    assert e.coefficients == ((Expr("n*s"), 2), (Expr("n"), 3), (Expr(1), 1))
    assert not e.is_monomial and Expr("2*n*s").is_monomial and const(3).is_monomial
    assert e.subs({"n": 2}) == 4 * s + 7 and e.subs({n: sym("m") + 1}) == Expr("2*m*s + 2*s + 3*m + 4")
    assert e.evaluate({"n": 2, "s": 3}) == 19
    assert sym("seq").name == "seq" and (2 * s).name is None
    assert int(const(5)) == 5
    assert as_extent(4) == 4 and as_extent(const(4)) == 4 and as_extent("2*4") == 8
    assert as_extent("n") == n and as_extent(n) == n and isinstance(as_extent(const(3)), int)
    assert is_symbolic(n) and not is_symbolic(const(3)) and not is_symbolic(3)


def test_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        s._terms = ()  # noqa: B018
    assert {s + 1: "x"}[1 + s] == "x"


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, where",
    [
        ("n + * 2", "position 4"),
        ("s0/2", "position 2"),
        ("2.0*n", "position 1"),
        ("foo(n)", "unknown function 'foo'"),
        ("(n", "expected ')'"),
        ("", "empty"),
        ("n//0", "positive"),
        ("n n", "position 2"),
        ("n**n", "exponent"),
        ("Max()", "position 4"),
        ("FloorDiv(n)", "2 argument"),
        ("(" * 200 + "n" + ")" * 200, "nested"),
    ],
)
def test_parse_errors_name_the_position(text, where):
    with pytest.raises(SymbolError, match="cannot parse") as info:
        parse(text)
    assert where in str(info.value)


def test_errors():
    assert issubclass(SymbolError, ShardingError)
    with pytest.raises(SymbolError, match="symbol 'b' is unbound"):
        (n + b).evaluate({"n": 1})
    with pytest.raises(SymbolError, match="bind it to an int"):
        n.evaluate({"n": 1.5})
    with pytest.raises(SymbolError, match="identifier"):
        sym("1x")
    with pytest.raises(SymbolError, match="positive"):
        n // 0
    with pytest.raises(SymbolError, match="positive"):
        ceil_div(n, -2)
    with pytest.raises(SymbolError, match="use //"):
        n / 2  # noqa: B018
    with pytest.raises(SymbolError, match="undecided"):
        bool(n)
    with pytest.raises(SymbolError, match="free symbols"):
        int(n)
    with pytest.raises(SymbolError, match="divisor"):
        (s // n).evaluate({"s": 3, "n": 0})
    with pytest.raises(SymbolError, match="too many terms"):
        (sym("a") + b + n + s + 1) ** 40
    for bad in (True, 1.5, -1, None, [3]):
        with pytest.raises(SymbolError):
            as_extent(bad)
    with pytest.raises(SymbolError, match=">= 0"):
        as_extent("2 - 5")
    with pytest.raises(SymbolError):
        const(True)


def test_no_torch_or_sympy_in_core():
    import subprocess
    import sys

    code = (
        "import sys, shardlayout.symbolic as m; m.parse('ceiling(s0/2)'); "
        "bad = [k for k in ('torch', 'sympy') if k in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("module", [symbolic_pkg, expr_mod, facts_mod])
def test_module_doctests(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
