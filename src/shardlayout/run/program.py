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
from .executor import TorchRankExecutor
from .moves import _group, raw_shape, splits, target_shape

_SHAPES: dict = {}  # placeholder key -> the local shape its real op returns, per part (tracing only)
PARTS = ("whole", "issue", "finish")  # a Move's parts a placeholder stands for (``Move.forward``)
_KEYS = itertools.count()
_LIB = None


def _library():
    """Register the two tracing placeholders once: ``shardlayout::move(x, key, part)`` (``part``
    indexes ``PARTS``: a whole move, its issue or its finish) and ``shardlayout::grad_sum(x, key)``,
    each giving a tensor of the recorded shape; swapped for modules after tracing."""
    global _LIB
    if _LIB is not None:
        return _LIB
    import torch

    lib = torch.library.Library("shardlayout", "FRAGMENT")
    lib.define("move(Tensor x, int key, int part) -> Tensor")
    lib.define("grad_sum(Tensor x, int key) -> Tensor")

    def move(x, key, part):
        return x.new_zeros(_SHAPES[key][part])

    def grad_sum(x, key):
        return x.clone()

    for name, fn in (("move", move), ("grad_sum", grad_sum)):
        lib.impl(name, fn, "CompositeExplicitAutograd")
        lib._register_fake(name, fn)
    _LIB = lib
    return lib


class _Recorder:
    """The executor ``make_fx`` traces: local aten ops for ops, placeholders for moves (each
    becomes a ``Move`` module after tracing), index ops for stream chunks."""

    def __init__(self, plan, rank: int, groups: dict, reductions: dict):
        self.mesh, self.rank, self.ranks = plan.mesh, rank, (rank,)
        self.groups, self.reductions = groups, reductions
        self.readers = reduction_at(self.reductions)  # (op index, input position) -> its reduction (walk)
        self.moves: dict = {}  # key -> Collective
        self.sums: dict = {}  # key -> axis pieces

    def op(self, opdef, inputs: list, params: dict, outputs: tuple) -> list:
        from ..ops.result import at_rank
        from .torch_ops import torch_op

        shapes = [s.local_shape(self.rank) for s in outputs]
        return torch_op(opdef, inputs, at_rank(params, self.mesh, self.rank), shapes)

    def _placeholder(self, c) -> int:
        key = next(_KEYS)
        self.moves[key] = c
        whole = target_shape(c, self.rank)
        raw = raw_shape(c, self.rank, _group(self.groups, c.axes)[1]) if splits(c) else whole
        _SHAPES[key] = (whole, raw, whole)
        return key

    def collective(self, c, x):
        import torch

        return torch.ops.shardlayout.move(x, self._placeholder(c), 0)

    def start(self, c, x):
        """A stream chunk's move as two graph nodes: issued here, waited for where the returned
        function is called (``execute.stream.run_segment`` calls it one chunk later)."""
        import torch

        key = self._placeholder(c)
        if not (c.kind.communicates and splits(c)):
            out = torch.ops.shardlayout.move(x, key, 0)
            return lambda: out
        raw = torch.ops.shardlayout.move(x, key, 1)
        return lambda: torch.ops.shardlayout.move(raw, key, 2)

    def use(self, reduction: tuple, value):
        import torch

        pieces = reduction[2]
        key = next(_KEYS)
        self.sums[key] = pieces
        return torch.ops.shardlayout.grad_sum(value, key)

    chunk = TorchRankExecutor.chunk  # index ops: traced into the graph alike
    join = TorchRankExecutor.join


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


def stream_segments(plan) -> tuple:
    """The segments of ``plan``'s stream choices a run executes chunk by chunk (``execute.stream``;
    ring-style ones when the plan was made with ``ring``: each step one send/recv to the next rank)."""
    from ..execute.stream import segments

    return segments(plan)[0]


def stream_pieces(plan, segs) -> set:
    """Axis-piece tuples the chunk moves of ``segs`` communicate over (forward, and the local
    slices' gradient completions): process groups a streamed run needs."""
    from ..execute.stream import chunk_moves
    from .backward import slice_completions

    out = set()
    for seg in segs:
        for c in chunk_moves(plan, seg):
            out.add(c.axes if c.kind.communicates else slice_completions(c))
    return {p for p in out if p}


def _module_base():
    import torch

    return torch.nn.Module


class InterpretedProgram(_module_base()):
    """A plan with ragged tensors at one rank, as a module: its forward walks the plan with the
    torch executor (``run.executor``: the same ``Move`` per dense collective, ``run.ragged`` for
    routed rows with the routing's split sizes). Eager: ``torch.compile`` would need the row
    counts as graph sizes. Same call convention as ``rank_program``'s GraphModule."""

    def __init__(self, plan, rank: int, groups: dict, reductions: dict, streams=()):
        super().__init__()
        object.__setattr__(self, "plan", plan)
        object.__setattr__(self, "streams", tuple(streams))
        object.__setattr__(self, "executor", TorchRankExecutor(plan.mesh, rank, groups, None, reductions))
        self._names = plan.program.inputs()

    def forward(self, *local):
        from ..execute import walk

        values = dict(zip(self._names, local))
        values.update(walk(self.plan, self.executor, values, self.streams))
        return tuple(values[n] for n in self.plan.program.outputs)


def _device(t):
    """Where a rank's piece lives: a meta example (a model built on ``meta``) runs on the CPU here."""
    return "cpu" if t.device.type == "meta" else t.device


def rank_program(plan, rank: int, groups: dict, examples: list, reductions: dict | None = None, streams=()):
    """The GraphModule running ``plan`` at ``rank``: ``gm(*local_inputs) -> tuple of outputs``.

    ``examples``: one tensor per program input (``program.inputs()`` order) giving its dtype (its
    values and size are not read: the local size is the plan's); ``groups``: ``process_groups``;
    ``reductions``: ``plan.backward.gradient_reductions`` (default: computed); ``streams``: the
    segments (``execute.stream.segments``) run chunk by chunk — each chunk's collective two nodes,
    issued a chunk ahead of its wait, so eager gloo/nccl and the compiler overlap it with the
    previous chunk's compute."""
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
    rec = _Recorder(plan, rank, groups, gradient_reductions(plan) if reductions is None else reductions)

    def body(*local):
        values = dict(walk(plan, rec, dict(zip(names, local)), streams))
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
    names_of: dict = {}  # placeholder key -> its module's name (a move's issue and finish share one)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (torch.ops.shardlayout.move.default,
                                                             torch.ops.shardlayout.grad_sum.default):
            continue
        x, key, *part = node.args
        if key not in names_of:
            kind = "move" if part else "grad_sum"
            names_of[key] = f"{kind}_{sum(n.startswith(kind) for n in names_of.values())}"
            gm.add_submodule(names_of[key], Move(rec.moves.pop(key), rank, groups) if part else
                             GradSum(rec.sums.pop(key), groups))
        with graph.inserting_after(node):
            new = graph.call_module(names_of[key], (x,), {"part": PARTS[part[0]]} if part and part[0] else {})
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    for key in [*names_of, *rec.moves]:  # rec.moves: traced away (an unused value's move)
        _SHAPES.pop(key, None)
    graph.lint()
    gm.recompile()
    return gm


__all__ = ["InterpretedProgram", "NotGenerable", "check_generable", "ragged_tensors", "rank_program",
           "stream_pieces", "stream_segments"]
