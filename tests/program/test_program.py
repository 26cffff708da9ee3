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
        ('{"tensors": [{"name": "a", "shape": ["__import__"]}], "ops": [], "outputs": []}', "bad entry"),
    ],
)
def test_malformed_json_is_refused_clearly(text, needle):
    with pytest.raises(ProgramError, match=needle):
        Program.from_json(text)
