"""Streams in the auto search: a stream (``plan.stream``) is an option of a move, priced by the
overlap model inside the ILP, so shardings and overlaps are chosen together.

A stream's saving (``plan.stream.move_candidate``) depends on the move (its source, target and
collectives) and on the strategies of the ops around it: which consumers read the moved tensor
where the move puts it, which views and pointwise ops carry the chunked dim on to matmuls, and
those matmuls' index letters and compute. ``move_candidate`` asks those questions of a *facts*
object; :class:`ComboFacts` answers them for the combinations of ``plan.space`` — when every
combination still allowed for an op gives one answer it is returned, else the question is a
branch: the allowed combinations are split by their answers and the candidate is asked again
on each part. Each leaf of that tree is a :class:`StreamOption`: the move, and per op the set of
combinations it needs (its *conditions*), with the exact saving and ``StreamChoice`` that
``move_candidate`` gives a plan whose ops run any of those combinations — the same function,
the same floats. Every plan of the space matches exactly one leaf per move, so the ILP's
stream variable of a leaf (``plan.ilp``: ``z <= m``, ``z <= sum of y`` over each condition)
can be 1 only when the plan makes that stream possible, and the greedy's rules become rows:
each matmul in one overlap at most, each tensor's side (``before``/``after``) in one at most.

    >>> from shardlayout import Mesh
    >>> from shardlayout.program.models import llama, style_pins
    >>> from shardlayout.plan.space import Context, domains, op_table, seed_plans
    >>> prog, m = llama(layers=1, dim=64, seq=64, batch=2, heads=4, ffn=256), Mesh.parse("tp=4")
    >>> ctx = Context.of(prog, m, flop_rate=1e9)
    >>> doms = domains(prog, seed_plans(prog, m, {}))
    >>> tabs = [op_table(prog, i, doms, ctx) for i in range(len(prog.ops))]
    >>> all(o.saving > 0 for o in stream_options(prog, tabs, ctx))
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..sharding import Sharding
from ..sharding.move import plan_move
from .estimate import compute_seconds, op_flops
from .stream import AS_IS, StreamChoice, move_candidate


@dataclass(frozen=True)
class StreamOption:
    """One stream the search may choose: the move of ``tensor`` to ``target`` (``move``: the
    ILP's ``(tensor, src, dst)`` of an input move; None for an op's output move to its pin,
    whose producer is among the conditions), overlapped with the matmuls ``sites`` (op
    indices); ``conditions``: ``((op index, (combination index, ...)), ...)`` the plan must run;
    ``saving``: seconds, and ``choice``: the ``StreamChoice``, both as ``move_candidate`` gives
    them."""

    tensor: str
    target: Sharding
    move: tuple | None
    conditions: tuple = field(repr=False)
    sites: tuple
    saving: float
    choice: StreamChoice = field(repr=False)
    source: Sharding | None = field(default=None, repr=False)

    @property
    def group(self) -> tuple:
        """The move the option streams: ``(tensor, source, target)`` (one per question tree)."""
        return self.tensor, self.source, self.target

    @property
    def side(self) -> str:
        """``"before"`` (the move feeds the matmuls) or ``"after"`` (it reduces their output)."""
        return self.choice.side

    def renamed(self, rename: dict, shift: int, program, twin: bool = False) -> "StreamOption":
        """The same option in another block of the same kind: tensors renamed by ``rename``, op
        indices shifted by ``shift`` (names read from ``program``). Conditions are dropped (they
        belong to the block the search solved) unless ``twin``: the other block's tables are
        this block's renamed (``plan.space.renamed_table``), so its combinations are numbered
        alike and the conditions and the move carry over."""
        tensor = rename.get(self.tensor, self.tensor)
        sites = tuple(i + shift for i in self.sites)
        choice = replace(self.choice, ops=tuple(program.ops[i].name for i in sites), tensor=tensor)
        if not twin:
            return StreamOption(tensor, self.target, None, (), sites, self.saving, choice, self.source)
        move = None if self.move is None else (tensor, *self.move[1:])
        conditions = tuple((i + shift, ks) for i, ks in self.conditions)
        return StreamOption(tensor, self.target, move, conditions, sites, self.saving, choice, self.source)


MAX_LEAVES = 512
"""A move whose question tree has more leaves than this gets no stream option (the search then
prices it unstreamed, and the plan runs it so); a block of a transformer has a few dozen."""


class _Need(Exception):
    """A question about op ``i`` whose allowed combinations answer differently: ``answers[k]``
    is the answer of combination ``k``."""

    def __init__(self, i: int, answers: tuple):
        super().__init__(i)
        self.i, self.answers = i, answers


class _Outside(Exception):
    """A question about an op the tables do not hold (another block's)."""


class ComboFacts:
    """``plan.stream.PlanFacts`` for the combinations of ``tables`` still ``allowed``
    (``{op index: (combination index, ...)}``; an op not named: all of its table's): an answer
    every allowed combination shares, else :class:`_Need` (module docstring). ``answers``: a
    memo of every combination's answer per question, shared by the facts of one search."""

    def __init__(self, program, cost_model, rate: float, tables: dict, allowed: dict, answers: dict,
                 touched: set | None = None):
        self.program, self.cost_model, self.rate = program, cost_model, rate
        self.tables, self.allowed, self.answers = tables, allowed, answers
        self.touched = set() if touched is None else touched  # the ops asked about

    def _ask(self, i: int, question: tuple, key):
        self.touched.add(i)
        ks = self.allowed.get(i)
        verdict = self.answers.get((question, ks))  # (shared, answer or every combination's answers)
        if verdict is None:
            vals = self.answers.get(question)
            if vals is None:
                tb = self.tables.get(i)
                if tb is None:
                    raise _Outside(i)
                vals = self.answers[question] = tuple(key(c) for c in tb.combos)
            first = vals[0] if ks is None else vals[ks[0]]
            shared = all(v == first for v in vals) if ks is None else all(vals[k] == first for k in ks)
            verdict = self.answers[(question, ks)] = (shared, first if shared else vals)
        if not verdict[0]:
            raise _Need(i, verdict[1])
        return verdict[1]

    def reads(self, i: int, pos: int, want) -> bool:
        """Does op ``i`` read input ``pos`` at ``want`` (``AS_IS``: at its own sharding)?"""
        self.touched.add(i)
        tb = self.tables.get(i)
        if tb is None:
            raise _Outside(i)
        if want is AS_IS:
            at = tb.tensors.index(self.program.ops[i].inputs[pos])
            return self._ask(i, ("reads", i, pos, AS_IS), lambda c: c.targets[pos] == c.shardings[at])
        return self._ask(i, ("reads", i, pos, want), lambda c: c.targets[pos] == want)

    def letters(self, i: int):
        """Matmul ``i``'s index letters."""
        from ..execute.stream import _letters

        op = self.program.ops[i]
        return self._ask(i, ("letters", i), lambda c: _letters(op.target, c.params, c.targets, c.made))

    def compute(self, i: int) -> float:
        """Op ``i``'s forward (inference-rated) seconds."""
        op = self.program.ops[i]
        return self._ask(i, ("compute", i), lambda c: compute_seconds(op_flops(op.target, c.params, c.targets, c.made),
                                                                      "inference", self.rate))


def _leaves(ask, tables: dict, allowed: dict):
    """``(allowed, answer)`` per leaf of the question tree of ``ask(allowed)`` (module docstring)."""
    try:
        got = ask(allowed)
    except _Outside:
        return
    except _Need as q:
        tb = tables[q.i]
        parts: dict = {}
        for k in allowed.get(q.i, range(len(tb.combos))):
            parts.setdefault(q.answers[k], []).append(k)
        for ks in parts.values():
            yield from _leaves(ask, tables, {**allowed, q.i: tuple(ks)})
        return
    yield allowed, got


def stream_options(program, tables, ctx, skip=frozenset()) -> tuple:
    """Every :class:`StreamOption` of the search over ``tables`` (``plan.space.OpTable``), in a
    fixed order: per move of the tables (input moves, then the ops' output moves), each leaf of
    ``move_candidate``'s questions with a saving. ``skip``: tensors whose output moves get no
    option (a chain block's outgoing tensor: its consumers are in the next block). A question
    about an op outside ``tables`` drops its leaf (that stream is not an option).
    ``stream_options(prog, tabs, ctx)[0].saving > 0``"""
    from . import _producers_users

    if not ctx.streams:
        return ()
    producer, ops_of = _producers_users(program)
    by_index = {tb.index: tb for tb in tables}
    holders: dict = {}
    for tb in tables:
        for j, t in enumerate(tb.tensors):
            holders.setdefault(t, []).append((tb.index, j))
    cm, out, answers = ctx.cost_model, [], {}

    def at(t: str, s: Sharding) -> dict:  # every op holding t runs a combination with t at s
        return {i: tuple(k for k, c in enumerate(by_index[i].combos) if c.shardings[j] == s) for i, j in holders[t]}

    index = {program.ops[i].name: i for i in by_index}

    memo = program.__dict__.setdefault("_stream_options", {})

    def options(t, src, tgt, move, allowed):
        if any(not ks for ks in allowed.values()):
            return  # an op holding t has no combination with t there: no plan makes this move
        key = (t, src, tgt, move is not None, cm, ctx.flop_rate)
        for touched, opts in memo.get(key, ()):  # the same tables of every op asked: the same options
            if all(by_index.get(i) is tb for i, tb in touched):
                out.extend(opts)
                return
        moves = plan_move(src, tgt, program.tensors[t].dtype, cm)
        seen: set = set(allowed)
        opts = []

        def ask(allowed):
            facts = ComboFacts(program, cm, ctx.flop_rate, by_index, allowed, answers, seen)
            return move_candidate(facts, producer, ops_of, t, src, tgt, moves, False)

        leaves = _leaves(ask, by_index, allowed) if any(c.kind.communicates for c in moves) else ()
        for n, (got_allowed, got) in enumerate(leaves):
            if n >= MAX_LEAVES:  # too many ways to reach matmuls: this move is not streamed by the search
                opts = []
                break
            if got is None:
                continue
            saving, choice = got
            conds = tuple((i, ks) for i, ks in sorted(got_allowed.items()) if len(ks) < len(by_index[i].combos))
            opts.append(StreamOption(t, tgt, move, conds, tuple(index[n] for n in choice.ops), saving, choice, src))
        memo.setdefault(key, []).append((tuple((i, by_index.get(i)) for i in sorted(seen)), opts))
        out.extend(opts)

    seen = {}
    for tb in tables:
        for cb in tb.combos:
            for key in cb.moves:
                seen.setdefault(key, None)
    for t, s, d in seen:
        options(t, s, d, (t, s, d), at(t, s))
    made: dict = {}
    for tb in tables:
        op = program.ops[tb.index]
        for q, o in enumerate(op.outputs):
            if o in skip:
                continue
            j = tb.tensors.index(o)
            for cb in tb.combos:
                if cb.made[q] != cb.shardings[j]:
                    made.setdefault((o, cb.made[q], cb.shardings[j]), (tb.index, q))
    for (o, src, pin), (i, q) in made.items():
        allowed = at(o, pin)
        allowed[i] = tuple(k for k in allowed[i] if by_index[i].combos[k].made[q] == src)
        options(o, src, pin, None, allowed)
    return tuple(out)


def segment_options(program, tables, segs, ctx, twins=None) -> tuple:
    """:func:`stream_options` of each block of the chain ``segs`` (``plan.chain.Segment``) over
    its own tables (``tables[i]``: op ``i``'s): the options the chain solver prices, for the one
    ILP over the whole program (a stream's ops lie in the block of its move). ``twins``
    (``{block index: (earlier block index, rename)}``, ``plan.space.twin_tables``): a block whose
    tables are an earlier block's renamed takes that block's options renamed (the same questions
    get the same answers). ``segment_options(prog, tabs, segments(prog), ctx)``"""
    out, mine = [], {}
    for k, s in enumerate(segs):
        if twins and k in twins:
            r, rename = twins[k]
            got = tuple(v.renamed(rename, s.lo - segs[r].lo, program, twin=True) for v in mine[r])
        else:
            got = stream_options(program, tables[s.lo:s.hi], ctx, frozenset({s.out}) - {None})
        mine[k] = got
        out.extend(got)
    return tuple(out)


__all__ = ["MAX_LEAVES", "ComboFacts", "StreamOption", "segment_options", "stream_options"]
