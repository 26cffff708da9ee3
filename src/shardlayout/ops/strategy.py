"""Op rules as factor maps, and the exact strategy search.

An op rule names one letter per independent index (an einsum): ``mm`` is ``mk,kn->mn``.
Each letter is *free* (in the output), *reduced* (not in the output: sharding it gives a
partial output with the rule's reduce op) or *whole* (must not be sharded, e.g. softmax's
dim). A single-dim strategy says what one mesh axis does: replicate (``R``), shard one letter
in every operand that carries it (``S(letter)``), or keep partial values partial through a
linear op (``P(op)``; through a multilinear op whose operands are partial on the same axis, one
operand's partial kept and the others reduced first, ``P(op, k)``: ``A @ B`` with both summed over
``tp`` is one all-reduce of A and B's partial carried to the product).

**Search: exact, priced by the moves that run.** A candidate is one option per mesh axis
(the full N-D product of the per-axis options that are valid) and, for each sharded letter, a
factor structure: the order and digit of its axes inside the dim (the operands' own
structures merged where they agree — so ``[8, b*4] @ [2*a*2, 8]`` finds ``k = b*a*2`` in both,
for free — each operand's structure as it is, or plain mesh order). A candidate's price is
``cost(plan_move(input, target) for every input + plan_move(output, pin) for pinned outputs)`` —
the very collectives the plan then emits. The cheapest wins (ties: produce pinned outputs as
pinned, change how the inputs use the fewest mesh axes, prefer sharding to partial to replicate,
then option text, then generation order), so the chosen strategy is the minimum under our own
cost model over the whole candidate set. It is found without building most of it: each
combination's options give lower bounds of its candidates' keys (``_Space.bounds``: the usages it
changes, the operands it certainly moves — a collective's latency each — and the pins it misses);
combinations are visited in bound order and the visit stops at the first that cannot win
(``_search``). ``Strategy.candidates`` enumerates the whole set when read.

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("dp=2,tp=4")
    >>> a, b = Sharding.parse("[dp*4, tp*4]", m), Sharding.parse("[tp*4, 6]", m)
    >>> [str(o) for o in choose(MM, [a, b]).outputs]
    ['[dp*4, 6] +sum(tp)']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import product as cartesian

from ..caches import memo
from ..errors import OpError, SearchTooLarge, ShardingSpecError
from ..sharding import Factor, Sharding
from ..sharding.core import ChunkProgram, _product
from ..sharding.cost import DEFAULT_COST_MODEL, CostModel
from ..sharding.move import is_local_move, plan_move
from .result import Deferred


@dataclass(frozen=True)
class FactorMap:
    """``inputs``: letters per input dim ('' for a non-tensor input); ``output``: letters of
    the output; ``reduce``: reduce op of the letters not in the output; ``whole``: letters
    that may not be sharded; ``even``: letters that may be sharded only evenly (a mean, max or
    min of unequal or empty chunks is wrong); ``broadcast``: letters whose size may be 1 in one
    operand and n in another (pointwise dims, matmul batch dims; any other mismatch is refused);
    ``linear``: how partial inputs may pass through — "sum" (output is the sum of the inputs:
    partial inputs stay partial, replicated ones are partitioned for free), "multi"
    (multilinear: exactly one partial input), "first" (linear in the first input only, e.g.
    div's numerator), "max" / "min" (the op commutes with a partial max / min, e.g. amax,
    maximum: replicated inputs join the partial for free), or None."""

    inputs: tuple
    output: str
    reduce: str = "sum"
    whole: frozenset = field(default_factory=frozenset)
    linear: str | None = None
    even: frozenset = field(default_factory=frozenset)
    broadcast: frozenset = field(default_factory=frozenset)

    def letters(self) -> tuple:
        """Letters in first-seen order. ``MM.letters() -> ('m', 'k', 'n')``."""
        return _letters(self.inputs, self.output)


@memo(4096)
def _letters(inputs: tuple, output: str) -> tuple:
    seen: list = []
    for s in inputs + (output,):
        for ch in s:
            if ch not in seen and ch != "1":
                seen.append(ch)
    return tuple(seen)


MM = FactorMap(("mk", "kn"), "mn", linear="multi")

OPTION_RANK = {"S": 0, "P": 1, "R": 2}


def fmt_option(opt) -> str:
    """``fmt_option(("S", "k")) -> "shard index 'k'"``."""
    if opt[0] == "R":
        return "replicate"
    if opt[0] == "S":
        return f"shard index {opt[1]!r}"
    if opt[0] == "L":
        return opt[1]
    if len(opt) > 2:
        return f"keep partial({opt[1]}) of input {opt[2]}, reduce the others"
    return f"keep partial({opt[1]})"


@dataclass(frozen=True)
class Candidate:
    """One strategy: ``choices`` ((mesh axis, option) in mesh order), the input targets, the
    outputs, and ``cost``: the price of ``collectives`` (input moves, then output-to-pin moves,
    each with ``tensor`` = "input i" / "output k"), exactly what ``plan_move`` emits."""

    choices: tuple
    input_targets: tuple
    outputs: tuple
    priced: float | None = field(default=None, repr=False, compare=False)  # None: priced on first use
    inputs: tuple = field(default=(), repr=False, compare=False)
    out_pins: tuple = field(default=(), repr=False, compare=False)
    tensor_dtype: object = field(default="float32", repr=False, compare=False)
    cost_model: object = field(default=None, repr=False, compare=False)
    local: tuple = field(default=(), repr=False, compare=False)  # the local run's params (Propagation.local)

    @cached_property
    def cost(self) -> float:
        """Seconds of this strategy's moves (``price``). The search skips pricing a candidate whose
        tie-break already loses to the best found even at no cost; it is priced here when asked."""
        if self.priced is not None:
            return self.priced
        return price(list(self.inputs), self.input_targets, self.outputs, self.out_pins,
                     self.cost_model or DEFAULT_COST_MODEL, self.tensor_dtype)

    @cached_property
    def collectives(self) -> tuple:
        """Every communicating collective of this strategy (computed on first use)."""
        return move_collectives(self.inputs, self.input_targets, self.outputs, self.out_pins, self.tensor_dtype,
                                self.cost_model)

    def describe(self) -> str:
        """``"dp: shard index 'm'; tp: replicate"``."""
        return "; ".join(f"{a}: {fmt_option(o)}" for a, o in self.choices)


@dataclass(frozen=True)
class Strategy:
    """The chosen candidate and every candidate priced (for ``explain``)."""

    chosen: Candidate
    candidates: tuple

    @property
    def input_targets(self) -> tuple:
        return self.chosen.input_targets

    @property
    def outputs(self) -> tuple:
        return self.chosen.outputs

    @property
    def cost(self) -> float:
        return self.chosen.cost


# ------------------------------------------------------------------------------------------
# how a sharding uses each mesh axis
# ------------------------------------------------------------------------------------------


@memo(1 << 14)
def axis_usage(s: Sharding) -> dict:
    """``{axis: ("R",) | ("S", dim) | ("P", op)}`` (the first dim an axis shards)."""
    table = {a: ("R",) for a in s.mesh.names}
    for a, op in s.partial:
        table[a] = ("P", op)
    for d, fs in enumerate(s.dims):
        for f in fs:
            if f.axis is not None and table[f.axis] == ("R",):
                table[f.axis] = ("S", d)
    return table


def _mesh(inputs):
    return next(s for s in inputs if s is not None).mesh


# ------------------------------------------------------------------------------------------
# per-axis options
# ------------------------------------------------------------------------------------------


def axis_options(fm: FactorMap, inputs: list, axis: str) -> list:
    """Valid options of one mesh axis: ``[("R",), ("S", letter)..., ("P", op)?, ("P", op, k)...]`` (the
    last: input ``k``'s partial kept through a multilinear op, the other partial inputs reduced)."""
    opts = [("R",)]
    for L in fm.letters():
        if L in fm.whole:
            continue
        if any(x is not None and L in lt and x.shape[lt.index(L)] > 1 for x, lt in zip(inputs, fm.inputs)):
            opts.append(("S", L))
    tensors = [s for s in inputs if s is not None]
    partial = [axis_usage(s)[axis] for s in tensors]
    ops = {u[1] for u in partial if u[0] == "P"}
    n_partial = sum(u[0] == "P" for u in partial)
    if fm.linear in ("max", "min") and ops == {fm.linear}:  # max of maxes: a lattice, not a sum
        opts.append(("P", fm.linear))
    elif fm.linear and len(ops) == 1:
        op = next(iter(ops))
        if op in ("sum", "avg"):  # linear ops commute with sums and averages, not max/min
            first = inputs[0] is not None and axis_usage(inputs[0])[axis][0] == "P"
            ok = {"sum": True, "multi": n_partial == 1, "first": first and n_partial == 1}
            if ok.get(fm.linear, False):
                opts.append(("P", op))
            elif fm.linear in ("multi", "first") and n_partial > 1:  # keep one, reduce the others
                keep = [k for k, x in enumerate(inputs) if x is not None and axis_usage(x)[axis] == ("P", op)
                        and (fm.linear == "multi" or k == 0)]
                opts.extend(("P", op, k) for k in keep)
    return opts


# ------------------------------------------------------------------------------------------
# factor structures of a sharded letter
# ------------------------------------------------------------------------------------------


def _even(fs, n: int, mesh) -> bool:
    """Does the factor list ``fs`` cut a dim of ``n`` into equal chunks at every level?"""
    if type(fs) is ChunkProgram:
        return False
    return Sharding._trusted(mesh, (n,), [fs], ()).is_even(0)


def _covers(fs, axes, mesh) -> bool:
    """Do the pieces of ``axes`` in ``fs`` make up each axis completely (and nothing else)?"""
    sizes: dict = {}
    for f in fs:
        if f.axis is not None:
            if f.axis not in axes:
                return False
            sizes[f.axis] = sizes.get(f.axis, 1) * f.size
    return all(sizes.get(a) == mesh.axis_size(a) for a in axes)


def _merge(carriers: list, axes: tuple, n: int, mesh):
    """One even factor list of size ``n`` holding every piece of ``axes`` that the carriers
    hold at the digit they hold it (missing axes placed outermost where they fit), or None
    when the carriers disagree."""
    at: dict = {}
    for fs in carriers:
        if type(fs) is ChunkProgram or _product(f.size for f in fs) != n:
            continue
        p = 1
        for f in fs:
            if f.axis in axes:
                key = (f.axis, f.pre, f.size)
                if at.setdefault(key, p) != p:
                    return None
            p *= f.size
    pieces = sorted((p, s, a, pre) for (a, pre, s), p in at.items())
    for a in axes:
        have = [pc for pc in pieces if pc[2] == a]
        if have:
            if _product(pc[1] for pc in have) != mesh.axis_size(a):
                return None
            continue
        m = mesh.axis_size(a)
        for q in [1] + [p * s for p, s, _, _ in pieces]:
            nxt = next((p for p, _, _, _ in pieces if p >= q), n)
            if nxt % (q * m) == 0 and n % (q * m) == 0:
                pieces = sorted(pieces + [(q, m, a, 1)])
                break
        else:
            return None
    out, cur = [], 1
    for p, s, a, pre in pieces:
        if p < cur or p % cur:
            return None
        if p > cur:
            out.append(Factor(p // cur))
        out.append(Factor(s, a, pre))
        cur = p * s
    if n % cur:
        return None
    if n > cur:
        out.append(Factor(n // cur))
    return tuple(out)


def letter_structures(axes: tuple, n: int, carriers: list, mesh) -> list:
    """Candidate factor lists for a letter of size ``n`` sharded on ``axes`` (mesh order):
    the carriers' structures merged, each carrier's own, then plain mesh order."""
    out: list = []
    merged = _merge(carriers, axes, n, mesh)
    if merged is not None:
        out.append(merged)
    for fs in carriers:
        if type(fs) is ChunkProgram:
            if sorted({st.axis for st in fs}) == sorted(axes):
                out.append(fs)
        elif _covers(fs, axes, mesh):
            out.append(tuple(fs))
    out.append(tuple(Factor(mesh.axis_size(a), a) for a in axes))
    seen, unique = set(), []
    for fs in out:
        key = (type(fs) is ChunkProgram, tuple(fs))
        if key not in seen:
            seen.add(key)
            unique.append(fs)
    return unique


# ------------------------------------------------------------------------------------------
# candidates
# ------------------------------------------------------------------------------------------


def _letter_sizes(fm: FactorMap, inputs: list, out_shapes: list) -> dict:
    sizes: dict = {}
    for x, lt in zip(inputs, fm.inputs):
        if x is None:
            continue
        for d, L in enumerate(lt):
            if x.shape[d] > 1:
                sizes[L] = x.shape[d]
    for shape in out_shapes:
        for d, L in enumerate(fm.output):
            if L not in sizes and shape[d] > 1:
                sizes[L] = shape[d]
    return sizes


def _carriers(fm, inputs, pins, L, n) -> list:
    out = []
    for x, lt in zip(inputs, fm.inputs):
        if x is not None and L in lt and x.shape[lt.index(L)] == n:
            out.append(x.dims[lt.index(L)])
    for p in pins:
        if p is not None and L in fm.output and p.ndim == len(fm.output) and p.shape[fm.output.index(L)] == n:
            out.append(p.dims[fm.output.index(L)])
    return out


def _dims(shape: tuple, letters: str, table: dict) -> tuple:
    """Each dim's factors under a structure ``{letter: (size, factors)}``: its letter's factors
    where the sizes agree (a broadcast dim of size 1 stays whole)."""
    out = []
    for n, L in zip(shape, letters):
        got = table.get(L)
        out.append(got[1] if n > 1 and got is not None and got[0] == n else ())
    return tuple(out)


@memo(1 << 16)
def _build(mesh, shape, dims, partial) -> Sharding:
    return Sharding._trusted(mesh, shape, dims, partial)


def _pieces(fs) -> set:
    return {(f.axis, f.pre, f.size) for f in fs if f.axis is not None}


def _overlaps(pieces: set, used: set) -> bool:
    """Do two sets of axis pieces share any part of a mesh axis?"""
    return any(a == b and p1 < p2 * s2 and p2 < p1 * s1 for a, p1, s1 in pieces for b, p2, s2 in used)


def carrier_structures(fm: FactorMap, inputs: list, sizes: dict, mesh) -> list:
    """Letter structures taken whole from the operands' own layouts — one per operand, and
    their union — so that a layout the per-axis options cannot name (an axis split into
    sub-axes across two letters, ``[dp*4*tp:(1)2, tp:(2)2*3]``) can flow through unchanged."""
    out = []
    sources = [[x] for x in inputs if x is not None] + [[x for x in inputs if x is not None]]
    for group in sources:
        struct, used = {}, set()
        for x in group:
            lt = fm.inputs[inputs.index(x)]
            for d, L in enumerate(lt):
                fs = x.dims[d]
                if L in struct or L in fm.whole or x.shape[d] != sizes.get(L) or type(fs) is ChunkProgram:
                    continue
                pieces = _pieces(fs)
                if not pieces or _overlaps(pieces, used):
                    continue
                if L in fm.even and not _even(fs, sizes[L], mesh):
                    continue
                if L not in fm.output and not all(  # a reduced letter becomes partial: whole axes only
                        f.pre == 1 and f.size == mesh.axis_size(f.axis) for f in fs if f.axis is not None):
                    continue
                struct[L], used = tuple(fs), used | pieces
        if struct and struct not in out:
            out.append(struct)
    return out


def candidates(fm: FactorMap, inputs: list, out_shapes: list, out_pins: tuple = ()):
    """Every distinct candidate ``(choices, input_targets, outputs)``: the product of the
    per-axis options and, per sharded letter, of its factor structures; then the operands'
    own layouts carried through whole (each layout pair once, with its first choices)."""
    seen = set()
    for _, choices, targets, outputs in _productions(_Space(fm, inputs, out_shapes, out_pins)):
        key = (targets, outputs)
        if key not in seen:
            seen.add(key)
            yield choices, targets, outputs


class _Space:
    """What the candidates of one search share: sizes, per-axis options, carriers, the inputs'
    axis usage; and the carried-through structures (``carrier_entries``)."""

    def __init__(self, fm, inputs, out_shapes, out_pins):
        self.fm, self.inputs, self.out_shapes = fm, list(inputs), list(out_shapes)
        self.mesh = mesh = _mesh(inputs)
        self.sizes = sizes = _letter_sizes(fm, inputs, out_shapes)
        self.per_axis = [axis_options(fm, inputs, a) for a in mesh.names]
        _check_search_size(fm, mesh, self.per_axis)
        self.order = {n: i for i, n in enumerate(mesh.names)}
        self.carriers = {L: tuple(_carriers(fm, inputs, out_pins, L, n)) for L, n in sizes.items()}
        self.uses = [None if x is None else axis_usage(x) for x in inputs]
        self.summing = fm.linear in ("sum", "max", "min")

    def combo(self, combo) -> tuple:
        """One per-axis combination's ``(choices, [(targets, outputs)] per structure pick)``, lazily."""
        fm, mesh, sizes = self.fm, self.mesh, self.sizes
        letter_axes: dict = {}
        partial = []
        for a, opt in zip(mesh.names, combo):
            if opt[0] == "S":
                letter_axes.setdefault(opt[1], []).append(a)
            elif opt[0] == "P":
                partial.append((a, opt[1], opt[2] if len(opt) > 2 else None))
        letters = sorted(letter_axes)
        options = [_letter_options(tuple(letter_axes[L]), sizes[L], self.carriers[L], mesh, L in fm.even)
                   for L in letters]
        red = [(a, fm.reduce) for L in letters if L not in fm.output for a in letter_axes[L]]
        order = self.order
        out_partial = tuple(sorted([(a, op) for a, op, _ in partial] + red, key=lambda p: order[p[0]]))
        summing = self.summing
        keeps = [None if use is None else tuple((a, op) for a, op, k in partial
                                                if summing or (use[a] == ("P", op) and k in (None, i)))
                 for i, use in enumerate(self.uses)]

        def picks():
            for pick in cartesian(*options):
                table = {L: (sizes[L], fs) for L, fs in zip(letters, pick)}
                targets = tuple(None if x is None else _build(mesh, x.shape, _dims(x.shape, lt, table), keep)
                                for x, lt, keep in zip(self.inputs, fm.inputs, keeps))
                yield targets, tuple(_build(mesh, shape, _dims(shape, fm.output, table), out_partial)
                                     for shape in self.out_shapes)

        return tuple(zip(mesh.names, combo)), picks()

    def carrier_entries(self) -> list:
        """``(choices, targets, outputs)`` of each structure carried whole from the operands."""
        return [(choices, *made()) for choices, made in self.carriers_lazy()]

    def carriers_lazy(self) -> list:
        """``(choices, build)`` of each structure carried whole from the operands: its choices at
        once, its ``(targets, outputs)`` when ``build()`` is called."""
        fm, mesh, sizes, out = self.fm, self.mesh, self.sizes, []
        for struct in carrier_structures(fm, self.inputs, sizes, mesh):
            letters_of: dict = {}
            for L, fs in sorted(struct.items()):
                for f in fs:
                    if f.axis is not None and L not in letters_of.setdefault(f.axis, []):
                        letters_of[f.axis].append(L)
            choices = tuple((a, ("S", ",".join(letters_of[a])) if a in letters_of else ("R",)) for a in mesh.names)
            out.append((choices, lambda struct=struct: self._carried(struct)))
        return out

    def _carried(self, struct: dict) -> tuple:
        fm, mesh, sizes = self.fm, self.mesh, self.sizes
        table = {L: (sizes[L], fs) for L, fs in struct.items()}
        red = sorted({f.axis for L, fs in struct.items() if L not in fm.output for f in fs if f.axis},
                     key=self.order.get)
        out_partial = tuple((a, fm.reduce) for a in red)
        targets = tuple(None if x is None else _build(mesh, x.shape, _dims(x.shape, lt, table), ())
                        for x, lt in zip(self.inputs, fm.inputs))
        outputs = tuple(_build(mesh, shape, _dims(shape, fm.output, table), out_partial) for shape in self.out_shapes)
        return targets, outputs

    def bounds(self, retarget, pins) -> list:
        """Per mesh axis, per option: ``(changed, moved, differ)`` — how many (input, axis) usages
        the option changes (summed over a combination's axes: the ``changed`` part of its
        tie-break, exact); the bit set of the operands it certainly moves off their devices (a
        piece leaves its dim, a partial axis is reduced: each costs at least one collective;
        inputs, then pinned outputs); the bit set of pinned outputs it makes differ from their pin
        (the ``mismatch`` part). With a retarget, which may change targets afterwards, the input
        parts are 0 (lower bounds still)."""
        fm, mesh, sizes = self.fm, self.mesh, self.sizes
        n_in = len(self.inputs)
        pinned = [(k, shape, axis_usage(p)) for k, (shape, p) in enumerate(zip(self.out_shapes, pins))
                  if p is not None]
        out = []
        for a, opts in zip(mesh.names, self.per_axis):
            row = {}
            for opt in opts:
                n = moved = differ = 0
                if retarget is None:
                    for k, (x, lt, use) in enumerate(zip(self.inputs, fm.inputs, self.uses)):
                        if x is None:
                            continue
                        now = use[a]
                        then = _usage_under(opt, a, x.shape, lt, use, sizes, mesh, self.summing, k)
                        if now != then:
                            n += 1
                            if now[0] != "R":
                                moved |= 1 << k
                for k, shape, want in pinned:
                    made = _out_usage_under(opt, a, shape, fm, sizes, mesh)
                    if made != want[a]:
                        differ |= 1 << k
                        if made[0] != "R":
                            moved |= 1 << (n_in + k)
                row[opt] = (n, moved, differ)
            out.append(row)
        return out


def _usage_under(opt, a, shape, lt, use, sizes, mesh, summing, k=None) -> tuple:
    """How input ``k``'s target uses axis ``a`` when ``a`` takes option ``opt`` (``axis_usage``)."""
    if opt[0] == "P":
        kept = opt[:2]
        return kept if summing or (use[a] == kept and (len(opt) == 2 or opt[2] == k)) else ("R",)
    if opt[0] == "S" and mesh.axis_size(a) > 1:
        for d, L in enumerate(lt):
            if L == opt[1] and shape[d] > 1 and sizes.get(L) == shape[d]:
                return ("S", d)
    return ("R",)


def _out_usage_under(opt, a, shape, fm, sizes, mesh) -> tuple:
    """How an output uses axis ``a`` when ``a`` takes option ``opt`` (``axis_usage``): partial
    when the option keeps partial values or shards a reduced letter."""
    if opt[0] == "P":
        return opt[:2]
    if opt[0] == "S":
        if opt[1] not in fm.output:
            return ("P", fm.reduce)
        return _usage_under(opt, a, shape, fm.output, None, sizes, mesh, False)
    return ("R",)


def _productions(space: _Space):
    """Every ``(index, choices, targets, outputs)`` in generation order, duplicates included:
    the per-axis combinations (index ``(combination, pick)``), then the carried structures."""
    n = 0
    for n, combo in enumerate(cartesian(*space.per_axis)):
        choices, picks = space.combo(combo)
        for j, (targets, outputs) in enumerate(picks):
            yield (n, j), choices, targets, outputs
    for j, (choices, targets, outputs) in enumerate(space.carrier_entries()):
        yield (n + 1 + j, 0), choices, targets, outputs


@memo(1 << 14)
def _letter_options(axes: tuple, n: int, carriers: tuple, mesh, even: bool) -> tuple:
    """``letter_structures`` of a letter, only the even ones when the rule needs them even."""
    opts = letter_structures(axes, n, list(carriers), mesh)
    return tuple(fs for fs in opts if _even(fs, n, mesh)) if even else tuple(opts)


MAX_AXIS_COMBINATIONS = 4096  # ~10 s of pricing on this 2-core machine at the worst


def _check_search_size(fm, mesh, per_axis) -> None:
    """Refuse a search whose per-axis option product exceeds ``MAX_AXIS_COMBINATIONS`` (it grows as
    (letters + 2) ** mesh axes: 4 letters on 6 axes is ~15k combinations, ~40 s), naming the fix."""
    n = 1
    for opts in per_axis:
        n *= len(opts)
    if n > MAX_AXIS_COMBINATIONS:
        raise SearchTooLarge(
            f"the exhaustive strategy search of an op with index letters {''.join(fm.letters())!r} on mesh "
            f"{mesh} ({mesh.ndim} axes) would price {n} per-axis combinations (limit "
            f"{MAX_AXIS_COMBINATIONS}); merge mesh axes that play one role (e.g. plan dp and fsdp as one "
            "axis) or plan on a mesh of fewer axes"
        )


def input_moves(src: Sharding, dst: Sharding, tensor_dtype="float32", cost_model=None) -> tuple:
    """The communicating collectives moving input 0 from ``src`` to ``dst`` (``plan_move``)."""
    return tuple(c.attributed("input 0") for c in plan_move(src, dst, dtype_of(tensor_dtype, 0), cost_model)
                 if c.kind.communicates)


def move_collectives(inputs, targets, outputs, out_pins, tensor_dtype="float32", cost_model=None) -> tuple:
    """The communicating collectives of a candidate: ``plan_move`` of every input to its target
    and of every pinned output to its pin, attributed "input i" / "output k"."""
    moves = []
    for i, (x, t) in enumerate(zip(inputs, targets)):
        if x is not None and t is not None and x != t:
            moves.extend(c.attributed(f"input {i}") for c in plan_move(x, t, dtype_of(tensor_dtype, i), cost_model)
                         if c.kind.communicates)
    for k, (o, p) in enumerate(zip(outputs, out_pins)):
        if p is not None and o != p:
            moves.extend(c.attributed(f"output {k}")
                         for c in plan_move(o, p, dtype_of(tensor_dtype, len(inputs) + k), cost_model)
                         if c.kind.communicates)
    return tuple(moves)


@memo(1 << 16)
def _move_prices(src: Sharding, dst: Sharding, tensor_dtype: str, cost_model: CostModel) -> tuple:
    return tuple(cost_model.seconds(c) for c in plan_move(src, dst, tensor_dtype, cost_model))


def price(inputs: list, targets: tuple, outputs: tuple, out_pins: tuple, cost_model: CostModel,
          tensor_dtype="float32") -> float:
    """Seconds of a candidate: the price of ``move_collectives`` (an exactly rounded sum of the
    same per-collective prices, so equal to ``cost(move_collectives(...))``)."""
    parts = []
    for i, (x, t) in enumerate(zip(inputs, targets)):
        if x is not None and t is not None and x != t:
            parts.extend(_move_prices(x, t, dtype_of(tensor_dtype, i), cost_model))
    for k, (o, p) in enumerate(zip(outputs, out_pins)):
        if p is not None and o != p:
            parts.extend(_move_prices(o, p, dtype_of(tensor_dtype, len(inputs) + k), cost_model))
    return math.fsum(parts)


def dtype_of(tensor_dtype, i: int) -> str:
    """The element type of operand ``i``: ``tensor_dtype`` is one name, or one per input followed
    by one per output (output k is operand ``len(inputs) + k``; missing ones take input 0's).
    ``dtype_of(("bf16", "f32"), 1) -> 'f32'``"""
    if isinstance(tensor_dtype, tuple):
        return tensor_dtype[i] if i < len(tensor_dtype) else (tensor_dtype[0] if tensor_dtype else "float32")
    return tensor_dtype


def _tie_key(choices, inputs, targets, outputs, out_pins) -> tuple:
    mismatch = sum(1 for o, p in zip(outputs, out_pins) if p is not None and o != p)
    changed = 0
    for x, t in zip(inputs, targets):
        if x is not None and t is not x:
            ux, ut = axis_usage(x), axis_usage(t)
            changed += sum(ux[a] != ut[a] for a, _ in choices)
    rank = sum(OPTION_RANK[o[0]] for _, o in choices)
    return mismatch, changed, rank, tuple(str(o) for _, o in choices)


def choose(fm: FactorMap, inputs: list, out_shapes: list | None = None, cost_model: CostModel | None = None,
           tensor_dtype: str = "float32", out_pins=(), retarget=None) -> Strategy:
    """The minimum-cost candidate and all candidates (``Strategy.candidates``, enumerated and
    priced when first read). ``retarget(targets, outputs)``, when given, adjusts each
    candidate's input targets (None drops the candidate), e.g. a bias made partial with its
    product (``families.bias_once``). ``choose(MM, [a, b])``.

    The winner is the least ``(seconds, tie-break, generation order)`` over every candidate
    (a layout pair several combinations produce takes its best tie-break). Combinations are
    visited in the order of their tie-break's lower bound (exact without pins or a retarget:
    ``_Space.changed_bound``); once a free candidate is found, every combination whose bound is
    above it loses even at no cost (prices are >= 0), so it is never built."""
    inputs = list(inputs)
    if len(inputs) != len(fm.inputs):
        raise ShardingSpecError(f"op expects {len(fm.inputs)} inputs, got {len(inputs)}")
    if out_shapes is None:
        out_shapes = [infer_out_shape(fm, inputs)]
    cm = cost_model or DEFAULT_COST_MODEL
    pins = tuple(out_pins or ()) + (None,) * (len(out_shapes) - len(out_pins or ()))
    pins = tuple(p if p is not None and p.shape == shp else None for p, shp in zip(pins, out_shapes))
    space = _Space(fm, inputs, list(out_shapes), pins)
    chosen = _search(space, pins, cm, tensor_dtype, retarget)
    if chosen is None:  # a bound was not a bound (never seen): decide over the full list instead
        chosen = min(_all_candidates(space, pins, cm, tensor_dtype, retarget), key=lambda c: c[0])[1]
    return Strategy(chosen, Deferred(lambda: tuple(c for _, c in _all_candidates(space, pins, cm, tensor_dtype,
                                                                                   retarget, chosen))))


def _search(space: _Space, pins, cm, tensor_dtype, retarget):
    """The winning Candidate, visiting combinations by lower bounds of their price and tie-break
    (None when a built candidate falls below its bound: the caller then decides over the full
    list)."""
    inputs, ins = space.inputs, tuple(space.inputs)
    bound = space.bounds(retarget, pins)
    # every collective on groups of more than one device costs at least the cost model's latency
    floor = cm.latency if all(n > 1 for n in space.mesh.shape) else 0.0
    combos = list(cartesian(*space.per_axis))
    ranks = [{o: OPTION_RANK[o[0]] for o in opts} for opts in space.per_axis]
    entries = []  # (least price, mismatch, changed, rank): lower bounds of a candidate's key; then order
    for n, combo in enumerate(combos):
        changed = moved = differ = rank = 0
        for row, rk, o in zip(bound, ranks, combo):
            c, m, f = row[o]
            changed += c
            moved |= m
            differ |= f
            rank += rk[o]
        entries.append((floor * moved.bit_count(), differ.bit_count(), changed, rank, n, combo))
    for j, (choices, made) in enumerate(space.carriers_lazy()):  # built only when visited
        entries.append((0.0, 0, 0, sum(OPTION_RANK[o[0]] for _, o in choices), len(combos) + j, (choices, made)))
    entries.sort(key=lambda e: e[:5])
    best, priced = None, {}
    for least, differ, changed, rank, n, what in entries:
        first = (n, 0)
        if best is not None:
            bound = (least, differ, changed, rank)
            if bound > best[0][:4]:
                break  # this and every later entry loses even at the least price its moves can have
            if bound == best[0][:4]:  # ties so far: its option text decides (then its order)
                text = tuple(str(o) for _, o in what[0]) if n >= len(combos) else tuple(str(o) for o in what)
                if (text, first) > best[0][4:]:
                    continue
        if first[0] >= len(combos):
            choices, build = what
            made = [(first, (choices, *build()))]
        else:
            choices, picks = space.combo(what)
            made = (((first[0], j), (choices, t, o)) for j, (t, o) in enumerate(picks))
        for idx, (choices, targets, outputs) in made:
            got = _judged(inputs, pins, retarget, choices, targets, outputs)
            if got is None:
                continue
            pair, targets, tie = got
            if tie[0] < differ or tie[1] < changed:
                return None
            moving = floor * _moving(inputs, targets, outputs, pins) if floor else 0.0
            if moving < least:
                return None
            if best is not None and (moving,) + tie + (idx,) > best[0]:
                continue  # loses even at the least price its moves can have
            seconds = priced.get(pair)  # a layout pair several combinations make is priced once
            if seconds is None:
                seconds = priced[pair] = price(inputs, targets, outputs, pins, cm, tensor_dtype)
            key = (seconds,) + tie + (idx,)
            if best is None or key < best[0]:
                best = (key, Candidate(choices, targets, outputs, seconds, ins, pins, tensor_dtype, cm))
    return best[1]


def _judged(inputs, pins, retarget, choices, targets, outputs):
    """``(layout pair, input targets after the retarget, tie-break)`` of a built candidate; None
    when the retarget drops it. The pair (before the retarget) names it among duplicates."""
    pair = (targets, outputs)
    if retarget is not None:
        targets = retarget(targets, outputs)
        if targets is None:
            return None
    return pair, targets, _tie_key(choices, inputs, targets, outputs, pins)


def _moving(inputs, targets, outputs, pins) -> int:
    """How many of a candidate's moves communicate (each costs at least one collective)."""
    n = 0
    for x, t in zip(inputs, targets):
        if x is not None and t is not None and not is_local_move(x, t):
            n += 1
    for o, p in zip(outputs, pins):
        if p is not None and not is_local_move(o, p):
            n += 1
    return n


def _all_candidates(space: _Space, pins, cm, tensor_dtype, retarget, chosen=None) -> list:
    """``[(key, Candidate)]``: each layout pair once, in order of first appearance, described by
    its producing combination of least tie-break; ``chosen`` stands for its own pair."""
    inputs, ins = space.inputs, tuple(space.inputs)
    best: dict = {}
    for idx, choices, targets, outputs in _productions(space):
        got = _judged(inputs, pins, retarget, choices, targets, outputs)
        if got is None:
            continue
        pair, targets, tie = got
        got = best.get(pair)
        if got is None or tie + (idx,) < got[0]:
            best[pair] = (tie + (idx,), choices, targets, outputs)
    out = []
    for tie, choices, targets, outputs in best.values():
        if chosen is not None and chosen.input_targets == targets and chosen.outputs == outputs:
            out.append(((chosen.cost,) + tie, chosen))
            continue
        c = Candidate(choices, targets, outputs, None, ins, pins, tensor_dtype, cm)
        out.append(((c.cost,) + tie, c) if chosen is None else ((None,) + tie, c))
    return out


def infer_out_shape(fm: FactorMap, inputs: list) -> tuple:
    """The output shape of a factor map from the inputs' letter sizes (broadcasting 1s);
    raises ``ShardingSpecError`` when two operands disagree on a letter's size."""
    sizes: dict = {}
    for k, (s, letters) in enumerate(zip(inputs, fm.inputs)):
        if s is None:
            continue
        for d, L in enumerate(letters):
            n = s.shape[d]
            if L in sizes and sizes[L][0] != n and (1 not in (n, sizes[L][0]) or L not in fm.broadcast):
                raise OpError(
                    f"input {k} dim {d} has size {n} where input {sizes[L][1]} has {sizes[L][0]} "
                    f"(index {L!r} of the rule); the shapes must agree"
                    + (" (or be 1 to broadcast)" if L in fm.broadcast else "")
                )
            if L not in sizes or sizes[L][0] == 1:
                sizes[L] = (n, k)
    return tuple(sizes[L][0] if L in sizes else 1 for L in fm.output)




# ------------------------------------------------------------------------------------------
# rules from factor maps
# ------------------------------------------------------------------------------------------


def factor_map_result(name: str, inputs, fm: FactorMap, out_shapes=None, cost_model=None,
                      tensor_dtype="float32", out_pins=(), n_out: int = 1):
    """Run the search for ``fm`` and wrap it as a ``Propagation`` (``n_out`` outputs that
    share the one output sharding, e.g. sort's values and indices)."""
    from .result import Propagation

    ins = [s if isinstance(s, Sharding) else None for s in inputs]
    infer_out_shape(fm, ins)  # the operands must agree on every letter's size
    pins = tuple(out_pins or ())[:1] if n_out > 1 else tuple(out_pins or ())
    st = choose(fm, ins, out_shapes, cost_model, tensor_dtype, pins)
    c = st.chosen
    notes = tuple(f"{a}: {fmt_option(o)}" for a, o in c.choices)
    targets = tuple(s if t is None or t == s else t for s, t in zip(inputs, c.input_targets))  # unmoved: itself
    outs = c.outputs * n_out if n_out > 1 else c.outputs
    return Propagation(name, tuple(inputs), targets, outs, c.collectives, notes, st.candidates,
                       cost_model or DEFAULT_COST_MODEL)


def factor_rule(fm_of, n_out: int = 1):
    """A sharding rule from a factor map. ``fm_of(name, inputs, params)`` returns a
    ``FactorMap`` (output shape inferred) or ``(FactorMap, [output shapes])``; inputs that
    are numbers are passed as None.

    ``factor_rule(lambda name, inputs, params: FactorMap(("mk", "kn"), "mn", linear="multi"))``
    """

    def rule(name, inputs, cost_model=None, tensor_dtype="float32", out_pins=(), **params):
        ins = [s if isinstance(s, Sharding) else None for s in inputs]
        got = fm_of(name, ins, params)
        fm, shapes = got if isinstance(got, tuple) else (got, None)
        return factor_map_result(name, inputs, fm, shapes, cost_model, tensor_dtype, out_pins, n_out)

    rule.__doc__ = fm_of.__doc__
    rule.factor_map_of = fm_of  # the verifier's index-level proof reads the same map
    return rule


__all__ = ["Candidate", "FactorMap", "MM", "Strategy", "axis_options", "axis_usage", "candidates", "choose",
           "factor_map_result", "factor_rule", "fmt_option", "infer_out_shape", "letter_structures", "move_collectives",
           "price"]
