"""The per-rank program: a plan at one rank as one ``torch.fx.GraphModule`` (torch extra).

``rank_program(plan, rank, groups, examples)`` walks the plan once (``execute.walk``, the walk the
numpy simulator and the checks use) with an executor that *records*: each op is traced by
``make_fx`` into its local aten ops at this rank's local sizes and params (``run.torch_ops``), and
each planned collective becomes one ``Move`` submodule (``run.moves``: functional collectives with
the plan's adjoint); where the plan's backward sums the consumers' partial gradients of a value
(``plan.backward``), a ``GradSum`` submodule. The graph's inputs are the program's inputs in
``program.inputs()`` order (this rank's local pieces), its outputs the program's outputs in their
planned shardings. No Python runs per op at run time, and ``torch.compile`` sees local aten ops and
``_c10d_functional`` collectives.

Programs with ragged tensors (routed rows, their sizes known only at run time) are not generated:
``RunError`` says so.
"""

from __future__ import annotations

import itertools

from ..errors import RunError, ShardingError
from .backward import reduction_at

_SHAPES: dict = {}  # placeholder key -> the local shape its real op returns (tracing only)
_KEYS = itertools.count()
_LIB = None


def _library():
    """Register the two tracing placeholders once: ``shardlayout::move`` / ``shardlayout::grad_sum``
    (``(x, key) -> a tensor of the recorded shape``), swapped for modules after tracing."""
    global _LIB
    if _LIB is not None:
        return _LIB
    import torch

    lib = torch.library.Library("shardlayout", "FRAGMENT")
    lib.define("move(Tensor x, int key) -> Tensor")
    lib.define("grad_sum(Tensor x, int key) -> Tensor")

    def move(x, key):
        return x.new_zeros(_SHAPES[key])

    def grad_sum(x, key):
        return x.clone()

    for name, fn in (("move", move), ("grad_sum", grad_sum)):
        lib.impl(name, fn, "CompositeExplicitAutograd")
        lib._register_fake(name, fn)
    _LIB = lib
    return lib


class _Recorder:
    """The executor ``make_fx`` traces: local aten ops for ops, placeholders for moves."""

    def __init__(self, plan, rank: int, reductions: dict):
        self.mesh, self.rank, self.ranks = plan.mesh, rank, (rank,)
        self.reductions = reductions
        self.readers = reduction_at(self.reductions)  # (op index, input position) -> its reduction (walk)
        self.moves: dict = {}  # key -> Collective
        self.sums: dict = {}  # key -> axis pieces

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        from ..ops.result import at_rank
        from .torch_ops import torch_op

        shapes = [s.local_shape(self.rank) for s in outputs]
        return torch_op(opdef, inputs, at_rank(params, self.mesh, self.rank), shapes)

    def collective(self, c, x):
        import torch

        key = next(_KEYS)
        _SHAPES[key] = tuple(c.dst.local_shape(self.rank))
        self.moves[key] = c
        return torch.ops.shardlayout.move(x, key)

    def use(self, reduction: tuple, value):
        import torch

        pieces = reduction[2]
        key = next(_KEYS)
        self.sums[key] = pieces
        return torch.ops.shardlayout.grad_sum(value, key)


class NotGenerable(ShardingError):
    """A plan no fixed per-rank program can run (ragged tensors), and what to do instead."""


def ragged_tensors(plan) -> list:
    """The plan's ragged tensors: their routed row counts are known only at run time."""
    return [n for n, t in plan.program.tensors.items() if t.ragged is not None]


def check_generable(plan) -> None:
    """Raise ``NotGenerable`` when ``plan`` has ragged tensors: no fixed per-rank graph exists
    (``parallelize`` runs such a plan through ``InterpretedProgram`` instead)."""
    ragged = ragged_tensors(plan)
    if ragged:
        raise NotGenerable(f"the plan has ragged tensors ({', '.join(ragged[:3])}): their routed row counts are known "
                           "only at run time, so no fixed per-rank graph exists; parallelize runs it through the "
                           "interpreter (eager only, not torch.compile)")


def _module_base():
    import torch

    return torch.nn.Module


class InterpretedProgram(_module_base()):
    """A plan with ragged tensors at one rank, as a module: its forward walks the plan with the
    torch executor (``run.executor``: the same ``Move`` per dense collective, ``run.ragged`` for
    routed rows with the routing's split sizes). Eager: ``torch.compile`` would need the row
    counts as graph sizes. Same call convention as ``rank_program``'s GraphModule."""

    def __init__(self, plan, rank: int, groups: dict, reductions: dict):
        super().__init__()
        from .executor import TorchRankExecutor

        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "executor", TorchRankExecutor(plan.mesh, rank, groups, None, reductions))
        self._names = plan.program.inputs()

    def forward(self, *local):
        from ..execute import walk

        values = dict(zip(self._names, local))
        values.update(walk(self.plan, self.executor, values))
        return tuple(values[n] for n in self.plan.program.outputs)


def _device(t):
    """Where a rank's piece lives: a meta example (a model built on ``meta``) runs on the CPU here."""
    return "cpu" if t.device.type == "meta" else t.device


def rank_program(plan, rank: int, groups: dict, examples: list, reductions: dict | None = None):
    """The GraphModule running ``plan`` at ``rank``: ``gm(*local_inputs) -> tuple of outputs``.

    ``examples``: one tensor per program input (``program.inputs()`` order) giving its dtype (its
    values and size are not read: the local size is the plan's); ``groups``: ``process_groups``;
    ``reductions``: ``plan.backward.gradient_reductions`` (default: computed)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..execute import walk
    from .backward import gradient_reductions
    from .moves import GradSum, Move

    prog = plan.program
    check_generable(plan)
    _library()
    names = prog.inputs()
    if len(examples) != len(names):
        raise RunError(f"rank_program: {len(examples)} example tensors for {len(names)} program inputs")
    rec = _Recorder(plan, rank, gradient_reductions(plan) if reductions is None else reductions)

    def body(*local):
        values = dict(walk(plan, rec, dict(zip(names, local))))
        return tuple(values[n] if n in values else local[names.index(n)] for n in prog.outputs)

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):  # no storage: a rank of a model that fits no host
        fakes = [torch.empty(plan.shardings[n].local_shape(rank), dtype=e.dtype, device=_device(e))
                 for n, e in zip(names, examples)]
    try:
        gm = make_fx(body, tracing_mode="fake")(*fakes)
    except RunError:
        raise
    except Exception as e:  # noqa: BLE001 - one line naming the failure
        raise RunError(f"generating rank {rank}'s program failed: {type(e).__name__}: {str(e).splitlines()[0]}") \
            from e
    graph = gm.graph
    n_move = n_sum = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (torch.ops.shardlayout.move.default,
                                                             torch.ops.shardlayout.grad_sum.default):
            continue
        x, key = node.args
        if node.target is torch.ops.shardlayout.move.default:
            c = rec.moves.pop(key)
            name = f"move_{n_move}"
            n_move += 1
            gm.add_submodule(name, Move(c, rank, groups))
        else:
            name = f"grad_sum_{n_sum}"
            n_sum += 1
            gm.add_submodule(name, GradSum(rec.sums.pop(key), groups))
        _SHAPES.pop(key, None)
        with graph.inserting_after(node):
            new = graph.call_module(name, (x,))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    for key in rec.moves:  # traced away (an unused value's move): nothing to keep
        _SHAPES.pop(key, None)
    graph.lint()
    gm.recompile()
    return gm


__all__ = ["InterpretedProgram", "NotGenerable", "check_generable", "ragged_tensors", "rank_program"]
