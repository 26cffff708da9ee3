"""Step time and memory per device of a plan: what ``--style auto`` minimises and bounds.

**Step time** (seconds, no overlap assumed) is the sum of three parts, each a list of terms so
that the auto search (``plan.space``) and this module add up exactly the same floats
(``math.fsum``: the sum does not depend on order):

    forward    every collective the plan emits (``Plan.collectives``), priced by the one
               cost model (``sharding.cost.CostModel``) — one term per collective
    backward   (training only) what ``plan.backward`` — the convention ``shardlayout run --train``
               executes — adds: the adjoint of each forward move of a tensor that carries a
               gradient (a reduce-scatter's all-gather, an all-to-all's reverse, a local slice's
               all-reduce over the axes it cut on; an all-reduce's and an all-gather's need
               nothing), and one all-reduce per gradient reduction (``gradient_reductions``: a
               weight's gradient sync over its data-parallel axes, Megatron's "f"), each priced
               by the same cost model
    compute    FLOPs of every op on its largest local piece / ``flop_rate`` (default
               ``DEFAULT_FLOP_RATE`` = 100 TFLOP/s per device); training counts the backward as
               twice the forward (3x). FLOPs: ``2*m*k*n`` for a matmul, ``2 * prod(all indices)``
               for an einsum that contracts, ``4*b*h*L*S*E`` for attention, one per output
               element for anything else, 0 for a view (an alias).

**Memory per device** (bytes, the largest piece of each tensor, no reuse assumed):

    parameters    at their sharding, times the copies the training mode keeps
                  (``TRAINING``: adam 4 = weights, gradients, two moments; momentum 3; sgd 2;
                  inference 1)
    inputs        the program's other inputs (tokens, tables), once
    activations   training: every op output that is not a view of another tensor (what the
                  backward keeps); inference: only the program's outputs
    not counted   the transient copies a move makes (an FSDP all-gather's full weight), workspace

    >>> from shardlayout import Mesh
    >>> from shardlayout.plan import plan
    >>> from shardlayout.program.models import llama, style_pins
    >>> prog, m = llama(layers=1), Mesh.parse("tp=2")
    >>> e = estimate(plan(prog, m, style_pins(prog, m, "megatron")))
    >>> e.forward == plan(prog, m, style_pins(prog, m, "megatron")).cost, e.backward > 0
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from ..caches import memo
from ..errors import ShardingError
from ..ops.families import MATMULS
from ..ops.result import canonical_op_name
from ..sharding import Sharding
from ..sharding.collective import AxisPiece, Collective, CollectiveKind
from ..sharding.cost import itemsize
from ..sharding.factors import ChunkProgram, digit_classes
from ..sharding.shards import dim_length
from .backward import grad_tensors, gradient_reductions, slice_completions

DEFAULT_FLOP_RATE = 100e12
"""FLOP/s of one device when none is given: 100 TFLOP/s (an A100's dense bf16 peak is 312; a
third of it is a typical achieved rate)."""

TRAINING = {"adam": 4, "momentum": 3, "sgd": 2, "inference": 1}
"""Copies of each parameter a device keeps, per training mode."""

ALIASES = frozenset({"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "squeeze",
                     "unsqueeze", "slice", "select", "alias", "unflatten", "flatten", "detach", "narrow",
                     "as_strided", "view_as", "expand_as", "contiguous", "clone_alias"})
"""Ops whose output is a view of their input: no FLOPs, no memory of their own."""



class TrainingModeError(ShardingError):
    """An unknown training mode or a bad FLOP rate."""


def check_training(training: str) -> str:
    """The training mode, validated. ``check_training("adam") -> 'adam'``"""
    if training not in TRAINING:
        raise TrainingModeError(f"training mode {training!r}: choose one of {', '.join(TRAINING)}")
    return training


def check_flop_rate(rate) -> float:
    """A positive finite FLOP/s (None: the default). ``check_flop_rate(None) -> 100000000000000.0``"""
    if rate is None:
        return DEFAULT_FLOP_RATE
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise TrainingModeError(f"flop rate {rate!r}: give a positive, finite number of FLOP/s, e.g. 1e14")
    return float(rate)


@dataclass(frozen=True)
class StepEstimate:
    """Estimated seconds of one step (``forward`` + ``backward`` communication + ``compute`` -
    ``overlap``, the seconds the plan's streams hide; ``seconds`` is their exactly rounded sum)
    and bytes per device (``memory`` = ``parameter_memory`` + ``activation_memory``, inputs
    included in the latter)."""

    forward: float
    backward: float
    compute: float
    seconds: float
    memory: int
    parameter_memory: int
    activation_memory: int
    training: str
    flop_rate: float
    overlap: float = 0.0

    def to_json(self) -> dict:
        """JSON-able form. ``{"seconds": ..., "memory_bytes": ...}``"""
        return {"seconds": self.seconds, "forward_comm_seconds": self.forward, "backward_comm_seconds": self.backward,
                "compute_seconds": self.compute, "overlap_seconds": self.overlap, "memory_bytes": self.memory,
                "parameter_memory_bytes": self.parameter_memory, "activation_memory_bytes": self.activation_memory,
                "training": self.training, "flop_rate": self.flop_rate}


# ------------------------------------------------------------------------------------------
# pieces
# ------------------------------------------------------------------------------------------


@memo(1 << 16)
def largest_piece(s: Sharding) -> tuple:
    """Per dim, the largest extent any rank holds (even: shape / shard count).
    ``largest_piece(Sharding.parse("[dp*4, 12]", m)) -> (4, 12)``"""
    if s.is_even():
        out = []
        for n, fs in zip(s.shape, s.dims):
            k = 1
            for f in fs:
                if f.axis is not None:
                    k *= f.size
            out.append(n // k)
        return tuple(out)
    return tuple(_largest_extent(n, fs) for n, fs in zip(s.shape, s.dims))


def _largest_extent(n: int, fs) -> int:
    """The most elements of a dim of size ``n`` cut by ``fs`` any device holds: a dim's extent
    depends on its own digits only, and ``digit_classes`` stands for all of them (a DTensor chunk
    program: each of its steps' digits), so this never enumerates the mesh's ranks."""
    if isinstance(fs, ChunkProgram):
        return max(dim_length(n, fs, list(g)) for g in product(*(range(st.size) for st in fs)))
    return max(dim_length(n, fs, digits) for digits in digit_classes(n, fs))


@memo(1 << 16)
def local_bytes(s: Sharding, dtype: str) -> int:
    """Bytes of the largest piece of ``s`` one rank holds. ``local_bytes(Sharding.parse("[8]", m), "float32") -> 32``"""
    if s.is_even() or _independent_dims(s):  # each dim's extent at its own largest: the largest product
        return math.prod(largest_piece(s)) * itemsize(dtype)
    return max(math.prod(s.local_shape(r)) for r in range(s.mesh.size)) * itemsize(dtype)


def _independent_dims(s: Sharding) -> bool:
    """Does no mesh axis cut two dims (then the dims' digits are independent coordinates)?"""
    seen: set = set()
    for fs in s.dims:
        axes = {f.axis for f in fs if f.axis is not None}
        if axes & seen:
            return False
        seen |= axes
    return True


def grads_of(program) -> frozenset:
    """``plan.backward.grad_tensors`` of a program, computed once (programs are immutable).
    ``"layers.0.wq" in grads_of(llama(layers=1)) -> True``"""
    got = program.__dict__.get("_grad_tensors")
    if got is None:
        got = frozenset(grad_tensors(program))
        object.__setattr__(program, "_grad_tensors", got)
    return got


def memory_weights(program, training: str) -> dict:
    """``{tensor: copies counted}`` (0: not counted) per the accounting in the module docstring.
    ``memory_weights(llama(layers=1), "adam")["layers.0.wq"] -> 4``"""
    key = "_memory_weights_" + training
    got = program.__dict__.get(key)
    if got is not None:
        return got
    check_training(training)
    out = {}
    for name in program.inputs():
        out[name] = TRAINING[training] if program.tensors[name].kind == "param" else 1
    outputs = set(program.outputs)
    for op in program.ops:
        alias = canonical_op_name(op.target) in ALIASES
        for o in op.outputs:
            if training == "inference":
                out[o] = 1 if o in outputs else 0
            else:
                out[o] = 0 if alias and o not in outputs else 1
    object.__setattr__(program, key, out)
    return out


# ------------------------------------------------------------------------------------------
# terms: the same functions price a Plan (estimate) and every ILP candidate (plan.space)
# ------------------------------------------------------------------------------------------


def _adjoint(c: Collective, dtype: str):
    kind = c.kind
    if kind is CollectiveKind.REDUCE_SCATTER:
        return (Collective(CollectiveKind.ALL_GATHER, c.axes, c.dims, c.bytes, c.dst, c.src),)
    if kind in (CollectiveKind.ALL_TO_ALL, CollectiveKind.PERMUTE):
        return (Collective(kind, c.axes, c.dims, local_bytes(c.dst, dtype), c.dst, c.src),)
    if kind is CollectiveKind.LOCAL:
        pieces = slice_completions(c)
        if pieces:
            return (Collective(CollectiveKind.ALL_REDUCE, pieces, (), local_bytes(c.src, dtype), c.src, c.src, "sum"),)
    return ()


def move_terms(collectives, grad: bool, dtype: str, cm) -> tuple:
    """``(forward seconds, backward seconds)`` of one move (``plan_move``'s collectives, local
    steps included), one float per collective; the backward part only when ``grad``.
    ``move_terms(plan_move(src, dst), True, "float32", CostModel())``"""
    fwd = tuple(cm.seconds(c) for c in collectives if c.kind.communicates)
    bwd = tuple(cm.seconds(a) for c in collectives for a in _adjoint(c, dtype)) if grad else ()
    return fwd, bwd


def reduction_seconds(target: Sharding, axes, dtype: str, cm) -> float:
    """Seconds of the all-reduce summing a gradient held at ``target`` over mesh ``axes``.
    ``reduction_seconds(Sharding.parse("[16, tp*8]", m), {"dp"}, "float32", CostModel())``"""
    mesh = target.mesh
    pieces = tuple(AxisPiece(a, mesh.axis_size(a)) for a in mesh.names if a in axes)
    return cm.seconds(Collective(CollectiveKind.ALL_REDUCE, pieces, (), local_bytes(target, dtype), target, target,
                                 "sum"))


def op_flops(target: str, params: dict, input_targets, outputs) -> int:
    """FLOPs of one op on its largest local pieces (module docstring).
    ``op_flops("mm", {}, (a, b), (c,))`` is ``2*m*k*n`` of the local shapes."""
    try:  # only an einsum's equation among the params counts
        return _op_flops(target, params.get("equation"), tuple(input_targets), tuple(outputs))
    except TypeError:  # an unhashable operand: computed every time
        return _op_flops.__wrapped__(target, params.get("equation"), tuple(input_targets), tuple(outputs))


@memo(1 << 14)
def _op_flops(target: str, equation, input_targets: tuple, outputs: tuple) -> int:
    params = {} if equation is None else {"equation": equation}
    name = canonical_op_name(target)
    if name in ALIASES:
        return 0
    ins = [largest_piece(t) for t in input_targets if isinstance(t, Sharding)]
    outs = [largest_piece(o) for o in outputs if isinstance(o, Sharding)]
    out_n = max((math.prod(o) for o in outs), default=0)
    if name in MATMULS and len(ins) > MATMULS[name] and ins[MATMULS[name]]:
        return 2 * out_n * ins[MATMULS[name]][-1]
    if name == "einsum" and "equation" in params:
        lhs = params["equation"].replace(" ", "").split("->")[0].split(",")
        sizes = {}
        for term, shape in zip(lhs, ins):
            sizes.update(zip(term, shape))
        contracted = set("".join(lhs)) - set(params["equation"].split("->")[1])
        return (2 if contracted else 1) * math.prod(sizes.values())
    if name == "scaled_dot_product_attention" and len(ins) >= 3:
        q, k, v = ins[:3]
        return 2 * math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1])
    return out_n


def compute_seconds(flops: int, training: str, flop_rate: float) -> float:
    """Seconds of ``flops`` forward FLOPs in one step (3x when training).
    ``compute_seconds(1e14, "inference", 1e14) -> 1.0``"""
    return flops * (1 if training == "inference" else 3) / flop_rate


# ------------------------------------------------------------------------------------------
# a Plan's estimate
# ------------------------------------------------------------------------------------------


def step_terms(plan, training: str = "adam", flop_rate: float | None = None) -> tuple:
    """``(forward, backward, compute, overlap)`` tuples of float terms of ``plan``'s step time
    (``overlap``: ``overlap_terms``). ``math.fsum(sum(step_terms(p), ())) == estimate(p).seconds``"""
    check_training(training)
    rate = check_flop_rate(flop_rate)
    prog, cm = plan.program, plan.cost_model
    grads = grads_of(prog) if training != "inference" else frozenset()
    fwd, bwd, comp = [], [], []
    for (tensor, _), moves in plan.moves.items():
        f, b = move_terms(moves, tensor in grads, prog.tensors[tensor].dtype, cm)
        fwd.extend(f)
        bwd.extend(b)
    if grads:
        bwd.extend(reduction_seconds(t, {pc.axis for pc in pieces}, prog.tensors[name].dtype, cm)
                   for name, t, pieces in gradient_reductions(plan, grads))
    for op, po in zip(prog.ops, plan.ops):
        comp.append(compute_seconds(op_flops(op.target, po.params, po.input_targets, po.outputs), training, rate))
    return tuple(fwd), tuple(bwd), tuple(comp), overlap_terms(plan, rate)


def overlap_terms(plan, flop_rate: float | None = None) -> tuple:
    """Minus the saving of each stream ``plan`` runs (``plan.stream``: its stream choices at
    ``flop_rate``; forward only, each a move overlapped with the matmuls it feeds or is fed by),
    one float per stream: its pipelined seconds less its serial ones, as the stream search made
    them (``Plan.stream_choices``; read through the plan, so this module needs nothing of
    ``plan.stream``, which prices with it). ``overlap_terms(p) == tuple(-s for s in savings)``"""
    return tuple(c.overlapped - c.serial for c in plan.stream_choices(check_flop_rate(flop_rate)))


def plan_memory(plan, training: str = "adam") -> tuple:
    """``(parameter bytes, other bytes)`` per device of ``plan`` (module docstring).
    ``sum(plan_memory(p)) == estimate(p).memory``"""
    prog = plan.program
    weights = memory_weights(prog, training)
    par = other = 0
    for name, w in weights.items():
        if w:
            b = w * local_bytes(plan.shardings[name], prog.tensors[name].dtype)
            if prog.tensors[name].kind == "param":
                par += b
            else:
                other += b
    return par, other


def estimate(plan, training: str = "adam", flop_rate: float | None = None) -> StepEstimate:
    """Step time and memory per device of ``plan`` (module docstring). ``estimate(p).seconds``"""
    fwd, bwd, comp, ovl = step_terms(plan, training, flop_rate)
    par, other = plan_memory(plan, training)
    return StepEstimate(math.fsum(fwd), math.fsum(bwd), math.fsum(comp), math.fsum(fwd + bwd + comp + ovl),
                        par + other, par, other, training, check_flop_rate(flop_rate), math.fsum(-x for x in ovl))


__all__ = ["ALIASES", "DEFAULT_FLOP_RATE", "StepEstimate", "TRAINING", "TrainingModeError", "check_flop_rate",
           "check_training", "compute_seconds", "estimate", "grads_of", "largest_piece", "local_bytes",
           "memory_weights", "move_terms", "op_flops", "overlap_terms", "plan_memory", "reduction_seconds",
           "step_terms"]
