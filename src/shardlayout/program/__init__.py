"""Programs: a DAG of ops over named tensors, a builder, and a JSON form that never runs code.

    >>> b = ProgramBuilder()
    >>> x = b.input("x", (4, 8)); w = b.param("w", (8, 2))
    >>> y = b.op("mm", [x, w]); b.output(y)
    >>> p = b.build(); [op.target for op in p.ops], p.tensors[y].shape
    (['mm'], (4, 2))
    >>> Program.from_json(p.to_json()) == p
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ShardingError
from ..sharding.cost import ITEMSIZE


class ProgramError(ShardingError):
    """A malformed program (unknown tensor, duplicate name, bad JSON)."""


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor: shape, dtype and kind ("input", "param", "buffer" or "value")."""

    name: str
    shape: tuple
    dtype: str = "float32"
    kind: str = "value"


@dataclass(frozen=True)
class Op:
    """One op: aten ``target``, tensor ``inputs`` (names), ``params`` (JSON values), ``outputs``."""

    target: str
    inputs: tuple
    params: tuple  # sorted (name, value) pairs, values JSON-able and hashable
    outputs: tuple
    name: str = ""

    def kwargs(self) -> dict:
        """Params as a dict. ``Op("mm", ("a",), (), ("b",)).kwargs() -> {}``."""
        return {k: _thaw(v) for k, v in self.params}


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise ProgramError(f"op parameter {v!r} is not JSON-able (ints, floats, strings, lists)")


def _thaw(v):
    return v


@dataclass(frozen=True)
class Program:
    """Tensors by name, ops in topological order, and the program's outputs."""

    tensors: dict = field(default_factory=dict)
    ops: tuple = ()
    outputs: tuple = ()

    def __eq__(self, other) -> bool:
        return (isinstance(other, Program) and self.tensors == other.tensors and self.ops == other.ops
                and self.outputs == other.outputs)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.tensors)), self.ops, self.outputs))

    def inputs(self, kind: str | None = None) -> list:
        """Names of tensors no op produces (optionally of one kind), in definition order."""
        produced = {o for op in self.ops for o in op.outputs}
        return [n for n, t in self.tensors.items() if n not in produced and (kind is None or t.kind == kind)]

    def to_json(self) -> str:
        """Deterministic JSON text. ``Program.from_json(p.to_json()) == p``."""
        data = {
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "kind": t.kind}
                        for t in self.tensors.values()],
            "ops": [{"name": op.name, "target": op.target, "inputs": list(op.inputs),
                     "params": {k: v for k, v in op.params}, "outputs": list(op.outputs)} for op in self.ops],
            "outputs": list(self.outputs),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Program":
        """Read JSON (no code is evaluated); checks every name and shape."""
        try:
            data = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise ProgramError(f"program JSON is malformed: {e.msg} at line {e.lineno}") from None
        except RecursionError:
            raise ProgramError("program JSON is nested too deeply (a program is a few levels deep)") from None
        except (ValueError, TypeError) as e:  # an int of thousands of digits, bytes that are not UTF-8, not text
            if isinstance(e, ShardingError):
                raise
            raise ProgramError(f"program JSON cannot be read: {str(e).split(';')[0]}") from None
        if not isinstance(data, dict) or not {"tensors", "ops", "outputs"} <= set(data):
            raise ProgramError("program JSON needs the keys 'tensors', 'ops' and 'outputs'")
        for key in ("tensors", "ops", "outputs"):
            if not isinstance(data[key], list):
                raise ProgramError(f"program JSON: {key!r} must be a list, got {type(data[key]).__name__}")
        b = ProgramBuilder()
        try:
            for t in data["tensors"]:
                b._add(_tensor_entry(t))
            for op in data["ops"]:
                b._add_op(_op_entry(op))
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
        _check_kinds(prog, {t["name"]: t["kind"] for t in data["tensors"] if "kind" in t})
        _check_dataflow(prog)
        return prog


DTYPES = tuple(ITEMSIZE)  # every element type the cost model knows the size of
KINDS = ("input", "param", "buffer", "value")
MAX_DIM = (1 << 63) - 1  # torch's int64 sizes


def _no_constant(name: str):
    raise ProgramError(f"program JSON: {name} is not a number JSON allows (nor a size or a parameter)")


def _op_entry(op) -> "Op":
    """One op of program JSON, checked: a target, lists of inputs and outputs, a params object."""
    if not isinstance(op, dict):
        raise ProgramError(f"program JSON: op entry {op!r} is not an object with 'target', 'inputs', 'outputs'")
    where = f"op {op.get('name') or op.get('target')!r}"
    if not isinstance(op.get("target"), str) or not op["target"]:
        raise ProgramError(f"program JSON: {where} needs a string 'target' (an aten op name, e.g. 'mm')")
    for key in ("inputs", "outputs"):
        if not isinstance(op.get(key), list):
            raise ProgramError(f"program JSON: {where}: {key!r} must be a list, got {op.get(key)!r}")
    if not all(isinstance(o, str) for o in op["outputs"]):
        raise ProgramError(f"program JSON: {where}: outputs {op['outputs']!r} must be tensor names")
    unknown = set(op) - {"target", "inputs", "outputs", "params", "name"}
    if unknown:
        raise ProgramError(f"program JSON: {where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; an op "
                           "has target, inputs, outputs, params and name")
    params = op.get("params", {})
    if not isinstance(params, dict):
        raise ProgramError(f"program JSON: {where}: 'params' must be an object, got {params!r}")
    if not isinstance(op.get("name", ""), str):
        raise ProgramError(f"program JSON: {where}: 'name' must be a string")
    frozen = tuple(sorted((str(k), _freeze(v)) for k, v in params.items()))
    return Op(op["target"], tuple(_freeze(i) for i in op["inputs"]), frozen, tuple(op["outputs"]), op.get("name", ""))


def _check_kinds(prog: "Program", declared: dict) -> None:
    """A tensor an op produces is a 'value'; one declared 'value' is produced by an op."""
    produced = {o: op for op in prog.ops for o in op.outputs}
    for name, kind in declared.items():
        if kind != "value" and name in produced:
            op = produced[name]
            raise ProgramError(f"program JSON: op {op.name or op.target} ({op.target}) produces {name!r}, declared "
                               f"kind {kind!r}; an op's output has kind 'value'")
        if kind == "value" and name not in produced:
            raise ProgramError(f"program JSON: tensor {name!r} has kind 'value' but no op produces it; give it kind "
                               "'input' or 'param', or add the op that computes it")


def _tensor_entry(t) -> "TensorSpec":
    """One tensor of program JSON, checked: a name, positive int sizes, a known dtype and kind."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise ProgramError(f"program JSON: tensor entry {t!r} needs a non-empty string 'name'")
    name, shape = t["name"], t.get("shape")
    if not isinstance(shape, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIM
                                          for x in shape):
        raise ProgramError(f"program JSON: tensor {name!r}: shape {shape!r} must be a list of ints >= 1 "
                           "(at most 2**63-1)")
    unknown = set(t) - {"name", "shape", "dtype", "kind"}
    if unknown:
        raise ProgramError(f"program JSON: tensor {name!r}: unknown key(s) {', '.join(sorted(unknown))}; "
                           "a tensor has name, shape, dtype and kind")
    dtype, kind = t.get("dtype", "float32"), t.get("kind", "value")
    if dtype not in DTYPES:
        raise ProgramError(f"program JSON: tensor {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if kind not in KINDS:
        raise ProgramError(f"program JSON: tensor {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    return TensorSpec(name, tuple(shape), dtype, kind)


def _check_dataflow(prog: "Program") -> None:
    """Every op known and called as its signature says, its inputs produced before it (or program
    inputs), each tensor produced once, and the declared shapes equal to what the op produces."""
    from ..ops.registry import get_op
    from .shapes import shape_of

    produced: set = set()
    made_by = {o: op for op in prog.ops for o in op.outputs}
    for op in prog.ops:
        where = f"op {op.name or op.target} ({op.target})"
        get_op(op.target)
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


class ProgramBuilder:
    """Write models in plain Python: ``x = b.input("x", (B, T, D)); y = b.op("mm", [x, w])``.

    Output shapes come from the op rules' own shape logic (``shape_of``)."""

    def __init__(self):
        self._tensors: dict = {}
        self._ops: list = []
        self._outputs: list = []
        self._count = 0

    def _add(self, spec: TensorSpec) -> str:
        if not isinstance(spec.name, str) or not spec.name:
            raise ProgramError(f"tensor name {spec.name!r} must be a non-empty string")
        if spec.name in self._tensors:
            raise ProgramError(f"tensor {spec.name!r} is defined twice")
        if any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DIM for n in spec.shape):
            raise ProgramError(f"tensor {spec.name!r}: shape {spec.shape} must be non-negative ints")
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

    def input(self, name: str, shape, dtype: str = "float32") -> str:
        """A program input (activations). Returns its name."""
        return self._add(TensorSpec(name, tuple(shape), dtype, "input"))

    def param(self, name: str, shape, dtype: str = "float32") -> str:
        """A parameter (weights). Returns its name."""
        return self._add(TensorSpec(name, tuple(shape), dtype, "param"))

    def op(self, target: str, inputs, name: str | None = None, n_out: int = 1, dtypes=None, **params):
        """Add an op; returns its output name (a tuple of names when ``n_out > 1``, None for an op
        with no output such as a runtime assert). ``dtypes``: the outputs' element types (default:
        the first tensor input's)."""
        from .shapes import shape_of

        tensors = self._tensors
        in_shapes, dtype = [], None
        for i in inputs:
            if type(i) is str:
                spec = tensors.get(i)
                if spec is None:
                    raise ProgramError(f"op {name or target}: input {i!r} is not a tensor defined before it")
                in_shapes.append(spec.shape)
                dtype = dtype or spec.dtype
            else:
                in_shapes.append(i)
        dtype = dtype or "float32"
        shapes = shape_of(target, in_shapes, params)
        self._count += 1
        base = name or f"{target.split('.')[0].replace('aten', '').strip('_:') or 'op'}_{self._count}"
        outs = [] if not shapes else [base] if len(shapes) == 1 else [f"{base}.{k}" for k in range(len(shapes))]
        dts = list(dtypes) if dtypes is not None else [dtype] * len(outs)
        for o, shp, dt in zip(outs, shapes, dts):
            if o in tensors:
                raise ProgramError(f"tensor {o!r} is defined twice")
            tensors[o] = TensorSpec(o, tuple(shp), str(dt or dtype), "value")  # shapes from the op rules
        frozen = tuple(sorted((k, _freeze(v)) for k, v in params.items())) if params else ()
        self._ops.append(Op(target, tuple(inputs), frozen, tuple(outs), base))
        if not outs:
            return None
        return outs[0] if n_out == 1 else tuple(outs)

    def output(self, name: str) -> None:
        """Mark a tensor as a program output."""
        if name not in self._tensors:
            raise ProgramError(f"output {name!r} is not a tensor of the program")
        self._outputs.append(name)

    def build(self) -> Program:
        """The immutable Program."""
        return Program(dict(self._tensors), tuple(self._ops), tuple(self._outputs))


__all__ = ["Op", "Program", "ProgramBuilder", "ProgramError", "TensorSpec"]
