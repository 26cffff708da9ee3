"""Sharding styles as pins on the blocks ``find_blocks`` finds by structure (never by names).

On a mesh with axes ``dp`` and/or ``tp`` (others replicate; ``ep`` for experts):

- ``megatron``: in each attention and MLP block the first Linears (q, k, v; up and gate) are
  column-parallel (output features on tp; a fused q|k|v or gate|up weight strided, so each rank
  holds its slice of every part; a q|k|v fused into unequal pieces, and k / v with fewer kv heads
  than ranks, whole; a whole attention block when tp does not divide its query heads; heads that
  an attention pairs run with run — differential attention's head ``i`` with ``i + H/2``,
  ``Block.runs`` — cut in each run, ``[2*tp*8, 32]``, so a rank's pairs are whole; a 1-D weight
  scaling q's features, as OLMo-2's ``q_norm``, cut with q, and the norm's statistic over all of
  q's features all-reduced where it is made: one collective), the last Linear (output / down
  projection) row-parallel (input features on tp, its bias added once; a norm of those features
  before it, as BitNet's ``attn_sub_norm`` / ``ffn_sub_norm``, cut with them, its statistic
  all-reduced where it is made), and the block's output
  (its residual add) replicated on tp: one all_reduce after each block. Embeddings and norms
  replicated (a lookup's or a patch convolution's output replicated on tp); a head (a Linear
  whose output is a program output) column-parallel on its vocabulary, its logits left sharded.
  A table tied to the head (one parameter for both) is the head's: cut on its vocabulary rows
  when tp divides them, its lookup vocab-parallel (a partial sum reduced where it is made: one
  all_reduce).
- ``megatron-sp``: the same weights; the residual stream sequence-sharded (dim 1 of a
  ``[batch, seq, ...]`` activation on tp, so norms run on sequence shards), the block's input
  (the norm output its projections read) replicated on tp: one all_gather before and one
  reduce_scatter after each block (free for the first block when the embedding's output is
  replicated; one all_gather before a head).
- ``dp``: user inputs batched on dp (dim 0; every input whose dim 0 is the first input's), and
  program outputs likewise; every weight replicated: no collective in the forward pass.
- ``fsdp``: ``dp`` plus every parameter sharded on dp along dim 0 (where it divides) and
  gathered before use: the output of every op reading a parameter and a batched activation (a
  Linear's matmul, a convolution, a lookup, a norm's scale) and every block output stays batched
  on dp.
- ``ep``: stacked expert weights (rank >= 3, feeding a batched matmul) sharded on ``ep`` (or
  ``dp``) along the expert dim; tokens (inputs and outputs) on the same axis — on ``dp`` and
  ``ep`` when the mesh has both (data parallel around expert parallel: routed tokens move
  within their ``ep`` group only).

    >>> from shardlayout.mesh import Mesh
    >>> from shardlayout.program.models import llama
    >>> s = apply_style(llama(layers=1), Mesh.parse("tp=2"), "megatron")
    >>> str(s.pins["layers.0.wq"]), str(s.pins["layers.0.wo"]), [b.kind for b in s.matched]
    ('[16, tp*8]', '[tp*8, 16]', ['norm', 'attention', 'norm', 'mlp'])
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..caches import memo
from ..errors import ShardingError, UnmatchedStyle
from ..mesh import Mesh
from ..sharding import Factor, Sharding
from . import Program
from .blocks import (
    Block,
    Linear,
    Structure,
    derived,
    expert_linears,
    feature_scales,
    feature_statistics,
    find_blocks,
    heads_of,
    input_scales,
    input_statistics,
    routed_source,
    short,
    view_root,
    weight_consumers,
)

STYLES = ("dp", "megatron", "megatron-sp", "fsdp", "ep")


@dataclass(frozen=True)
class StylePins:
    """A style applied to a program: ``pins`` (tensor name -> Sharding), the blocks it
    ``matched`` (in program order) and the pinned weights it ``kept``: the ones the style promises
    stay where it put them (Megatron's column and row weights, EP's experts), so the planner never
    moves them with a collective; a plan that would have to is refused (``StyleConflict``).
    ``whole`` names the matched blocks the style could not cut and kept whole on every rank, with
    the reason (``{"model.layers.0.self_attn": "3 heads do not divide over tp=2"}``)."""

    pins: dict
    matched: tuple
    kept: frozenset = frozenset()
    whole: tuple = ()  # ((block name, reason), ...)

    def matched_json(self) -> list:
        """``[{"block": ..., "kind": ..., "tensors": [...]}, ...]``, with ``"whole": reason`` on a
        block kept whole."""
        why = dict(self.whole)
        return [b.to_json() | ({"whole": why[b.name]} if b.name in why else {}) for b in self.matched]


def kept_pins(pins: dict, *applied: StylePins) -> frozenset:
    """The tensors of ``pins`` (the final ones: a style's, then a TP plan's, then the user's) that one
    of the ``applied`` styles keeps with the very sharding it pinned (a pin the user changed is not
    the style's promise any more). ``kept_pins(pins, apply_style(prog, mesh, "ep"))``"""
    return frozenset(n for g in applied for n in g.kept if n in pins and pins[n] == g.pins.get(n))


def sharded(mesh: Mesh, shape: tuple, placement: dict) -> Sharding:
    """A Sharding with ``placement = {dim: [axes, outer first]}``; axes missing from the mesh
    (or of size 1) are dropped; one object per distinct call (a style pins every layer's weights
    alike, and equal pins that are one object compare by identity in the planner's memo).
    ``sharded(Mesh.parse("tp=2"), (4, 8), {1: ["tp"]}) -> [4, tp*4]``"""
    return _sharded(mesh, tuple(shape), tuple(sorted((d, tuple(a)) for d, a in placement.items())))


def replica(mesh: Mesh, shape: tuple) -> Sharding:
    """The replicated Sharding of ``shape``, one object per mesh and shape (see :func:`sharded`).
    ``str(replica(Mesh.parse("tp=2"), (4, 8))) -> '[4, 8]'``"""
    return _sharded(mesh, tuple(shape), ())


@memo(1 << 12)
def _sharded(mesh: Mesh, shape: tuple, placement: tuple) -> Sharding:
    placement = dict(placement)
    dims = []
    for d in range(len(shape)):
        axes = [a for a in placement.get(d, []) if a in mesh.names and mesh.axis_size(a) > 1]
        dims.append([Factor(mesh.axis_size(a), a) for a in axes])
    return Sharding(mesh, shape, dims)


def strided(mesh: Mesh, shape: tuple, dim: int, axis: str, parts: int = 1) -> Sharding:
    """``shape`` with ``dim`` sharded on ``axis``; with ``parts > 1`` (a fused weight) each of
    the ``parts`` equal pieces of the dim is sharded on its own — ``[3*tp*8, 16]`` — so a split
    into the parts leaves every rank its slice of each, without moving data.
    ``str(strided(Mesh.parse("tp=2"), (48, 16), 0, "tp", 3)) -> '[3*tp*8, 16]'``"""
    if axis not in mesh.names or mesh.axis_size(axis) == 1:
        return replica(mesh, shape)
    n, k = shape[dim], mesh.axis_size(axis)
    if parts <= 1 or n % parts or (n // parts) % k:
        return sharded(mesh, shape, {dim: [axis]})
    return _strided(mesh, tuple(shape), dim, axis, parts)


@memo(1 << 12)
def _strided(mesh: Mesh, shape: tuple, dim: int, axis: str, parts: int) -> Sharding:
    n, k = shape[dim], mesh.axis_size(axis)
    fs = [Factor(parts), Factor(k, axis)] + ([Factor(n // parts // k)] if n // parts // k > 1 else [])
    return Sharding(mesh, shape, [fs if d == dim else [] for d in range(len(shape))])


def column(mesh: Mesh, program: Program, lin: Linear, axis: str = "tp", runs: int = 1) -> dict:
    """Pins of a column-parallel Linear: output features (weight and bias) on ``axis``; with
    ``runs > 1`` (an attention whose heads combine run with run: ``Block.runs``) each part's
    features cut run by run, so each rank holds its share of every run (``[2*tp*8, 32]``)."""
    t = program.tensors
    parts = lin.parts * runs
    pins = {lin.weight: strided(mesh, t[lin.weight].shape, lin.out_dim, axis, parts)}
    if lin.bias:  # its features are its last dim (an expert's bias [experts, features] too)
        pins[lin.bias] = strided(mesh, t[lin.bias].shape, len(t[lin.bias].shape) - 1, axis, parts)
    return pins


def row(mesh: Mesh, program: Program, lin: Linear, axis: str = "tp") -> dict:
    """Pins of a row-parallel Linear: input features on ``axis``, the bias replicated."""
    t = program.tensors
    pins = {lin.weight: sharded(mesh, t[lin.weight].shape, {lin.in_dim: [axis]})}
    if lin.bias:
        pins[lin.bias] = replica(mesh, t[lin.bias].shape)
    return pins


def replicated(mesh: Mesh, program: Program, names) -> dict:
    """Every tensor in ``names`` replicated."""
    return {n: replica(mesh, program.tensors[n].shape) for n in names}


def batched_inputs(program: Program) -> list:
    """User inputs (and program outputs) whose dim 0 is the batch: the first user input's dim 0."""
    user = [n for n in program.inputs("input") if program.tensors[n].shape]
    if not user:
        return []
    b = program.tensors[user[0]].shape[0]
    outs = [o for o in program.outputs if program.tensors[o].shape and program.tensors[o].shape[0] == b]
    return list(dict.fromkeys([n for n in user if program.tensors[n].shape[0] == b] + outs))


def _activation(mesh: Mesh, shape: tuple, sequence: bool) -> Sharding:
    """The residual stream ``[batch, seq, ...]``: batch on dp; with ``sequence`` also the
    sequence on tp."""
    return sharded(mesh, shape, {0: ["dp"], 1: ["tp"]} if sequence else {0: ["dp"]})


def _need_axis(mesh: Mesh, style: str, axis: str) -> None:
    if axis not in mesh.names:
        raise ShardingError(f"style {style} shards on mesh axis {axis!r}; the mesh {str(mesh) or '(one device)'} has "
                            f"{', '.join(mesh.names) or 'no axes'}: add {axis}=N to --mesh")


def _unmatched(program: Program, style: str, looked_for: str, s: Structure) -> UnmatchedStyle:
    ops = Counter(short(op) for op in program.ops)
    top = ", ".join(f"{n} x{k}" for n, k in ops.most_common(8))
    lins = ", ".join(lin.weight for lin in s.linears[:6]) + (" ..." if len(s.linears) > 6 else "")
    return UnmatchedStyle(
        f"style {style} found nothing to shard: it looks for {looked_for}; the model has {s.summary()}, "
        f"{len(s.linears)} Linear(s){' (' + lins + ')' if lins else ''} and ops {top}. "
        "Pass --allow-unmatched to plan it anyway, or pin tensors with --tp-plan / --pin")


LOOKED_FOR = {
    "megatron": "attention blocks (Linears feeding scaled_dot_product_attention or softmax(QK^T)V, then a Linear "
                "consuming the result) and MLP blocks (an up [+ gate] Linear reaching a down Linear through "
                "pointwise ops)",
    "ep": "stacked expert weights (a parameter of rank >= 3 feeding bmm, einsum or _grouped_mm)",
    "dp": "user inputs with a batch dim",
    "fsdp": "parameters (sharded along dim 0 where it divides by the dp axis)",
}
LOOKED_FOR["megatron-sp"] = LOOKED_FOR["megatron"]


def apply_style(program: Program, mesh: Mesh, style: str, allow_unmatched: bool = False) -> StylePins:
    """The pins of ``style`` on ``program`` and the blocks it matched; ``UnmatchedStyle`` when it
    matches nothing (unless ``allow_unmatched``). ``apply_style(llama(), Mesh.parse("tp=2"), "megatron")``"""
    if style not in STYLES:
        raise ShardingError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")
    got = _repeated_style(program, mesh, style) if program.repeated is not None else None
    if got is None:
        s = find_blocks(program)
        got = _STYLES[style](program, mesh, s)
    if not got.matched and not allow_unmatched:
        raise _unmatched(program, style, LOOKED_FOR[style], find_blocks(program))
    return got


def _repeated_style(program: Program, mesh: Mesh, style: str):
    """The style of a program of repeated blocks from its compressed form: instance 3's pins
    and blocks renamed for every middle instance (``program.repeat``), when instances 2 and 3
    got the same ones (else None: the caller reads the whole program)."""
    from dataclasses import replace

    from .repeat import last_reads, local, to_instance

    cp, rep = program.repeated
    got = _STYLES[style](cp, mesh, find_blocks(cp))
    if local(rep, 2, got.pins) != local(rep, 3, got.pins):
        return None
    n = len(rep.ops)

    def moved(b: Block, f, shift: int) -> Block:  # names renamed by f, op indices shifted
        lin = lambda x: replace(x, weight=f(x.weight), bias=f(x.bias), op=x.op + shift,  # noqa: E731
                                output=f(x.output), activation=f(x.activation))
        return replace(b, name=f(b.name + ".")[:-1], first=tuple(map(lin, b.first)), last=tuple(map(lin, b.last)),
                       inputs=tuple(map(f, b.inputs)), output=f(b.output), params=tuple(map(f, b.params)))

    def of(k: int) -> list:
        head = f"{rep.prefix}.{k}."
        return [i for i, b in enumerate(got.matched) if all(t.startswith(head) for t in b.tensors()) and b.tensors()]

    at = {k: of(k) for k in (2, 3)}
    if len(at[2]) != len(at[3]) or any(moved(got.matched[i], to_instance(rep, 3, 2), n) != got.matched[j]
                                       for i, j in zip(at[2], at[3])):
        return None
    pins, template = dict(got.pins), local(rep, 3, got.pins)
    kept, kept3 = set(got.kept), [sfx for sfx in local(rep, 3, dict.fromkeys(got.kept, True))]
    blocks = [got.matched[i] for i in at[3]]
    why = dict(got.whole)
    middle, whole = [], []

    def renamed(b: Block, f, shift: int) -> Block:  # and its reason to be kept whole, if any
        out = moved(b, f, shift)
        if b.name in why:
            whole.append((out.name, why[b.name]))
        return out

    for k in rep.middle:
        head = f"{rep.prefix}.{k}."
        pins.update((head + sfx, v) for sfx, v in template.items())
        kept.update(head + sfx for sfx in kept3)
        middle.extend(renamed(b, to_instance(rep, k, 3), (k - 3) * n) for b in blocks)
    if middle:  # the last instance's blocks and the rest: ops later by the middle, reads of instance 3 renamed
        cut = (at[3][-1] + 1) if at[3] else len(got.matched)
        last, reads, same = f"{rep.prefix}.{rep.count - 1}.", last_reads(rep), lambda x: x
        head = [b for b in got.matched[:cut] if b.name in why]
        tail = [renamed(b, reads if b.tensors() and all(t.startswith(last) for t in b.tensors()) else same,
                        len(rep.middle) * n) for b in got.matched[cut:]]
        return StylePins(pins, tuple(got.matched[:cut]) + tuple(middle) + tuple(tail), frozenset(kept),
                         tuple((b.name, why[b.name]) for b in head) + tuple(whole))
    return StylePins(pins, got.matched, frozenset(kept), got.whole)


def style_pins(program: Program, mesh: Mesh, style: str) -> dict:
    """The pins of ``style`` (``apply_style(...).pins``). ``style_pins(llama(), mesh, "megatron")``"""
    return apply_style(program, mesh, style).pins


def _megatron(program: Program, mesh: Mesh, s: Structure, sequence: bool) -> StylePins:
    _need_axis(mesh, "megatron-sp" if sequence else "megatron", "tp")
    t = program.tensors
    pins: dict = {}
    for n in batched_inputs(program):
        if n in program.inputs("input"):
            pins[n] = _activation(mesh, t[n].shape, sequence and len(t[n].shape) == 3)  # [batch, seq, features]
    blocks = s.of_kind("attention", "mlp")
    if not blocks:
        return StylePins(pins, ())
    for b in s.of_kind("embedding", "norm"):
        pins.update(replicated(mesh, program, b.params))
    for i in _lookups(program):  # embeddings and patch convolutions: replicated on tp, batched on dp
        out = program.ops[i].outputs[0]
        pins[out] = sharded(mesh, t[out].shape, {0: ["dp"]})
    tp = mesh.axis_size("tp")
    kept: set = set()
    whole: list = []

    def keep(got: dict) -> dict:  # a column or row weight (and bias) stays where it is pinned
        kept.update(got)
        return got

    for b in blocks:
        if b.kind == "attention" and b.heads is not None and b.heads % (tp * b.runs):  # a cut would split a head
            pins.update(replicated(mesh, program, b.tensors()))  # (or a pair of differential attention's)
            whole.append((b.name, f"{b.heads} heads do not divide over tp={tp}" if b.runs == 1 else
                          f"{b.heads} heads in {b.runs} runs paired run with run: {b.heads // b.runs} per run "
                          f"do not divide over tp={tp}"))
        else:
            for lin in b.first:
                if _whole(program, b, lin, tp):
                    pins.update(replicated(mesh, program, [lin.weight] + ([lin.bias] if lin.bias else [])))
                else:
                    pins.update(keep(column(mesh, program, lin, runs=b.runs)))
                    if b.kind == "attention":  # OLMo2's q_norm / k_norm weight, cut with q / k
                        pins.update(keep({n: strided(mesh, t[n].shape, 0, "tp", lin.parts * b.runs)
                                          for n in feature_scales(program, lin)}))
                        pins.update(_statistics(mesh, program, lin, keep))
            for lin in b.last:
                pins.update(keep(row(mesh, program, lin)))
                pins.update(keep({n: sharded(mesh, t[n].shape, {0: ["tp"]}) for n in input_scales(program, lin)}))
                pins.update(_statistics(mesh, program, lin, keep, input_statistics))
        if sequence:
            for x in b.inputs:
                pins[x] = sharded(mesh, t[x].shape, {0: ["dp"]})
        pins[b.output] = _activation(mesh, t[b.output].shape, sequence and len(t[b.output].shape) >= 3)
    claimed = {lin.weight for b in blocks for lin in b.first + b.last}  # an attention's expert q / o (JetMoE)
    for b in s.of_kind("experts"):  # tensor parallel inside each expert: gate|up column, down row
        first, last, outputs = expert_linears(program, b)
        first = tuple(lin for lin in first if lin.weight not in claimed)
        last = tuple(lin for lin in last if lin.weight not in claimed)
        if not (first and last):
            continue
        for lin in first:
            pins.update(keep(column(mesh, program, lin)))
        for lin in last:
            pins.update(keep(row(mesh, program, lin)))
        for out in outputs:
            pins[out] = _activation(mesh, t[out].shape, sequence and len(t[out].shape) >= 3)
        if sequence:  # the routed tokens gathered once, before the router and the experts read them
            for src in dict.fromkeys(view_root(program, x) for lin in first
                                     if (x := routed_source(program, lin)) is not None):
                pins[src] = sharded(mesh, t[src].shape, {0: ["dp"]})
        blocks += (b,)
    tied = {b: e for b in s.of_kind("head") if (e := tied_embedding(program, mesh, s, b)) is not None}
    heads = [b for b in s.of_kind("head") if b in tied or all(lin.weight not in pins for lin in b.first)]
    for b in heads:
        pins.update(keep(column(mesh, program, b.first[0])))
        if sequence:
            for x in b.inputs:
                pins[x] = sharded(mesh, t[x].shape, {0: ["dp"]})
    for e in tied.values():  # the shared table cut on its vocab rows: a vocab-parallel lookup, reduced where made
        if e.output in pins:
            pins[e.output] = _activation(mesh, t[e.output].shape, sequence and len(t[e.output].shape) >= 3)
    matched = tuple(b for b in s.blocks if b.kind in ("attention", "mlp", "embedding", "norm") or b in heads
                    or b in blocks)
    return StylePins(pins, matched, frozenset(kept), tuple(whole))


def _statistics(mesh: Mesh, program: Program, lin: Linear, keep, which=feature_statistics) -> dict:
    """Pins of the statistics over all of a column Linear's output features (OLMo2's q_norm mean
    square, ``feature_statistics``) or of a row Linear's input features (BitNet's sub-norms before
    o_proj and down_proj, ``input_statistics``): the statistic's input kept where the cut makes it
    (batch on dp, features on tp), the statistic replicated on tp: the partial sum all-reduced where
    it is made, one collective (the planner, op by op, would reduce-scatter it, the cheaper move
    there, and gather it again before it scales q; or, at small sizes, gather q)."""
    if lin.parts > 1:
        return {}
    t = program.tensors
    pins = {}
    for x, stat in which(program, lin):
        n = len(t[x].shape)
        pins.update(keep({x: sharded(mesh, t[x].shape, {0: ["dp"], n - 1: ["tp"]})}))
        pins[stat] = sharded(mesh, t[stat].shape, {0: ["dp"]})
    return pins


def _whole(program: Program, b: Block, lin: Linear, tp: int) -> bool:
    """Does Megatron keep a first Linear of ``b`` whole on every rank? When its kv heads are fewer
    than (or not a multiple of) the ranks (MQA, GQA), and when it fuses q|k|v of unequal sizes
    (grouped-query attention: no layout gives each rank its q heads and their kv heads in one cut
    of the fused dim; the q, k and v it makes are sliced locally into each rank's heads)."""
    if b.kind != "attention":
        return False
    heads = heads_of(program, lin)
    return bool(lin.pieces) or (heads is not None and heads % (tp * b.runs) != 0)


def tied_embedding(program: Program, mesh: Mesh, s: Structure, head: Block) -> Block | None:
    """The embedding whose table is ``head``'s weight (tied word embeddings: one parameter looked up
    by the token ids and multiplied by the last hidden states), when cutting it on its vocabulary
    rows serves both: the head's output features are the table's rows (dim 0) and the tp axis
    divides them evenly (a vocab-parallel lookup needs whole, equal row blocks); else None. Cut
    there, the lookup gives a partial sum (each rank its rows' tokens, zeros elsewhere) and the
    head vocab-sharded logits, as an untied embedding and head under Megatron.
    ``tied_embedding(gpt2, Mesh.parse("tp=2"), find_blocks(gpt2), head).params -> ('transformer.wte.weight',)``"""
    lin = head.first[0] if len(head.first) == 1 else None
    if lin is None or lin.out_dim != 0 or "tp" not in mesh.names:
        return None
    vocab = program.tensors[lin.weight].shape[0]
    if vocab % mesh.axis_size("tp"):
        return None
    return next((e for e in s.of_kind("embedding") if e.params == (lin.weight,)), None)


def _lookups(program: Program) -> list:
    """Ops outside the blocks that read a parameter and a batched input: embedding lookups and
    (patch) convolutions, whose outputs start the residual stream."""
    batch = derived(program, [n for n in batched_inputs(program) if n in program.inputs("input")])
    return [i for i in weight_consumers(program) if short(program.ops[i]) in ("embedding", "convolution", "conv1d",
                                                                              "conv2d", "conv3d")
            and any(x in batch for x in program.ops[i].inputs) and program.ops[i].outputs]


def _dp(program: Program, mesh: Mesh, s: Structure) -> StylePins:
    _need_axis(mesh, "dp", "dp")
    t = program.tensors
    names = batched_inputs(program)
    pins = {n: sharded(mesh, t[n].shape, {0: ["dp"]}) for n in names}
    for b in s.of_kind("attention", "mlp"):
        pins[b.output] = sharded(mesh, t[b.output].shape, {0: ["dp"]})
    user = [n for n in names if n in program.inputs("input")]
    return StylePins(pins, (Block("batch", "inputs", params=tuple(user)),) if user else ())


def _fsdp(program: Program, mesh: Mesh, s: Structure) -> StylePins:
    _need_axis(mesh, "fsdp", "dp")
    t = program.tensors
    pins = _dp(program, mesh, s).pins
    k = mesh.axis_size("dp")
    params = [n for n, spec in t.items() if spec.kind == "param" and n not in program.outputs]
    for n in params:
        if t[n].shape and t[n].shape[0] % k == 0:
            pins[n] = sharded(mesh, t[n].shape, {0: ["dp"]})
    batch = derived(program, [n for n in batched_inputs(program) if n in program.inputs("input")])
    for i in weight_consumers(program):  # the compute stays data parallel: weights are gathered
        out = program.ops[i].outputs
        if out and t[out[0]].shape and out[0] not in pins and any(x in batch for x in program.ops[i].inputs):
            pins[out[0]] = sharded(mesh, t[out[0]].shape, {0: ["dp"]})
    matched = tuple(b for b in s.blocks if b.tensors())
    others = tuple(n for n in params if not any(n in b.tensors() for b in matched))
    if others:
        matched += (Block("params", "", params=others),)
    return StylePins(pins, matched)


def _ep(program: Program, mesh: Mesh, s: Structure) -> StylePins:
    axis = "ep" if "ep" in mesh.names else "dp"
    if axis not in mesh.names:
        raise ShardingError(f"style ep shards on mesh axis 'ep' (or 'dp'); the mesh {str(mesh) or '(one device)'} has "
                            f"{', '.join(mesh.names) or 'no axes'}: add ep=N to --mesh")
    t = program.tensors
    experts = s.of_kind("experts")
    pins = {}
    for b in experts:
        for n in b.params:
            pins[n] = sharded(mesh, t[n].shape, {0: [axis]})
    tokens = ["dp", "ep"] if axis == "ep" and "dp" in mesh.names else [axis]  # data parallel around EP
    for n in batched_inputs(program):
        pins[n] = sharded(mesh, t[n].shape, {0: tokens})
    return StylePins(pins, experts, frozenset(n for b in experts for n in b.params))


_STYLES = {
    "megatron": lambda p, m, s: _megatron(p, m, s, False),
    "megatron-sp": lambda p, m, s: _megatron(p, m, s, True),
    "dp": _dp,
    "fsdp": _fsdp,
    "ep": _ep,
}

__all__ = ["STYLES", "StylePins", "apply_style", "column", "kept_pins", "row", "sharded", "strided", "style_pins"]
