"""Repeated blocks: a model's layers written once, checked twice and stamped.

``ProgramBuilder.repeat(block, count, carry, prefix)`` calls ``block(b, carry)`` for instances 0
and 1, each naming what it makes relative to the instance (``{prefix}.{i}.{name}``), and checks
that they are one block (:func:`derive`): the same ops, params and shapes, the same names within
the instance, and instance 1 reading instance 0's outputs exactly where instance 0 read the
carry. The other instances are copies with their names renamed (:func:`stamp`): shape inference
and the op rules give a renamed copy the same answers. The program keeps instances 0, 1, 2, 3 and
the last one (its *compressed* form, a program in its own right, in which the last instance reads
instance 3), and makes the middle ones (4 .. count-2) only when something reads every op
(:func:`expand`); planning and styles read the compressed form (``plan.repeat``).

    >>> from shardlayout.program import ProgramBuilder
    >>> b = ProgramBuilder(); w0 = b.input("x", (4, 8))
    >>> def block(b, x):
    ...     w = b.param("w", (8, 8))
    ...     return b.op("mm", [x, w], name="y")
    >>> y = b.repeat(block, 8, w0); b.output(y); prog = b.build()
    >>> y, len(prog.ops), len(prog.repeated[0].ops)
    ('layers.7.y', 8, 5)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..caches import paused_gc

MIN_COUNT = 6  # below this every instance is kept: there is no middle to share
_LOCAL, _PREV, _EXT, _CONST = 0, 1, 2, 3


@dataclass(frozen=True)
class Repeat:
    """One block repeated ``count`` times, as instance names relative to the instance:
    ``suffixes`` (its tensors, in creation order) with their ``specs`` ``(shape, dtype, kind)``;
    ``ops`` (per op: target, inputs as ``(kind, suffix or name or constant)``, params, output
    suffixes, name suffix, symbolic params); ``carry``: the suffixes the block returns;
    ``tensor_at`` / ``op_at``: where the middle instances go in the compressed program's
    tensors and ops (after instance 3's; the last instance's start there)."""

    prefix: str
    count: int
    suffixes: tuple
    specs: tuple
    ops: tuple
    carry: tuple
    tensor_at: int = 0
    op_at: int = 0

    @property
    def kept(self) -> tuple:
        """The instances the compressed program holds: ``(0, 1, 2, 3, count - 1)``."""
        return (0, 1, 2, 3, self.count - 1)

    @property
    def middle(self) -> range:
        """The instances only the full program holds."""
        return range(4, self.count - 1)

    def name(self, k: int, suffix: str) -> str:
        """``rep.name(5, "wq") -> 'layers.5.wq'``."""
        return f"{self.prefix}.{k}.{suffix}"

    def instance_of(self, name: str):
        """``(k, suffix)`` when ``name`` is an instance's tensor or op name, else None.
        ``rep.instance_of("layers.5.wq") -> (5, 'wq')``"""
        head = self.prefix + "."
        if not name.startswith(head):
            return None
        k, dot, suffix = name[len(head):].partition(".")
        if not dot or not k.isdigit() or (len(k) > 1 and k[0] == "0") or not int(k) < self.count:
            return None
        return int(k), suffix

    def is_middle(self, name: str) -> bool:
        """Is ``name`` a tensor name of a middle instance (one the compressed program does not hold)?"""
        got = self.instance_of(name)
        return got is not None and 4 <= got[0] < self.count - 1


def derive(prefix: str, names: list, tensors: dict, ops: list, carry0: tuple, carry1: tuple,
           carry2: tuple, t: tuple, o: tuple):
    """The :class:`Repeat` of instances 0 and 1 (``names[t[0]:t[1]]`` / ``ops[o[0]:o[1]]`` and
    ``names[t[1]:t[2]]`` / ``ops[o[1]:o[2]]``; ``carry0`` what instance 0 read, ``carry1`` /
    ``carry2`` what instances 0 / 1 returned), or None when they are not one block (the caller
    then builds every instance)."""
    p0, p1 = f"{prefix}.0.", f"{prefix}.1."
    n0, n1 = names[t[0]:t[1]], names[t[1]:t[2]]
    if len(n0) != len(n1) or o[1] - o[0] != o[2] - o[1] or not n0:
        return None
    if not all(a.startswith(p0) for a in n0) or not all(a.startswith(p1) for a in n1):
        return None
    suffixes = tuple(a[len(p0):] for a in n0)
    if suffixes != tuple(a[len(p1):] for a in n1):
        return None
    specs = []
    for a, b in zip(n0, n1):
        s0, s1 = tensors[a], tensors[b]
        if (s0.shape, s0.dtype, s0.kind) != (s1.shape, s1.dtype, s1.kind):
            return None
        specs.append((s0.shape, s0.dtype, s0.kind))
    local0, local1 = set(n0), set(n1)
    if len(carry0) != len(carry1) or len(carry1) != len(carry2) or \
            not all(type(c) is str and c.startswith(p0) and c in local0 for c in carry1) or \
            not all(type(c) is str and c.startswith(p1) and c in local1 for c in carry2) or \
            [c[len(p0):] for c in carry1] != [c[len(p1):] for c in carry2]:
        return None
    carried = {c1: c0 for c0, c1 in zip(carry0, carry1)}  # instance 0's output -> what instance 0 read there
    recipes = []
    for op0, op1 in zip(ops[o[0]:o[1]], ops[o[1]:o[2]]):
        if (op0.target, op0.params, op0.sym_params, len(op0.inputs), len(op0.outputs)) != \
                (op1.target, op1.params, op1.sym_params, len(op1.inputs), len(op1.outputs)):
            return None
        if not (op0.name.startswith(p0) and op1.name.startswith(p1)) or op0.name[len(p0):] != op1.name[len(p1):]:
            return None
        if [a[len(p0):] for a in op0.outputs] != [a[len(p1):] for a in op1.outputs] or \
                not all(a in local0 for a in op0.outputs):
            return None
        ins = []
        for a, b in zip(op0.inputs, op1.inputs):
            if type(b) is not str:
                if type(a) is str or type(a) is not type(b) or a != b:
                    return None
                ins.append((_CONST, b))
            elif b in local1:
                if a != p0 + b[len(p1):]:
                    return None
                ins.append((_LOCAL, b[len(p1):]))
            elif b in local0:  # instance 1 reads instance 0's output where instance 0 read the carry
                if carried.get(b) != a:
                    return None
                sa, sb = tensors[a], tensors[b]
                if (sa.shape, sa.dtype) != (sb.shape, sb.dtype):
                    return None
                ins.append((_PREV, b[len(p0):]))
            else:
                if a != b:
                    return None
                ins.append((_EXT, b))
        recipes.append((op0.target, tuple(ins), op0.params, tuple(a[len(p0):] for a in op0.outputs),
                        op0.name[len(p0):], op0.sym_params))
    return Repeat(prefix, 0, suffixes, tuple(specs), tuple(recipes), tuple(c[len(p0):] for c in carry1))


def stamp(rep: Repeat, k: int, prev: int) -> tuple:
    """Instance ``k`` reading instance ``prev``'s outputs: ``([TensorSpec], [Op])``.
    ``stamp(rep, 5, 4)[1][0].name -> 'layers.5.attn_norm.sq'``"""
    from . import _new_op, _new_spec

    here, before = f"{rep.prefix}.{k}.", f"{rep.prefix}.{prev}."
    specs = [_new_spec(here + s, shape, dtype, kind) for s, (shape, dtype, kind) in zip(rep.suffixes, rep.specs)]
    ops = []
    for target, ins, params, outs, name, sym_params in rep.ops:
        inputs = tuple([here + v if kind == _LOCAL else before + v if kind == _PREV else v for kind, v in ins])
        ops.append(_new_op(target, inputs, params, tuple([here + s for s in outs]), here + name, sym_params))
    return specs, ops


def renamer(moves: dict):
    """A function renaming tensor and op names by instance: ``moves`` maps an instance's name
    prefix (``"layers.2."``) to another's; other values pass unchanged.
    ``renamer({"layers.2.": "layers.7."})("layers.2.wq") -> 'layers.7.wq'``"""
    pairs = tuple(moves.items())

    def rename(n):
        if type(n) is str:
            for a, b in pairs:
                if n.startswith(a):
                    return b + n[len(a):]
        return n
    return rename


def to_instance(rep: Repeat, k: int, src: int = 2):
    """The renamer taking instance ``src``'s names to instance ``k``'s and what ``src`` reads of
    instance ``src - 1`` to instance ``k - 1``'s."""
    p = rep.prefix
    return renamer({f"{p}.{src}.": f"{p}.{k}.", f"{p}.{src - 1}.": f"{p}.{k - 1}."})


def last_reads(rep: Repeat):
    """The renamer taking what the compressed program's last instance reads of instance 3 to
    what the full program's reads of instance ``count - 2``."""
    return renamer({f"{rep.prefix}.3.": f"{rep.prefix}.{rep.count - 2}."})


def local(rep: Repeat, k: int, named: dict) -> dict:
    """``{suffix: value}`` of the entries of ``named`` (name -> value) that are instance ``k``'s."""
    head = f"{rep.prefix}.{k}."
    return {n[len(head):]: v for n, v in named.items() if type(n) is str and n.startswith(head)}


def expand(compressed, rep: Repeat) -> tuple:
    """The full program's ``(tensors, ops)`` from its compressed form: the middle instances
    inserted after instance 3, the last instance reading instance ``count - 2``."""
    with paused_gc():  # thousands of small immutable records, no cycles
        return _expand(compressed, rep)


def _expand(compressed, rep: Repeat) -> tuple:
    names = list(compressed.tensors)
    tensors = {n: compressed.tensors[n] for n in names[:rep.tensor_at]}
    ops = list(compressed.ops[:rep.op_at])
    for k in rep.middle:
        specs, made = stamp(rep, k, k - 1)
        tensors.update((s.name, s) for s in specs)
        ops.extend(made)
    specs, made = stamp(rep, rep.count - 1, rep.count - 2)
    tensors.update((n, compressed.tensors[n]) for n in names[rep.tensor_at:])
    ops.extend(made)
    ops.extend(compressed.ops[rep.op_at + len(rep.ops):])
    return tensors, tuple(ops)


_INSTANCE = re.compile(r"^(.+?)\.(0|[1-9][0-9]*)\.")


def compress(prog):
    """``prog`` as a program of repeated blocks (its compressed form and :class:`Repeat`, as
    ``ProgramBuilder.repeat`` makes) when its ops named ``{prefix}.{i}.…`` (``i`` = 0 .. count-1,
    e.g. an imported model's layers, named by module path) are one block: each instance's ops
    contiguous and in one order, instances 0 and 1 one block by :func:`derive`, and every other
    instance equal to its stamp (checked, op by op). Else ``prog`` itself. The full program keeps
    every tensor, its order changed only so that each instance's tensors (its parameters first, as
    the block defines them) are together, after what comes before the block.
    ``compress(Program.from_json(text)).repeated is not None`` for an exported 8-layer Llama."""
    if prog.repeated is not None or prog.symbols or any(t.ragged is not None for t in prog.tensors.values()):
        return prog
    ops = prog.ops
    found = _instance_ops(ops)
    if found is None:
        return prog
    prefix, starts = found
    count = len(starts) - 1
    o_start, o_end, width = starts[0], starts[-1], starts[1] - starts[0]
    if any(b - a != width for a, b in zip(starts, starts[1:])):
        return prog
    head = f"{prefix}."
    names = list(prog.tensors)
    first_read: dict = {}
    made_at: dict = {}
    for i, op in enumerate(ops):
        for x in op.inputs:
            if type(x) is str:
                first_read.setdefault(x, i)
        for o in op.outputs:
            made_at[o] = i
    inst: list = [[] for _ in range(count)]
    pre, post = [], []
    seen_instance = False
    for n in names:
        m = _INSTANCE.match(n) if n.startswith(head) else None
        k = int(m.group(2)) if m is not None and m.group(1) == prefix else None
        if k is not None and k < count:
            inst[k].append(n)
            seen_instance = True
            continue
        at = made_at.get(n, first_read.get(n))
        (pre if (at is not None and at < o_end) or (at is None and not seen_instance) else post).append(n)
    if any(made_at.get(n, -1) >= o_start for n in pre) or len({len(x) for x in inst}) != 1:
        return prog
    order = pre + [n for x in inst for n in x] + post
    tensors = prog.tensors
    t0 = len(pre)
    t1, t2 = t0 + len(inst[0]), t0 + 2 * len(inst[0])
    carry0, carry1, carry2 = _carries(ops, starts, prefix, set(inst[0]))
    rep = derive(prefix, order, tensors, list(ops), carry0, carry1, carry2, (t0, t1, t2),
                 (o_start, starts[1], starts[2]))
    if rep is None:
        return prog
    rep = replace(rep, count=count)
    for k in range(2, count):  # every other instance is the block's stamp, exactly
        specs, made = stamp(rep, k, k - 1)
        if tuple(made) != ops[starts[k]:starts[k + 1]] or \
                [(sp.name, sp.shape, sp.dtype, sp.kind) for sp in specs] != \
                [(tensors[n].name, tensors[n].shape, tensors[n].dtype, tensors[n].kind) for n in inst[k]]:
            return prog
    last = set(inst[-1])
    outside = [x for op in ops[o_end:] for x in op.inputs if type(x) is str] + list(prog.outputs)
    if any(x.startswith(head) and x not in last and _INSTANCE.match(x) for x in outside):
        return prog  # something after the block reads an instance other than the last
    from . import Program, _repeated_program

    specs, made = stamp(rep, count - 1, 3)
    kept = pre + [n for x in inst[:4] for n in x]
    compressed_tensors = {n: tensors[n] for n in kept}
    compressed_tensors.update((sp.name, sp) for sp in specs)
    compressed_tensors.update((n, tensors[n]) for n in post)
    rep = replace(rep, tensor_at=len(kept), op_at=o_start + 4 * width)
    compressed = Program(compressed_tensors, tuple(ops[:starts[4]]) + tuple(made) + tuple(ops[o_end:]), prog.outputs,
                         prog.symbols, prog.sym_shapes, prog.facts, prog.notes)
    return _repeated_program(compressed, rep)


def with_count(prog, count: int):
    """The repeated program ``prog`` with its block repeated ``count`` times instead (``count`` >=
    ``MIN_COUNT``): the compressed program's last instance stamped as instance ``count - 1`` and
    what follows the block reading it there. For a model imported with only its first layers
    whose other layers are known to be the same block (``program.hf.import_hf``).
    ``with_count(llama(layers=6), 32) == llama(layers=32)``"""
    from . import Program, _new_op, _repeated_program

    cp, rep = prog.repeated
    if count < MIN_COUNT:
        raise ValueError(f"with_count: {count} instances; a repeated block has at least {MIN_COUNT}")
    old, new = rep.name(rep.count - 1, ""), rep.name(count - 1, "")
    rename = renamer({old: new})
    names = list(cp.tensors)
    last = len(rep.suffixes)
    specs, made = stamp(replace(rep, count=count), count - 1, 3)
    tensors = {n: cp.tensors[n] for n in names[:rep.tensor_at]}
    tensors.update((sp.name, sp) for sp in specs)
    tensors.update((n, cp.tensors[n]) for n in names[rep.tensor_at + last:])
    after = [_new_op(op.target, tuple(rename(x) for x in op.inputs), op.params, op.outputs, op.name, op.sym_params)
             for op in cp.ops[rep.op_at + len(rep.ops):]]
    compressed = Program(tensors, tuple(cp.ops[:rep.op_at]) + tuple(made) + tuple(after),
                         tuple(rename(o) for o in cp.outputs), cp.symbols, cp.sym_shapes, cp.facts, cp.notes)
    return _repeated_program(compressed, replace(rep, count=count))


def _instance_ops(ops) -> tuple | None:
    """``(prefix, starts)``: the ops named ``{prefix}.{i}.…`` for i = 0 .. count-1 (count >=
    ``MIN_COUNT``; of the prefixes that qualify, the one with the most instances) run as one
    contiguous range, instance after instance; ``starts[i]`` is instance ``i``'s first op,
    ``starts[count]`` the end. None when no prefix qualifies."""
    marks = [(m.group(1), int(m.group(2))) if m is not None else None
             for m in (_INSTANCE.match(op.name) for op in ops)]
    best = None
    for prefix in dict.fromkeys(m[0] for m in marks if m is not None and m[1] == 0):
        at = [i for i, m in enumerate(marks) if m is not None and m[0] == prefix]
        if at[-1] - at[0] + 1 != len(at):
            continue  # other ops between the instances
        starts, ok = [], True
        for i in at:
            k = marks[i][1]
            if k == len(starts):
                starts.append(i)
            elif k != len(starts) - 1:
                ok = False
                break
        if ok and len(starts) >= MIN_COUNT and (best is None or len(starts) > len(best[1]) - 1):
            best = (prefix, starts + [at[-1] + 1])
    return best


def _carries(ops, starts: list, prefix: str, local0: set) -> tuple:
    """``(carry0, carry1, carry2)``: what instance 1 reads of instance 0 (in reading order), what
    instance 0 read at those places, and instance 1's tensors of the same suffixes."""
    p0, p1 = f"{prefix}.0.", f"{prefix}.1."
    carry0, carry1 = [], []
    for j, op in enumerate(ops[starts[1]:starts[2]]):
        for pos, x in enumerate(op.inputs):
            if type(x) is str and x in local0 and x not in carry1:
                twin = ops[starts[0] + j]
                carry1.append(x)
                carry0.append(twin.inputs[pos] if pos < len(twin.inputs) else None)
    carry2 = [p1 + c[len(p0):] for c in carry1]
    return tuple(carry0), tuple(carry1), tuple(carry2)


__all__ = ["MIN_COUNT", "Repeat", "compress", "derive", "expand", "last_reads", "local", "renamer", "stamp",
           "to_instance", "with_count"]
