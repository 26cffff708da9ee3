"""The oracle the MoE import tests share: an imported program run unsharded on torch (a plan over
ep=1) from the module's own parameters, to compare with the module's forward."""

from __future__ import annotations

from shardlayout import Mesh
from shardlayout.execute.verify import reference_run
from shardlayout.ops.result import canonical_op_name
from shardlayout.plan import plan
from shardlayout.program.models import style_pins


def targets(prog) -> list:
    """The program's ops by their short names."""
    return [canonical_op_name(op.target) for op in prog.ops]


def run_unsharded(module, x, prog):
    """The program's output run on torch without sharding (a plan over ep=1), from the module's
    own parameters (by name) and ``x``."""
    import torch

    from shardlayout.run.torch_ops import torch_op

    mesh = Mesh.parse("ep=1")
    p = plan(prog, mesh, style_pins(prog, mesh, "ep"))
    inputs = {n: t.detach() for n, t in module.named_parameters()}
    inputs["x"] = x
    assert set(inputs) == set(prog.inputs())
    with torch.no_grad():
        return reference_run(p, inputs, torch_op, torch)[prog.outputs[0]]
