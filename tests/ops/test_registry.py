"""The op registry: signatures parsed and enforced before any rule runs, register_op for users."""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout import Mesh, OpError, Sharding, ShardingSpecError, UnsupportedOp, propagate, register_op
from shardlayout.ops import FactorMap, factor_rule, get_op, parse_signature, registered
from shardlayout.plan import plan
from shardlayout.program import ProgramBuilder

M = Mesh.parse("dp=2,tp=4")
X = Sharding.parse("[dp*4, tp*3]", M)


def test_signature_text_is_parsed_into_typed_params():
    sig = parse_signature("x, w?, *rest ; dim: dim = -1, k: int[1..8], mask: bool? = None")
    assert [(t.name, t.optional, t.variadic) for t in sig.tensors] == [("x", False, False), ("w", True, False),
                                                                       ("rest", False, True)]
    k = sig.param("k")
    assert (k.type, k.low, k.high) == ("int", 1, 8) and sig.param("mask").nullable
    for bad in ("x ; dim: dimension", "*xs, y", "x ; k int", "x ; k: int = nope"):
        with pytest.raises(OpError):
            parse_signature(bad)


@pytest.mark.parametrize("op,inputs,params,match", [
    ("sum", [X], {"dim": 5}, r"dim = 5 is out of range \[-2, 1\]"),
    ("sum", [X], {"dimm": 1}, "unknown param.*'dimm'.*takes dim, dtype, keepdim"),
    ("sum", [X], {"keepdim": 1}, "keepdim = 1 is not a bool"),
    ("topk", [X], {"k": 99, "dim": 1}, "k = 99 is out of range for dim 1 of size 12"),
    ("topk", [X], {"k": -1}, r"k = -1 is out of range \[0..\]"),
    ("topk", [X], {}, "param k .* is required"),
    ("mm", [X], {}, r"got 1 tensor input\(s\), expects \(a, b\)"),
    ("mm", [X, Sharding.parse("[tp*4, 6]", M)], {}, "input 1 dim 0 has size 16 where input 0 has 12"),
    ("cat", [X, Sharding.parse("[8, 5]", M)], {"dim": 0}, "input 1 has shape .8, 5., input 0 has .8, 12."),
    ("einsum", [X, X], {"equation": "ab,bc"}, "needs an explicit '->'"),
    ("einsum", [X, X], {"equation": "aa,ab->ab"}, "must be distinct letters"),
    ("unsqueeze", [X], {"dim": 3}, r"dim = 3 is out of range \[-3, 2\]"),
    ("view", [X], {"size": (7, 7)}, "has 49 elements"),
])
def test_bad_calls_are_refused_before_the_rule_runs(op, inputs, params, match):
    with pytest.raises(ShardingSpecError, match=match):  # OpError, or the view's own spec error
        propagate(op, inputs, **params)


def test_dims_are_normalised_before_the_rule_sees_them():
    assert get_op("sum").bind((X,), {"dim": -1})["dim"] == 1
    assert str(propagate("sum", [X], dim=-1).outputs[0]) == str(propagate("sum", [X], dim=1).outputs[0])


def test_unknown_ops_name_the_way_in():
    with pytest.raises(UnsupportedOp, match="register_op"):
        propagate("frobnicate", [X])


def test_every_op_is_declared_once_with_a_signature():
    ops = registered()
    assert len(ops) > 120
    for name, op in ops.items():
        assert op.signature.text is not None and callable(op.rule), name
        assert op.numpy is not None or op.not_simulated, name


def test_register_op_plans_and_verifies_a_user_op():
    def scaled(name, inputs, params):
        return FactorMap(("mk", "kn"), "mn", linear="multi")

    register_op("test_scaled_mm", "a, b ; scale: float = 1.0", factor_rule(scaled),
                lambda a, b, scale=1.0: (a @ b) * scale, replace_existing=True)
    with pytest.raises(OpError, match="already registered"):
        register_op("test_scaled_mm", "a, b", factor_rule(scaled))
    b = ProgramBuilder()
    x, w = b.input("x", (8, 16)), b.param("w", (16, 6))
    y = b.op("test_scaled_mm", [x, w], name="y", scale=0.5)
    b.output(b.op("relu", [y], name="z"))
    m = Mesh.parse("tp=4")
    p = plan(b.build(), m, {"x": Sharding.parse("[8, tp*4]", m), "w": Sharding.parse("[tp*4, 6]", m)})
    assert str(p.shardings["y"]) == "[8, 6] +sum(tp)" and len(p.collectives) == 1  # one reduction for relu
    assert p.verify().ok
    # the numpy implementation is what verify runs: a wrong one is caught
    register_op("test_scaled_mm", "a, b ; scale: float = 1.0", factor_rule(scaled),
                lambda a, b, scale=1.0: (a @ b) * scale + 1, replace_existing=True)
    p = plan(b.build(), m, {"x": Sharding.parse("[8, tp*4]", m), "w": Sharding.parse("[tp*4, 6]", m)})
    assert not p.verify().ok
    with pytest.raises(OpError, match="not an identifier"):
        register_op("bad name", "a", factor_rule(scaled))
    assert np.isclose(get_op("test_scaled_mm").run_numpy([np.eye(2), np.eye(2)], {"scale": 2.0}, [(2, 2)])[0][0, 0],
                      3.0)


W = Sharding.parse("[12, 6]", M)


@pytest.mark.parametrize("call,needle", [
    (lambda: propagate("mm", 5), "op mm: inputs 5 are not a list; give one Sharding"),
    (lambda: propagate("mm", [X, W], out_pins="x"), "op mm: out_pins 'x' is not a list; give one Sharding (or None) "
                                                    "per output"),
    (lambda: propagate("mm", [X, W], out_pins=["[8, 6]"]), "out_pins[0] is str '[8, 6]', not a Sharding"),
    (lambda: propagate("mm", [X, W], out_pins=[Sharding.parse("[8]", M)]), "op mm: out_pins[0] [8] has shape (8,), "
                                                                           "output 0 has shape (8, 6)"),
    (lambda: propagate("mm", [X, W], out_pins=[X, X]), "op mm: 2 out_pins for 1 output(s)"),
    (lambda: propagate("mm", [X, W], out_pins=[Sharding.parse("[8, 6]", "tp=2")]), "is on mesh tp=2, the inputs "
                                                                                   "on mesh dp=2,tp=4"),
    (lambda: propagate("mm", [X, W], cost_model="fast"), "op mm: cost_model 'fast' is not a CostModel"),
    (lambda: propagate("mm", [X, W], tensor_dtype=[]), "op mm: tensor_dtype lists 0 dtypes for 2 inputs"),
    (lambda: propagate("mm", [X, W], out_dtype="float99"), "op mm: param out_dtype = 'float99' is not a dtype; give "
                                                           "one of float64"),
])
def test_propagate_refuses_bad_arguments(call, needle):
    with pytest.raises(OpError) as e:
        call()
    assert needle in str(e.value), str(e.value)


def test_an_unknown_aten_overload_is_refused():
    pytest.importorskip("torch")  # torch's own list of overloads is the reference
    with pytest.raises(UnsupportedOp) as e:
        propagate("aten.mm.bogus", [X, W])
    assert "op 'aten.mm.bogus': aten.mm has no overload 'bogus' (its overloads: default, dtype" in str(e.value)
    assert propagate("aten.mm.out", [X, W]).outputs == propagate("mm", [X, W]).outputs


def test_near_misses_of_the_propagate_arguments_succeed():
    want = propagate("mm", [X, W]).outputs
    assert propagate("mm", (X, W), out_pins=[None], tensor_dtype=["bfloat16"], out_dtype="bfloat16").outputs == want
    pin = Sharding.parse("[dp*4, 6]", M)
    assert propagate("mm", [X, W], out_pins=[pin], tensor_dtype=["float32", "float32"]).outputs == (pin,)
    assert propagate("aten.mm.default", [X, W]).outputs == want


_RULE = factor_rule(lambda name, inputs, params: FactorMap(("x",), "x"))


@pytest.mark.parametrize("args,kw,needle", [
    (("t_sig_none", None), {}, "register_op t_sig_none: signature must be text like 'x, w ; dim: int = 0'"),
    (("t_sig_int", 5), {}, "got int 5"),
    (("t_check", "a"), {"check": 5}, "register_op t_check: check must be callable or None, got int 5"),
    (("t_alias_str", "a"), {"aliases": "ab"}, "aliases must be a list of op names, got str 'ab'; e.g. aliases=['ab']"),
    (("t_alias_id", "a"), {"aliases": ["not an id"]}, "alias 'not an id' is not an identifier"),
    (("t_range", "a ; k: int[5..1]"), {}, "param 'k' has the empty range [5..1]; write [lo..hi] with lo <= hi"),
    (("t_default_str", "a ; k: int = 'str'"), {}, "default 'str' of param 'k' is not an int"),
    (("t_default_float", "a ; k: int = 1.5"), {}, "default 1.5 of param 'k' is not an int"),
    (("t_default_range", "a ; k: int[1..4] = 9"), {}, "default 9 of param 'k' is not an int[1..4]"),
    (("t_default_dtype", "a ; d: dtype = 'float99'"), {}, "default 'float99' of param 'd' is not a dtype"),
    (("t_dup_tensor", "a, a"), {}, "tensor 'a' is named twice"),
    (("t_dup_param", "a ; k: int, k: float"), {}, "param 'k' has the name of a param before it"),
    (("t_param_tensor", "a ; a: int = 1"), {}, "param 'a' has the name of a tensor before it"),
])
def test_register_op_refuses_bad_declarations(args, kw, needle):
    with pytest.raises(OpError) as e:
        register_op(args[0], args[1], _RULE, **kw)
    assert needle in str(e.value), str(e.value)
    assert args[0] not in registered()


def test_register_op_takes_typed_defaults_and_alias_lists():
    from shardlayout.ops.registry import _REGISTRY

    op = register_op("t_good_defaults", "a ; k: int[1..4] = 2, d: dtype? = None, e: dtype = 'bfloat16', f: float = 1",
                     _RULE, aliases=("t_good_defaults_alias",), check=lambda *a: None, replace_existing=True)
    try:
        assert op.signature.param("k").default == 2 and "t_good_defaults_alias" in registered()
    finally:  # registered ops are global: other tests walk every one of them
        _REGISTRY.pop("t_good_defaults", None)
        _REGISTRY.pop("t_good_defaults_alias", None)
