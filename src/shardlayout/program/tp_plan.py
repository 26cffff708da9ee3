"""``--tp-plan FILE.json``: a tensor-parallel plan in torchtitan / ``parallelize_module`` convention.

Keys are module paths with fnmatch patterns matched atom by atom, as torch's ``parallelize_module``
does (``layers.*.attention.wq`` matches ``layers.0.attention.wq``; ``*`` never spans a dot);
modules are the prefixes of the program's parameter and buffer names. Values, on mesh axis ``tp``:

- ``"colwise"``: a Linear's output features on tp (a fused q|k|v or gate|up weight strided, so a
  split leaves each rank its slice of every part), its bias likewise; an Embedding's embedding dim.
- ``"rowwise"``: a Linear's input features on tp, its bias added once; an Embedding's vocabulary
  (a vocab-parallel lookup: each rank looks up the tokens in its rows, zeros elsewhere — a
  partial sum, reduced where the next op needs it: an all_reduce, or a reduce_scatter to sequence
  shards under ``sequence_parallel``).
- ``"sequence_parallel"``: a norm runs on sequence shards (its input on tp along dim 1); its
  output is gathered once if every Linear reading it is colwise, else stays sequence-sharded.
- ``"replicate"``: the module's parameters replicated.
- explicit placements: a list of DTensor placements for the module's ``weight`` (or for the tensor
  the key names), ``["Replicate()", "Shard(0)"]``; a sharding in our notation, ``"[tp*16, 16]"``;
  or ``{"weight": ..., "bias": ...}`` per parameter.

A module whose parameters no op reads and that runs no op (a vision encoder a text-only forward
never calls) is listed as ``unread`` and left to the planner (replicated: no value depends on it).

Block boundaries follow the plan: the residual add closing a block whose last Linear is rowwise is
replicated on tp (sequence-sharded when the plan has a ``sequence_parallel`` entry); user inputs
are batched on dp when the mesh has it. The planner completes every other tensor at minimum cost.

    >>> from shardlayout.mesh import Mesh
    >>> from shardlayout.program.models import llama
    >>> t = apply_tp_plan(llama(layers=1), Mesh.parse("tp=2"), {"layers.*": "replicate"})
    >>> [m["block"] for m in t.matched_json()]
    ['layers.0']
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

from ..errors import ShardingError, UnmatchedStyle
from ..mesh import Mesh
from ..sharding import Sharding
from . import Program
from .blocks import Block, expert_linears, find_blocks, graph, routed_source, short, view_root
from .styles import StylePins, batched_inputs, column, row, sharded, strided

VALUES = ("colwise", "rowwise", "sequence_parallel", "replicate")


class TpPlanError(ShardingError):
    """A malformed TP plan: bad JSON, an unknown value, a value that does not fit its module."""


def read_tp_plan(path: str) -> dict:
    """The ``{pattern: value}`` of a JSON file (``read_tp_plan("tp.json")``); errors name the fix."""
    if not str(path).strip():
        raise TpPlanError(f"--tp-plan {path!r}: an empty value names no file; give e.g. --tp-plan tp.json, or drop "
                          "--tp-plan")

    def unique(pairs: list) -> dict:  # json keeps the last of a key given twice, silently
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))
            values = [v for k, v in pairs if k == key]
            raise TpPlanError(f"--tp-plan {path}: key {key!r} is given twice ({values[0]!r} and {values[1]!r}); "
                              "give each pattern once")
        return out

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=unique)
    except OSError as e:
        raise TpPlanError(f"--tp-plan {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TpPlanError(f"--tp-plan {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                          "save the plan as UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise TpPlanError(f"--tp-plan {path}: malformed JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise TpPlanError(f"--tp-plan {path}: the JSON is nested too deeply (a TP plan is an object of module "
                          "pattern -> value, a few levels deep)") from None
    except ValueError as e:  # an int of thousands of digits
        if isinstance(e, ShardingError):
            raise
        raise TpPlanError(f"--tp-plan {path}: the JSON cannot be read: {str(e).split(';')[0]}") from None
    if not isinstance(data, dict) or not data:
        raise TpPlanError(f"--tp-plan {path}: give a JSON object {{\"module pattern\": \"colwise\", ...}}")
    return data


def modules(program: Program) -> tuple:
    """Module paths of ``program``: every prefix of its parameter and buffer names.
    ``modules(llama(layers=1))[:2] -> ('layers', 'layers.0')``"""
    out: dict = {}
    for n, t in program.tensors.items():
        if t.kind in ("param", "buffer"):
            atoms = n.split(".")
            for k in range(1, len(atoms)):
                out[".".join(atoms[:k])] = True
    return tuple(out)


def matches(pattern: str, path: str) -> bool:
    """fnmatch atom by atom, as ``parallelize_module``. ``matches("layers.*.wq", "layers.0.wq") -> True``"""
    pa, ma = pattern.split("."), path.split(".")
    return len(pa) == len(ma) and all(fnmatchcase(m, p) for m, p in zip(ma, pa))


def _own(program: Program, module: str) -> tuple:
    """The parameters and buffers directly in ``module``."""
    return tuple(n for n, t in program.tensors.items() if t.kind in ("param", "buffer")
                 and n.rsplit(".", 1)[0] == module)


def _explicit(mesh: Mesh, shape: tuple, value, where: str) -> Sharding:
    try:
        if isinstance(value, str) and value.strip().startswith("["):
            s = Sharding.parse(value, mesh)
            if s.shape != shape:
                raise TpPlanError(f"{where}: {value} has shape {s.shape}, the tensor has {shape}")
            return s
        if isinstance(value, list) and all(isinstance(p, str) for p in value):
            return Sharding.from_placements(mesh, shape, value)
    except TpPlanError:
        raise
    except ShardingError as e:
        raise TpPlanError(f"{where}: {e}") from None
    raise TpPlanError(f"{where}: {value!r} is not one of {', '.join(VALUES)}, a list of DTensor placements "
                      "(one per mesh dim, e.g. [\"Replicate()\", \"Shard(0)\"]) or a sharding like \"[tp*16, 16]\"")


def _roles(program: Program, names: tuple) -> str:
    s = find_blocks(program)
    used = []
    for n in names:
        kinds = [b.kind for b in s.blocks if n in b.tensors()]
        lin = any(lin.weight == n for lin in s.linears)
        used.append(f"{n} ({'Linear weight' if lin else ', '.join(kinds) or 'no block'})")
    return ", ".join(used) or "no parameters"


def _module_pins(program: Program, mesh: Mesh, module: str, value, sequence: bool) -> dict:
    """The pins one plan entry gives one module."""
    t = program.tensors
    own = _own(program, module)
    where = f"--tp-plan {module!r}"
    s = find_blocks(program)
    if isinstance(value, dict):
        pins = {}
        for leaf, v in value.items():
            name = f"{module}.{leaf}"
            if name not in t:
                raise TpPlanError(f"{where}: no tensor {name!r}; the module holds {', '.join(own) or 'nothing'}")
            if isinstance(v, str) and v in VALUES:
                sub = name.rsplit(".", 1)[0]
                raise TpPlanError(f"{where}.{leaf}: {v!r} is a module's value, given as a string on the module's key, "
                                  f"not inside an object; write {{\"{sub}\": \"{v}\"}} (an object maps parameters "
                                  "to explicit placements, e.g. {\"weight\": [\"Shard(0)\"]})")
            pins[name] = _explicit(mesh, t[name].shape, v, f"{where}.{leaf}")
        return pins
    if value == "replicate":
        return {n: Sharding(mesh, t[n].shape) for n in own}
    if not isinstance(value, str) or value not in VALUES:
        weight = f"{module}.weight" if f"{module}.weight" in t else None
        if weight is None:
            raise TpPlanError(f"{where}: explicit placements need a 'weight' in the module (it holds "
                              f"{', '.join(own) or 'nothing'}); write {{\"param\": placements}}")
        return {weight: _explicit(mesh, t[weight].shape, value, where)}
    linears = [lin for lin in s.linears if lin.weight in own]
    embeds = [b for b in s.of_kind("embedding") if set(b.params) & set(own)]
    norms = [b for b in s.of_kind("norm") if set(b.params) & set(own)]
    if own and not linears and not embeds and not norms and not _read(program) & set(own):
        # tied: torch.export reads a tied group's parameter by one name (the last module's); the
        # others' are unread. The module's own Linears and lookups are then the ops run in it.
        linears = [lin for lin in s.linears if _under(lin.output, module)]
        embeds = [b for b in s.of_kind("embedding") if b.output and _under(b.output, module)]
    if value in ("colwise", "rowwise"):
        if linears:
            pins = {}
            for lin in linears:
                pins.update(column(mesh, program, lin) if value == "colwise" else row(mesh, program, lin))
            return pins
        if embeds:
            w = embeds[0].params[0]
            pins = {w: strided(mesh, t[w].shape, 1 if value == "colwise" else 0, "tp")}
            out = embeds[0].output
            if value == "rowwise" and out:  # vocab-parallel: its partial output reduced once, where it is made
                pins[out] = _seq(mesh, t[out].shape) if sequence else sharded(mesh, t[out].shape, {0: ["dp"]})
            return pins
        raise TpPlanError(f"{where} is {value!r}, but the module holds no Linear or Embedding weight: "
                          f"{_roles(program, own)}. colwise/rowwise apply to Linears and Embeddings, "
                          "sequence_parallel to norms")
    if not norms:  # sequence_parallel
        raise TpPlanError(f"{where} is 'sequence_parallel', but the module holds no norm: {_roles(program, own)}. "
                          "sequence_parallel applies to norms (LayerNorm, RMSNorm)")
    pins = {n: Sharding(mesh, t[n].shape) for b in norms for n in b.params}
    for b in norms:
        for x in b.inputs:
            pins[x] = _seq(mesh, t[x].shape)
    return pins


def _unread(program: Program, module: str) -> bool:
    """Does ``module`` hold parameters that no op reads, and run no op (``_under``) itself?"""
    own = _own(program, module)
    return bool(own) and not _read(program) & set(own) and not any(_under(o, module) for op in program.ops
                                                                     for o in op.outputs)


def _read(program: Program) -> set:
    """The tensors some op of ``program`` reads."""
    return {x for op in program.ops for x in op.inputs}


def _under(tensor: str, module: str) -> bool:
    """Is ``tensor`` made by an op run in ``module`` (its name the module's path, then the op's)?"""
    return tensor.startswith(module + ".") and "." not in tensor[len(module) + 1:]


def _seq(mesh: Mesh, shape: tuple) -> Sharding:
    return sharded(mesh, shape, {0: ["dp"], 1: ["tp"]} if len(shape) >= 3 else {0: ["dp", "tp"]})


def apply_tp_plan(program: Program, mesh: Mesh, tp_plan: dict, allow_unmatched: bool = False) -> StylePins:
    """The pins of a TP plan (module docstring) and the modules each entry matched, as blocks of
    kind = the entry's value. ``UnmatchedStyle`` for a pattern matching no module (unless
    ``allow_unmatched``). ``apply_tp_plan(prog, mesh, {"layers.*.attention.wq": "colwise"})``"""
    if "tp" not in mesh.names:
        raise TpPlanError(f"--tp-plan shards on mesh axis 'tp'; the mesh {str(mesh) or '(one device)'} has "
                          f"{', '.join(mesh.names) or 'no axes'}: add tp=N to --mesh")
    t = program.tensors
    mods = modules(program)
    sequence = any(v == "sequence_parallel" for v in tp_plan.values())
    pins: dict = {}
    matched = []
    claimed: dict = {}  # module or tensor -> (pattern, value) of the entry that matched it first
    for pattern, value in tp_plan.items():
        hits = [m for m in mods if matches(pattern, m)]
        tensors = [n for n in t if t[n].kind in ("param", "buffer") and matches(pattern, n)] if not hits else []
        for m in hits + tensors:
            first = claimed.setdefault(m, (pattern, value))
            if first[1] != value:
                raise TpPlanError(f"--tp-plan: {m!r} is matched by {first[0]!r} ({first[1]!r}) and by {pattern!r} "
                                  f"({value!r}); give each module one value: narrow a pattern or drop an entry")
        if not hits and not tensors:
            if allow_unmatched:
                continue
            raise UnmatchedStyle(
                f"--tp-plan pattern {pattern!r} matches no module; the model's modules are "
                f"{_listing(mods)} (patterns match atom by atom: '*' never spans a dot). Fix the pattern, or pass "
                "--allow-unmatched")
        for m in hits:
            if isinstance(value, str) and value in VALUES and _unread(program, m):
                # torchtitan's plan names modules this forward never runs (a VLM's vision encoder on text):
                # nothing reads their parameters, so no cut of them changes a value or a collective
                matched.append(Block("unread", m, params=_own(program, m)))
                continue
            got = _module_pins(program, mesh, m, value, sequence)
            pins.update(got)
            matched.append(Block(value if isinstance(value, str) and value in VALUES else "explicit", m,
                                 params=tuple(n for n in got if t[n].kind in ("param", "buffer"))))
        for n in tensors:
            pins[n] = _explicit(mesh, t[n].shape, value, f"--tp-plan {n!r}")
            matched.append(Block("explicit", n, params=(n,)))
    pins.update(_completion(program, mesh, pins, sequence))
    for n in batched_inputs(program):
        if n in program.inputs("input") and "dp" in mesh.names:
            pins.setdefault(n, sharded(mesh, t[n].shape, {0: ["dp"]}))
    kept = frozenset(n for b in matched if b.kind in ("colwise", "rowwise") for n in b.params if n in pins)
    return StylePins(pins, tuple(matched), kept)


def _listing(mods: tuple, limit: int = 12) -> str:
    shown = ", ".join(mods[:limit])
    return shown + (f", ... ({len(mods) - limit} more)" if len(mods) > limit else "") if mods else "(none)"


def _colwise(pin: Sharding, lin) -> bool:
    return any(f.axis == "tp" for f in pin.dims[lin.out_dim])


def _rowwise(pin: Sharding, lin) -> bool:
    return any(f.axis == "tp" for f in pin.dims[lin.in_dim])


def _completion(program: Program, mesh: Mesh, pins: dict, sequence: bool) -> dict:
    """What the plan implies at block boundaries: a block whose first Linears are all colwise
    reads its input gathered once (when that input is sequence-sharded or unpinned); a block
    whose last Linear is rowwise is closed replicated on tp, or sequence-sharded in a sequence-
    parallel plan."""
    t = program.tensors
    s = find_blocks(program)
    g = graph(program)
    out = {}
    for b in s.of_kind("attention", "mlp", "head"):
        if b.first and all(lin.weight in pins and _colwise(pins[lin.weight], lin) for lin in b.first):
            for x in b.inputs:
                if x not in pins or any(f.axis == "tp" for fs in pins[x].dims for f in fs):
                    out[x] = sharded(mesh, t[x].shape, {0: ["dp"]})
        if b.last and all(lin.weight in pins and _rowwise(pins[lin.weight], lin) for lin in b.last):
            if b.output and b.output not in pins and short(g.made_by(b.output)) == "add":
                out[b.output] = _seq(mesh, t[b.output].shape) if sequence else \
                    sharded(mesh, t[b.output].shape, {0: ["dp"]})
    for b in s.of_kind("experts"):  # tensor parallel inside each expert, as torchtitan's MoE boundary says
        first, last, outputs = expert_linears(program, b)
        if first and all(lin.weight in pins and _colwise(pins[lin.weight], lin) for lin in first):
            for lin in first:  # the tokens gathered once, before the router and the experts read them
                x = routed_source(program, lin)
                root = view_root(program, x) if x is not None else None
                if root is not None and (root not in pins or any(f.axis == "tp" for fs in pins[root].dims for f in fs)):
                    out[root] = sharded(mesh, t[root].shape, {0: ["dp"]})
        if last and all(lin.weight in pins and _rowwise(pins[lin.weight], lin) for lin in last):
            for o in outputs:
                if o not in pins:
                    out[o] = _seq(mesh, t[o].shape) if sequence and len(t[o].shape) >= 3 else \
                        sharded(mesh, t[o].shape, {0: ["dp"]})
    return out


__all__ = ["TpPlanError", "VALUES", "apply_tp_plan", "matches", "modules", "read_tp_plan"]
