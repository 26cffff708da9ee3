"""Programs: a DAG of ops over named tensors, a builder, and a JSON form that never runs code.

    >>> b = ProgramBuilder()
    >>> x = b.input("x", (4, 8)); w = b.param("w", (8, 2))
    >>> y = b.op("mm", [x, w]); b.output(y)
    >>> p = b.build(); [op.target for op in p.ops], p.tensors[y].shape
    (['mm'], (4, 2))
    >>> Program.from_json(p.to_json()) == p
    True

Symbolic extents: a builder with ``symbols`` (name -> example value) takes symbol names, Exprs
or expression text in shapes (and Exprs in size params such as a view's). Every tensor keeps its
concrete shape at the example (what the planner decides on) and, where it has one, its symbolic
shape (``Program.sym_shape``); ``Program.at(bindings)`` is the same program at other sizes.

    >>> b = ProgramBuilder(symbols={"batch": 4, "seq": 16})
    >>> x = b.input("x", ("batch", "seq", 8)); w = b.param("w", (8, 2))
    >>> h = b.op("view", [x], size=("batch*seq", 8)); b.output(b.op("mm", [h, w], name="y"))
    >>> p = b.build(); p.tensors["y"].shape, [str(e) for e in p.sym_shape("y")]
    ((64, 2), ['batch*seq', '2'])
    >>> p.at({"batch": 2}).tensors["y"].shape
    (32, 2)
"""

from __future__ import annotations

import json
import numbers
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..caches import register_clearer
from ..errors import ShardingError, SymbolError, UnsupportedOp
from ..sharding.cost import ITEMSIZE
from ..symbolic import Expr, FactBase, Guard, sym


class ProgramError(ShardingError):
    """A malformed program (unknown tensor, duplicate name, bad JSON, a bad symbolic extent)."""


from . import symbols as _sy  # noqa: E402 - after ProgramError, which its errors derive from


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor: shape, dtype and kind ("input", "param", "buffer", "value", or a random draw
    made in forward: "rand" uniform on [0, 1), "randn" standard normal, e.g. dropout's); ``ragged``
    (a :class:`~shardlayout.sharding.ragged.Ragged`) when one dim's extent differs per component
    (the shape then holds the expected extent; set from the ops, ``program.ragged``)."""

    name: str
    shape: tuple
    dtype: str = "float32"
    kind: str = "value"
    ragged: object = None


@dataclass(frozen=True)
class Op:
    """One op: aten ``target``, tensor ``inputs`` (names), ``params`` (JSON values), ``outputs``."""

    target: str
    inputs: tuple
    params: tuple  # sorted (name, value) pairs, values JSON-able and hashable
    outputs: tuple
    name: str = ""
    sym_params: tuple = ()  # sorted (name, value) of the params holding symbolic extents, as text

    def kwargs(self) -> dict:
        """Params as a dict. ``Op("mm", ("a",), (), ("b",)).kwargs() -> {}``."""
        return {k: _thaw(v) for k, v in self.params}

    def sym_kwargs(self) -> dict:
        """The symbolic params as Exprs: ``{"size": (Expr('batch*seq'), 64)}`` for a symbolic view."""
        return {k: _sy.params_exprs(v) for k, v in self.sym_params}


def _freeze(v):
    t = type(v)
    if t is int or t is str or t is float or t is bool or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return tuple([_freeze(x) for x in v])
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (bool, int, float, str)):
        return v
    raise ProgramError(f"op parameter {v!r} is not JSON-able (ints, floats, strings, lists)")


def _thaw(v):
    return v


def _frozen_params(params: dict, typed) -> tuple:
    """``Op.params`` of ``params``: sorted ``(name, frozen value)`` pairs; memoised per ``typed``
    (``_typed(params)``, which tells 1, 1.0 and True apart), as a model's layers repeat them."""
    got = _FROZEN.get(typed)
    if got is None:
        got = tuple(sorted([(k, _freeze(v)) for k, v in params.items()]))
        if len(_FROZEN) >= 1 << 14:
            _FROZEN.clear()
        _FROZEN[typed] = got
    return got


_FROZEN: dict = {}
register_clearer("shardlayout.program._FROZEN", _FROZEN.clear, _FROZEN.__len__)


def _new_spec(name: str, shape: tuple, dtype: str, kind: str) -> "TensorSpec":
    """``TensorSpec(name, shape, dtype, kind)`` without the frozen dataclass's per-field setattr
    (a builder makes one per op output; the builder has validated the fields)."""
    obj = object.__new__(TensorSpec)
    obj.__dict__.update(name=name, shape=shape, dtype=dtype, kind=kind, ragged=None)
    return obj


def _new_op(target: str, inputs: tuple, params: tuple, outputs: tuple, name: str, sym_params: tuple) -> "Op":
    """``Op(...)`` without the frozen dataclass's per-field setattr (a builder makes one per op)."""
    obj = object.__new__(Op)
    obj.__dict__.update(target=target, inputs=inputs, params=params, outputs=outputs, name=name,
                        sym_params=sym_params)
    return obj


@dataclass(frozen=True)
class Program:
    """Tensors by name, ops in topological order, and the program's outputs.

    A symbolic program also has ``symbols`` (sorted ``(name, example value)`` pairs),
    ``sym_shapes`` (``(tensor, shape of ints and Exprs)`` for each tensor with a symbolic
    extent; ``tensors[name].shape`` stays the shape at the example), ``facts`` (the Guards the
    source states: ranges, runtime asserts, and the specialisations shape inference had to make)
    and ``notes`` (assertions of the source that are not guards, as text)."""

    tensors: dict = field(default_factory=dict)
    ops: tuple = ()
    outputs: tuple = ()
    symbols: tuple = ()
    sym_shapes: tuple = ()
    facts: tuple = ()
    notes: tuple = ()

    def __getattr__(self, name: str):
        # a program of repeated blocks holds its compressed form; the full tensors and ops are
        # made the first time something reads them (program.repeat.expand)
        rep = self.__dict__.get("_repeated") if name in ("tensors", "ops") else None
        if rep is None:
            raise AttributeError(f"'Program' object has no attribute {name!r}")
        from .repeat import expand

        tensors, ops = expand(*rep)
        object.__setattr__(self, "tensors", tensors)
        object.__setattr__(self, "ops", ops)
        return tensors if name == "tensors" else ops

    @property
    def repeated(self):
        """``(compressed program, Repeat)`` of a program built with ``ProgramBuilder.repeat``
        (instances 0-3 and the last; the middle ones are stamped copies of the block, made when
        read), else None."""
        return self.__dict__.get("_repeated")

    def __eq__(self, other) -> bool:
        return (isinstance(other, Program) and self.tensors == other.tensors and self.ops == other.ops
                and self.outputs == other.outputs and self.symbols == other.symbols
                and self.sym_shapes == other.sym_shapes and self.facts == other.facts and self.notes == other.notes)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.tensors)), self.ops, self.outputs, self.symbols))

    # -- symbolic extents -----------------------------------------------------------------------
    @property
    def is_symbolic(self) -> bool:
        """True when the program has symbols: ``ProgramBuilder(symbols={"b": 2}).build().is_symbolic -> True``."""
        return bool(self.symbols)

    @property
    def example(self) -> dict:
        """The example binding the concrete shapes are at: ``{"batch": 4, "seq": 16}``."""
        return dict(self.symbols)

    def sym_shape(self, name: str) -> tuple:
        """The tensor's shape with its symbolic extents (Exprs), else its concrete shape:
        ``p.sym_shape("x") -> (Expr('batch'), Expr('seq'), 64)``."""
        table = self.__dict__.get("_sym_table")
        if table is None:
            table = dict(self.sym_shapes)
            object.__setattr__(self, "_sym_table", table)
        got = table.get(name)
        return got if got is not None else self.tensors[name].shape

    def at(self, bindings, check: bool = True) -> "Program":
        """The same program at other sizes: every symbolic extent (shapes, and params that hold
        sizes such as a view's) evaluated at the example updated with ``bindings``, which become
        the new example. Raises when a binding violates a fact, and (``check``) when an op's rule
        at these sizes gives another shape than the symbolic one.
        ``p.at({"batch": 8}).tensors["x"].shape -> (8, 16, 64)``"""
        full = _sy.check_bindings(self.symbols, self.facts, bindings)
        sym = dict(self.sym_shapes)
        tensors = {}
        for n, t in self.tensors.items():
            if n in sym:
                shape = _sy.evaluate_shape(sym[n], full)
                bad = [d for d, x in enumerate(shape) if x < 0]
                if bad:
                    raise ProgramError(f"Program.at({_sy.bindings_text(bindings)}): tensor {n!r} dim {bad[0]} is "
                                       f"{sym[n][bad[0]]} = {shape[bad[0]]} < 0; give larger sizes")
                t = TensorSpec(n, shape, t.dtype, t.kind)
            tensors[n] = t
        tensors = _ragged_tensors(tensors, self.ops)
        ops = []
        for op in self.ops:
            if op.sym_params:
                params = {**dict(op.params), **{k: _sy.evaluate_params(v, full) for k, v in op.sym_params}}
                op = Op(op.target, op.inputs, tuple(sorted((k, _freeze(v)) for k, v in params.items())), op.outputs,
                        op.name, op.sym_params)
            ops.append(op)
        prog = Program(tensors, tuple(ops), self.outputs, tuple(sorted(full.items())), self.sym_shapes, self.facts,
                       self.notes)
        if check:
            _check_shapes(prog, f"Program.at({_sy.bindings_text(bindings)})")
        return prog

    def inputs(self, kind: str | None = None) -> list:
        """Names of tensors no op produces (optionally of one kind), in definition order."""
        names = self.__dict__.get("_inputs")
        if names is None:  # once per Program (programs are immutable)
            produced = {o for op in self.ops for o in op.outputs}
            names = tuple(n for n in self.tensors if n not in produced)
            object.__setattr__(self, "_inputs", names)
        tensors = self.tensors
        return [n for n in names if kind is None or tensors[n].kind == kind]

    def to_json(self) -> str:
        """Deterministic JSON text. ``Program.from_json(p.to_json()) == p``. A symbolic program adds
        ``symbols`` ({name: example}), ``facts`` and ``notes`` (text), a ``sym_shape`` per tensor
        with a symbolic extent (ints and expression text) and ``sym_params`` per op that has them."""
        sym = dict(self.sym_shapes)
        tensors = []
        for t in self.tensors.values():
            entry = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "kind": t.kind}
            if t.name in sym:
                entry["sym_shape"] = _sy.shape_text(sym[t.name])
            if t.ragged is not None:
                entry["ragged"] = t.ragged.to_json()
            tensors.append(entry)
        ops = []
        for op in self.ops:
            entry = {"name": op.name, "target": op.target, "inputs": list(op.inputs),
                     "params": {k: v for k, v in op.params}, "outputs": list(op.outputs)}
            if op.sym_params:
                entry["sym_params"] = {k: v for k, v in op.sym_params}
            ops.append(entry)
        data = {"tensors": tensors, "ops": ops, "outputs": list(self.outputs)}
        if self.symbols:
            data["symbols"] = dict(self.symbols)
        if self.facts:
            data["facts"] = [str(g) for g in self.facts]
        if self.notes:
            data["notes"] = list(self.notes)
        return json.dumps(data, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Program":
        """Read JSON (no code is evaluated); checks every name and shape."""
        constants: list = []
        try:
            data = json.loads(text, parse_constant=lambda name: constants.append(name) or _NonNumber(name),
                              object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            raise ProgramError(f"program JSON is malformed: {e.msg} at line {e.lineno}") from None
        except RecursionError:
            raise ProgramError("program JSON is nested too deeply (a program is a few levels deep)") from None
        except (ValueError, TypeError) as e:  # an int of thousands of digits, bytes that are not UTF-8, not text
            if isinstance(e, ShardingError):
                raise
            raise ProgramError(f"program JSON cannot be read: {str(e).split(';')[0]}") from None
        if constants:
            _refuse_non_number(data, constants[0])
        if not isinstance(data, dict) or not {"tensors", "ops", "outputs"} <= set(data):
            raise ProgramError("program JSON needs the keys 'tensors', 'ops' and 'outputs'")
        for key in ("tensors", "ops", "outputs"):
            if not isinstance(data[key], list):
                raise ProgramError(f"program JSON: {key!r} must be a list, got {type(data[key]).__name__}")
        unknown = set(data) - {"tensors", "ops", "outputs", "symbols", "facts", "notes"}
        if unknown:
            raise ProgramError(f"program JSON: unknown key(s) {', '.join(sorted(map(str, unknown)))}; a program has "
                               "tensors, ops, outputs and, when symbolic, symbols, facts and notes")
        b = _symbolic_builder(data)
        try:
            for i, t in enumerate(data["tensors"]):
                spec, sym_shape = _tensor_entry(t, b._symbols, i)
                b._add(spec)
                if sym_shape is not None:
                    b._sym[spec.name] = sym_shape
            for i, op in enumerate(data["ops"]):
                entry = _op_entry(op, b._symbols, i)
                for role, names in (("input", entry.inputs), ("output", entry.outputs)):
                    for n in names:
                        if isinstance(n, str) and n not in b._tensors:
                            raise ProgramError(f"program JSON: {_op_where(i, op)}: {role} {n!r} is not defined: no "
                                               "tensor entry has that name; add one to 'tensors' or fix the name")
                b._add_op(entry)
            for o in data["outputs"]:
                if not isinstance(o, str):
                    raise ProgramError(f"program JSON: output {o!r} is not a tensor name")
                b.output(o)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ShardingError):
                raise
            raise ProgramError(f"program JSON: bad entry ({type(e).__name__}: {e})") from None
        if not data["outputs"]:
            raise ProgramError("program JSON: 'outputs' is empty; name the tensors the program computes")
        prog = b.build()
        for t in data["tensors"]:
            if "ragged" in t and (prog.tensors[t["name"]].ragged is None
                                  or prog.tensors[t["name"]].ragged.to_json() != t["ragged"]):
                raise ProgramError(f"program JSON: tensor {t['name']!r}: ragged {t['ragged']!r} is not what its ops "
                                   "make; drop the key (it is derived from the ops) or fix it")
        _check_kinds(prog, {t["name"]: t["kind"] for t in data["tensors"] if "kind" in t})
        _check_dataflow(prog)
        return prog


DTYPES = tuple(ITEMSIZE)  # every element type the cost model knows the size of
KINDS = ("input", "param", "buffer", "value", "rand", "randn")
MAX_DIM = (1 << 63) - 1  # torch's int64 sizes
MAX_REPEAT = 1 << 20  # instances of a repeated block (the CLI's --layers stops at 4096)


class _NonNumber:
    """Where program JSON had NaN, Infinity or -Infinity (numbers JSON does not allow): kept
    while parsing, so the error can name the tensor or op it came from."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _unique_keys(pairs: list) -> dict:
    """A JSON object as a dict, or a ProgramError for a key given twice (json keeps the last one
    silently), naming the key and the object: the tensor or op by its name, else its keys."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        values = [v for k, v in pairs if k == key]
        name = out.get("name")
        if isinstance(name, str) and "shape" in out:
            where = f"tensor {name!r}"
        elif "target" in out and isinstance(out.get("target"), str):
            where = f"op {name!r} ({out['target']})" if isinstance(name, str) and name else f"op {out['target']!r}"
        elif {"tensors", "ops"} & set(out):
            where = "the program object"
        else:
            where = f"the object with keys {', '.join(map(repr, list(out)[:6]))}"
        raise ProgramError(f"program JSON: key {key!r} is given twice in {where} ({reprlib.repr(values[0])} and "
                           f"{reprlib.repr(values[1])}); give each key once")
    return out


def _holds(value, name: str) -> str | None:
    """The path (``[0]``, ``.dim``) to the first ``_NonNumber`` in ``value``, found without
    recursion; None when there is none."""
    stack = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, _NonNumber):
            return path
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}") for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{j}]") for j, x in reversed(list(enumerate(v))))
    return None


def _refuse_non_number(data, name: str) -> None:
    """The ProgramError for NaN / Infinity in program JSON, naming the tensor or op (and the key)
    that holds it."""
    fix = "JSON allows finite numbers only; sizes and size parameters are ints >= 1"
    if isinstance(data, dict):
        for i, t in enumerate(data.get("tensors") if isinstance(data.get("tensors"), list) else ()):
            path = _holds(t, name)
            if path is not None:
                who = f"tensor {t['name']!r} (tensors[{i}])" if isinstance(t, dict) and isinstance(t.get("name"), str) \
                    else f"tensors[{i}]"
                raise ProgramError(f"program JSON: {who}: {path.lstrip('.')} is {name}; {fix}")
        for i, op in enumerate(data.get("ops") if isinstance(data.get("ops"), list) else ()):
            path = _holds(op, name)
            if path is not None:
                raise ProgramError(f"program JSON: {_op_where(i, op)}: {path.lstrip('.')} is {name}; {fix}")
        for k, v in data.items():
            path = _holds(v, name)
            if path is not None:
                raise ProgramError(f"program JSON: {k}{path} is {name}; {fix}")
    raise ProgramError(f"program JSON: {name} is not a number JSON allows (nor a size or a parameter)")


def _op_where(i: int, op) -> str:
    """How errors name op ``i`` of program JSON: its index, name, target and output tensors,
    ``op 3 'wq' (mm -> 'q')``; whatever of them the entry has."""
    if not isinstance(op, (dict, Op)):
        return f"op {i}"
    get = op.get if isinstance(op, dict) else lambda k: getattr(op, k, None)
    name, target, outs = get("name"), get("target"), get("outputs")
    text = f"op {i}" + (f" {name!r}" if isinstance(name, str) and name else "")
    if isinstance(target, str) and target:
        outs = [o for o in outs if isinstance(o, str)] if isinstance(outs, (list, tuple)) else []
        arrow = f" -> {', '.join(map(repr, outs[:3]))}{', ...' if len(outs) > 3 else ''}" if outs else ""
        text += f" ({target}{arrow})"
    return text


def _symbolic_builder(data: dict) -> "ProgramBuilder":
    """A builder with the symbols, facts and notes of program JSON, checked."""
    symbols, facts, notes = data.get("symbols", {}), data.get("facts", []), data.get("notes", [])
    if not isinstance(symbols, dict):
        raise ProgramError(f"program JSON: 'symbols' must be an object of name -> example int, got {symbols!r}")
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        raise ProgramError(f"program JSON: 'facts' must be a list of guard texts like 'batch % 2 == 0', got {facts!r}")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ProgramError("program JSON: 'notes' must be a list of strings")
    b = ProgramBuilder(symbols=symbols, facts=facts)
    b._notes.extend(notes)
    return b


def _op_entry(op, symbols=None, i: int = 0) -> "Op":
    """One op of program JSON (entry ``i``), checked: a target, lists of inputs and outputs, a
    params object."""
    if not isinstance(op, dict):
        raise ProgramError(f"program JSON: op entry {reprlib.repr(op)} (ops[{i}]) is not an object with 'target', "
                           "'inputs', 'outputs'")
    where = _op_where(i, op)
    if not isinstance(op.get("target"), str) or not op["target"]:
        raise ProgramError(f"program JSON: {where} needs a string 'target' (an aten op name, e.g. 'mm')")
    for key in ("inputs", "outputs"):
        if not isinstance(op.get(key), list):
            raise ProgramError(f"program JSON: {where}: {key!r} must be a list, got {op.get(key)!r}")
    if not all(isinstance(o, str) for o in op["outputs"]):
        raise ProgramError(f"program JSON: {where}: outputs {op['outputs']!r} must be tensor names")
    unknown = set(op) - {"target", "inputs", "outputs", "params", "name", "sym_params"}
    if unknown:
        raise ProgramError(f"program JSON: {where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; an op "
                           "has target, inputs, outputs, params, sym_params and name")
    params = op.get("params", {})
    if not isinstance(params, dict):
        raise ProgramError(f"program JSON: {where}: 'params' must be an object, got {params!r}")
    if not isinstance(op.get("name", ""), str):
        raise ProgramError(f"program JSON: {where}: 'name' must be a string")
    frozen = tuple(sorted((str(k), _freeze(v)) for k, v in params.items()))
    sym_params = op.get("sym_params", {})
    if not isinstance(sym_params, dict):
        raise ProgramError(f"program JSON: {where}: 'sym_params' must be an object, got {sym_params!r}")
    example = dict(symbols or {})
    sym_frozen = []
    for k, v in sorted(sym_params.items()):
        value = _sy.param_extents(op["target"], {k: _freeze(v)}, example).get(k)
        if value is None:
            raise ProgramError(f"program JSON: {where}: sym_params {k!r} = {v!r} holds no symbolic extent; give "
                               "expression text of the program's symbols, e.g. ['batch*seq', 64]")
        if _sy.evaluate_params(value, example) != _freeze(params.get(k)):
            raise ProgramError(f"program JSON: {where}: sym_params {k!r} = {v!r} is "
                               f"{list(_sy.evaluate_params(value, example))} at the example, params say "
                               f"{params.get(k)!r}; make them agree")
        sym_frozen.append((k, _sy.params_text(value)))
    return Op(op["target"], tuple(_freeze(i) for i in op["inputs"]), frozen, tuple(op["outputs"]), op.get("name", ""),
              tuple(sym_frozen))


def _check_kinds(prog: "Program", declared: dict) -> None:
    """A tensor an op produces is a 'value'; one declared 'value' is produced by an op."""
    produced = {o: (i, op) for i, op in enumerate(prog.ops) for o in op.outputs}
    for name, kind in declared.items():
        if kind != "value" and name in produced:
            raise ProgramError(f"program JSON: {_op_where(*produced[name])} produces {name!r}, declared "
                               f"kind {kind!r}; an op's output has kind 'value'")
        if kind == "value" and name not in produced:
            raise ProgramError(f"program JSON: tensor {name!r} has kind 'value' but no op produces it; give it kind "
                               "'input' or 'param', or add the op that computes it")


def _tensor_entry(t, symbols=None, i: int = 0) -> tuple:
    """One tensor of program JSON (entry ``i``), checked: a name, positive int sizes, a known
    dtype and kind; ``(TensorSpec, symbolic shape or None)``."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise ProgramError(f"program JSON: tensor entry {reprlib.repr(t)} (tensors[{i}]) needs a non-empty string "
                           "'name'")
    name, shape = t["name"], t.get("shape")
    if not isinstance(shape, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIM
                                          for x in shape):
        bad = "" if not isinstance(shape, list) else next(
            f"; dim {d} is {x!r}" + (" (a bool)" if isinstance(x, bool) else "") for d, x in enumerate(shape)
            if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIM)
        raise ProgramError(f"program JSON: tensor {name!r} (tensors[{i}]): shape {reprlib.repr(shape)} must be a list "
                           f"of ints >= 1 (at most 2**63-1){bad}")
    unknown = set(t) - {"name", "shape", "dtype", "kind", "sym_shape", "ragged"}
    if unknown:
        raise ProgramError(f"program JSON: tensor {name!r}: unknown key(s) {', '.join(sorted(unknown))}; "
                           "a tensor has name, shape, sym_shape, dtype and kind")
    dtype, kind = t.get("dtype", "float32"), t.get("kind", "value")
    if dtype not in DTYPES:
        raise ProgramError(f"program JSON: tensor {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if kind not in KINDS:
        raise ProgramError(f"program JSON: tensor {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    sym_shape = None
    if "sym_shape" in t:
        example = dict(symbols or {})
        if not isinstance(t["sym_shape"], list):
            raise ProgramError(f"program JSON: tensor {name!r}: sym_shape {t['sym_shape']!r} must be a list of ints "
                               "and expression texts")
        sym_shape = _sy.to_shape(t["sym_shape"], example, f"program JSON: tensor {name!r}")
        if _sy.evaluate_shape(sym_shape, example) != tuple(shape):
            raise ProgramError(f"program JSON: tensor {name!r}: sym_shape {t['sym_shape']} is "
                               f"{list(_sy.evaluate_shape(sym_shape, example))} at the example, shape says {shape}; "
                               "make them agree")
        if not _sy.is_symbolic_shape(sym_shape):
            sym_shape = None
    return TensorSpec(name, tuple(shape), dtype, kind), sym_shape


def _check_dataflow(prog: "Program") -> None:
    """Every op known and called as its signature says, its inputs produced before it (or program
    inputs), each tensor produced once, and the declared shapes equal to what the op produces."""
    from ..ops.registry import did_you_mean, get_op
    from .shapes import shape_of

    produced: set = set()
    made_by = {o: op for op in prog.ops for o in op.outputs}
    for n, op in enumerate(prog.ops):
        where = _op_where(n, op)
        try:
            get_op(op.target)
        except UnsupportedOp:
            raise UnsupportedOp(f"program JSON: {where}: no sharding rule for op {op.target!r}"
                                f"{did_you_mean(op.target)}; use an aten op name (e.g. 'mm', 'aten.mm.default'), "
                                "or declare it first with shardlayout.ops.register_op(name, signature, rule, numpy)"
                                ) from None
        for i in op.inputs:
            if isinstance(i, str) and i in made_by and i not in produced:
                raise ProgramError(f"program JSON: {where} reads {i!r} before the op that produces it; "
                                   "list ops in the order they run")
        for o in op.outputs:
            if o in produced:
                raise ProgramError(f"program JSON: {where}: tensor {o!r} is produced twice; give each output its "
                                   "own name")
            produced.add(o)
        try:
            shapes = shape_of(op.target, [prog.tensors[i].shape if isinstance(i, str) else i for i in op.inputs],
                              op.kwargs())
        except ShardingError as e:
            raise type(e)(f"program JSON: {where}: {e}") from None
        declared = [prog.tensors[o].shape for o in op.outputs]
        if [tuple(x) for x in shapes] != declared:
            raise ProgramError(f"program JSON: {where}: declares output shapes {declared}, the op produces "
                               f"{[tuple(x) for x in shapes]}; fix the tensor entries")


def _check_shapes(prog: "Program", where: str) -> None:
    """Every op's rule, run on the program's shapes, gives the output shapes the program declares."""
    from .shapes import shape_of

    for op in prog.ops:
        at = f"{where}: op {op.name or op.target} ({op.target})"
        try:
            shapes = shape_of(op.target, [prog.tensors[i].shape if isinstance(i, str) else i for i in op.inputs],
                              op.kwargs())
        except ShardingError as e:
            raise ProgramError(f"{at} fails at these sizes ({e}); state the condition it needs as a fact of the "
                               "program, or choose other sizes") from None
        got = [tuple(x) for x in shapes]
        declared = [prog.tensors[o].shape for o in op.outputs]
        if got != declared:
            raise ProgramError(f"{at} gives output shapes {got} at these sizes, its symbolic shapes say {declared}: "
                               "the symbolic shape is wrong here; plan at the example sizes only, or report it")


def _check_symbols(symbols) -> dict:
    """``{name: example}``: identifiers bound to ints >= 1."""
    if symbols is None:
        return {}
    if not isinstance(symbols, Mapping):
        raise ProgramError(f"symbols={symbols!r}: give a dict of symbol name -> example size, e.g. "
                           "{'batch': 4, 'seq': 16}")
    out = {}
    for k, v in symbols.items():
        try:
            sym(k)
        except SymbolError:
            raise ProgramError(f"symbol {k!r}: a symbol name is an identifier like 'batch' or 'seq'") from None
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            raise ProgramError(f"symbol {k!r}: example value {v!r} must be an int >= 1 (the size the plan is made at)")
        out[k] = v
    return out


class ProgramBuilder:
    """Write models in plain Python: ``x = b.input("x", (B, T, D)); y = b.op("mm", [x, w])``.

    Output shapes come from the op rules' own shape logic (``shape_of``). With ``symbols``
    (``{"batch": 4, "seq": 16}``: each symbol with its example size) shapes take symbol names,
    Exprs or expression text (``("batch", "seq", 64)``, ``"2*seq"``), size params take Exprs (and,
    in params typed int/ints/shape, text), and ``facts`` (``["seq % 2 == 0", "2 <= batch <= 1024"]``)
    state what the sizes satisfy. Symbolic output shapes are inferred by interpolation
    (``program.symbols.infer_shapes``)."""

    def __init__(self, symbols=None, facts=()):
        self._tensors: dict = {}
        self._ops: list = []
        self._outputs: list = []
        self._count = 0
        self._symbols = _check_symbols(symbols)
        self._facts: list = []
        self._sym: dict = {}  # tensor -> symbolic shape
        self._notes: list = []
        self._repeat = None  # the Repeat whose middle instances this builder left out
        self._scope = ""  # inside a repeated block: its instance's name prefix ("layers.3.")
        self._scoped = 0  # ops named automatically in the current instance
        if isinstance(facts, (str, Guard)):
            facts = (facts,)
        for f in facts:
            self.assume(f)

    def assume(self, guard) -> None:
        """State a fact on the symbols: ``b.assume("seq % 2 == 0")``; it must hold at the example."""
        try:
            g = Guard.parse(guard)
        except SymbolError as e:
            raise ProgramError(f"fact {guard!r}: {e}") from None
        unknown = sorted(g.free_symbols - set(self._symbols))
        if unknown:
            raise ProgramError(f"fact {g}: names unknown symbol {unknown[0]!r} (known: "
                               f"{', '.join(sorted(self._symbols)) or 'none'}); declare it in symbols=")
        if not g.holds(self._symbols):
            raise ProgramError(f"fact {g} does not hold at the example {_sy.bindings_text(self._symbols)}; give "
                               "example sizes that satisfy it")
        self._facts.append(g)

    def _add(self, spec: TensorSpec) -> str:
        if not isinstance(spec.name, str) or not spec.name:
            raise ProgramError(f"tensor name {spec.name!r} must be a non-empty string")
        if spec.name in self._tensors or (self._repeat is not None and self._repeat.is_middle(spec.name)):
            raise ProgramError(f"tensor {spec.name!r} is defined twice")
        if any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DIM for n in spec.shape):
            d, n = next((d, n) for d, n in enumerate(spec.shape)
                        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DIM)
            raise ProgramError(f"tensor {spec.name!r}: shape {reprlib.repr(spec.shape)} must be non-negative ints "
                               f"(at most 2**63-1); dim {d} is {n!r}" + (" (a bool)" if isinstance(n, bool) else ""))
        if spec.dtype not in DTYPES:
            raise ProgramError(f"tensor {spec.name!r}: dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
        self._tensors[spec.name] = spec
        return spec.name

    def _add_op(self, op: Op) -> None:
        for i in op.inputs:
            if isinstance(i, str) and i not in self._tensors:
                raise ProgramError(f"op {op.name or op.target}: input {i!r} is not defined before it")
        for o in op.outputs:
            if o not in self._tensors:
                raise ProgramError(f"op {op.name or op.target}: output {o!r} has no tensor entry")
        self._ops.append(op)

    def _tensor(self, name, shape, dtype: str, kind: str, sym_shape=None) -> str:
        if self._scope and isinstance(name, str) and name:
            name = self._scope + name
        shape = tuple(shape) if hasattr(shape, "__iter__") and not isinstance(shape, str) else shape
        if sym_shape is None and isinstance(shape, tuple) and any(isinstance(x, (str, Expr)) for x in shape):
            sym_shape = _sy.to_shape(shape, self._symbols, f"tensor {name!r}")
        if sym_shape is not None:
            shape = _sy.evaluate_shape(sym_shape, self._symbols)
        if not isinstance(shape, tuple):
            raise ProgramError(f"tensor {name!r}: shape {shape!r} must be a tuple of sizes, e.g. (4, 8)")
        if any(type(n) is not int for n in shape):  # numpy ints are sizes too
            shape = tuple(int(n) if isinstance(n, numbers.Integral) and not isinstance(n, bool) else n for n in shape)
        out = self._add(TensorSpec(name, shape, dtype, kind))
        if sym_shape is not None and _sy.is_symbolic_shape(sym_shape):
            self._sym[name] = tuple(sym_shape)
        return out

    def input(self, name: str, shape, dtype: str = "float32") -> str:
        """A program input (activations). Returns its name. ``b.input("x", ("batch", "seq", 64))``."""
        return self._tensor(name, shape, dtype, "input")

    def param(self, name: str, shape, dtype: str = "float32") -> str:
        """A parameter (weights). Returns its name. ``b.param("w", (64, 128))``."""
        return self._tensor(name, shape, dtype, "param")

    def op(self, target: str, inputs, name: str | None = None, n_out: int = 1, dtypes=None, **params):
        """Add an op; returns its output name (a tuple of names when ``n_out > 1``, None for an op
        with no output such as a runtime assert). ``dtypes``: the outputs' element types (default:
        the first tensor input's). ``b.op("view", [x], size=("batch*seq", 64))``."""
        if name is not None and (not isinstance(name, str) or not name):
            raise ProgramError(f"op {target}: name {name!r} must be a non-empty string (its output tensor is named "
                               "after it), or None for an automatic name")
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 1:
            raise ProgramError(f"op {name or target}: n_out {n_out!r} must be an int >= 1 (1 returns the output's "
                               "name, more a tuple of names)")
        if dtypes is not None:
            if isinstance(dtypes, (str, bytes)) or not hasattr(dtypes, "__iter__"):
                raise ProgramError(f"op {name or target}: dtypes {dtypes!r} must be a list of dtype names, one per "
                                   "output, e.g. dtypes=['float32']")
            dtypes = list(dtypes)
            for k, dt in enumerate(dtypes):
                if dt is not None and dt not in DTYPES:
                    raise ProgramError(f"op {name or target}: dtypes[{k}] {dt!r} is not one of {', '.join(DTYPES)}")
        return self._op(target, inputs, name, n_out, dtypes, params)

    def _op(self, target: str, inputs, name, n_out, dtypes, params: dict, sym_outs=None):
        """``op``; ``sym_outs``: the outputs' symbolic shapes when the source knows them (torch.export)."""
        tensors, sym = self._tensors, self._sym
        in_shapes, dtype = [], None
        symbolic = False
        typed = _TYPED[0] if _TYPED else _load_typed()
        shapes_key = []  # the shape memo's key: tensor shapes (ints, validated) and typed constants
        for i in inputs:
            if type(i) is str:
                spec = tensors.get(i)
                if spec is None:
                    if self._repeat is not None and self._repeat.is_middle(i):
                        raise ProgramError(
                            f"op {name or target}: input {i!r} belongs to an instance of the repeated block "
                            f"{self._repeat.prefix!r} that is stamped, not built; after repeat() read only what it "
                            "returns (the last instance's outputs), or build the layers with a plain loop")
                    raise ProgramError(f"op {name or target}: input {i!r} is not a tensor defined before it")
                in_shapes.append(spec.shape)
                shapes_key.append(spec.shape)
                if sym and i in sym:
                    symbolic = True
                if dtype is None:
                    dtype = spec.dtype
            else:
                in_shapes.append(i)
                shapes_key.append(None if i is None else _KEYLESS)
        dtype = dtype or "float32"
        sym_params = _sy.param_extents(target, params, self._symbols) if params and self._symbols else {}
        if sym_params:
            params = {**params, **{k: _sy.evaluate_params(v, self._symbols) for k, v in sym_params.items()}}
        sym_shapes = typed_params = None
        if sym_outs is not None:
            shapes = shape_of(target, in_shapes, params)
            sym_shapes = [tuple(s) for s in sym_outs]
            if [_sy.evaluate_shape(s, self._symbols) for s in sym_shapes] != [tuple(s) for s in shapes]:
                raise ProgramError(f"op {name or target}: the source's symbolic shapes "
                                   f"{[_sy.shape_text(s) for s in sym_shapes]} are {[tuple(s) for s in shapes]} "
                                   "by the op rule at the example; they must agree")
        elif symbolic or sym_params:
            sym_in = [self._sym.get(i, tensors[i].shape) if type(i) is str else i for i in inputs]
            sym_shapes, special = _sy.infer_shapes(target, sym_in, params, sym_params, self._symbols, self._facts,
                                                   f"op {name or target} ({target})")
            self._facts.extend(g for g in special if g not in self._facts)
            shapes = [_sy.evaluate_shape(s, self._symbols) for s in sym_shapes]
        else:
            try:
                if _KEYLESS in shapes_key:
                    shapes_key = [typed(c) if k is _KEYLESS else k for c, k in zip(in_shapes, shapes_key)]
                typed_params = typed(params) if params else None
                shapes = shapes_keyed(target, tuple(shapes_key), typed_params, in_shapes, params)
            except TypeError:  # an unhashable constant or param: computed every time
                typed_params = shapes = None
            if shapes is None:
                shapes = shape_of(target, in_shapes, params)
        self._count += 1
        if self._scope:  # inside a repeated block: names relative to the instance, counted per instance
            self._scoped += 1
            base = self._scope + (name or f"{target.split('.')[0].replace('aten', '').strip('_:') or 'op'}_"
                                  f"{self._scoped}")
        else:
            base = name or f"{target.split('.')[0].replace('aten', '').strip('_:') or 'op'}_{self._count}"
        outs = [] if not shapes else [base] if len(shapes) == 1 else [f"{base}.{k}" for k in range(len(shapes))]
        dts = list(dtypes) if dtypes is not None else [dtype] * len(outs)
        for k, (o, shp, dt) in enumerate(zip(outs, shapes, dts)):
            if o in tensors or (self._repeat is not None and self._repeat.is_middle(o)):
                raise ProgramError(f"tensor {o!r} is defined twice")
            dt = dt if type(dt) is str and dt else str(dt or dtype)
            tensors[o] = _new_spec(o, tuple(shp), dt, "value")  # shapes from the op rules
            if sym_shapes is not None and _sy.is_symbolic_shape(sym_shapes[k]):
                self._sym[o] = sym_shapes[k]
        if not params:
            frozen = ()
        elif sym_params or sym_outs is not None or typed_params is None:
            frozen = tuple(sorted([(k, _freeze(v)) for k, v in params.items()]))
        else:
            frozen = _frozen_params(params, typed_params)
        sym_frozen = tuple(sorted((k, _freeze(_sy.params_text(v))) for k, v in sym_params.items())) \
            if sym_params else ()
        self._ops.append(_new_op(target, tuple(inputs), frozen, tuple(outs), base, sym_frozen))
        if not outs:
            return None
        return outs[0] if n_out == 1 else tuple(outs)

    def repeat(self, block, count: int, carry, prefix: str = "layers"):
        """``count`` instances of ``block(b, carry) -> carry``; returns the last instance's carry.
        Inside the block every name it gives (``b.param("wq", ...)``, ``b.op(..., name="q")``) and
        every automatic op name is relative to the instance: instance ``i`` makes
        ``f"{prefix}.{i}.wq"``. The block is not told which instance it builds, so it builds the
        same ops for every one (as the body of ``jax.lax.scan`` is traced once): the builder calls
        it for instances 0 and 1, checks that they are one block (``program.repeat.derive``: same
        ops, params and shapes, instance 1 reading instance 0's carry where instance 0 read the
        initial one; a block keeping state between calls fails it) and stamps the others. The
        program keeps instances 0-3 and the last and makes the middle ones when read; styles and
        plans read the kept ones only. When the two differ, or ``count < 6``, or the program is
        symbolic, or inside another repeat, every instance is built by calling ``block``.
        ``x = b.repeat(lambda b, x: b.op("relu", [x], name="y"), 8, x)`` makes ``layers.7.y``."""
        from .repeat import MIN_COUNT, derive, stamp

        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ProgramError(f"repeat: count {count!r} must be an int >= 1 (the number of instances)")
        if count > MAX_REPEAT:
            raise ProgramError(f"repeat: count {count} is more than the {MAX_REPEAT} instances a program may have "
                               "(every instance's ops are made when read); give at most that many")
        if not isinstance(prefix, str) or not prefix or not callable(block):
            raise ProgramError(f"repeat: give a callable block and a non-empty prefix (got {prefix!r})")
        single = isinstance(carry, str)
        carry0 = (carry,) if single else tuple(carry)
        for c in carry0:
            if not isinstance(c, str) or c not in self._tensors:
                raise ProgramError(f"repeat {prefix!r}: carry {c!r} is not a tensor defined before it")

        def run(i: int, c: tuple) -> tuple:
            scope, scoped = self._scope, self._scoped
            self._scope, self._scoped = f"{scope}{prefix}.{i}.", 0
            try:
                out = block(self, c[0] if single else c)
            finally:
                self._scope, self._scoped = scope, scoped
            out = (out,) if single else tuple(out) if isinstance(out, (tuple, list)) else None
            if out is None or len(out) != len(c) or not all(isinstance(x, str) and x in self._tensors for x in out):
                raise ProgramError(f"repeat {prefix!r}: instance {i} returned {out!r}; the block must return "
                                   f"its carry like the one it was given ({'a tensor name' if single else len(c)})")
            return out

        def result(c: tuple):
            return c[0] if single else c

        c = carry0
        if count < MIN_COUNT or self._symbols or self._repeat is not None or self._scope:
            for i in range(count):
                c = run(i, c)
            return result(c)
        t0, o0 = len(self._tensors), len(self._ops)
        c1 = run(0, c)
        t1, o1 = len(self._tensors), len(self._ops)
        c2 = run(1, c1)
        t2, o2 = len(self._tensors), len(self._ops)
        rep = derive(prefix, list(self._tensors), self._tensors, self._ops, carry0, c1, c2, (t0, t1, t2),
                     (o0, o1, o2))
        if rep is None or any(n in self._sym for n in list(self._tensors)[t0:t2]):
            c = c2
            for i in range(2, count):
                c = run(i, c)
            return result(c)
        rep = replace(rep, count=count)
        clash = [f"{prefix}.{k}.{s}" for k in (2, 3, count - 1) for s in rep.suffixes
                 if f"{prefix}.{k}.{s}" in self._tensors] + [n for n in list(self._tensors)[:t0] if rep.is_middle(n)]
        if clash:
            raise ProgramError(f"repeat {prefix!r}: tensor {clash[0]!r} is defined twice (before the block made it)")
        for k, prev in ((2, 1), (3, 2)):
            specs, ops = stamp(rep, k, prev)
            self._tensors.update((sp.name, sp) for sp in specs)
            self._ops.extend(ops)
        rep = replace(rep, tensor_at=len(self._tensors), op_at=len(self._ops))
        specs, ops = stamp(rep, count - 1, 3)
        self._tensors.update((sp.name, sp) for sp in specs)
        self._ops.extend(ops)
        self._repeat = rep
        return result(tuple(rep.name(count - 1, s) for s in rep.carry))

    def output(self, name: str) -> None:
        """Mark a tensor as a program output."""
        if name not in self._tensors:
            raise ProgramError(f"output {name!r} is not a tensor of the program")
        self._outputs.append(name)

    def build(self) -> Program:
        """The immutable Program (of repeated blocks: see :meth:`repeat`)."""
        sym_shapes = tuple((n, self._sym[n]) for n in self._tensors if n in self._sym)
        prog = Program(_ragged_tensors(dict(self._tensors), self._ops), tuple(self._ops), tuple(self._outputs),
                       tuple(sorted(self._symbols.items())), sym_shapes, FactBase(tuple(self._facts)).guards,
                       tuple(dict.fromkeys(self._notes)))
        if self._repeat is None:
            return prog
        full = _repeated_program(prog, self._repeat)
        if any(t.ragged is not None for t in prog.tensors.values()):  # ragged dims are derived program-wide
            return Program(_ragged_tensors(dict(full.tensors), full.ops), full.ops, prog.outputs, prog.symbols,
                           prog.sym_shapes, prog.facts, prog.notes)
        return full


del Program.ops  # no class-level default: a repeated program's ops are made on first read (__getattr__)


def _repeated_program(compressed: Program, rep) -> Program:
    """The Program of ``compressed`` (with its middle instances left out) and ``rep``: fields
    other than ``tensors`` and ``ops`` are the compressed program's."""
    prog = object.__new__(Program)
    prog.__dict__.update(outputs=compressed.outputs, symbols=compressed.symbols, sym_shapes=compressed.sym_shapes,
                         facts=compressed.facts, notes=compressed.notes, _repeated=(compressed, rep))
    return prog


def _ragged_tensors(tensors: dict, ops) -> dict:
    """Tensors with their ragged dims set from the ops (``program.ragged``); a RaggedError (an op
    not defined on a ragged operand) is a ProgramError naming it."""
    from ..sharding.nested import RaggedError
    from .ragged import with_ragged

    try:
        return with_ragged(tensors, ops)
    except RaggedError as e:
        raise ProgramError(str(e)) from None


from .shapes import _TYPED, _load_typed, shape_of, shapes_keyed  # noqa: E402 - the builder's shape inference

_KEYLESS = object()  # a constant input whose memo key is computed only when needed

__all__ = ["Op", "Program", "ProgramBuilder", "ProgramError", "TensorSpec"]
