"""The op registry: one :class:`OpDef` per op, declared once, keyed by short aten name.

An OpDef holds the op's typed signature, its sharding rule, its numpy implementation (for
simulation) and an optional extra check; ``register_op`` is the public way in. Every call is
validated against the signature before the rule runs: unknown or missing params, wrong
types, dims out of range and a wrong number of tensors raise :class:`OpError` naming the op,
the argument and the fix.

**Signature format** — tensors, then ``;``, then params::

    "x, w, bias? ; dim: dim = -1, keepdim: bool = False"

Tensors: ``name`` (required), ``name?`` (optional: absent or None), ``name|scalar`` (a tensor
or a Python number), ``*name`` (one or more tensors). Param types: ``int`` (``int[1..]``
bounds it, both ends inclusive, either end optional), ``float``, ``bool``, ``str``,
``scalar`` (int or float), ``dim`` (an int in ``[-ndim, ndim)`` of the first tensor,
normalised to ``[0, ndim)``), ``dim+1`` (``[-(ndim+1), ndim]``, for unsqueeze), ``dims`` (a dim or a
list of dims), ``ints``, ``shape`` (ints >= 1 with at most one -1), ``dtype`` (a dtype name),
``mesh`` (a Mesh), ``any`` (any JSON value), ``ignored`` (accepted, no effect: torch's
``layout``, ``device``, ``memory_format`` ...). A ``?`` after a type allows None; ``= v`` gives
a default (a Python literal), otherwise the param is required.

    >>> from shardlayout.ops.registry import parse_signature
    >>> sig = parse_signature("x ; dim: dim = -1, keepdim: bool = False")
    >>> [t.name for t in sig.tensors], [(p.name, p.type, p.default) for p in sig.params]
    (['x'], [('dim', 'dim', -1), ('keepdim', 'bool', False)])
"""

from __future__ import annotations

import ast
import keyword
import numbers
import re
from dataclasses import dataclass, field, replace
from typing import Callable

from ..caches import memo, register_clearer
from ..config import settings
from ..errors import OpError, UnsupportedOp
from ..mesh import Mesh
from ..sharding import Sharding
from ..sharding.core import split_top_level
from ..sharding.cost import DEFAULT_COST_MODEL, ITEMSIZE
from .result import canonical_op_name

REQUIRED = object()

# params that steer planning, not values: the numpy implementation never sees them
PLANNING_PARAMS = ("subaxes", "routed")
LOCAL_PARAMS = ("local",)  # set by a rule for the local run only (``Propagation.local``), never by a caller

PARAM_TYPES = ("int", "float", "bool", "str", "scalar", "dim", "dim+1", "dims", "ints", "shape", "dtype", "mesh",
               "any", "ignored")


@dataclass(frozen=True)
class TensorArg:
    """A tensor input: ``optional`` (may be absent or None), ``scalar`` (may be a Python
    number), ``variadic`` (one or more)."""

    name: str
    optional: bool = False
    scalar: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Param:
    """A typed op parameter; ``low``/``high`` bound ints; ``nullable`` allows None."""

    name: str
    type: str
    default: object = REQUIRED
    nullable: bool = False
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class Signature:
    """Tensor inputs and params of an op (see the module docstring for the text form)."""

    tensors: tuple
    params: tuple
    text: str = ""
    # bind's fast path, computed once: the binder generated for this signature (``compile_binder``)
    binder: Callable | None = field(init=False, repr=False, compare=False)
    invoker: Callable = field(init=False, repr=False, compare=False)  # ``compile_invoker``

    def __post_init__(self):
        object.__setattr__(self, "binder", compile_binder(self))
        object.__setattr__(self, "invoker", compile_invoker(self))

    def param(self, name: str) -> Param | None:
        """The param called ``name``, or None."""
        return next((p for p in self.params if p.name == name), None)


_PARAM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([a-z+1]+)(\[(-?\d*)\.\.(-?\d*)\])?(\?)?\s*(=\s*(.+))?$")


@memo(4096)
def parse_signature(text: str) -> Signature:
    """Read a signature text (module docstring). ``parse_signature("a, b")``."""
    head, _, tail = text.partition(";")
    tensors = []
    for part in [p.strip() for p in head.split(",") if p.strip()]:
        variadic = part.startswith("*")
        name = part.lstrip("*")
        scalar = name.endswith("|scalar")
        name = name.removesuffix("|scalar")
        optional = name.endswith("?")
        name = name.removesuffix("?")
        if not name.isidentifier():
            raise OpError(f"signature {text!r}: tensor {part!r} is not a name (write 'x', 'x?', 'x|scalar' or '*xs')")
        tensors.append(TensorArg(name, optional, scalar, variadic))
    if any(t.variadic for t in tensors[:-1]):
        raise OpError(f"signature {text!r}: a variadic '*name' must be the last tensor")
    seen = [t.name for t in tensors]
    twice = next((n for k, n in enumerate(seen) if n in seen[:k]), None)
    if twice is not None:
        raise OpError(f"signature {text!r}: tensor {twice!r} is named twice; give each tensor its own name")
    params = []
    for part in [p for p in split_top_level(tail) if p]:
        m = _PARAM.match(part)
        if not m or m.group(2) not in PARAM_TYPES:
            raise OpError(
                f"signature {text!r}: param {part!r} does not read 'name: type[lo..hi]? = default' with a type "
                f"among {', '.join(PARAM_TYPES)}"
            )
        default = REQUIRED
        if m.group(8) is not None:
            try:
                default = ast.literal_eval(m.group(8).strip())
            except (ValueError, SyntaxError):
                raise OpError(f"signature {text!r}: default of {m.group(1)!r} is not a Python literal") from None
        low = int(m.group(4)) if m.group(4) else None
        high = int(m.group(5)) if m.group(5) else None
        name = m.group(1)
        if low is not None and high is not None and low > high:
            raise OpError(f"signature {text!r}: param {name!r} has the empty range [{low}..{high}]; write [lo..hi] "
                          "with lo <= hi (both ends inclusive)")
        if name in seen:
            what = "a tensor" if name in [t.name for t in tensors] else "a param"
            raise OpError(f"signature {text!r}: param {name!r} has the name of {what} before it; give each tensor "
                          "and param its own name")
        seen.append(name)
        p = Param(name, m.group(2), default, bool(m.group(6)) or default is None, low, high)
        if default is not REQUIRED and default is not None:
            try:
                _check_value("signature", p, default, None)
            except OpError:
                kind = p.type + (f"[{'' if low is None else low}..{'' if high is None else high}]"
                                 if low is not None or high is not None else "")
                kind = ("an " if kind[0] in "aeiou" else "a ") + kind
                raise OpError(f"signature {text!r}: default {default!r} of param {name!r} is not {kind}; give a "
                              "default of the param's type, or None") from None
        params.append(p)
    return Signature(tuple(tensors), tuple(params), text)


# ------------------------------------------------------------------------------------------
# validation: small named checks, run once at the boundary
# ------------------------------------------------------------------------------------------


def _is_int(v) -> bool:
    t = type(v)
    return t is int or (t is not bool and isinstance(v, numbers.Integral))


def _is_number(v) -> bool:
    t = type(v)
    return t is int or t is float or (t is not bool and isinstance(v, numbers.Real))


def _check_tensors(op: str, sig: Signature, inputs: tuple) -> None:
    required = sum(1 for t in sig.tensors if not t.optional and not t.variadic)
    variadic = any(t.variadic for t in sig.tensors)
    most = len(sig.tensors) if not variadic else None
    names = ", ".join(("*" if t.variadic else "") + t.name + ("?" if t.optional else "") for t in sig.tensors)
    least = required + (1 if variadic else 0)
    if len(inputs) < least or (most is not None and len(inputs) > most):
        raise OpError(
            f"op {op}: got {len(inputs)} tensor input(s), expects ({names or 'none'}); pass exactly those"
        )
    for k, x in enumerate(inputs):
        arg = sig.tensors[min(k, len(sig.tensors) - 1)]
        if isinstance(x, Sharding):
            continue
        if x is None and arg.optional:
            continue
        if arg.scalar and _is_number(x):
            continue
        want = "a Sharding" + (" or a number" if arg.scalar else "") + (" or None" if arg.optional else "")
        raise OpError(f"op {op}: input {k} ({arg.name}) is {x!r}; expected {want}")
    meshes = {x.mesh for x in inputs if isinstance(x, Sharding)}
    if len(meshes) > 1:
        raise OpError(f"op {op}: inputs are on different meshes ({', '.join(sorted(map(str, meshes)))}); "
                      "put every operand of one op on one mesh")


def _check_value(op: str, p: Param, v, ndim: int | None):
    where = f"op {op}: param {p.name}"
    if v is None:
        if p.nullable:
            return None
        raise OpError(f"{where} is None; give a {p.type}")
    t = p.type
    if t in ("any", "ignored", "dtype", "str"):
        if t == "str" and not isinstance(v, str):
            raise OpError(f"{where} = {v!r} is not a string")
        if t == "dtype" and str(v).replace("torch.", "") not in ITEMSIZE:
            raise OpError(f"{where} = {v!r} is not a dtype; give one of {', '.join(ITEMSIZE)}")
        return v
    if t == "mesh":
        if not isinstance(v, Mesh):
            raise OpError(f"{where} = {v!r} is not a Mesh")
        return v
    if t == "bool":
        if not isinstance(v, bool):
            raise OpError(f"{where} = {v!r} is not a bool (True or False)")
        return v
    if t == "scalar":  # torch's Scalar: a number or a bool
        if not (_is_number(v) or isinstance(v, bool)):
            raise OpError(f"{where} = {v!r} is not a number")
        return v
    if t == "float":
        if not _is_number(v):
            raise OpError(f"{where} = {v!r} is not a number")
        return v
    if t == "int":
        if not _is_int(v):
            raise OpError(f"{where} = {v!r} is not an int")
        if (p.low is not None and v < p.low) or (p.high is not None and v > p.high):
            lo = "" if p.low is None else p.low
            hi = "" if p.high is None else p.high
            raise OpError(f"{where} = {v} is out of range [{lo}..{hi}]; give an int in that range")
        return int(v)
    if t in ("dim", "dim+1"):
        return _check_dim(where, v, ndim, 1 if t == "dim+1" else 0)
    if t == "dims":
        vals = [v] if _is_int(v) else _int_list(where, v)
        dims = [_check_dim(where, x, ndim, 0) for x in vals]
        if len(set(dims)) != len(dims):
            raise OpError(f"{where} = {v!r} names a dim twice; name each dim once")
        return dims[0] if _is_int(v) else tuple(dims)
    if t == "ints":
        return tuple(_int_list(where, v))
    if t == "shape":
        vals = tuple(_int_list(where, v))
        if any(x < -1 or x == 0 for x in vals) or vals.count(-1) > 1:
            raise OpError(f"{where} = {list(vals)}: sizes must be >= 1, with at most one -1 (inferred)")
        return vals
    raise OpError(f"{where}: unknown type {t!r}")  # pragma: no cover - parse_signature refuses it


def _int_list(where: str, v) -> list:
    if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v):
        return [int(x) for x in v]
    raise OpError(f"{where} = {v!r} is not a list of ints")


def _check_dim(where: str, v, ndim: int | None, extra: int) -> int:
    if not _is_int(v):
        raise OpError(f"{where} = {v!r} is not an int dim")
    if ndim is None:
        return int(v)
    n = ndim + extra
    lo, hi = -max(n, 1), max(n, 1) - 1
    if not lo <= v <= hi:
        raise OpError(f"{where} = {v} is out of range [{lo}, {hi}] for a tensor of {ndim} dims; "
                      f"give a dim in that range")
    return int(v) % max(n, 1)


def bind(op: str, sig: Signature, inputs: tuple, params: dict) -> dict:
    """Validated params with defaults filled in and dims normalised; raises ``OpError``.

    The common call (Shardings on one mesh for every tensor, known params) through the
    signature's generated binder (``compile_binder``); anything else, and every error, through
    ``_bind_checked``.
    ``bind("sum", parse_signature("x ; dim: dims? = None"), (s,), {"dim": -1})``
    """
    binder = sig.binder
    if binder is not None:
        try:
            out = binder(op, inputs, params)
        except OpError:  # a bad value: _bind_checked names the first bad param in signature order
            out = None
        if out is not None:
            return out
    return _bind_checked(op, sig, inputs, params)


def compile_binder(sig: Signature):
    """``binder(op, inputs, params) -> dict | None``: ``bind``'s answer on the common call, in
    straight-line code generated once for ``sig`` (no loop over the signature per call); None
    (or an ``OpError``) where ``_bind_checked`` must look: a tensor input that is not a
    Sharding, two meshes, an unknown or missing param, a bad value. None when ``sig`` has
    optional, scalar or variadic tensors (``_bind_checked`` binds those).

    ``compile_binder(parse_signature("x ; k: bool = False"))("op", (s,), {}) -> {'k': False}``
    """
    if any(t.optional or t.variadic or t.scalar for t in sig.tensors):
        return None
    n = len(sig.tensors)
    lines = ["def binder(op, inputs, params):", f"    if len(inputs) != {n}:", "        return None"]
    for k in range(n):
        lines += [f"    x{k} = inputs[{k}]", f"    if type(x{k}) is not Sharding:", "        return None"]
        if k:  # every tensor on the mesh of the first
            lines += [f"    if x{k}.mesh is not x0.mesh and x{k}.mesh != x0.mesh:", "        return None"]
    lines.append(f"    ndim = {'len(x0.shape)' if n else 'None'}")
    for j, p in enumerate(sig.params):  # every param starts unset (None when that is its default), given
        lines.append(f"    v{j} = {'None' if p.default is None else 'UNSET'}")  # ones are checked as they come
    if sig.params:
        lines += ["    for name in params:", "        v = params[name]"]  # (cheaper than params.items())
        for j, p in enumerate(sig.params):
            lines.append(f"        {'if' if j == 0 else 'elif'} name == {p.name!r}:")
            lines += [" " * 12 + line for line in _value_check(j, p)]
            lines.append(f"            v{j} = v")
        lines += ["        else:", "            return None"]
    else:
        lines += ["    if params:", "        return None"]
    for j, p in enumerate(sig.params):  # a param not given: its default, checked as given (a dim normalised)
        if p.default is None:  # None where None is allowed: nothing to check
            continue
        lines.append(f"    if v{j} is UNSET:")
        if p.default is REQUIRED:
            lines.append("        return None")
        else:
            lines.append(f"        v = DEFAULTS[{j}]")
            lines += [" " * 8 + line for line in _value_check(j, p)]
            lines.append(f"        v{j} = v")
    lines.append("    return {" + ", ".join(f"{p.name!r}: v{j}" for j, p in enumerate(sig.params)) + "}")
    scope = {"Sharding": Sharding, "UNSET": REQUIRED, "PARAMS": sig.params, "check": _check_value,
             "DEFAULTS": tuple(p.default for p in sig.params)}
    exec("\n".join(lines), scope)  # noqa: S102 - code generated above from a parsed signature
    return scope["binder"]


def compile_invoker(sig: Signature):
    """``invoker(rule, name, inputs, cost_model, tensor_dtype, out_pins, bound)``: the rule called
    with every param of ``sig`` as a keyword of its own, generated once (no dictionary merged and
    unpacked per call, as ``rule(..., **bound)`` does); ``bound`` holds them all (``bind``).

    ``compile_invoker(parse_signature("x ; k: bool = False"))(rule, "op", (s,), cm, "float32", (), {"k": True})``
    """
    names = [p.name for p in sig.params]
    if any(keyword.iskeyword(n) or n in _RULE_ARGS for n in names):  # not a keyword argument: merged
        return lambda rule, name, inputs, cm, dtype, pins, bound: rule(
            name, inputs, cost_model=cm, tensor_dtype=dtype, out_pins=pins, **bound)
    kws = "".join(f", {n}=bound[{n!r}]" for n in names)
    scope: dict = {}
    exec("def invoker(rule, name, inputs, cm, dtype, pins, bound):\n"  # noqa: S102 - from a parsed signature
         f"    return rule(name, inputs, cost_model=cm, tensor_dtype=dtype, out_pins=pins{kws})", scope)
    return scope["invoker"]


_RULE_ARGS = ("cost_model", "tensor_dtype", "out_pins")  # the keywords every rule gets besides the params


def _value_check(j: int, p: Param) -> list:
    """The generated lines that check (and normalise) value ``v`` of param ``j``: a tuple of
    positive ints as a shape and a bool inline, every other value through ``_check_value``."""
    general = [f"v = check(op, PARAMS[{j}], v, ndim)"]
    if p.type == "shape":
        body = ["if type(v) is not tuple:", "    " + general[0], "else:", "    for e in v:",
                "        if type(e) is not int or e < 1:", "            " + general[0], "            break"]
    elif p.type == "bool":
        body = ["if type(v) is not bool:", "    " + general[0]]
    else:
        body = general
    if p.nullable:  # None stays None
        return ["if v is not None:"] + ["    " + line for line in body]
    return body


def _bind_checked(op: str, sig: Signature, inputs: tuple, params: dict) -> dict:
    """``bind`` on any call, every check spelled out (each error names the op, the argument, the fix)."""
    _check_tensors(op, sig, inputs)
    known = {p.name for p in sig.params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise OpError(
            f"op {op}: unknown param(s) {', '.join(map(repr, unknown))}; {op} takes "
            f"{', '.join(sorted(known)) or 'no params'}"
        )
    first = next((x for x in inputs if isinstance(x, Sharding)), None)
    ndim = first.ndim if first is not None else None
    out = {}
    for p in sig.params:
        if p.name in params:
            v = params[p.name]
        elif p.default is REQUIRED:
            raise OpError(f"op {op}: param {p.name} ({p.type}) is required; pass {p.name}=...")
        else:
            v = p.default
        out[p.name] = _check_value(op, p, v, ndim)
    return out


# ------------------------------------------------------------------------------------------
# OpDef and the registry
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # one object per registered name: compared and hashed by identity
class OpDef:
    """One op, declared once: ``name``, ``signature``, ``rule`` (``rule(name, inputs, **params,
    cost_model=, tensor_dtype=, out_pins=) -> Propagation``), ``numpy`` (``numpy(*arrays, **params)``
    -> array or tuple; with ``shape_driven`` it also receives ``out_shapes=``, the shapes it
    must produce, e.g. a view on one rank), ``check`` (``check(name, inputs, params)``, extra
    validation that raises ``OpError``), ``aliases`` and ``not_simulated`` (why numpy cannot
    run it, for ops whose values are random or data-dependent)."""

    name: str
    signature: Signature
    rule: Callable
    numpy: Callable | None = None
    check: Callable | None = None
    aliases: tuple = ()
    shape_driven: bool = False
    not_simulated: str | None = None

    def bind(self, inputs: tuple, params: dict) -> dict:
        """Validate a call; returns the full params. Raises ``OpError``."""
        out = bind(self.name, self.signature, tuple(inputs), params)
        if self.check is not None:
            self.check(self.name, tuple(inputs), out)
        return out

    def propagate(self, inputs: tuple, params: dict, out_pins=None, cost_model=None, tensor_dtype="float32"):
        """Validate, then run the rule (memoised on immutable arguments)."""
        return self.resolve(inputs, params, out_pins, cost_model, tensor_dtype)[0]

    def resolve(self, inputs: tuple, params: dict, out_pins=None, cost_model=None, tensor_dtype="float32",
                typed_params=None):
        """``(Propagation, bound params)``: what :meth:`propagate` returns and the validated params.

        A call seen before (same op, inputs, params with their types, pins, cost model, dtypes and
        settings) is one dictionary probe: it was validated the first time, and a call that failed
        validation is never stored. ``typed_params``: ``_typed(params)`` when the caller has it.
        ``get_op("relu").resolve((s,), {})[1] -> {}``
        """
        cm = cost_model or DEFAULT_COST_MODEL
        pins = None if out_pins is None else tuple(out_pins)
        try:
            ins = inputs if type(inputs) is tuple and len(inputs) == 1 and type(inputs[0]) is Sharding else \
                _typed(inputs)  # (_typed's answer for one Sharding)
            seen = (self, ins, _typed(params) if typed_params is None else typed_params, pins,
                    None if cm is DEFAULT_COST_MODEL else cm, tensor_dtype, settings.subaxes)  # cost_key(cm)
            hit = _SEEN.get(seen)
        except TypeError:  # an unhashable param (a list of lists, a dict): validate and run every time
            seen = hit = None
        if hit is not None:
            return hit[0], dict(hit[1])
        inputs = inputs if type(inputs) is tuple else tuple(inputs)
        # bind(self.name, self.signature, inputs, params) inlined: two calls less on every first call
        binder = self.signature.binder
        try:
            bound = None if binder is None else binder(self.name, inputs, params)
        except OpError:  # a bad value: _bind_checked names the first bad param in signature order
            bound = None
        if bound is None:
            bound = _bind_checked(self.name, self.signature, inputs, params)
        if self.check is not None:
            self.check(self.name, inputs, bound)
        p = self.signature.invoker(self.rule, self.name, inputs, cm, tensor_dtype, pins or (), bound)
        if len(p.input_targets) < len(inputs) or (p.cost_model is not cm and p.cost_model != cm):
            p = _completed(p, inputs, cm)
        if seen is not None:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN[seen] = (p, bound.copy())
        return p, bound

    def run_numpy(self, args: list, params: dict, out_shapes: list) -> list:
        """Run the numpy implementation; always returns a list of arrays."""
        import numpy as np

        from ..errors import SimulationUnsupported

        if self.numpy is None:
            raise SimulationUnsupported(
                f"op {self.name} cannot be simulated in numpy: "
                + (self.not_simulated or "it has no numpy implementation (give numpy= to register_op)")
            )
        kw = {k: v for k, v in params.items() if k in LOCAL_PARAMS
              or k not in PLANNING_PARAMS and self.signature.param(k).type not in ("ignored", "mesh")}
        if self.shape_driven:
            kw["out_shapes"] = [tuple(s) for s in out_shapes]
        out = self.numpy(*args, **kw)
        return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else [np.asarray(out)]


def _completed(p, inputs: tuple, cm):
    """A rule's Propagation made whole: inputs the rule leaves alone are not moved (their
    targets are the inputs), and it is priced with ``cm``."""
    if len(p.input_targets) < len(inputs):
        p = replace(p, input_targets=tuple(p.input_targets) + tuple(inputs[len(p.input_targets):]))
    return p if p.cost_model is cm or p.cost_model == cm else replace(p, cost_model=cm)


def cost_key(cm):
    """The cost model as ``_SEEN``'s keys hold it: None for the default (its hash is a Python
    call, twice on every first call), else the model. ``cost_key(DEFAULT_COST_MODEL) -> None``"""
    return None if cm is DEFAULT_COST_MODEL else cm


def _typed(v):
    """A memo key of a call's arguments that tells ``1``, ``1.0`` and ``True`` apart (equal and
    equally hashed in Python, but not the same input to validate)."""
    t = type(v)
    if t is dict:  # a call's params first: every first call has them
        if len(v) == 1:
            for k in v:  # (cheaper than v.items())
                x = v[k]
                tx = type(x)
                if tx is tuple:  # a shape, as the tuple case below returns it
                    for y in x:
                        if type(y) is not int:
                            break
                    else:
                        return (dict, (k, x))
                elif tx is int or tx is str or x is None:
                    return (dict, (k, x))
                return (dict, (k, _typed(x)))
        return (dict, *sorted([(k, _typed(x)) for k, x in v.items()]))
    if t is tuple or t is list:
        for x in v:
            if type(x) is not int:
                break
        else:
            return v if t is tuple else (list, *v)  # a shape: ints only
        if t is tuple:
            for x in v:
                if type(x) is not Sharding:
                    return (t, *(_typed(x) for x in v))
            return v  # the inputs: Shardings only
        return (t, *(_typed(x) for x in v))
    if t is int or t is str or v is None or t is Sharding:
        return v
    return (t, v)


_SEEN: dict = {}  # raw call -> (Propagation, bound params); the fast path of OpDef.resolve
_SEEN_MAX = 1 << 15
register_clearer("shardlayout.ops.registry._SEEN", _SEEN.clear, _SEEN.__len__)


_REGISTRY: dict = {}


def register_op(name: str, signature: str, rule: Callable, numpy: Callable | None = None, *,
                check: Callable | None = None, aliases=(), shape_driven: bool = False,
                not_simulated: str | None = None, replace_existing: bool = False) -> OpDef:
    """Declare an op: its signature text, sharding rule and numpy implementation.

    ``rule`` is usually built from a factor map with :func:`factor_rule`. Registering a name
    that exists raises unless ``replace_existing=True``. Returns the OpDef.
    ``register_op("scale", "x ; by: float = 2.0", factor_rule(...), lambda x, by: x * by)``
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise OpError(f"register_op: name {name!r} is not an identifier (use the short aten name, e.g. 'mm')")
    if not callable(rule):
        raise OpError(f"register_op {name}: rule must be callable, got {type(rule).__name__}")
    if numpy is not None and not callable(numpy):
        raise OpError(f"register_op {name}: numpy must be callable or None, got {type(numpy).__name__}")
    if check is not None and not callable(check):
        raise OpError(f"register_op {name}: check must be callable or None, got {type(check).__name__} "
                      f"{check!r}; give check(name, inputs, params), which raises OpError on a bad call")
    if not isinstance(signature, str):
        raise OpError(f"register_op {name}: signature must be text like 'x, w ; dim: int = 0' (tensors, then ';', "
                      f"then params), got {type(signature).__name__} {signature!r}; '' for an op of no tensors")
    if isinstance(aliases, (str, bytes)) or not isinstance(aliases, (list, tuple, set, frozenset)):
        raise OpError(f"register_op {name}: aliases must be a list of op names, got {type(aliases).__name__} "
                      f"{aliases!r}; e.g. aliases=[{aliases!r}] for one alias" if isinstance(aliases, str) else
                      f"register_op {name}: aliases must be a list of op names, got {type(aliases).__name__} "
                      f"{aliases!r}; e.g. aliases=['my_op_alias']")
    for a in aliases:
        if not isinstance(a, str) or not a.isidentifier():
            raise OpError(f"register_op {name}: alias {a!r} is not an identifier (use a short op name, e.g. "
                          "'my_op_alias')")
    sig = parse_signature(signature)
    opdef = OpDef(name, sig, rule, numpy, check, tuple(aliases), shape_driven, not_simulated)
    for n in (name, *aliases):
        if n in _REGISTRY and not replace_existing:
            raise OpError(f"register_op: op {n!r} is already registered; pass replace_existing=True to replace it")
    for n in (name, *aliases):
        _REGISTRY[n] = opdef if n == name else replace(opdef, name=n)
    _SEEN.clear()
    return opdef


def get_op(op: str) -> OpDef:
    """The OpDef of ``op`` (short or aten name); raises ``UnsupportedOp`` naming the fix."""
    name = canonical_op_name(op)
    opdef = _REGISTRY.get(name)
    if opdef is None:
        raise UnsupportedOp(
            f"no sharding rule for op {op!r} (looked up {name!r}){did_you_mean(name)}; shardlayout.ops.registered() "
            f"lists the {len(_REGISTRY)} known ops. Declare it with shardlayout.ops.register_op(name, signature, "
            "rule, numpy)"
        )
    if type(op) is str and op not in _OVERLOADS_OK:
        _check_overload(op, name)
    return opdef


_OVERLOADS_OK: set = set()  # op names whose overload was checked (or that name none)


def _check_overload(op: str, name: str) -> None:
    """``aten.NAME.OVERLOAD``: the overload is one of torch's (checked when torch is loaded already: the
    core never imports it; ``default`` always passes, the run picks the overload by the call itself);
    else ``UnsupportedOp``."""
    rest = next((op[len(p):] for p in ("torch.ops.aten.", "aten.") if op.startswith(p)), None)
    overload = rest.partition(".")[2] if rest is not None else ""
    if overload and overload != "default":
        import sys

        torch = sys.modules.get("torch")
        packet = getattr(torch.ops.aten, name, None) if torch is not None and hasattr(torch, "ops") else None
        known = tuple(packet.overloads()) if packet is not None and hasattr(packet, "overloads") else None
        if known is not None and overload not in known:
            raise UnsupportedOp(f"op {op!r}: aten.{name} has no overload {overload!r} (its overloads: "
                                f"{', '.join(sorted(known))}); give one of them, or the short name {name!r}")
    if len(_OVERLOADS_OK) < 4096:
        _OVERLOADS_OK.add(op)


def did_you_mean(name) -> str:
    """`` (did you mean 'mm', 'bmm'?)``: the registered ops closest to ``name``, or ``""``."""
    import difflib

    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name.removeprefix("aten.").split(".")[0], list(_REGISTRY), n=3)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def registered() -> dict:
    """``{name: OpDef}`` of every registered op (a copy)."""
    return dict(_REGISTRY)


__all__ = ["OpDef", "Param", "Signature", "TensorArg", "get_op", "parse_signature", "register_op", "registered"]
