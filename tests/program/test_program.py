"""Programs: builder, JSON round trip without evaluation, errors."""

from __future__ import annotations

import pytest

from shardlayout.program import Program, ProgramBuilder, ProgramError
from shardlayout.program.models import llama


def test_builder_shapes_come_from_the_rules():
    b = ProgramBuilder()
    x = b.input("x", (2, 8, 16))
    h = b.op("view", [x], shape=(16, 16))
    w = b.param("w", (16, 4))
    y = b.op("mm", [h, w])
    s = b.op("sum", [y], dim=1)
    b.output(s)
    p = b.build()
    assert p.tensors[y].shape == (16, 4) and p.tensors[s].shape == (16,)
    assert p.inputs() == ["x", "w"] and p.inputs("param") == ["w"]


def test_json_round_trip_is_exact_and_deterministic():
    p = llama(layers=2)
    text = p.to_json()
    assert Program.from_json(text) == p and Program.from_json(text).to_json() == text


@pytest.mark.parametrize(
    "text,needle",
    [
        ("{oops", "malformed"),
        ('{"tensors": []}', "needs the keys"),
        ('{"tensors": [], "ops": [{"target": "mm", "inputs": ["a"], "outputs": ["b"]}], "outputs": []}',
         "not defined"),
        ('{"tensors": [{"name": "a", "shape": [2]}, {"name": "a", "shape": [2]}], "ops": [], "outputs": []}',
         "defined twice"),
        ('{"tensors": [{"name": "a", "shape": [2]}], "ops": [], "outputs": ["z"]}', "not a tensor"),
        ('{"tensors": [{"name": "a", "shape": ["__import__"]}], "ops": [], "outputs": []}', "list of ints"),
    ],
)
def test_malformed_json_is_refused_clearly(text, needle):
    with pytest.raises(ProgramError, match=needle):
        Program.from_json(text)


@pytest.mark.parametrize("text,match", [
    ('{"tensors":[{"name":"a","shape":[2]},{"name":"b","shape":[2]}],"ops":[{"target":"neg","inputs":["a"],'
     '"outputs":["b"]},{"target":"neg","inputs":["a"],"outputs":["b"]}],"outputs":["b"]}', "produced twice"),
    ('{"tensors":[{"name":"a","shape":[2]},{"name":"b","shape":[2]},{"name":"c","shape":[2]}],"ops":[{"target":'
     '"neg","inputs":["b"],"outputs":["c"]},{"target":"neg","inputs":["a"],"outputs":["b"]}],"outputs":["c"]}',
     "before the op that produces it"),
    ('{"tensors":[{"name":"a","shape":[2]},{"name":"b","shape":[2]}],"ops":[{"target":"frob","inputs":["a"],'
     '"outputs":["b"]}],"outputs":["b"]}', "no sharding rule for op 'frob'"),
    ('{"tensors":[{"name":"a","shape":[2]},{"name":"b","shape":[999, 3]}],"ops":[{"target":"neg","inputs":["a"],'
     '"outputs":["b"]}],"outputs":["b"]}', r"declares output shapes \[\(999, 3\)\], the op produces \[\(2,\)\]"),
    ('{"tensors":[{"name":"a","shape":[2.5]}],"ops":[],"outputs":["a"]}', "must be a list of ints >= 1"),
    ('{"tensors":[{"name":"a","shape":[true]}],"ops":[],"outputs":["a"]}', "must be a list of ints >= 1"),
    ('{"tensors":[{"name":"a","shape":[2],"dtype":"floaty"}],"ops":[],"outputs":["a"]}', "dtype 'floaty'"),
    ('{"tensors":[{"name":"a","shape":[2],"kind":"weird"}],"ops":[],"outputs":["a"]}', "kind 'weird'"),
    ('{"tensors":[{"name":"a","shape":[2,3]},{"name":"b","shape":[2]}],"ops":[{"target":"sum","inputs":["a"],'
     '"params":{"dim":5},"outputs":["b"]}],"outputs":["b"]}', r"op 0 \(sum -> 'b'\): .*dim = 5 is out of range"),
])
def test_program_json_is_validated_in_full(text, match):
    from shardlayout import ShardingError

    with pytest.raises(ShardingError, match=match):
        Program.from_json(text)


def test_params_keep_their_types_through_the_frozen_params_memo():
    """1, 1.0 and True are equal in Python; the builder's memo of frozen params must not hand one
    op another's (the params of a repeated layer are frozen once)."""
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    ops = [b.op("add", [x, x], alpha=v) for v in (1, 1.0, True, 1, 2)]
    b.output(ops[-1])
    p = b.build()
    kinds = [type(dict(op.params)["alpha"]) for op in p.ops]
    assert kinds == [int, float, bool, int, int]
    assert p.ops[0].params is p.ops[3].params  # one frozen tuple per signature


def test_builder_shapes_with_constants_equal_the_rule_shapes():
    """The builder's keyed shape memo (input shapes it holds, typed constants) gives what
    ``shape_of`` gives, with the memo cleared or not."""
    from shardlayout.caches import clear_caches
    from shardlayout.program.shapes import shape_of

    def build():
        b = ProgramBuilder()
        x = b.input("x", (2, 3, 8))
        y = b.op("pow", [x, 2.0])
        z = b.op("add", [y, 1e-6])
        s = b.op("sum", [z], dim=[1, 2])
        b.output(b.op("mul", [s, 3]))
        return b.build()

    clear_caches()
    cold = build()
    warm = build()
    assert cold == warm
    for op in cold.ops:
        ins = [cold.tensors[i].shape if isinstance(i, str) else i for i in op.inputs]
        assert [cold.tensors[o].shape for o in op.outputs] == [tuple(s) for s in shape_of(op.target, ins,
                                                                                          op.kwargs())]


def _relu(**kw):
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    return b.op("relu", [x], **kw)


@pytest.mark.parametrize("kw,needle", [
    ({"name": 5}, "op relu: name 5 must be a non-empty string"),
    ({"name": ""}, "op relu: name '' must be a non-empty string"),
    ({"dtypes": ["float99"]}, "op relu: dtypes[0] 'float99' is not one of float64, float32"),
    ({"dtypes": [5]}, "op relu: dtypes[0] 5 is not one of float64"),
    ({"dtypes": "float32"}, "dtypes 'float32' must be a list of dtype names, one per output"),
    ({"n_out": 0}, "op relu: n_out 0 must be an int >= 1"),
    ({"n_out": -3}, "op relu: n_out -3 must be an int >= 1"),
])
def test_builder_op_refuses_bad_arguments(kw, needle):
    with pytest.raises(ProgramError) as e:
        _relu(**kw)
    assert needle in str(e.value), str(e.value)


def test_builder_op_takes_dtype_names_and_none():
    b = ProgramBuilder()
    x = b.input("x", (4, 8))
    v, i = b.op("topk", [x], name="t", n_out=2, dtypes=["bfloat16", None], k=2, dim=1)
    assert (b._tensors[v].dtype, b._tensors[i].dtype) == ("bfloat16", "float32")


@pytest.mark.parametrize("text,needle", [
    ('{"tensors": [{"name": "x", "shape": [4], "dtype": "float32", "dtype": "int64"}], "ops": [], "outputs": ["x"]}',
     "program JSON: key 'dtype' is given twice in tensor 'x' ('float32' and 'int64'); give each key once"),
    ('{"tensors": [], "ops": [], "outputs": [], "outputs": ["x"]}', "key 'outputs' is given twice in the program"),
    ('{"tensors": [{"name": "x", "shape": [4]}], "ops": [{"target": "relu", "name": "r", "inputs": ["x"], '
     '"inputs": ["x"], "outputs": ["x"]}], "outputs": ["x"]}', "key 'inputs' is given twice in op 'r' (relu)"),
])
def test_program_json_refuses_a_key_given_twice(text, needle):
    with pytest.raises(ProgramError) as e:
        Program.from_json(text)
    assert needle in str(e.value), str(e.value)
