"""Repeated blocks (program.repeat): a stamped program equals the one built by calling the block
for every instance (the oracle: a plain loop through the same builder), and is lazy until read."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlayout.mesh import Mesh
from shardlayout.program import Program, ProgramBuilder, ProgramError
from shardlayout.program.models import llama
from shardlayout.program.repeat import MIN_COUNT
from shardlayout.program.styles import STYLES, apply_style


def _loop(self, block, count, carry, prefix="layers"):
    """The oracle: every instance built by calling the block (names prefixed by the builder)."""
    single = isinstance(carry, str)
    for i in range(count):
        scope, scoped = self._scope, self._scoped
        self._scope, self._scoped = f"{prefix}.{i}.", 0
        carry = block(self, carry)
        self._scope, self._scoped = scope, scoped
    return carry if single else tuple(carry)


def _looped(build, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(ProgramBuilder, "repeat", _loop)
        return build()


def _flat(p: Program) -> Program:
    return Program(p.tensors, p.ops, p.outputs, p.symbols, p.sym_shapes, p.facts, p.notes)


@pytest.mark.parametrize("layers", [1, 2, 5, 6, 7, 9, 16])
def test_stamped_llama_is_the_looped_one(layers, monkeypatch):
    got = llama(layers=layers)
    want = _looped(lambda: llama(layers=layers), monkeypatch)
    assert (got.repeated is not None) == (layers >= MIN_COUNT)
    assert got == want and got.to_json() == want.to_json() and list(got.tensors) == list(want.tensors)
    assert got.inputs() == want.inputs() and got.outputs == want.outputs


def test_a_repeated_program_holds_five_instances_until_read():
    p = llama(layers=40)
    cp, rep = p.repeated
    assert "ops" not in p.__dict__ and "tensors" not in p.__dict__
    assert rep.count == 40 and rep.kept == (0, 1, 2, 3, 39) and len(rep.ops) == 50
    assert len(cp.ops) == 5 * 50 and "layers.39.resid2" in cp.tensors and "layers.20.wq" not in cp.tensors
    # the compressed program's last instance reads instance 3; the full one reads instance 38
    assert cp.ops[4 * 50].inputs[0] == "layers.3.resid2"
    assert p.ops[39 * 50].inputs[0] == "layers.38.resid2" and len(p.ops) == 2000
    assert "ops" in p.__dict__ and p.tensors["layers.20.wq"].shape == (16, 16)


def test_a_lazy_program_pickles_and_compares():
    p = llama(layers=8)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and q.to_json() == llama(layers=8).to_json()


_UNARY = ["relu", "neg", "silu", "rsqrt"]


@st.composite
def _blocks(draw):
    """A random block over a (4, 8) carry: unary ops, a product with its own weight, an add of a
    shared outside tensor, a second carry (two-tensor carries)."""
    steps = draw(st.lists(st.sampled_from(_UNARY + ["mm", "add_shared", "add_carry"]), min_size=1, max_size=6))
    two = draw(st.booleans())
    count = draw(st.integers(1, 11))
    return steps, two, count


def _build(steps, two, count, repeat):
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    z = b.input("z", (4, 8))
    shared = b.input("shared", (4, 8))

    def block(b, carry):
        h, other = (carry if two else (carry, None))
        for j, s in enumerate(steps):
            if s == "mm":
                w = b.param(f"w{j}", (8, 8))
                h = b.op("mm", [h, w], name=f"mm{j}")
            elif s == "add_shared":
                h = b.op("add", [h, shared])  # named automatically, per instance
            elif s == "add_carry":
                h = b.op("add", [h, other if two else h], name=f"ca{j}")
            else:
                h = b.op(s, [h], name=f"{s}{j}")
        if two:
            return h, b.op("mul", [h, other], name="other")
        return h

    out = repeat(b, block, count, (x, z) if two else x)
    for o in (out if two else (out,)):
        b.output(o)
    return b.build()


@settings(max_examples=30, deadline=None)
@given(_blocks())
def test_random_blocks_stamp_as_they_loop(case):
    steps, two, count = case
    got = _build(steps, two, count, lambda b, *a: b.repeat(*a))
    want = _build(steps, two, count, lambda b, *a: _loop(b, *a))
    assert got == want and got.to_json() == want.to_json()
    assert (got.repeated is not None) == (count >= MIN_COUNT)


def test_a_block_that_keeps_state_between_calls_is_built_every_time():
    calls = []

    def block(b, x):  # not one block: the second call adds an op
        calls.append(1)
        y = b.op("relu", [x], name="a")
        return b.op("neg", [y], name="b") if len(calls) == 2 else y

    b = ProgramBuilder()
    x = b.input("x", (4,))
    b.output(b.repeat(block, 8, x))
    p = b.build()
    assert p.repeated is None and len(calls) == 8 and len(p.ops) == 9
    assert [op.name for op in p.ops[:3]] == ["layers.0.a", "layers.1.a", "layers.1.b"]


def test_auto_named_ops_are_named_per_instance():
    b = ProgramBuilder()
    x = b.input("x", (4,))
    b.output(b.repeat(lambda b, x: b.op("neg", [b.op("relu", [x])]), 8, x))
    p = b.build()
    assert p.repeated is not None and [op.name for op in p.ops[10:12]] == ["layers.5.relu_1", "layers.5.neg_2"]


def test_a_repeat_inside_a_repeat_builds_the_inner_one():
    b = ProgramBuilder()
    x = b.input("x", (4,))
    inner = lambda b, x: b.op("relu", [x], name="y")  # noqa: E731
    b.output(b.repeat(lambda b, x: b.repeat(inner, 6, x, prefix="sub"), 7, x))
    p = b.build()
    assert p.repeated is not None and len(p.ops) == 42 and p.ops[-1].name == "layers.6.sub.5.y"


def _eight():
    b = ProgramBuilder()
    x = b.input("x", (4,))
    y = b.repeat(lambda b, x: b.op("relu", [x], name="y"), 8, x)
    return b, y


def test_reading_a_stamped_instance_names_the_fix():
    b, y = _eight()
    with pytest.raises(ProgramError, match="layers.5.y.*stamped.*read only what it returns"):
        b.op("add", [y, "layers.5.y"], name="out")
    b.op("add", [y, "layers.3.y"], name="ok")  # the kept instances are real tensors


def test_a_stamped_name_cannot_be_defined_again():
    b, _ = _eight()
    with pytest.raises(ProgramError, match="'layers.5.y' is defined twice"):
        b.input("layers.5.y", (4,))
    b = ProgramBuilder()
    x = b.input("x", (4,))
    b.input("layers.6.y", (4,))
    with pytest.raises(ProgramError, match="'layers.6.y' is defined twice"):
        b.repeat(lambda b, x: b.op("relu", [x], name="y"), 8, x)


@pytest.mark.parametrize("count, block, carry, match", [
    (0, lambda b, x: x, "x", "count 0 must be an int >= 1"),
    (True, lambda b, x: x, "x", "count True must be an int >= 1"),
    (8, lambda b, x: None, "x", "instance 0 returned"),
    (8, lambda b, x: b.op("relu", [x], name="y"), "nope", "carry 'nope' is not a tensor"),
    (10**9, lambda b, x: b.op("relu", [x]), "x", r"count 1000000000 is more than the 1048576 instances a program may "
                                                 "have"),
])
def test_bad_repeats_name_what_is_wrong(count, block, carry, match):
    b = ProgramBuilder()
    b.input("x", (4,))
    with pytest.raises(ProgramError, match=match):
        b.repeat(block, count, carry)


@pytest.mark.parametrize("mesh", ["dp=2,tp=4", "tp=2", "dp=2"])
@pytest.mark.parametrize("layers", [6, 9])
def test_styles_of_a_repeated_program_are_those_of_the_whole(mesh, layers):
    m = Mesh.parse(mesh)
    p = llama(layers=layers)
    flat = _flat(llama(layers=layers))
    for style in STYLES:
        if style == "ep":  # llama has no experts
            continue
        try:
            want = apply_style(flat, m, style)
        except Exception as e:  # a style the mesh lacks an axis for: the same error
            with pytest.raises(type(e)):
                apply_style(p, m, style)
            continue
        got = apply_style(p, m, style)
        assert got.pins == want.pins and got.matched == want.matched, style
    assert "ops" not in p.__dict__  # the style read the compressed program only


def _routed(repeat):
    """A stack of routed MoE layers (ragged tensors: derived program-wide, so materialised)."""
    b = ProgramBuilder()
    x = b.input("x", (16, 16))

    def block(b, x):
        wr, w1, w2 = b.param("router", (16, 4)), b.param("w1", (4, 16, 32)), b.param("w2", (4, 32, 16))
        probs = b.op("_softmax", [b.op("mm", [x, wr], name="logits")], name="probs", dim=1)
        scores, idx = b.op("topk", [probs], name="topk", n_out=2, dtypes=("float32", "int64"), k=2, dim=1)
        xs = b.op("route", [x, idx], name="dispatch", experts=4)
        h = b.op("silu", [b.op("einsum", [xs, w1], name="in", equation="erd,edf->erf")], name="act")
        o = b.op("einsum", [h, w2], name="out", equation="erf,efd->erd")
        return b.op("add", [x, b.op("unroute", [o, idx, scores], name="combine")], name="resid")

    b.output(repeat(b, block, 7, x))
    return b.build()


def test_a_repeated_block_with_ragged_tensors_is_materialised(monkeypatch):
    got = _routed(lambda b, *a: b.repeat(*a))
    want = _routed(lambda b, *a: _loop(b, *a))
    assert got.repeated is None and got == want
    assert got.tensors["layers.5.dispatch"].ragged == want.tensors["layers.5.dispatch"].ragged is not None


# -- compress: a program built op by op (an import, a JSON program) found to be one repeated block --


@settings(max_examples=30, deadline=None)
@given(_blocks())
def test_compress_finds_the_block_the_builder_stamps(case):
    from shardlayout.program.repeat import compress

    steps, two, count = case
    looped = _build(steps, two, count, lambda b, *a: _loop(b, *a))  # every instance built: no Repeat
    stamped = _build(steps, two, count, lambda b, *a: b.repeat(*a))  # the oracle: the builder's own
    got = compress(looped)
    assert (got.repeated is not None) == (stamped.repeated is not None)
    if got.repeated is not None:
        assert got.repeated[0] == stamped.repeated[0] and got.repeated[1] == stamped.repeated[1]
    assert got == looped and list(got.tensors) == list(looped.tensors) and got.inputs() == looped.inputs()


@pytest.mark.parametrize("layers", [6, 9, 16])
def test_compress_of_every_llama_layer_is_the_builders_repeat(layers):
    from shardlayout.program.repeat import compress

    p = llama(layers=layers)
    got = compress(_flat(p))
    assert got.repeated[0] == p.repeated[0] and got.repeated[1] == p.repeated[1] and got == p


def _odd_layer(change):
    """A 7-layer program built op by op whose layer 5 differs as ``change`` says."""
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    for i in range(7):
        b._scope, b._scoped = f"layers.{i}.", 0
        w = b.param("w", (8, 8))
        h = b.op("mm", [x, w], name="mm")
        h = b.op("relu" if not (change == "op" and i == 5) else "neg", [h], name="act")
        x = b.op("add", [h, x], name="out")
    b._scope = ""
    late = "layers.3.mm" if change == "read-middle" else x
    b.output(b.op("add", [x, late], name="head"))
    return b.build()


@pytest.mark.parametrize("change", ["op", "read-middle"])
def test_compress_leaves_a_program_whose_layers_are_not_one_block_as_it_is(change):
    from shardlayout.program.repeat import compress

    assert compress(_odd_layer("none")).repeated is not None
    p = _odd_layer(change)
    got = compress(p)
    assert got is p and got.repeated is None  # planned op by op, as before


@pytest.mark.parametrize("made,count", [(6, 32), (9, 7), (7, 7)])
def test_with_count_restamps_the_block_as_the_builder_makes_that_many(made, count):
    from shardlayout.program.repeat import with_count

    got, want = with_count(llama(layers=made), count), llama(layers=count)
    assert got.repeated[0] == want.repeated[0] and got.repeated[1] == want.repeated[1]
    assert got == want and list(got.tensors) == list(want.tensors)
