"""Index maps: which global indices an op's local run needs, per index letter.

The index-level proof (``execute.proof``) checks a planned op against its *index map*: one
letter per independent index, like an einsum, and what each letter does.

* **pass-through** (in an output and in inputs): every operand carrying it must hold the same
  global indices of it, in the same order, on every rank (``mm``'s ``m`` and ``n``);
* **reduced** (in inputs, not in output k): sharding it makes output k partial with the map's
  ``reduce`` op on exactly those axes, and the chunks must partition the dim (``mm``'s ``k``);
* **whole**: every rank holds the whole dim (softmax's dim, a slice's dim, causal attention's
  query positions);
* **free**: an output-only letter any index list may fill (``expand``'s broadcast dims);
  any other output-only letter is whole;
* ``linear`` says how partial inputs pass (``"sum"``, ``"multi"``, ``"first"``, ``"max"``,
  ``"min"``, ``"any"`` for views, None);
* ``kind="reshape"``: a view that keeps row-major order (``view``, ``flatten``, ``squeeze``):
  the local run is a reshape, so each rank's local input and output must list the same global
  flat offsets in the same order.

Where the map comes from: an op declared with ``factor_rule`` *is* a factor map, read from the
rule (the map the planner searched with); ops with hand-written rules (views, cat, slices,
norms, attention, sorts, index ops) have theirs here. An op with neither has no map
(``index_map`` returns None): it is checked numerically only and reported as unproven.

    >>> from shardlayout import Mesh, Sharding
    >>> m = Mesh.parse("tp=2")
    >>> a, b = Sharding.parse("[4, tp*4]", m), Sharding.parse("[tp*4, 6]", m)
    >>> im = index_map("mm", (a, b), {})
    >>> im.inputs, im.outputs, im.reduce
    (('mk', 'kn'), ('mn',), 'sum')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ops.registry import get_op
from ..sharding import Sharding

LETTERS = "abcdefghijklmnopqrstuvwxyz"

RESHAPES = frozenset({"view", "_unsafe_view", "view_copy", "reshape", "_reshape_alias", "alias", "clone",
                      "contiguous", "flatten", "unflatten", "squeeze", "unsqueeze"})
POSITIVE = frozenset({"rsqrt", "sqrt", "log", "reciprocal", "pow", "div"})


@dataclass(frozen=True)
class IndexMap:
    """An op's index map (module docstring). ``values`` names, per input, how the numeric
    oracle draws it: None (floats in [-1, 1)), ``"positive"``, ``"mask"`` (0/1), or
    ``("index", n)`` (integers in [0, n))."""

    inputs: tuple
    outputs: tuple
    reduce: str = "sum"
    whole: frozenset = field(default_factory=frozenset)
    linear: str | None = None
    free: frozenset = field(default_factory=frozenset)
    kind: str = "letters"
    values: tuple = ()
    resize: tuple = ()  # kind "resize": (op, dim, start, step, cuts) of a comm-free cut / join / pad


def _fresh(used: str, k: int = 0) -> str:
    return next(ch for ch in "ZYXWVUTSRQPONMLKJIHGFEDCBA"[k:] if ch not in used)


def _lx(s) -> str:
    return LETTERS[: s.ndim]


def _tensors(inputs) -> list:
    return [x for x in inputs if isinstance(x, Sharding)]


def _from_factor_rule(name, inputs, params, n_outputs):
    """The factor map of a rule built with ``ops.strategy.factor_rule`` (its ``fm_of``), or None."""
    opdef = get_op(name)
    fm_of = getattr(opdef.rule, "factor_map_of", None)  # set by factor_rule: the map the planner searched
    if fm_of is None:
        return None
    ins = [s if isinstance(s, Sharding) else None for s in inputs]
    got = fm_of(opdef.name, ins, dict(params))
    fm = got[0] if isinstance(got, tuple) else got
    letters = tuple(lt if isinstance(x, Sharding) else None for x, lt in zip(inputs, fm.inputs))
    values = ()
    if opdef.name in POSITIVE:
        values = tuple("positive" for _ in inputs)
    elif opdef.name == "where":
        values = ("mask",)
    elif opdef.name == "masked_fill":
        values = (None, "mask")
    return IndexMap(letters, (fm.output,) * n_outputs, fm.reduce, fm.whole, fm.linear, values=values)


def _permute_map(s, perm) -> IndexMap:
    lx = _lx(s)
    return IndexMap((lx,), ("".join(lx[p] for p in perm),), linear="any")


def _views(name, s, params):
    if name in RESHAPES:
        return IndexMap(("",), ("",), kind="reshape", linear="any")
    if name == "permute":
        dims = params.get("dims", ())
        return _permute_map(s, [dims] if isinstance(dims, int) else list(dims))
    if name == "transpose":
        perm = list(range(s.ndim))
        if s.ndim:
            a, b = params.get("dim0", 0), params.get("dim1", 1)
            perm[a], perm[b] = perm[b], perm[a]
        return _permute_map(s, perm)
    if name == "t":
        return _permute_map(s, list(range(s.ndim))[::-1])
    if name == "movedim":
        src, dst = params.get("source", 0), params.get("destination", 0)
        src = [src] if isinstance(src, int) else list(src)
        dst = [dst] if isinstance(dst, int) else list(dst)
        perm = [None] * s.ndim
        for a, b in zip(src, dst):
            perm[b] = a
        rest = iter(d for d in range(s.ndim) if d not in src)
        return _permute_map(s, [p if p is not None else next(rest) for p in perm])
    if name == "expand":
        size = list(params.get("size", ()))
        lead = len(size) - s.ndim
        lx = _lx(s)
        out = "".join(_fresh(lx, i) for i in range(lead)) + lx
        return IndexMap((lx,), (out,), linear="any", free=frozenset(out))
    return None


def _norms(name, inputs, params, n_out):
    x = inputs[0]
    k = len(params.get("normalized_shape", ()))
    lx = _lx(x)
    lead, norm = lx[: x.ndim - k], lx[x.ndim - k:]
    if name == "native_layer_norm_backward":
        ones = "".join(_fresh(lx, i) for i in range(k))
        letters = [lx, lx, lead + ones, lead + ones, norm, norm]
        ins = tuple(letters[i][len(letters[i]) - s.ndim:] if isinstance(s, Sharding) else None
                    for i, s in enumerate(inputs))
        return IndexMap(ins, (lx, norm, norm), whole=frozenset(norm))
    ins = (lx,) + tuple(norm[len(norm) - s.ndim:] if isinstance(s, Sharding) else None for s in inputs[1:])
    outs = (lx,)
    if n_out == 3:
        stats = lead + "".join(_fresh(lx, i) for i in range(k))
        outs = (lx, stats, stats)
    return IndexMap(ins, outs, whole=frozenset(norm))


def _along(name, s, params, n_out):
    lx = _lx(s)
    if name in ("flip", "roll"):
        dims = params.get("dims", ())
        dims = (dims,) if isinstance(dims, int) else tuple(dims) or tuple(range(s.ndim))
        return IndexMap((lx,), (lx,), whole=frozenset(lx[d] for d in dims), linear="sum")
    d = params.get("dim", 0)
    d = d if isinstance(d, int) else d[0]
    z = _fresh(lx)
    if name in ("slice", "narrow"):
        return IndexMap((lx,), (lx[:d] + z + lx[d + 1:],), whole=frozenset({lx[d], z}))
    if name == "select":
        return IndexMap((lx,), (lx[:d] + lx[d + 1:],), whole=frozenset(lx[d]))
    if name in ("cumsum", "cumprod"):
        return IndexMap((lx,), (lx,), whole=frozenset(lx[d]), linear="sum" if name == "cumsum" else None)
    if name in ("sort", "argsort", "topk"):
        d = params.get("dim", -1) % max(s.ndim, 1)
        return IndexMap((lx,), (lx,) * n_out, whole=frozenset(lx[d]))
    if name in ("split_with_sizes", "split", "chunk", "unbind"):
        outs = tuple(lx[:d] + ("" if name == "unbind" else _fresh(lx, k % 20)) + lx[d + 1:] for k in range(n_out))
        return IndexMap((lx,), outs, whole=frozenset({lx[d]} | {o[d] for o in outs if name != "unbind"}))
    if name == "slice_backward":
        return IndexMap((lx,), (lx[:d] + z + lx[d + 1:],), whole=frozenset({lx[d], z}), linear="sum")
    if name == "one_hot":
        return IndexMap((lx,), (lx + z,), whole=frozenset(z), values=(("index", params.get("num_classes", 1)),))
    return None


def _resized(name, inputs, params) -> IndexMap | None:
    """The index map of a slice / split / cat / slice_backward that each rank runs on its own
    shard (``ops.resize``): kind ``"resize"``, the cut dim checked rank class by rank class
    against the planned local run (``params["local"]``, ``Propagation.local``; a cat needs none:
    its local run is a plain cat), every other dim a pass-through letter. None otherwise (the
    op reads its dim whole: the letters say so)."""
    from ..ops.resize import slice_bounds, slice_range

    tensors = _tensors(inputs)
    d = params.get("dim", 0)
    s = tensors[0]
    lx = _lx(s)
    z = _fresh(lx)
    sharded = [any(f.axis is not None for f in t.dims[d]) for t in tensors]
    if name == "cat":
        if not any(sharded):
            return None
        return IndexMap(tuple(lx[:d] + z + lx[d + 1:] for _ in tensors), (lx[:d] + z + lx[d + 1:],), linear="any",
                        free=frozenset(z), kind="resize", resize=("cat", d, 0, 1, ()))
    local = params.get("local")
    if local is None:
        return None
    n = s.shape[d]
    if name in ("split_with_sizes", "split", "chunk"):
        return IndexMap((lx[:d] + z + lx[d + 1:],), tuple(lx[:d] + z + lx[d + 1:] for _ in local), linear="any",
                        free=frozenset(z), kind="resize", resize=("split", d, 0, 1, tuple(local)))
    if name == "slice_backward":
        a = slice_bounds(params["input_sizes"][d], params.get("start"), params.get("end"), 1)[0]
        return IndexMap((lx,), (lx,), linear="any", free=frozenset(lx[d]), kind="resize",
                        resize=("pad", d, a, 1, (tuple(local),)))
    a, b, step = slice_range(name, n, params)
    count = len(range(a, b, step))
    return IndexMap((lx,), (lx,), linear="any", free=frozenset(lx[d]), kind="resize",
                    resize=("slice", d, a, step if count > 1 else 1, (tuple(local),)))


def _attention(name, inputs, params, n_out):
    causal = bool(params.get("is_causal", False))
    if name.endswith("_backward"):
        letters = ["bhse", "bhsd", "bhtd", "bhte", "bhse", "bhs"]
        ins = tuple(letters[i] if i < 6 and isinstance(x, Sharding) else None for i, x in enumerate(inputs))
        return IndexMap(ins, ("bhsd", "bhtd", "bhte"), whole=frozenset("stde"))
    from ..ops.families import sdpa_map

    fm = sdpa_map(inputs, causal)
    ins = tuple(lt if isinstance(x, Sharding) else None for x, lt in zip(inputs, fm.inputs))
    outs = ("bhse",) if n_out == 1 else ("bhse", "bhs")
    return IndexMap(ins, outs, whole=fm.whole)


def _indexing(name, inputs, params):
    x = inputs[0]
    lx = _lx(x)
    d = params.get("dim", 0)
    if name == "embedding":
        idx = inputs[1]
        li = LETTERS[: idx.ndim]
        if params.get("local") is not None:  # vocab-parallel: a lookup is a one-hot matmul, V contracted
            return IndexMap(("VD", li), (li + "D",), linear="first", values=(None, ("index", x.shape[0])))
        return IndexMap(("VD", li), (li + "D",), whole=frozenset("V"), values=(None, ("index", x.shape[0])))
    if name == "index_select":
        return IndexMap((lx, "Z"), (lx[:d] + "Z" + lx[d + 1:],), whole=frozenset(lx[d]),
                        values=(None, ("index", x.shape[d])))
    if name == "gather":
        lidx = lx[:d] + "Z" + lx[d + 1:]
        return IndexMap((lx, lidx), (lidx,), whole=frozenset(lx[d]), values=(None, ("index", x.shape[d])))
    if name == "index":
        from ..ops.families import index_letters

        dims, lx, li, out, _ = index_letters(x, list(inputs[1:]), params.get("indexed"))
        return IndexMap((lx, *li), (out,), whole=frozenset(lx[d] for d in dims), linear="first",
                        values=(None, *(("index", x.shape[d]) for d in dims)))
    if name in ("index_put", "_index_put_impl"):
        idx, vals = inputs[1], inputs[2]
        li = LETTERS[x.ndim: x.ndim + idx.ndim].upper()
        lv = li + lx[1:] if vals.shape == idx.shape + x.shape[1:] else LETTERS[: vals.ndim].upper()
        whole = {lx[0]} | set(li) | (set(lv) - set(lx[1:]))
        return IndexMap((lx, li, lv), (lx,), whole=frozenset(whole), values=(None, ("index", x.shape[0]), None))
    return None


def _grouped_mm(inputs):
    ins = ("tk", "gkn") + (("g",) if len(inputs) > 2 and isinstance(inputs[2], Sharding) else ())
    ins = ins + tuple(None for _ in inputs[len(ins):])
    return IndexMap(ins, ("tn",), whole=frozenset("tg"), linear="multi")


def _creation(name, inputs, n_out):
    if n_out == 0:
        return IndexMap(tuple(None for _ in inputs), ())
    return IndexMap(tuple(None for _ in inputs), ("",) * n_out, whole=frozenset(), kind="created")


_CREATION = frozenset({"arange", "full", "zeros", "ones", "scalar_tensor", "empty", "empty_permuted", "rand", "randn",
                       "new_zeros",
                       "new_ones", "new_full", "new_empty", "_assert_tensor_metadata", "_assert_async",
                       "_assert_scalar", "sym_constrain_range_for_size"})
_DATA_DEPENDENT = frozenset({"nonzero", "masked_select", "unique", "_unique2", "argwhere"})


def index_map(target: str, inputs: tuple, params: dict, n_outputs: int = 1) -> IndexMap | None:
    """The index map of one call: ``target`` (an op name), its inputs (Shardings where tensors,
    numbers or None elsewhere), its bound params. None when the op has no map (checked
    numerically only). ``index_map("mm", (a, b), {}).outputs -> ('mn',)``"""
    opdef = get_op(target)
    name = opdef.name
    fm = _from_factor_rule(name, inputs, params, n_outputs)
    if fm is not None:
        return fm
    tensors = _tensors(inputs)
    if name in _CREATION:
        return _creation(name, inputs, n_outputs)
    if not tensors:
        return None
    x = tensors[0]
    if name in ("slice", "narrow", "cat", "concat", "concatenate", "slice_backward", "split_with_sizes", "split",
                "chunk"):
        got = _resized("cat" if name in ("concat", "concatenate") else name, inputs, params)
        if got is not None:
            return got
    got = _views(name, x, params)
    if got is not None:
        return got
    if name in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "native_layer_norm_backward"):
        return _norms(name, inputs, params, n_outputs)
    if name in ("cat", "concat", "concatenate"):
        d = params.get("dim", 0)
        lx = _lx(x)
        letters = tuple(lx[:d] + LETTERS[20 + i % 6].upper() + lx[d + 1:] for i in range(len(inputs)))
        return IndexMap(letters, (lx[:d] + "Z" + lx[d + 1:],), whole=frozenset({lt[d] for lt in letters} | {"Z"}))
    if "attention" in name:
        return _attention(name, inputs, params, n_outputs)
    if name in _DATA_DEPENDENT:
        return IndexMap(tuple(_lx(s) if isinstance(s, Sharding) else None for s in inputs), ("Z",) * n_outputs,
                        whole=frozenset(LETTERS + "Z"))
    if name == "_grouped_mm":
        return _grouped_mm(inputs)
    if name in ("embedding", "index_select", "gather", "index", "index_put", "_index_put_impl"):
        return _indexing(name, inputs, params)
    if name in ("histc", "bincount"):
        lx = _lx(x)
        whole = {"Z"} | (set(lx) if params.get("min", 0) == params.get("max", 0) else set())
        return IndexMap((lx,) + tuple(None for _ in inputs[1:]), ("Z",), whole=frozenset(whole))
    return _along(name, x, params, n_outputs)


__all__ = ["IndexMap", "RESHAPES", "index_map"]
