"""``from_torch(module, example_args)``: a Program from ``torch.export`` in core ATen (torch extra).

Parameters, buffers and lifted tensor constants become named inputs with their fully-qualified
module names (``layers.0.self_attn.q_proj.weight``, never export's placeholder names); user inputs
keep their argument names. Every op must have a sharding rule: otherwise ``UnsupportedOp`` names the
op, its node and the source line.

**Dynamic shapes.** With ``dynamic_shapes`` (torch's own argument: ``{"x": {0: Dim("batch")}}``)
the program is symbolic: every tensor keeps torch's symbolic sizes (``meta["val"]``, read with
``symbolic.parse``), with torch's symbols (``s77``) renamed after the user's ``Dim`` names
(``batch``; a derived ``2*Dim("half")`` names its root), and the example binding is torch's hints
(the example inputs' sizes). Facts: ``range_constraints`` become range guards, the divisibility
checks torch put on the inputs become divisibility guards, ``_assert_scalar`` and
``sym_constrain_range_for_size`` become guards when their expression is a range, equality or
divisibility statement (else a note, kept as text). Scalar nodes (``sym_size.int``,
``operator.mul`` of sizes, ...) are not ops: their value is the Expr, substituted where it flows
into an op's params (a view of ``[batch*seq, 64]``); where a size is used as a tensor value
(``x * x.size(0)``), its example value is taken. A size torch prints in a form ``symbolic.parse``
cannot read is specialised: every symbol in it gets a guard ``symbol == example``.
"""

from __future__ import annotations

import contextlib
import math
import operator
import re

from ..errors import SymbolError, UnsupportedOp
from ..symbolic import Expr, Guard, as_extent, parse, sym
from . import Program, ProgramBuilder, ProgramError
from .expert_loop import check_loops_routed, expert_loops, node_where
from .repeat import compress

# scalar arguments of these ops are operands (add(x, 1e-6)), not parameters
_POINTWISE_SCALARS = {"add", "sub", "mul", "div", "pow", "where", "eq", "ne", "le", "lt", "ge", "gt",
                      "maximum", "minimum", "fill", "full_like", "masked_fill"}
# custom ops of model libraries that are an aten op under another name (same arguments, same values)
LIBRARY_OPS = {
    "transformers.grouped_mm_fallback.default": "aten._grouped_mm.default",  # (rows, w[E,K,N], offs): torch's
    "torchtitan.deterministic_scatter_add.default": "aten.scatter_add.default",  # (out, index, src): dim 0
}
LIBRARY_PARAMS = {"torchtitan.deterministic_scatter_add.default": {"dim": 0}}  # what the library op fixes
_ASSERTS = ("aten._assert_scalar", "aten.sym_constrain_range_for_size", "aten.sym_constrain_range")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _jsonable(v):
    import torch

    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v).replace("torch.", "")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def from_torch(module, example_args, dynamic_shapes=None, decompose: bool = True) -> Program:
    """Export ``module`` with ``example_args`` (and torch's ``dynamic_shapes``) and read its graph
    into a Program. ``from_torch(LlamaTorch(2), (x, cos, sin))``;
    ``from_torch(m, (x,), {"x": {0: Dim("batch")}})`` is symbolic in ``batch``."""

    args = tuple(example_args)
    ep = export_module(module, args, dynamic_shapes)
    return from_exported(ep, decompose, dim_names=_dim_names(dynamic_shapes, module, args))


def export_module(module, example_args, dynamic_shapes=None):
    """``torch.export.export`` of ``module``, its dynamic-shape refusals as one ``ProgramError`` line."""
    import torch

    try:
        with _without_cache(module), _quiet_torch_logs():
            return torch.export.export(module, tuple(example_args), dynamic_shapes=dynamic_shapes)
    except torch._dynamo.exc.UserError as e:  # dynamic shapes torch cannot keep: one line with its fix
        raise ProgramError(f"torch.export refused the dynamic shapes: {_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the model's forward or torch.export failed on it: one line
        where = _user_frame(e)
        raise ProgramError(f"torch.export could not trace the module ({type(module).__name__}){where}: "
                           f"{type(e).__name__}: {_first_line(e)}; shardlayout plans what torch.export can capture "
                           "(a forward that runs with the example arguments alone, e.g. attention without "
                           "FlexAttention block masks)") from None


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"


def _user_frame(e: Exception) -> str:
    """`` at FILE:LINE`` of the last frame of the traceback outside torch (the model's own line)."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/torch/" not in f.filename]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


# torch's loggers that print tracebacks while export fails (fake tensors running a mismatched op):
# the failure is raised as one ProgramError line, so they are silenced while exporting
_TORCH_LOGGERS = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch.export", "torch._export",
                  "torch.fx.experimental.symbolic_shapes", "torch._functorch")


@contextlib.contextmanager
def _quiet_torch_logs():
    """The loggers of ``_TORCH_LOGGERS`` at CRITICAL while the block runs (as ``--export`` quiets
    ``torch.export.load``), their levels restored afterwards."""
    import logging

    loggers = [logging.getLogger(n) for n in _TORCH_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def _without_cache(module):
    """A Hugging Face model (``module.config.use_cache``) exported without its KV cache: the cache
    object is generation state, not a tensor the program computes (torch.export cannot return it),
    and a plan is of one forward. The user's config is restored afterwards."""
    cfg = getattr(module, "config", None)
    if getattr(cfg, "use_cache", None) is not True:
        yield
        return
    cfg.use_cache = False
    try:
        yield
    finally:
        cfg.use_cache = True


def output_structure(ep):
    """``(out_spec, leaves)``: how the module's forward returns its outputs (a tuple, a dict, a
    ``ModelOutput``), with ``leaves[i]`` the constant a non-tensor leaf holds and ``TENSOR`` where
    the program's next output goes. ``torch.utils._pytree.tree_unflatten`` rebuilds the value."""
    import torch

    out = next(n for n in ep.graph.nodes if n.op == "output")
    leaves = [TENSOR if isinstance(v, torch.fx.Node) else v for v in out.args[0]]
    return ep.call_spec.out_spec, leaves


class _TensorLeaf:
    """output_structure's marker of a tensor leaf: one object, also after a pickle round trip."""

    def __reduce__(self):
        return "TENSOR"

    def __repr__(self) -> str:
        return "TENSOR"


TENSOR = _TensorLeaf()


def lifted_constants(module, example_args) -> dict:
    """``{program input name: tensor}`` of the tensor constants ``torch.export`` lifts out of
    ``module``'s forward (a mask built with ``torch.tril`` in ``forward``): program inputs that are
    neither parameters nor buffers of the module. ``lifted_constants(gpt2, (ids,))``"""
    return constants_of(export_module(module, example_args))


def constants_of(ep) -> dict:
    """``lifted_constants`` of an export already made."""
    sig = ep.graph_signature
    return {name: ep.constants[name] for name in dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
            .values() if name in ep.constants}


def _one_line(e: Exception) -> str:
    """torch's multi-line export error as one line: what it says, why, and its suggested fix."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    head = re.sub(r"\s*For more information, run with TORCH_LOGS=\S+\s*", " ", lines[0] if lines else type(e).__name__)
    why = next((ln.lstrip("- ") for ln in lines[1:] if ln.startswith("- ")), "")
    fix = [ln for ln in lines if "= Dim(" in ln or re.match(r"^\w+ = .*\*", ln)]
    parts = [head.strip().rstrip(".")] + ([why.rstrip(".")] if why else [])
    parts.append(f"suggested fix: {'; '.join(fix)}" if fix else "mark fewer dims dynamic, or derive them (Dim)")
    return "; ".join(parts)


def _dim_names(dynamic_shapes, module, args) -> dict:
    """``{input name or position: {dim: symbol name}}`` from torch's ``dynamic_shapes`` (a Dim's
    name; a derived Dim's root's name; unnamed hints are left out)."""
    import inspect

    if not dynamic_shapes:
        return {}
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    items = dynamic_shapes.items() if isinstance(dynamic_shapes, dict) else enumerate(dynamic_shapes)
    out: dict = {}
    for key, spec in items:
        if isinstance(key, str) and key in params:
            key = params.index(key)
        if isinstance(spec, dict):
            dims = spec.items()
        elif isinstance(spec, (list, tuple)):
            dims = enumerate(spec)
        else:
            continue
        names = {}
        for d, dim in dims:
            root = getattr(dim, "root", None)
            name = getattr(root if root is not None else dim, "__name__", None)
            if isinstance(name, str) and _NAME.match(name) and isinstance(d, int):
                names[d] = name
        if names:
            out[key] = names
    return out


class _Symbols:
    """torch's symbols renamed after the user's Dims, their examples, and text -> Expr."""

    def __init__(self):
        self.rename: dict = {}  # torch name -> ours
        self.example: dict = {}  # ours -> int
        self.special: list = []  # Guards of specialised symbols
        self._memo: dict = {}
        self.sums: tuple = ()  # per-expert loops: ((count symbols in expert order), rows) each

    def expr(self, v):
        """The extent of a SymInt / int: an int or an Expr in our names."""
        import torch

        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, torch.SymInt):
            text = str(v)
            if self.sums:
                got = self._summed(v.node.expr)
                if isinstance(got, int):
                    return got
                text = str(got) if got is not None else text
            hit = self._memo.get(text)
            if hit is None:
                try:
                    e = parse(text)
                    hit = as_extent(e.subs({k: sym(n) for k, n in self.rename.items() if k in e.free_symbols}))
                except SymbolError:  # a form we cannot read: specialise the symbols in it
                    names = sorted(str(s) for s in v.node.expr.free_symbols)
                    self.special += [Guard.eq(self.rename.get(n, n), self.example[self.rename.get(n, n)])
                                     for n in names if self.rename.get(n, n) in self.example]
                    hit = _hint(v)
                self._memo[text] = hit
            return hit
        raise ProgramError(f"size {v!r} ({type(v).__name__}) is not an int or a SymInt")

    def shape(self, val) -> tuple:
        return tuple(self.expr(s) for s in val.shape)

    def _summed(self, expr):
        """A size over the counts of a per-expert loop (``program.expert_loop``): an int when it is
        one whenever the counts sum to the rows (``u0 + ... + u3`` is the rows, ``rows - u0 - ...``
        is 0), or expert 0's rows when it reads expert 0's count alone (expert 0's ops run on
        every row); None when it reads no count."""
        free = expr.free_symbols
        for counts, rows in self.sums:
            mine = [u for u in counts if u in free]
            if not mine:
                continue
            whole = expr.subs(counts[0], rows - sum(counts[1:])).expand()
            if not whole.free_symbols:
                return int(whole)
            first = expr.subs(counts[0], rows).expand()
            if not first.free_symbols:
                return int(first)
            return whole
        return None


def _hint(v) -> int:
    h = getattr(getattr(v, "node", None), "hint", None)
    if h is None:
        raise ProgramError(f"size {v} has no example value (a data-dependent size, e.g. from .item() or nonzero); "
                           "shardlayout plans sizes known at export only")
    return int(h)


def _collect_symbols(ep, dim_names: dict, user_inputs: list) -> _Symbols:
    """Every symbol of the graph with its example, renamed after the Dims."""
    import torch

    out = _Symbols()
    seen: dict = {}  # torch name -> example

    def visit(v):
        if isinstance(v, torch.SymInt):
            env = v.node.shape_env
            for s in v.node.expr.free_symbols:
                name = str(s)
                if name in seen:
                    continue
                val = None
                if env is not None:
                    known = getattr(env, "backed_var_to_val", None)
                    val = (known if known is not None else env.var_to_val).get(s)
                if val is None and v.node.expr == s:
                    val = v.node.hint
                if val is not None:
                    seen[name] = int(val)

    for node in ep.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        for x in vals:
            if hasattr(x, "shape"):
                for s in x.shape:
                    visit(s)
            else:
                visit(x)
    taken = set(seen)
    for pos, node in enumerate(user_inputs):
        names = dim_names.get(pos) or dim_names.get(node.name) or {}
        val = node.meta.get("val")
        for d, name in names.items():
            if not hasattr(val, "shape") or not -len(val.shape) <= d < len(val.shape):
                continue
            s = val.shape[d]
            if not isinstance(s, torch.SymInt):
                continue
            free = [str(x) for x in s.node.expr.free_symbols]
            if len(free) == 1 and free[0] not in out.rename and (name not in taken or name == free[0]) \
                    and name not in out.rename.values():
                out.rename[free[0]] = name
                taken.add(name)
    for name, val in seen.items():
        out.example[out.rename.get(name, name)] = val
    return out


def _range_facts(ep, syms: _Symbols) -> list:
    """``range_constraints`` as range guards (torch's lower bounds 0 and 1 say nothing here:
    symbols are >= 1)."""
    out = []
    for key, vr in (getattr(ep, "range_constraints", None) or {}).items():
        try:
            e = parse(str(key)).subs({k: sym(n) for k, n in syms.rename.items()})
        except SymbolError:
            continue
        lo, hi = _bound(vr.lower), _bound(vr.upper)
        lo = lo if lo is not None and lo > 1 else None
        if (lo is None and hi is None) or not e.free_symbols <= set(syms.example):
            continue
        out.append(Guard.range(e, lo, hi))
    return out


def _bound(x):
    """An int bound, or None for torch's ``int_oo`` / ``-int_oo`` and anything not an integer."""
    if getattr(x, "is_finite", True) is False or getattr(x, "is_integer", True) is False:
        return None
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return v if abs(v) < (1 << 62) else None


_SIZE_REF = re.compile(r"L\['([^']+)'\]\.size\(\)\[(\d+)\]")


def _input_guard_facts(ep, inputs: dict) -> list:
    """The divisibility checks torch put on the inputs (``_guards_code``), in our symbols:
    ``((L['x'].size()[0]*...) % 4) == 0`` becomes ``batch*... % 4 == 0``."""
    out = []
    for text in getattr(ep, "_guards_code", None) or ():
        if "%" not in text or "==" not in text:
            continue

        def extent(m):
            shape = inputs.get(m.group(1))
            d = int(m.group(2))
            if shape is None or d >= len(shape):
                raise KeyError(m.group(0))
            return f"({shape[d]})"

        try:
            g = Guard.parse(_SIZE_REF.sub(extent, text))
        except (KeyError, SymbolError):
            continue
        if g.kind == "divisible" and g.free_symbols:
            out.append(g)
    return out


def _sympy_guard(text: str):
    """A guard from sympy's text of a SymBool (``Eq(Mod(u0, 4), 0)``, ``u0 <= 64``), else None."""
    text = text.strip()
    m = re.match(r"^(Eq|Ne)\((.*)\)$", text)
    if m:
        if m.group(1) == "Ne":
            return None
        from ..sharding.core import split_top_level

        parts = split_top_level(m.group(2))
        if len(parts) != 2:
            return None
        text = f"{parts[0]} == {parts[1]}"
    try:
        return Guard.parse(text)
    except SymbolError:
        return None


RANDOM_DRAWS = {"rand_like": "rand", "rand": "rand", "randn_like": "randn", "randn": "randn", "uniform": "rand"}
"""Ops that draw random values, read as program inputs of kind ``rand`` (uniform on [0, 1)) or
``randn`` (standard normal) of the draw's global shape: a plan then shards the draw like any input
(each rank keeps its piece of one global draw, as DTensor's offset-based RNG does), so a sharded
dropout equals the unsharded one, mask for mask. ``uniform(x, lo, hi)`` (``x.uniform_(lo, hi)``:
Mixtral's router jitter) is ``lo + (hi - lo) * draw``."""


def _draw_shapes_only(nodes) -> set:
    """Allocations (``empty_like``, ``empty_permuted``) read only by draws, which take their shape
    alone (``torch.empty_like(x).uniform_(lo, hi)``): not ops of the program."""
    from ..ops import canonical_op_name

    def is_draw(n) -> bool:
        return n.op == "call_function" and canonical_op_name(str(n.target)) in RANDOM_DRAWS

    return {n for n in nodes if n.op == "call_function" and canonical_op_name(str(n.target)).startswith("empty")
            and n.users and all(is_draw(u) for u in n.users)}


def _draw(node, short: str, name: str, val, syms, b) -> str:
    """The draw ``node`` makes, as an input of kind ``RANDOM_DRAWS[short]`` (rescaled for ``uniform``)."""
    dtype = str(val.dtype).replace("torch.", "")
    draw = b._tensor(name, (), dtype, RANDOM_DRAWS[short], sym_shape=syms.shape(val))
    if short != "uniform":
        return draw
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("from", 0.0)
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("to", 1.0)
    if not all(isinstance(x, (int, float)) for x in (lo, hi)):
        raise ProgramError(f"{node_where(node)}: uniform({lo!r}, {hi!r}) needs number bounds")
    if (lo, hi) == (0.0, 1.0):
        return draw
    x = b._op("aten.mul.Tensor", [draw, float(hi) - float(lo)], f"{name}_width", 1, None, {})
    return b._op("aten.add.Tensor", [x, float(lo)], f"{name}_from", 1, None, {})


def _decomposed(ep):
    """``ep`` in core ATen (``repeat`` too, as expand + view, and ``clamp`` by tensors), attention kept whole:
    ``scaled_dot_product_attention`` has a rule, and one op is what the per-rank program should run
    (torch's fused kernel, not its math path of bmm + softmax + a mask rebuilt every step — and
    torch's decomposition of it can fail: GPT-2 under sdpa returns other strides than the traced
    graph). A failure is one ``ProgramError``."""
    import torch
    from torch._decomp import get_decompositions

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    # a tile is expand + view (views' rules); a clamp by tensor bounds (PhiMoE's router) is where / ge / le
    table.update(get_decompositions([torch.ops.aten.repeat.default, torch.ops.aten.clamp.Tensor]))
    # dropout in training mode: a uniform draw compared with p (``RANDOM_DRAWS``), then two products
    table.update(get_decompositions([torch.ops.aten.native_dropout.default]))
    try:
        return ep.run_decompositions(table)
    except (ValueError, RuntimeError) as e:
        raise ProgramError(f"torch could not decompose the exported program to core ATen: "
                           f"{type(e).__name__}: {_first_line(e)}") from None


def from_exported(ep, decompose: bool = True, dim_names: dict | None = None) -> Program:
    """A Program from an ``ExportedProgram`` (e.g. ``torch.export.load("model.pt2")``);
    ``dim_names`` (``{"x": {0: "batch"}}``, an input's name or position) names its symbols (else
    they keep torch's names, ``s77``). ``from_exported(torch.export.load("m.pt2")).symbols``"""
    import torch

    from ..ops import canonical_op_name, registered

    known = registered()
    if decompose:
        ep = _decomposed(ep)
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = {**dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {}), **dict(sig.inputs_to_buffers)}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user_inputs = [n for n in placeholders if n.name not in params and n.name not in buffers]
    syms = _collect_symbols(ep, dim_names or {}, user_inputs)
    loops = expert_loops(ep.graph.nodes)
    syms.sums = loops.sums
    facts: list = []
    notes: list = []
    b = ProgramBuilder(symbols=syms.example)
    names: dict = {}
    input_shapes: dict = {}
    label = op_labels(ep.graph.nodes, set(params.values()) | set(buffers.values()))
    casts: dict = {}  # (tensor, cast kwargs) -> its cast: a cast repeated per use is made once
    unread = _draw_shapes_only(ep.graph.nodes)
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            shape = syms.shape(val)
            dtype = str(val.dtype).replace("torch.", "")
            if node.name in params:
                name, kind = params[node.name], "param"
            elif node.name in buffers:
                name, kind = buffers[node.name], "buffer"
            else:
                name, kind = node.name, "input"
                input_shapes[name] = shape
            b._tensor(name, (), dtype, kind, sym_shape=shape)
            names[node] = name
        elif node.op == "call_function":
            if node in loops.skip or node in unread:
                continue
            if node in loops.alias:
                names[node] = names[loops.alias[node]]
                continue
            if node in loops.offsets:  # a per-expert loop's split: the offsets of its grouped matmuls
                names[node] = b._op("cumsum", [names[loops.offsets[node]]], f"{label[node]}_offsets", 1, None,
                                    {"dim": 0})
                continue
            if node in loops.emit:
                names[node] = _emit_stacked(node, loops.emit[node], names, syms, b, label[node])
                continue
            cast = _cast_key(node, names)
            if cast is not None and cast in casts:  # the same cast of the same tensor again (one per use): one
                names[node] = casts[cast]
                continue
            if node.target is operator.getitem:
                base = names[node.args[0]]
                names[node] = base[node.args[1]] if isinstance(base, tuple) else base
                continue
            target = LIBRARY_OPS.get(str(node.target), str(node.target))
            val = node.meta.get("val")
            if _is_scalar_node(node, val):
                names[node] = syms.expr(val) if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool) \
                    else str(val)
                continue
            if target.startswith(_ASSERTS):
                _assert_fact(node, target, names, syms, facts, notes)
                continue
            short = canonical_op_name(target)
            if short in RANDOM_DRAWS:  # a draw (dropout's mask): an input of its own, drawn over the global
                names[node] = _draw(node, short, label[node], val, syms, b)  # shape, each rank keeps its piece
                continue
            if short not in known:
                if short == "_local_scalar_dense":
                    raise UnsupportedOp(
                        f"{node_where(node)} reads a tensor's value as a Python number (.item(), "
                        ".tolist(), int(t)): what follows has sizes known at run time only, which shardlayout plans "
                        "only as the rows of a per-expert loop (torch.split(rows, counts.tolist()) after top-k "
                        "routing; docs/expert-parallelism.md); compute the size from shapes, or make it a constant")
                raise UnsupportedOp(
                    f"{target} at {node_where(node)} has no sharding rule; declare it with "
                    f"shardlayout.register_op({short!r}, signature, rule, numpy)"
                )
            empties = [a for a in node.all_input_nodes if isinstance(names.get(a), _Empty)]
            if _is_empty(val, syms):  # a zero-size value (Phi-3's partial rotary: the part not rotated is empty)
                names[node] = _Empty(node.name)
                continue
            if empties:
                got = _without_empties(node, short, names, empties)
                if got is not None:
                    names[node] = got
                    continue
            inputs, kwargs = _arguments(node, short, names, syms, b)
            kwargs.update(LIBRARY_PARAMS.get(str(node.target), {}))
            if kwargs.get("enable_gqa") and short == "scaled_dot_product_attention":
                inputs, kwargs = _repeated_kv(label[node], inputs, kwargs, b)
            if kwargs.get("dropout_p") and short == "scaled_dot_product_attention":
                names[node] = _attention_dropout(label[node], inputs, kwargs, b)
                continue
            n_out = len(val) if isinstance(val, (list, tuple)) else 1
            vals = val if isinstance(val, (list, tuple)) else (val,)
            dtypes = [str(v.dtype).replace("torch.", "") if hasattr(v, "dtype") else None for v in vals]
            sym_outs = [syms.shape(v) for v in vals if v is not None and hasattr(v, "shape")] if syms.example else None
            if sym_outs is not None and len(sym_outs) != len([v for v in vals if v is not None]):
                sym_outs = None
            try:
                out = b._op(target, inputs, label[node], n_out, dtypes, kwargs, sym_outs)
            except Exception as e:  # noqa: BLE001 - name the node whatever the rule raised
                raise ProgramError(f"{node_where(node)} ({target}): {e}") from None
            names[node] = out
            if cast is not None and isinstance(out, str):
                casts[cast] = out
            outs = () if out is None else out if isinstance(out, tuple) else (out,)
            for o, v in zip(outs, vals):
                if v is not None and hasattr(v, "shape") and tuple(b._tensors[o].shape) != tuple(
                        _hint_shape(v, syms)):
                    raise ProgramError(
                        f"node {node.name!r} ({target}): the rule gives shape {b._tensors[o].shape}, "
                        f"torch.export says {tuple(_hint_shape(v, syms))}"
                    )
        elif node.op == "output":  # the forward's own outputs; a buffer it updates in place is not one
            kinds = [spec.kind.name for spec in sig.output_specs] if len(sig.output_specs) == len(node.args[0]) \
                else ["USER_OUTPUT"] * len(node.args[0])
            for o, kind in zip(node.args[0], kinds):
                if isinstance(o, torch.fx.Node) and kind == "USER_OUTPUT":
                    b.output(names[o])
    if syms.example:
        facts += _range_facts(ep, syms) + _input_guard_facts(ep, input_shapes) + syms.special
        for g in facts:
            if g.free_symbols <= set(syms.example) and g.holds(syms.example):
                b._facts.append(g)
            else:
                notes.append(str(g))
    b._notes.extend(notes)
    from .head_norms import merge_head_norms
    from .max_values import max_values
    from .parallel_residual import sum_branches_first
    from .routing import recognise_routing

    prog = sum_branches_first(merge_head_norms(max_values(recognise_routing(b.build()))))
    if loops.rows:
        check_loops_routed(prog, {names[r]: split.name for split, r in loops.rows.items()})
    return compress(prog)  # a model's layers, one block: planned from its first instances


def _cast_key(node, names: dict):
    """``(tensor, cast kwargs)`` of a dtype cast (``_to_copy`` without a device), else None: equal
    keys are one cast (torchtitan casts the routed rows to bf16 once per expert matmul)."""
    import torch

    if node.target is not torch.ops.aten._to_copy.default or node.kwargs.get("device") is not None or \
            len(node.args) != 1 or not isinstance(names.get(node.args[0]), str):
        return None
    return names[node.args[0]], tuple(sorted((k, str(v)) for k, v in node.kwargs.items()))


def op_labels(nodes, taken: set) -> dict:
    """``{node: its op's name}``: the innermost module's path and the node's name without its
    counter, counted again within the module (``layers.3.self_attn.o_proj.mm``; the second ``mm``
    of that module is ``..._1``), so every instance of a repeated layer names its ops alike
    (``program.repeat.compress`` finds the layers by these names). A node outside any module, or
    whose name would clash with a parameter's, keeps torch's name."""
    out: dict = {}
    seen: dict = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        if not isinstance(path, str) or not path:
            out[node] = node.name
            continue
        base = re.sub(r"_\d+$", "", node.name) or node.name
        k = seen.get((path, base), 0)
        seen[(path, base)] = k + 1
        name = f"{path}.{base}" + (f"_{k}" if k else "")
        out[node] = node.name if name in taken else name
    return out


def _repeated_kv(node: str, inputs: list, kwargs: dict, b) -> tuple:
    """Grouped-query attention (``enable_gqa=True``: k and v hold ``hk`` heads for ``hk * g``
    query heads, query head ``i`` reading kv head ``i // g``) as the plain call torch computes:
    k and v repeated to the query heads (``unsqueeze`` -> ``expand`` -> ``flatten``, as Hugging
    Face's ``repeat_kv``), so the kv heads shard exactly as the query heads that read them."""
    q, k, v = (b._tensors[n].shape for n in inputs[:3])
    if not len(q) == len(k) == len(v) == 4:
        raise ProgramError(f"node {node!r} (scaled_dot_product_attention, enable_gqa): q {q}, k {k}, v {v} must be "
                           "[batch, heads, seq, head_dim]; call it with 4-D q, k and v")
    hq, hk = q[-3], k[-3]
    if not isinstance(hq, int) or not isinstance(hk, int) or hk < 1 or hq % hk:
        raise ProgramError(f"node {node!r} (scaled_dot_product_attention, enable_gqa): {hq} query heads are not a "
                           f"multiple of {hk} kv heads")
    g = hq // hk
    if g == 1:
        return inputs, {**kwargs, "enable_gqa": False}
    out = list(inputs)
    for j, which in ((1, "k"), (2, "v")):
        x = b._op("aten.unsqueeze.default", [inputs[j]], f"{node}_{which}_groups", 1, None, {"dim": 2})
        x = b._op("aten.expand.default", [x], f"{node}_{which}_expand", 1, None, {"size": [-1, -1, g, -1, -1]})
        out[j] = b._op("aten.flatten.using_ints", [x], f"{node}_{which}_repeat", 1, None,
                       {"start_dim": 1, "end_dim": 2})
    return out, {**kwargs, "enable_gqa": False}


def _attention_dropout(node: str, inputs: list, kwargs: dict, b) -> str:
    """Attention with dropout (``dropout_p > 0``: training mode) as torch's math path computes it,
    written out so the dropout's draw is an input of its own (``RANDOM_DRAWS``): ``softmax(q k^T *
    scale + mask) * (draw > p) / (1 - p) @ v``, the draw uniform over ``[b, h, s, t]``; ``is_causal``
    is the mask ``key position <= query position``. A style
    finds it as softmax(QK^T)V; each rank keeps its piece of one global draw."""
    q, k, v = inputs[:3]
    mask = inputs[3] if len(inputs) > 3 else None
    p = float(kwargs["dropout_p"])
    causal = bool(kwargs.get("is_causal"))
    if causal and mask is not None or not 0 < p < 1:
        raise ProgramError(f"node {node!r} (scaled_dot_product_attention, dropout_p={p}, is_causal={causal}): "
                           "attention dropout is read with 0 < p < 1 and either attn_mask or is_causal; put the "
                           "module in eval() to plan without dropout")
    qs, ks = b._tensors[q].shape, b._tensors[k].shape
    scale = kwargs.get("scale")
    scale = float(scale) if scale is not None else 1 / math.sqrt(qs[-1])
    kt = b._op("aten.transpose.int", [k], f"{node}_kT", 1, None, {"dim0": -2, "dim1": -1})
    x = b._op("aten.matmul.default", [q, kt], f"{node}_scores", 1, None, {})
    x = b._op("aten.mul.Tensor", [x, scale], f"{node}_scaled", 1, None, {})
    if mask is not None and b._tensors[mask].dtype == "bool":  # keep where True
        x = b._op("aten.where.ScalarOther", [mask, x, -math.inf], f"{node}_masked", 1, None, {})
    elif mask is not None:  # an additive bias
        x = b._op("aten.add.Tensor", [x, mask], f"{node}_masked", 1, None, {})
    elif causal:  # query i attends keys j <= i (torch's top-left alignment): keys' positions <= queries'
        rows, cols = (b._op("aten.arange.start_step", [], f"{node}_{w}_positions", 1, None,
                            {"start": 0, "end": n, "step": 1}) for w, n in (("query", qs[-2]), ("key", ks[-2])))
        rows = b._op("aten.unsqueeze.default", [rows], f"{node}_query_column", 1, None, {"dim": 1})
        keep = b._op("aten.ge.Tensor", [rows, cols], f"{node}_causal", 1, None, {})
        x = b._op("aten.where.ScalarOther", [keep, x, -math.inf], f"{node}_masked", 1, None, {})
    x = b._op("aten._softmax.default", [x], f"{node}_softmax", 1, None, {"dim": -1, "half_to_float": False})
    sq, sk = b._sym.get(q, qs), b._sym.get(k, ks)  # symbolic extents where the import has them
    shape = tuple(sq[:-1]) + (sk[-2],)
    draw = b._tensor(f"{node}_dropout_draw", qs[:-1] + (ks[-2],), "float32", "rand",
                     sym_shape=shape if shape != qs[:-1] + (ks[-2],) else None)
    keep = b._op("aten.gt.Scalar", [draw, p], f"{node}_dropout_keep", 1, None, {})
    x = b._op("aten.mul.Tensor", [x, keep], f"{node}_dropout", 1, None, {})
    x = b._op("aten.mul.Tensor", [x, 1 / (1 - p)], f"{node}_dropout_scaled", 1, None, {})
    return b._op("aten.matmul.default", [x, v], node, 1, None, {})


class _Empty:
    """A zero-size value of the graph (no sharding has a 0 extent): not a tensor of the program.
    A ``cat`` drops it; any other reader that makes something non-empty is refused by name."""

    def __init__(self, node: str):
        self.node = node


def _is_empty(val, syms) -> bool:
    if not hasattr(val, "shape"):
        return False
    return 0 in _hint_shape(val, syms)


def _without_empties(node, short: str, names: dict, empties: list):
    """A node reading zero-size values: ``cat`` of the others (one left: that value itself);
    anything else raises ``UnsupportedOp`` naming the node and the empty input."""
    if short in ("cat", "concat", "concatenate"):
        parts = [names[a] for a in node.args[0] if not isinstance(names[a], _Empty)]
        if len(parts) == 1:
            return parts[0]
        return None  # several left: ``_arguments`` skips the empties (see there)
    raise UnsupportedOp(f"{node_where(node)} ({node.target}) reads the zero-size value of node "
                        f"{empties[0].name!r} and makes a non-empty one; shardlayout plans zero-size values only "
                        "where a cat drops them (a partial rotary's empty part): make the size non-zero or drop "
                        "the op")


def _emit_stacked(node, kind: tuple, names: dict, syms: _Symbols, b, name: str):
    """One of expert 0's ops of a per-expert loop, emitted for every expert at once
    (``program.expert_loop``): a view of ``w[0]`` as the same view of ``w`` (dims after its
    expert dim), ``rows @ w[0]`` as ``_grouped_mm(rows, w, offs)``, an op on rows as itself."""
    import torch

    from ..ops import canonical_op_name

    short = canonical_op_name(str(node.target))
    val = node.meta.get("val")
    dtypes = [str(val.dtype).replace("torch.", "")] if hasattr(val, "dtype") else None
    if kind[0] == "grouped_mm":
        rows, w = (names[a] for a in node.args[:2])
        return b._op("_grouped_mm", [rows, w, names[kind[1]]], name, 1, dtypes, {})
    inputs, kwargs = _arguments(node, short, names, syms, b)
    if kind[0] == "weight":
        nd = len(node.args[0].meta["val"].shape)  # the dims of w[0]; w has one more in front
        if short == "t":
            short, kwargs = "transpose", {"dim0": 1, "dim1": 2}
        elif short == "permute":
            kwargs = {"dims": [0] + [d % nd + 1 for d in kwargs["dims"]]}
        elif short == "transpose":
            kwargs = {"dim0": kwargs["dim0"] % nd + 1, "dim1": kwargs["dim1"] % nd + 1}
        elif short in ("view", "_unsafe_view", "reshape", "expand"):
            experts = b._tensors[inputs[0]].shape[0]
            kwargs = {**kwargs, "size": [experts] + list(kwargs["size"])}
        return b._op(short, inputs, name, 1, dtypes, kwargs)
    n_out = len(val) if isinstance(val, (list, tuple)) else 1
    if isinstance(val, (list, tuple)):
        dtypes = [str(v.dtype).replace("torch.", "") if isinstance(v, torch.Tensor) else None for v in val]
    return b._op(str(node.target), inputs, name, n_out, dtypes, kwargs)


def _hint_shape(v, syms: _Symbols) -> tuple:
    from .symbols import evaluate_shape

    return evaluate_shape(syms.shape(v), syms.example)


def _is_scalar_node(node, val) -> bool:
    """A node computing a size or a condition on sizes (sym_size.int, operator.mul, ...), not an op."""
    import torch

    if hasattr(val, "shape"):
        return False
    target = node.target
    if getattr(target, "__module__", None) in ("_operator", "operator") or target in (
            getattr(torch, "sym_max", None), getattr(torch, "sym_min", None), getattr(torch, "sym_not", None),
            getattr(torch, "sym_sum", None), getattr(torch, "sym_float", None), getattr(torch, "sym_int", None)):
        return isinstance(val, (int, float, bool, torch.SymInt, torch.SymBool, torch.SymFloat))
    return str(target).startswith(("aten.sym_size", "aten.sym_numel", "aten.sym_stride", "aten.sym_storage_offset"))


def _assert_fact(node, target: str, names: dict, syms: _Symbols, facts: list, notes: list) -> None:
    """A runtime assert as a fact (a guard when its expression is one, else a note)."""
    args = list(node.args)
    if target.startswith("aten._assert_scalar"):
        cond = args[0] if args else None
        text = names.get(cond) if hasattr(cond, "op") else str(cond)
        if isinstance(text, (Expr, int)):
            text = str(text)
        g = _sympy_guard(_renamed(str(text), syms)) if text is not None else None
        (facts.append(g) if g is not None else notes.append(f"assert {text}"))
        return
    size = args[0] if args else node.kwargs.get("size")
    e = names.get(size) if hasattr(size, "op") else size
    lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    lo = lo if isinstance(lo, int) and lo > 1 else None
    hi = hi if isinstance(hi, int) and hi < (1 << 62) else None
    if isinstance(e, Expr) and not e.is_constant and (lo is not None or hi is not None):
        facts.append(Guard.range(e, lo, hi))
    elif lo is not None or hi is not None:
        notes.append(f"{target.split('.')[1]}({e}, min={lo}, max={hi})")


def _renamed(text: str, syms: _Symbols) -> str:
    if not syms.rename:
        return text
    return re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: syms.rename.get(m.group(0), m.group(0)), text)


def _arguments(node, short: str, names: dict, syms: _Symbols, b) -> tuple:
    """``(tensor inputs, params)`` of a call: tensors by name, sizes as ints or Exprs."""
    import torch

    inputs, kwargs = [], {}
    schema = node.target._schema.arguments
    values = list(node.args) + [node.kwargs.get(a.name, a.default_value) for a in schema[len(node.args):]]

    def resolve(x):
        return names[x] if isinstance(x, torch.fx.Node) else x

    def is_tensor(r):
        return isinstance(r, str) and r in b._tensors

    for arg, v in zip(schema, values):
        if isinstance(v, torch.fx.Node):
            r = resolve(v)
            if is_tensor(r):
                inputs.append(r)
            elif short in _POINTWISE_SCALARS and arg.name in ("other", "exponent", "value", "self", "scalar"):
                inputs.append(float(_example_value(r, syms)))  # a size used as a value: its example
            else:
                kwargs[arg.name] = r
        elif isinstance(v, (list, tuple)) and v and any(isinstance(x, torch.fx.Node) for x in v):
            rs = [r for r in (resolve(x) for x in v) if not isinstance(r, _Empty)]  # a cat drops empties
            if all(is_tensor(r) for r in rs):
                inputs.extend(rs)
            elif short == "index" and all(r is None or is_tensor(r) for r in rs):  # x[:, idx]: skipped dims
                inputs.extend(r for r in rs if r is not None)
                kwargs["indexed"] = [d for d, r in enumerate(rs) if r is not None]
            else:
                kwargs[arg.name] = [r if isinstance(r, (int, Expr)) else _jsonable(r) for r in rs]
        elif short in _POINTWISE_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and arg.name in ("other", "exponent", "value", "self", "scalar"):
            inputs.append(v if isinstance(v, int) else float(v))  # torch's own type: int // 2 stays int
        elif v is not None:
            kwargs[arg.name] = _jsonable(v)
    return inputs, kwargs


def _example_value(r, syms: _Symbols):
    if isinstance(r, Expr):
        return r.evaluate(syms.example)
    if isinstance(r, (int, float)):
        return r
    raise ProgramError(f"value {r!r} is not a number at the example")


# ------------------------------------------------------------------------------------------
# --dynamic "x:0=batch,x:1=seq"
# ------------------------------------------------------------------------------------------


def dynamic_shapes_from_text(text: str, module, example_args) -> tuple:
    """torch's ``dynamic_shapes`` (one entry per example arg) from ``"x:0=batch,x:1=seq"``: an
    input (its name in ``forward``, or its position), a dim, and the symbol; one ``Dim`` per
    symbol name, shared by every dim that names it.
    ``dynamic_shapes_from_text("x:0=batch", m, (x,)) -> ({0: Dim('batch')},)``"""
    import inspect

    import torch

    args = tuple(example_args)
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    specs: list = [None] * len(args)
    dims: dict = {}
    items = [x.strip() for x in text.split(",")]
    if "" in items:
        raise ProgramError(f"--dynamic {text!r}: entry {items.index('')} is empty (a comma too many); give "
                           "INPUT:DIM=SYMBOL entries separated by single commas, e.g. x:0=batch,x:1=seq")
    for item in items:
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|\d+)\s*:\s*(-?\d+)\s*=\s*(.+)$", item)
        if not m or not m.group(3).strip().isascii():
            raise ProgramError(f"--dynamic {item!r}: write INPUT:DIM=SYMBOL, e.g. x:0=batch (INPUT is a forward "
                               "argument's name or position)")
        who, d, name = m.group(1), int(m.group(2)), m.group(3).strip()
        if who.isdigit():
            pos = int(who)
            if pos >= len(args):
                raise ProgramError(f"--dynamic {item!r}: the model takes {len(args)} example input(s); position {pos} "
                                   f"does not exist (inputs: {', '.join(params[:len(args)]) or 'none'})")
        else:
            if who not in params[:len(args)]:
                raise ProgramError(f"--dynamic {item!r}: the model's forward has no input {who!r}; its inputs are "
                                   f"{', '.join(params[:len(args)]) or 'positional only (use 0, 1, ...)'}")
            pos = params.index(who)
        arg = args[pos]
        if not isinstance(arg, torch.Tensor):
            raise ProgramError(f"--dynamic {item!r}: input {who!r} is a {type(arg).__name__}, not a tensor")
        if not -arg.dim() <= d < arg.dim():
            raise ProgramError(f"--dynamic {item!r}: input {who!r} has {arg.dim()} dims (shape {tuple(arg.shape)}); "
                               f"dim {d} does not exist")
        if not _NAME.match(name):
            raise ProgramError(f"--dynamic {item!r}: symbol {name!r} must be an identifier like batch or seq")
        if d % arg.dim() in (specs[pos] or {}):
            raise ProgramError(f"--dynamic {text!r}: input {who!r} dim {d % arg.dim()} is named twice (as "
                               f"{specs[pos][d % arg.dim()].__name__!r} and in {item!r}); give each dim once")
        dim = dims.setdefault(name, torch.export.Dim(name))
        specs[pos] = {**(specs[pos] or {}), d % arg.dim(): dim}
    if not any(specs):
        raise ProgramError(f"--dynamic {text!r}: name at least one dim, e.g. x:0=batch")
    return tuple(specs)


__all__ = ["TENSOR", "constants_of", "dynamic_shapes_from_text", "export_module", "from_exported", "from_torch",
           "lifted_constants", "output_structure"]
