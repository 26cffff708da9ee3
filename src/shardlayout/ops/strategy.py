"""Op rules as factor maps, and the exact strategy search over mesh axes.

An op rule names one letter per independent index (an einsum): ``mm`` is ``mk,kn->mn``.
Each letter is *free* (in the output), *reduced* (not in the output: sharding it gives a
partial output with the rule's reduce op) or *whole* (must not be sharded, e.g. softmax's
dim). A single-dim strategy says what one mesh axis does: nothing (replicate), shard one
letter in every operand that carries it (the placeholder: however that dim is sharded —
plain, strided, sub-axis, uneven — the structure is taken from the operand that has it), or
keep partial inputs partial through a linear op.

Cost: DTensor's model — per mesh axis and operand, the collective that turns the operand's
current use of that axis into the strategy's (all-gather, all-to-all, all-reduce,
reduce-scatter; free local slices). The total is a sum over mesh axes of terms that depend
only on that axis's choice, so the exact minimum over the full N-D expansion (S^N
combinations) is the per-axis minimum: N*S evaluations. ``brute_force`` enumerates the
product for the tests.

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> a, b = Sharding.parse("[dp*4, tp*4]", m), Sharding.parse("[tp*4, 6]", m)
    >>> [str(o) for o in choose(MM, [a, b]).outputs]
    ['[dp*4, 6] +sum(tp)']
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import product as cartesian

from ..errors import ShardingSpecError
from ..sharding import Factor, Sharding
from ..sharding.core import ChunkProgram, _product
from ..sharding.redistribute import DEFAULT_COST_MODEL, ITEMSIZE, CostModel, plan_redistribution


@dataclass(frozen=True)
class FactorMap:
    """``inputs``: letters per input dim ('' for a non-tensor input); ``output``: letters of
    the output; ``reduce``: reduce op of the letters not in the output; ``whole``: letters
    that may not be sharded; ``linear``: how partial inputs may pass through — "sum" (output is
    the sum of the inputs: all partial together), "multi" (multilinear: exactly one partial),
    or None."""

    inputs: tuple
    output: str
    reduce: str = "sum"
    whole: frozenset = field(default_factory=frozenset)
    linear: str | None = None

    def letters(self) -> list:
        seen = []
        for s in self.inputs + (self.output,):
            for ch in s:
                if ch not in seen and ch != "1":
                    seen.append(ch)
        return seen


MM = FactorMap(("mk", "kn"), "mn", linear="multi")

# shardings the caller wants the op's outputs in (the whole-program planner's pins): the
# search adds the cost of moving each output there
OUT_PINS: ContextVar = ContextVar("out_pins", default=None)


def _out_usage(fm: FactorMap, option: tuple, out_index: int = 0):
    if option[0] == "S":
        L = option[1]
        return ("S", fm.output.index(L)) if L in fm.output else ("P", fm.reduce)
    return option


@dataclass(frozen=True)
class Choice:
    """What one mesh axis does: ``("R",)``, ``("S", letter)`` or ``("P", op)``."""

    axis: str
    option: tuple
    cost: float


@dataclass(frozen=True)
class Strategy:
    """The chosen targets, outputs and collectives of one op."""

    choices: tuple
    input_targets: tuple
    outputs: tuple
    redistributions: tuple
    cost: float
    alternatives: tuple = ()


def _usage(s: Sharding, axis: str):
    """How ``s`` uses ``axis``: ("R",), ("S", dim) or ("P", op)."""
    table = s._cache.get("usage")
    if table is None:
        table = s._cache["usage"] = {a: _usage_of(s, a) for a in s.mesh.names}
    return table[axis]


def _usage_of(s: Sharding, axis: str):
    for a, op in s.partial:
        if a == axis:
            return ("P", op)
    for d, fs in enumerate(s.dims):
        for f in fs:
            if f.axis == axis:
                return ("S", d)
    return ("R",)


def _local_bytes(s: Sharding, itemsize: int) -> float:
    return _product(s.local_shape(0)) * itemsize


def transition_seconds(cur, tgt, axis: str, n: int, nbytes: float, cm: CostModel) -> float:
    """Per-axis DTensor-style transition cost of one operand. ``inf`` when not allowed."""
    if cur == tgt:
        return 0.0
    k = cur[0]
    if k == "S" and tgt[0] == "R":
        return cm.seconds("all_gather", axis, n, nbytes * n)
    if k == "S" and tgt[0] == "S":
        return cm.seconds("all_to_all", axis, n, nbytes)
    if k == "P" and tgt[0] == "R":
        return cm.seconds("all_reduce", axis, n, nbytes)
    if k == "P" and tgt[0] == "S":
        return cm.seconds("reduce_scatter", axis, n, nbytes)
    if k == "R" and tgt[0] == "S":
        return 0.0
    if k == "R" and tgt[0] == "P":
        return 0.0
    return float("inf")


def _options(fm: FactorMap, inputs: list, axis: str) -> list:
    opts = [("R",)]
    for L in fm.letters():
        if L in fm.whole:
            continue
        opts.append(("S", L))
    partial_ops = {_usage(s, axis)[1] for s in inputs if s is not None and _usage(s, axis)[0] == "P"}
    # linear ops commute with sums and averages, not with max/min
    if fm.linear and len(partial_ops) == 1 and next(iter(partial_ops)) in ("sum", "avg"):
        opts.append(("P", partial_ops.pop()))
    return opts


def _targets_for(fm: FactorMap, inputs: list, axis: str, option: tuple) -> list:
    out = []
    for s, letters in zip(inputs, fm.inputs):
        if s is None:
            out.append(None)
            continue
        cur = _usage(s, axis)
        if option[0] == "S" and option[1] in letters:
            d = letters.index(option[1])
            # a size-1 (broadcast) dim is never sharded
            out.append(("S", d) if s.shape[d] > 1 else ("R",))
        elif option[0] == "P" and cur == ("P", option[1]):
            out.append(cur)
        else:
            out.append(("R",))
    return out


def _valid(fm: FactorMap, inputs: list, axis: str, option: tuple) -> bool:
    if option[0] == "P":
        partial = [s is not None and _usage(s, axis)[0] == "P" for s in inputs]
        tensors = [s is not None for s in inputs]
        if fm.linear == "sum":
            return all(p for p, t in zip(partial, tensors) if t)
        return sum(partial) == 1
    if option[0] == "S":  # some input must really have that index (not only broadcast size 1)
        return any(
            x is not None and option[1] in letters and x.shape[letters.index(option[1])] > 1
            for x, letters in zip(inputs, fm.inputs)
        )
    return True


def axis_cost(fm, inputs, axis, option, cm, itemsize, nbytes=None) -> float:
    """Cost of one axis choice (sum over operands); ``nbytes``: the operands' local bytes."""
    if not _valid(fm, inputs, axis, option):
        return float("inf")
    n = inputs_mesh(inputs).axis_size(axis)
    if nbytes is None:
        nbytes = [None if s is None else _local_bytes(s, itemsize) for s in inputs]
    total = 0.0
    for s, tgt, b in zip(inputs, _targets_for(fm, inputs, axis, option), nbytes):
        if s is None:
            continue
        total += transition_seconds(_usage(s, axis), tgt, axis, n, b, cm)
    return total


def inputs_mesh(inputs):
    return next(s for s in inputs if s is not None).mesh


def _rank(option) -> int:
    # tie-break: prefer sharding, then partial, then replicate (less memory, less compute)
    return {"S": 0, "P": 1, "R": 2}[option[0]]


def search(fm: FactorMap, inputs: list, cost_model: CostModel | None = None, dtype: str = "float32"):
    """Exact per-axis minimum: ``[Choice]`` in mesh order, plus every alternative considered."""
    cm = cost_model or DEFAULT_COST_MODEL
    itemsize = ITEMSIZE.get(str(dtype).replace("torch.", ""), 4)
    mesh = inputs_mesh(inputs)
    nbytes = [None if s is None else _local_bytes(s, itemsize) for s in inputs]
    pins = [p for p in (OUT_PINS.get() or ())[:1] if p is not None]
    pin_bytes = [_local_bytes(p, itemsize) for p in pins]
    chosen, considered = [], []
    inf = float("inf")
    for axis, n in zip(mesh.names, mesh.shape):
        best = None
        usage = [None if x is None else _usage(x, axis) for x in inputs]
        for opt in _options(fm, inputs, axis):
            mismatch = 0
            if _valid(fm, inputs, axis, opt):
                c, changed = 0.0, 0
                for u, t, b in zip(usage, _targets_for(fm, inputs, axis, opt), nbytes):
                    if u is not None and u != t:
                        changed += 1
                        c += transition_seconds(u, t, axis, n, b, cm)
                for pin, b in zip(pins, pin_bytes):
                    ou, pu = _out_usage(fm, opt), _usage(pin, axis)
                    if ou != pu:
                        mismatch += 1
                        c += transition_seconds(ou, pu, axis, n, b, cm)
            else:
                c, changed = inf, 0
            considered.append(Choice(axis, opt, c))
            # ties: produce the pinned output directly, then change the fewest inputs
            key = (c, mismatch, changed, _rank(opt), str(opt))
            if best is None or key < best[0]:
                best = (key, Choice(axis, opt, c))
        chosen.append(best[1])
    return chosen, considered


def brute_force(fm: FactorMap, inputs: list, cost_model: CostModel | None = None, dtype: str = "float32"):
    """Enumerate the full N-D expansion (tests only): the minimum total cost."""
    cm = cost_model or DEFAULT_COST_MODEL
    itemsize = ITEMSIZE.get(str(dtype).replace("torch.", ""), 4)
    mesh = inputs_mesh(inputs)
    per_axis = [_options(fm, inputs, a) for a in mesh.names]
    nbytes = [None if s is None else _local_bytes(s, itemsize) for s in inputs]
    best = float("inf")
    count = 0
    for combo in cartesian(*per_axis):
        count += 1
        total = sum(axis_cost(fm, inputs, a, o, cm, itemsize, nbytes) for a, o in zip(mesh.names, combo))
        best = min(best, total)
    return best, count


def _dim_factors(template, axes: list, mesh) -> list:
    """Factors of a dim sharded on ``axes``: the template's structure when it shards exactly
    these axes (however: strided, sub-axis, uneven), else plain mesh order."""
    if template is not None:
        return list(template)
    return [Factor(mesh.axis_size(a), a) for a in axes]


def materialize(fm: FactorMap, inputs: list, out_shapes: list, choices: list):
    """Target shardings of the inputs and the output sharding for per-axis choices."""
    mesh = inputs_mesh(inputs)
    letter_axes: dict = {}
    partial = []
    for ch in choices:
        if ch.option[0] == "S":
            letter_axes.setdefault(ch.option[1], []).append(ch.axis)
        elif ch.option[0] == "P":
            partial.append((ch.axis, ch.option[1]))
    # a structure per letter, taken from an input already sharding it on exactly those axes
    structure: dict = {}
    for s, letters in zip(inputs, fm.inputs):
        if s is None:
            continue
        for d, L in enumerate(letters):
            axes = letter_axes.get(L)
            fs = s.dims[d]
            if axes and L not in structure and type(fs) is not ChunkProgram:
                used = [f.axis for f in fs if f.axis is not None]
                if sorted(set(used)) == sorted(axes) and all(f.pre == 1 and f.size == mesh.axis_size(f.axis)
                                                             for f in fs if f.axis):
                    structure[L] = (s.shape[d], fs)
    targets = []
    for s, letters in zip(inputs, fm.inputs):
        if s is None:
            targets.append(None)
            continue
        dims = []
        for d, L in enumerate(letters):
            axes = [a for a in letter_axes.get(L, []) if s.shape[d] > 1]
            tmpl = structure.get(L)
            same = tmpl and tmpl[0] == s.shape[d] and axes == letter_axes[L]
            dims.append(_dim_factors(tmpl[1] if same else None, axes, mesh))
        keep_partial = [(a, op) for a, op in partial if _usage(s, a) == ("P", op)]
        targets.append(Sharding._trusted(mesh, s.shape, dims, tuple(keep_partial)))
    outputs = []
    red = [(a, fm.reduce) for L, axes in letter_axes.items() if L not in fm.output for a in axes]
    for shape in out_shapes:
        dims = []
        for d, L in enumerate(fm.output):
            axes = letter_axes.get(L, []) if shape[d] > 1 else []
            tmpl = structure.get(L)
            dims.append(_dim_factors(tmpl[1] if tmpl and tmpl[0] == shape[d] else None, axes, mesh))
        order = {n: i for i, n in enumerate(mesh.names)}
        parts = tuple(sorted(partial + red, key=lambda p: order[p[0]]))
        outputs.append(Sharding._trusted(mesh, shape, dims, parts))
    return targets, outputs


def choose(fm: FactorMap, inputs: list, out_shapes: list | None = None, cost_model=None,
           dtype: str = "float32") -> Strategy:
    """Search, materialize and plan the redistributions. ``choose(MM, [a, b])``."""
    inputs = list(inputs)
    if len(inputs) != len(fm.inputs):
        raise ShardingSpecError(f"op expects {len(fm.inputs)} inputs, got {len(inputs)}")
    if out_shapes is None:
        out_shapes = [_infer_out_shape(fm, inputs)]
    choices, considered = search(fm, inputs, cost_model, dtype)
    targets, outputs = materialize(fm, inputs, out_shapes, choices)
    reds = []
    cm = cost_model or DEFAULT_COST_MODEL
    for i, (s, t) in enumerate(zip(inputs, targets)):
        if s is None:
            continue
        for st in plan_redistribution(s, t, cm, dtype):
            if st.kind != "local":
                reds.append((i, st))
    cost = sum(st.seconds for _, st in reds)
    return Strategy(tuple(choices), tuple(targets), tuple(outputs), tuple(reds), cost, tuple(considered))


def _infer_out_shape(fm: FactorMap, inputs: list) -> tuple:
    sizes: dict = {}
    for s, letters in zip(inputs, fm.inputs):
        if s is None:
            continue
        for d, L in enumerate(letters):
            n = s.shape[d]
            if L in sizes and sizes[L] != n and 1 not in (n, sizes[L]):
                raise ShardingSpecError(
                    f"dim {d} of an input has size {n} for index {L!r}, another input has {sizes[L]}"
                )
            sizes[L] = max(n, sizes.get(L, 1))
    return tuple(sizes.get(L, 1) for L in fm.output)
