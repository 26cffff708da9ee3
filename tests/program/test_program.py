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
     '"params":{"dim":5},"outputs":["b"]}],"outputs":["b"]}', r"op sum \(sum\): .*dim = 5 is out of range"),
])
def test_program_json_is_validated_in_full(text, match):
    from shardlayout import ShardingError

    with pytest.raises(ShardingError, match=match):
        Program.from_json(text)
