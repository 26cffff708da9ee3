"""``program.rewrite``: readers of each tensor, and a program rebuilt with ops replaced."""

from __future__ import annotations

from shardlayout.program import ProgramBuilder
from shardlayout.program.models import llama
from shardlayout.program.rewrite import readers, rebuilt


def test_rebuilt_with_nothing_replaced_is_the_same_program():
    prog = llama(layers=1)
    again = rebuilt(prog, {}, set())
    assert [(o.name, o.target, o.inputs, o.outputs, o.kwargs()) for o in again.ops] == \
        [(o.name, o.target, o.inputs, o.outputs, o.kwargs()) for o in prog.ops]
    assert again.tensors == prog.tensors and again.outputs == prog.outputs


def test_an_op_replaced_and_one_dropped():
    b = ProgramBuilder()
    x = b.input("x", (2, 4))
    y = b.op("relu", [x], name="y")
    z = b.op("neg", [y], name="z")
    b.output(b.op("add", [x, z], name="out"))
    prog = b.build()
    assert readers(prog) == {"out": [-1], "x": [0, 2], "y": [1], "z": [2]}
    got = rebuilt(prog, {1: lambda bb: bb._op("aten.exp.default", ["y"], "z", 1, ["float32"], {})}, set())
    assert [o.target for o in got.ops] == [prog.ops[0].target, "aten.exp.default", prog.ops[2].target]
    fused = rebuilt(prog, {2: lambda bb: bb._op("aten.sub.Tensor", ["x", "y"], "out", 1, ["float32"], {})}, {1})
    assert [o.name for o in fused.ops] == ["y", "out"] and "z" not in fused.tensors
    assert fused.ops[1].inputs == ("x", "y")
