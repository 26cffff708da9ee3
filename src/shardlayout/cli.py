"""The ``shardlayout`` command line.

    shardlayout demo
    shardlayout layout composition "(4,6):(6,1)" "(2,3):(1,4)"

Errors from bad input are one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import jobs
from .errors import ShardingError, ShardingSpecError
from .sharding.ragged import ragged_text


def _layout_ops() -> tuple:
    from .layout.algebra import __all__ as ops

    return tuple(ops)


LAYOUT_OPS = _layout_ops()


def _parse_operand(text: str):
    """A layout ``(4,2):(1,4)``, an int ``4``, ``_`` (None) or a by-mode tiler ``[4,_,(2,2):(1,2)]``."""
    from .layout import Layout

    text = text.strip()
    if text in ("_", "None"):
        return None
    if text.count("[") > 32:  # each level re-splits the text: refuse absurd nesting before it costs seconds
        raise ShardingError(f"operand {text[:40]!r}... nests more than 32 '[' levels")
    if text.lstrip("-").isascii() and text.lstrip("-").isdigit():
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        parts = _split_top(text[1:-1], "operand", "mode", "one tiler per mode, e.g. [4,_,(2,2):(1,2)]")
        return tuple(_parse_operand(p) for p in parts)
    return Layout.parse(text)


def cmd_layout(args) -> int:
    from . import layout as L

    f = getattr(L, args.op)
    _check_arity(args.op, f, len(args.operands))
    operands = [_parse_operand(x) for x in args.operands]
    result = f(*operands)
    if args.json:
        print(json.dumps({"op": args.op, "operands": args.operands, "result": str(result),
                          "shape": result.shape, "stride": result.stride,
                          "size": result.size(), "cosize": result.cosize()}))
    else:
        print(result)
    return 0


def _check_arity(op: str, f, n: int) -> None:
    """``n`` operands fit ``f``'s positional parameters, or a LayoutError saying how many it takes."""
    import inspect

    from .errors import LayoutError

    params = list(inspect.signature(f).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    least = sum(p.default is p.empty for p in positional)
    most = len(positional)
    if not least <= n <= most:
        takes = str(most) if least == most else f"{least} to {most}"
        raise LayoutError(f"{op} takes {takes} operand{'s' if most != 1 else ''}, got {n}; e.g. shardlayout layout "
                          f"{op} " + " ".join(["'(4,2):(1,4)'"] + ["2"] * (max(least, 1) - 1)))


def _parse_shape(text: str, flag: str = "--shape") -> tuple:
    """``8,12`` (or ``(8,12)``, Python's ``(8,)``) as a tuple of ints; ``''`` or ``()`` is a
    scalar's shape. An empty entry (``8,,12``, ``8,12,``) is refused, never skipped."""
    body = text.strip()
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1].strip()
        if body.endswith(",") and "," not in body[:-1]:  # Python's one-tuple (8,)
            body = body[:-1]
    if not body:
        return ()
    parts = _no_empty(body.split(","), text, flag, "dim", "one int per dim, e.g. 8,12")
    try:
        if not text.isascii():  # int() would read '８' or '٨' as 8
            raise ValueError
        shape = tuple(int(x) for x in parts)
    except ValueError:
        raise ShardingError(f"{flag} {text!r} is not a comma-separated list of ints, e.g. 8,12") from None
    return shape


def _no_empty(parts: list, text: str, flag: str, what: str, fix: str) -> list:
    """``parts``, or a ShardingError naming the first empty one (``8,,12``: a size left out or a
    comma too many, which would shift every later entry)."""
    for i, p in enumerate(parts):
        if not p.strip():
            where = ("at the end" if i == len(parts) - 1 else "at the start" if i == 0
                     else f"after {parts[i - 1].strip()!r}")
            raise ShardingError(f"{flag} {text!r}: {what} {i} is empty (a comma {where}); give {fix}")
    return parts


def _split_top(text: str, flag: str | None = None, what: str = "entry", fix: str = "") -> list:
    """Split at top-level commas; with ``flag``, an empty entry is refused (naming ``flag``),
    else skipped."""
    from .sharding.core import split_top_level

    parts = split_top_level(text)
    if flag is not None:
        return _no_empty(parts, text, flag, what, fix)
    return [p for p in parts if p]


def _parse_spec(text: str) -> tuple:
    out = []
    fix = "one entry per dim (None for a dim on no axis), e.g. \"('dp','tp'),None\""
    body = text.strip()
    opened, closed = body.count("("), body.count(")")
    if opened != closed:
        raise ShardingError(f"--partition-spec {text!r}: unbalanced parentheses ({opened} '(' and {closed} ')'); close "
                            "each one, e.g. \"P('dp', None)\" or \"('dp','tp'),None\"")
    if body.startswith(("P(", "PartitionSpec(")) and body.endswith(")"):
        body = body.removeprefix("P(").removeprefix("PartitionSpec(")[:-1]
    for part in _split_top(body, "--partition-spec", "entry", fix):
        p = part.strip().strip("'\"")
        if p in ("None", "_", ""):
            out.append(None)
        elif p.startswith("(") and p.endswith(")"):
            out.append(tuple(x.strip().strip("'\"") for x in _split_top(p[1:-1], "--partition-spec", "axis",
                                                                           "axis names, e.g. ('dp','tp')")))
        else:
            out.append(p)
    return tuple(out)


def sharding_from_args(args):
    """The Sharding named by --sharding, --placements or --partition-spec (with --mesh, --shape)."""
    from .mesh import Mesh
    from .sharding import Sharding

    mesh = Mesh.parse(args.mesh)
    given = [x for x in (args.sharding, args.placements, args.partition_spec) if x is not None]
    if len(given) != 1:
        raise ShardingError("give exactly one of --sharding, --placements, --partition-spec")
    if args.sharding is not None:
        s = Sharding.parse(args.sharding, mesh)
        if args.shape and _parse_shape(args.shape, "--shape") != s.shape:
            raise ShardingError(f"--shape {args.shape} does not match {args.sharding} (shape {s.shape})")
        return s
    if not args.shape:
        raise ShardingError("--placements and --partition-spec need --shape, e.g. --shape 8,12")
    shape = _parse_shape(args.shape)
    if args.placements is not None:
        return Sharding.from_placements(mesh, shape, _split_top(args.placements, "--placements", "placement",
                                                                 "one placement per mesh dim, e.g. S(0),R"))
    return Sharding.from_partition_spec(mesh, shape, _parse_spec(args.partition_spec))


def describe(s, rank_limit: int | None = None) -> dict:
    """Everything `show` prints, as a JSON-able dict (every rank, or the first ``rank_limit``)."""
    from .errors import NotRepresentable
    from .report import rank_table

    out = {"mesh": str(s.mesh), "devices": s.mesh.size, "shape": list(s.shape), "sharding": str(s),
           "even": s.is_even()}
    try:
        out["placements"] = list(s.to_placements())
        out["placements_error"] = None
    except NotRepresentable as e:
        out["placements"], out["placements_error"] = None, str(e)
    try:
        spec = s.to_partition_spec()
        out["partition_spec"] = [list(x) if isinstance(x, tuple) else x for x in spec]
        out["partition_spec_error"] = None
    except NotRepresentable as e:
        out["partition_spec"], out["partition_spec_error"] = None, str(e)
    out["layout"] = str(s.layout()) if s.is_even() else None
    out["ranks"] = rank_table(s, rank_limit)
    return out


def _spec_text(spec) -> str:
    def one(x):
        if x is None:
            return "None"
        if isinstance(x, list):
            return "(" + ", ".join(repr(a) for a in x) + ")"
        return repr(x)

    return "PartitionSpec(" + ", ".join(one(x) for x in spec) + ")"


def print_sharding(s, info: dict) -> None:
    from .report import picture

    print(f"mesh        {info['mesh']} ({info['devices']} devices)")
    print(f"shape       {tuple(info['shape'])}")
    print(f"sharding    {info['sharding']}")
    if info["placements"] is not None:
        print(f"DTensor     [{', '.join(info['placements'])}]")
    else:
        print(f"DTensor     none: {info['placements_error']}")
    if info["partition_spec"] is not None:
        print(f"JAX         {_spec_text(info['partition_spec'])}")
    else:
        print(f"JAX         none: {info['partition_spec_error']}")
    if info["layout"]:
        print(f"layout      {info['layout']}   ((local dims), (mesh axes)) -> offset")
    print()
    print(picture(s))  # per block from the factors (report/cells.py): bounded whatever the tensor and mesh
    print()
    for row in info["ranks"][:16]:
        coord = ",".join(f"{k}={v}" for k, v in row["coord"].items())
        dims = "  ".join(
            f"dim{d} " + ",".join(f"{a}:{b}" for a, b in rs[:4]) + (",..." if len(rs) > 4 else "")
            for d, rs in enumerate(row["ranges"])
        )
        print(f"rank {row['rank']:>3} ({coord}): local {tuple(row['local_shape'])}  {dims}")
    if s.mesh.size > 16:
        print(f"... {s.mesh.size - 16} more ranks (--json lists all)")


def cmd_show(args) -> int:
    s = sharding_from_args(args)
    info = describe(s, None if args.json else 16)  # the text shows 16 ranks: compute only those
    info.update(_figures(args, lambda path, fmt: _report("figure").sharding_figure(s, path, fmt)))
    if args.json:
        print(json.dumps(info))
    else:
        print_sharding(s, info)
        for path in info.get("pictures", ()):
            print(f"picture written to {path}")
    return 0


def cmd_view(args) -> int:
    from .propagation import propagate

    s = sharding_from_args(args)
    to = _parse_shape(args.to, "--to")
    p = propagate("view", [s], shape=to, subaxes=not args.no_subaxes)
    out = p.outputs[0]
    info = {
        "input": describe(s, None if args.json else 16),
        "input_target": str(p.input_targets[0]),
        "output": describe(out, None if args.json else 16),
        "communication": p.needs_communication,
        "collectives": [c.to_json(p.cost_model) for c in p.collectives],
        "cost_seconds": p.cost,
    }
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"view {s} {s.shape} -> {out.shape} on mesh {s.mesh}")
    if p.needs_communication:
        print(f"data moves: the input is first redistributed to {p.input_targets[0]}")
        for c in p.collectives:
            print(f"  {c.kind.value} on {c.axes_text()}: {c.bytes} bytes per device, "
                  f"~{p.cost_model.seconds(c) * 1e6:.1f} µs")
    else:
        print("no data moves: the view only regroups factors")
    print()
    print_sharding(out, info["output"])
    return 0


def _parse_input(text: str, mesh):
    from .sharding import Sharding

    text = text.strip()
    if text.startswith("["):
        return Sharding.parse(text, mesh)
    if ":" not in text:
        raise ShardingError(
            f"input {text!r}: write a sharding '[dp*4, tp*3]' or 'SHAPE:PLACEMENTS', e.g. '8,12:S(0),R'"
        )
    shape, placements = text.split(":", 1)
    return Sharding.from_placements(mesh, _parse_shape(shape, "--inputs shape"),
                                    _split_top(placements, "--inputs placements", "placement",
                                               "one placement per mesh dim, e.g. 8,12:S(0),R"))


def _parse_param(text: str):
    if "=" not in text:
        raise ShardingError(f"--param {text!r}: write name=value, e.g. dim=1 or equation=mk,kn->mn")
    k, v = text.split("=", 1)
    v = v.strip()
    try:
        value = json.loads(v, parse_constant=str)  # NaN / Infinity stay text: no param takes them as numbers
    except ValueError:
        value = v
    except RecursionError:
        raise ShardingError(f"--param {k.strip()}: the value is nested too deeply") from None
    if isinstance(value, list):
        value = tuple(value)
    return k.strip(), value


def cmd_explain(args) -> int:
    from .mesh import Mesh
    from .propagation import propagate
    from .sharding import Sharding

    if args.top < 1:
        raise ShardingError(f"--top {args.top}: give 1 or more candidates to list (--all lists every one)")
    mesh = Mesh.parse(args.mesh)
    inputs, streamed = [], {}
    for i, t in enumerate(args.inputs):
        if "~" in t:  # a stream factor: the input cut into k chunks computed one after another
            s = Sharding.parse(t, mesh)
            d, _, k = s.stream
            try:
                usual = s.without_stream().with_stream(d, k)
            except ShardingSpecError:
                usual = None
            if usual != s:
                raise ShardingSpecError(f"input {i} {t!r}: explain reads a stream as every rank's shard cut in k "
                                        f"chunks, ~k right after the dim's mesh-axis factors"
                                        + (f": write {usual}" if usual is not None else
                                           f"; dim {d} has no local factor there that {k} divides"))
            inputs.append(s.without_stream())
            streamed[i] = (d, k)
        else:
            inputs.append(_parse_input(t, mesh))
    params: dict = {}
    for text in args.param or []:
        k, v = _parse_param(text)
        if k in params:
            raise ShardingError(f"--param {k} is given twice ({params[k]!r} and {v!r}); give each param once")
        params[k] = v
    p = propagate(args.op, inputs, **params)
    data = p.to_json()
    streams = [_explain_stream(args.op, p, params, i, d, k) for i, (d, k) in sorted(streamed.items())]
    if streams:
        data["streams"] = streams
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"{args.op} on mesh {mesh}")
    for i, (s, t) in enumerate(zip(p.inputs, p.input_targets)):
        arrow = "" if s == t else f"  ->  {t}"
        print(f"  input {i}: {s}{arrow}")
    for i, o in enumerate(p.outputs):
        print(f"  output {i}: {o}")
    cm = p.cost_model
    if p.notes:
        print("strategy (per mesh axis):")
        for n in p.notes:
            print(f"  {n}")
    if p.collectives:
        print("collectives:")
        for c in p.collectives:
            print(f"  {_collective_line(c, cm)}")
    else:
        print("collectives: none")
    print(f"total estimated cost: {p.cost * 1e6:.2f} µs")
    for st in streams:
        print(f"stream: {st['text']}")
    if p.candidates:
        ranked = sorted(p.candidates, key=lambda c: c.cost)
        shown = ranked if args.all else ranked[: args.top]
        print(f"candidates ({len(p.candidates)} priced by the collectives each would emit; "
              f"{'all' if len(shown) == len(ranked) else f'cheapest {len(shown)}, --all for every one'}):")
        for c in shown:
            chosen = all(t is None or t == pt for t, pt in zip(c.input_targets, p.input_targets)) \
                and c.outputs == p.outputs[: len(c.outputs)]
            mark = "*" if chosen else " "
            print(f" {mark} {c.cost * 1e6:9.2f} µs  {c.describe()}")
            for x in c.collectives:
                print(f"               {_collective_line(x, cm)}")
    return 0


def _explain_stream(op: str, p, params: dict, i: int, d: int, k: int) -> dict:
    """What a stream factor on input ``i`` (dim ``d``, ``k`` chunks) means for the op: the dim
    passes through to an output dim (each chunk runs the same strategy on a k-th of it), or the op
    contracts or reduces it (no stream can cut it)."""
    from .plan.stream import _letters, stream_text

    tgt = p.input_targets[i]
    got = _letters(op, params, p.input_targets, p.outputs)
    out = {"input": i, "dim": d, "chunks": k, "output": None, "output_dim": None}
    if got is None or got[0][i] is None:
        out["text"] = (f"input {i} {stream_text(tgt, d, k)}: this op has no index map saying where dim {d} goes; "
                       "plan finds the streams of whole programs (views and pointwise ops between a move and matmuls)")
        return out
    from .ops.families import MATMULS, pointwise_ops
    from .ops.result import canonical_op_name

    letter = got[0][i][d]
    follows = canonical_op_name(op) in MATMULS or canonical_op_name(op) in pointwise_ops()
    for o, letters in enumerate(got[1] if follows else ()):
        if letter in letters:
            e = letters.index(letter)
            out.update(output=o, output_dim=e)
            out["text"] = (f"input {i} {stream_text(tgt, d, k)} passes dim {d} through to output {o} dim {e} "
                           f"({stream_text(p.outputs[o], e, k)}): each of the {k} chunks runs this strategy on 1/{k} "
                           "of it, one after another, so a chunk's collective can overlap the next chunk's compute")
            return out
    if not follows and any(letter in letters for letters in got[1]):
        out["text"] = (f"input {i} {stream_text(tgt, d, k)}: this op reads dim {d} whole (a normalisation, scan, sort "
                       "or reorder along it), so stream chunks of it are not chunks of the output; streams follow "
                       "only matmuls' pass-through dims, pointwise ops and views")
        return out
    out["text"] = (f"input {i} {stream_text(tgt, d, k)}: this op contracts or reduces dim {d} (index {letter!r}), so "
                   "stream chunks of it are not chunks of the output; a stream cannot cut this dim here")
    return out


def _collective_line(c, cm) -> str:
    return (f"{c.tensor}: {c.kind.value} on {c.axes_text()} (group of {c.group_size}), {c.bytes} bytes, "
            f"~{cm.seconds(c) * 1e6:.2f} µs")


def cmd_plan(args) -> int:
    if args.max_rows < 0:
        raise ShardingError(f"--max-rows {args.max_rows}: give 0 or more tensor rows to print")
    if args.style == "auto":
        return _plan_auto(args)
    with _report("progress").task(f"planning on mesh {args.mesh}"):  # a transient bar past ~2 s on a terminal
        p = jobs.build_plan(args)
    with _report("progress").task(f"verifying ({args.verify})"):
        v = p.verify(mode=args.verify) if args.verify else None
    pictures = _figures(args, lambda path, fmt: _report("figure").plan_figure(p, path, fmt, _plan_title(p, args)))
    pictures.setdefault("pictures", []).extend(_timeline(p, args))
    if not pictures["pictures"]:
        del pictures["pictures"]
    if args.json:
        print(p.to_json())
        return 0 if v is None or v.ok else 1
    print_plan(p, v, args)
    for path in pictures.get("pictures", ()):
        print(f"picture written to {path}")
    return 0 if v is None or v.ok else 1


def _plan_auto(args) -> int:
    """``plan --style auto``: the plan, then how it was found and what it costs against each style."""
    with _report("progress").task(f"searching every sharding on mesh {args.mesh} (HiGHS)"):
        a = jobs.build_auto(args)
    p = a.plan
    with _report("progress").task(f"verifying ({args.verify})"):
        v = p.verify(mode=args.verify) if args.verify else None
    _timeline(p, args)
    if args.json:
        data = json.loads(p.to_json())
        data["auto"] = a.to_json()
        print(json.dumps(data, indent=1, sort_keys=True))
    else:
        print_plan(p, v, args)
        print()
        print(a.text())
    return 0 if v is None or v.ok else 1


def _timeline(p, args) -> list:
    """``--timeline FILE``: the stream overlaps' picture, written; its path in a list (or [])."""
    if not getattr(args, "timeline", None):
        return []
    from .plan.stream import stream_plan

    return [_report("figure").stream_figure(stream_plan(p), args.timeline, None, _plan_title(p, args))]


def _report(name: str):
    import importlib

    return importlib.import_module(f".report.{name}", __package__)


def _figures(args, draw) -> dict:
    """Write the pictures --png / --svg ask for with ``draw(path, fmt)``: ``{"pictures": [...]}``."""
    done = [draw(path, fmt) for fmt, path in (("png", getattr(args, "png", None)), ("svg", getattr(args, "svg", None)))
            if path]
    return {"pictures": done} if done else {}


def _plan_title(p, args) -> str:
    source = (getattr(args, "hf", None) or getattr(args, "module", None) or getattr(args, "export", None)
              or getattr(args, "program", None)
              or getattr(args, "model", "program"))
    return f"plan of {source} ({len(p.program.ops)} ops) on mesh {p.mesh}" + (
        f", style {args.style}" if getattr(args, "style", None) else "")


def _print_streams(p) -> None:
    """The collectives a stream overlaps with matmuls (plan.stream), when any pays."""
    from .plan.estimate import check_flop_rate
    from .plan.stream import stream_plan

    sp = stream_plan(p)
    if not sp.choices:
        return
    rate = check_flop_rate(p.flop_rate) / 1e12
    print(f"step (forward, at {rate:.3g} TFLOP/s): ~{sp.serial_seconds * 1e6:.1f} µs serial, "
          f"~{sp.overlapped_seconds * 1e6:.1f} µs with {len(sp.choices)} stream overlap(s):")
    for c in sp.choices:
        kinds = "+".join(c.kinds) or "move"
        what = "feeds" if c.side == "before" else "takes the output of"
        style = f" (ring: {c.chunks - 1} send/recv steps)" if c.style == "ring" else ""
        print(f"  {c.chunks:>2} chunks {c.text}{style}: the {kinds} of {c.tensor} {what} {', '.join(c.ops)} "
              f"({c.serial * 1e6:.1f} -> {c.overlapped * 1e6:.1f} µs)")


def _print_ragged(p) -> None:
    """One line per routing: its experts, the expected and the most rows per expert, and the
    largest piece of a tensor of it a device holds."""
    by_routing: dict = {}
    for n, info in p.ragged_rows().items():
        by_routing.setdefault(info["counts"], []).append((n, info))
    for key, items in by_routing.items():
        first = items[0][1]
        n, big = max(items, key=lambda item: item[1]["max_rows_per_device"])
        print(f"ragged: {first['components']} experts x rows from {key}: expected {first['expected']} rows per "
              f"expert, at most {first['maximum']}; largest piece {n} {big['sharding']}: expected "
              f"{big['expected_rows_per_device']} rows per device, at most {big['max_rows_per_device']}")


def print_plan(p, v, args) -> None:
    prog = p.program
    shown = [n for n in prog.tensors if prog.tensors[n].kind in ("input", "param")
             or n in prog.outputs or any(c.tensor == n for c in p.collectives)]
    source = (getattr(args, "hf", None) or getattr(args, "module", None) or getattr(args, "export", None)
              or getattr(args, "program", None)
              or getattr(args, "model", "program"))
    print(f"plan of {source} ({len(prog.ops)} ops, {len(prog.tensors)} tensors) "
          f"on mesh {p.mesh}" + (f", style {args.style}" if getattr(args, "style", None) else ""))
    print()
    if p.matched is not None:
        print_matched(p.matched, args)
    w = max(len(n) for n in shown)
    shapes = {n: _shape_cell(prog, n) for n in shown[: args.max_rows]}
    sw = max([14] + [len(x) for x in shapes.values()])
    print(f"{'tensor'.ljust(w)}  {'shape':<{sw}} sharding")
    for n in shown[: args.max_rows]:
        r = prog.tensors[n].ragged
        print(f"{n.ljust(w)}  {shapes[n]:<{sw}} {p.shardings[n] if r is None else ragged_text(p.shardings[n], r)}")
    if len(shown) > args.max_rows:
        print(f"... {len(shown) - args.max_rows} more (--json lists every tensor)")
    print()
    if p.collectives:
        print(f"{'collective':<16}{'axes':<8}{'bytes':>8}{'µs':>8}  tensor (op)")
        for c in p.collectives:
            print(f"{c.kind.value:<16}{c.axes_text():<8}{c.bytes:>8}{p.seconds(c) * 1e6:>8.1f}  {c.tensor} ({c.op})")
    else:
        print("no collectives: every op runs on the local pieces as they are")
    counts = ", ".join(f"{n} x {k} on {','.join(a)}" for (k, a), n in sorted(p.counts().items()))
    print()
    print(f"total: {len(p.collectives)} collectives ({counts or 'none'}), {p.total_bytes} bytes, "
          f"~{p.total_seconds * 1e6:.1f} µs estimated; planned in {p.plan_seconds * 1e3:.1f} ms")
    _print_streams(p)
    _print_ragged(p)
    if prog.symbols:
        print(f"guards: {', '.join(str(g) for g in p.guards) or 'none'}")
    if v is not None:
        if v.ok and v.mode == "full":
            print(f"verified: every rank simulated in numpy; all {v.checked} tensors equal the unsharded run")
            for note in v.notes:
                print(f"  {note}")
        elif v.ok:
            how = "proven at the index level for every rank" if v.proven else \
                f"proven for every rank except {len(v.unproven)} op(s) checked numerically only"
            print(f"verified: all {v.checked} tensors {how}; {v.simulated} local runs of {v.classes} rank classes "
                  f"({v.ops} distinct ops, {v.collectives} distinct collectives) equal the unsharded values")
            for note in v.notes:
                if note.startswith(("ragged", "streams", "repeated")):
                    print(f"  {note}")
        elif getattr(v, "reason", "") in ("decisions", "error"):  # at other sizes (plan.guards.verify_sizes)
            print(f"NOT verified: {v.first_mismatch}")
        else:
            print(f"NOT verified: {v.first_mismatch} differs (max error {v.max_error:.3g})")
        if getattr(v, "bindings", None):
            print(f"sizes verified: {v.bindings_text()}")


def _shape_cell(prog, name: str) -> str:
    """A tensor's shape for the table: symbolic extents by their expressions, ``(batch, seq, 64)``."""
    shape = prog.sym_shape(name)
    if not prog.symbols or shape == prog.tensors[name].shape:
        return str(prog.tensors[name].shape)
    return "(" + ", ".join(str(x) for x in shape) + ("," if len(shape) == 1 else "") + ")"


def print_matched(matched: list, args, limit: int = 12) -> None:
    """The blocks the style / TP plan found, one line each (the first ``limit``)."""
    from collections import Counter

    what = " and ".join(x for x in (f"style {args.style}" if getattr(args, "style", None) else "",
                                    "--tp-plan" if getattr(args, "tp_plan", None) else "") if x)
    kinds = Counter(m["kind"] for m in matched)
    print(f"{what} matched " + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "nothing") + ":")
    for m in matched[:limit]:
        pre = m["block"] + "." if m["block"] else ""
        names = [n[len(pre):] if pre and n.startswith(pre) else n for n in m["tensors"]]
        whole = f" (kept whole: {m['whole']})" if "whole" in m else ""
        print(f"  {m['kind']:<10} {m['block'] or '(root)'}: {', '.join(names)}{whole}")
    if len(matched) > limit:
        print(f"  ... {len(matched) - limit} more (--json lists every one)")
    whole = [m for m in matched[limit:] if "whole" in m]
    if whole:
        print(f"  {len(whole)} more kept whole on every rank, as {whole[0]['block']}: {whole[0]['whole']}")
    print()


def _add_sharding_args(p) -> None:
    p.add_argument("--mesh", required=True, help="mesh axes, e.g. dp=2,tp=4")
    p.add_argument("--shape", help="global shape, e.g. 8,12")
    p.add_argument("--sharding", help="our notation, e.g. '[dp*4, tp*3]'")
    p.add_argument("--placements", help="DTensor placements, e.g. 'S(0),SS(1,2)' or 'R,P(sum)'")
    p.add_argument("--partition-spec", help="JAX PartitionSpec entries, e.g. \"('dp','tp'),None\"")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_demo(args) -> int:
    """Plan and verify the built-in Llama block on dp=2,tp=4 with megatron-sp."""
    import argparse

    ns = argparse.Namespace(model="llama", program=None, layers=2, mesh="dp=2,tp=4", style="megatron-sp",
                            pin=None, max_rows=24)
    print("shardlayout demo: a 2-layer Llama block on mesh dp=2,tp=4, Megatron tensor + sequence parallel\n")
    p = jobs.build_plan(ns)
    v = p.verify(mode="full")
    print_plan(p, v, ns)
    print("\nThe same with --style megatron gives exactly 4 all-reduces on tp; try:")
    print("  shardlayout plan --style megatron --verify     shardlayout show --mesh dp=2,tp=4 --shape 8,12 "
          "--placements 'S(0),S(1)'")
    print("  shardlayout view ... --to 16,6                 shardlayout explain mm --mesh ... --inputs ...")
    print("  shardlayout run --mesh dp=2,tp=2 --style megatron-sp --train   (the plan on torch.distributed, gloo)")
    return 0 if v.ok else 1


def cmd_run(args) -> int:
    """Run the plan on torch.distributed (forward) and compare with the unsharded run."""

    from .mesh import Mesh

    opts = {k: v for k, v in vars(args).items() if k != "func"}
    opts["streams"] = not opts.pop("no_streams", False)
    _need_torch("run")
    mesh = Mesh.parse(args.mesh)
    if not args.timeout > 0 or args.timeout == float("inf"):  # also refuses nan
        raise ShardingError(f"--timeout {args.timeout}: give a positive, finite number of seconds")
    if args.repeat < 0:
        raise ShardingError(f"--repeat {args.repeat}: give 0 or more steps to time")
    if not 0 <= args.seed < 2**64:
        raise ShardingError(f"--seed {args.seed}: give an int >= 0 (torch seeds are 0 to 2**64-1)")
    _check_steps(args)
    if args.steps:
        return _cmd_train(args, opts, mesh)
    from .run import rank_main
    from .run.launch import check_trainable, rank_plan

    report, code = _on_ranks(args, opts, mesh, lambda rank, world: rank_main(
        rank, world, lambda: rank_plan(args), opts), lambda: check_trainable(jobs.build_plan(args), args.train),
        "running")
    if report is None:
        return code
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(f"ran {report['ranks']} ranks on mesh {report['mesh']} ({report['backend']}) in "
              f"{report['seconds']:.2f} s")
        print(f"collectives executed on rank 0: {report['collectives'] or 'none'}; planned: "
              f"{report['planned_collectives'] or 'none'}")
        if report.get("streams"):
            print(f"streams: {len(report['streams'])} overlap(s) run chunk by chunk ("
                  + ", ".join(f"{st['tensor']} x{st['chunks']}" for st in report["streams"]) + ")"
                  + (f"; whole: {report['streams_whole']}" if report.get("streams_whole") else ""))
        elif report.get("streams_whole"):
            print(f"streams: run whole ({report['streams_whole']})")
        if report.get("step_seconds"):
            st = report["step_seconds"]
            print(f"steady state: {st['median'] * 1e3:.2f} ms per {'training ' if args.train else ''}step "
                  f"(median of {st['steps']}, {st['min'] * 1e3:.2f}-{st['max'] * 1e3:.2f} ms)")
        if report["grads_max_abs_err"] is not None:
            print(f"gradients and updated parameters: max abs error {report['grads_max_abs_err']:.2e}")
        verdict = "equal to" if report["equal"] else "NOT equal to"
        half = str(report.get("tolerance", "")).startswith(("bfloat16", "float16"))
        print(f"{verdict} the unsharded run: {report['tensors_compared']} tensors compared on every rank, "
              f"max abs error {report['max_abs_err']:.2e}, relative to each tensor's scale "
              f"{report['max_rel_err']:.1e}" + (f" (the program computes in {report['tolerance']})" if half else ""))
    return 0 if report["equal"] else 1


def _on_ranks(args, opts: dict, mesh, rank_job, check, what: str, job=None) -> tuple:
    """Run a job on every rank: under torchrun this process is one rank (``rank_job(rank, world)``);
    from a shell ``check()`` refuses bad input once, before any rank starts, then ``launch`` starts
    the ranks running ``job`` (its module-level rank function; default ``rank_main``).
    ``(rank 0's report, None)``, or ``(None, exit code)`` on the other ranks and when the run
    failed (a rank died, a timeout: exit 1, not 2)."""
    import os

    from .run import RunError, launch

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        report = rank_job(rank, world)
        return (report, None) if rank == 0 else (None, 0)
    nproc = mesh.size if args.nproc is None else args.nproc
    if nproc != mesh.size:
        raise ShardingError(f"--nproc {nproc}: the mesh {mesh} has {mesh.size} devices; one rank per device")
    check()
    try:
        with _report("progress").task(f"{what} on {nproc} ranks"):
            return launch(opts, nproc, job), None
    except RunError as e:
        print(f"shardlayout: error: {e}", file=sys.stderr)
        return None, 1


def _check_steps(args) -> None:
    """``--steps`` and its companions, checked before any rank starts."""
    given = [f"--{n}" for n in ("optimizer", "lr", "checkpoint", "weights") if getattr(args, n) is not None] + \
        [f"--{n}" for n in ("compile", "resume") if getattr(args, n)]
    if args.steps is None and args.train and given:  # `run --train --checkpoint DIR`: one step through parallelize
        args.steps = 1
    if args.steps is None:
        if given:
            one = len(given) == 1
            raise ShardingError(f"{', '.join(given)} {'is' if one else 'are'} for --steps N (training through "
                                f"parallelize): add --steps, or drop {'it' if one else 'them'}")
        return
    if args.steps < 1 or args.steps > 100000:
        raise ShardingError(f"--steps {args.steps}: give a number of training steps from 1 to 100000")
    if args.resume and not args.checkpoint:
        raise ShardingError("--resume loads from --checkpoint DIR: give the directory")
    if args.resume and args.weights:
        raise ShardingError("--resume and --weights both say where the weights come from: give one")
    if args.weights is not None:
        from .run.weights import check_header, weight_files

        for path in weight_files(args.weights):  # exist and are safetensors, before any rank starts
            check_header(path)
    if args.checkpoint is not None and not args.checkpoint.strip():
        raise ShardingError("--checkpoint '': give a directory")
    if args.lr is not None and not (0 < args.lr < float("inf")):
        raise ShardingError(f"--lr {args.lr}: give a positive, finite learning rate")
    if args.repeat:
        raise ShardingError("--repeat times the interpreter's steps; with --steps every step is timed already "
                            "(step_seconds): drop --repeat")


def _cmd_train(args, opts: dict, mesh) -> int:
    """``run --steps N``: train through parallelize on every rank, compared with the unsharded model."""

    from .run.launch import check_trainable
    from .run.train import check_checkpoint, train_rank

    def check():
        plan = jobs.build_plan(args)
        check_trainable(plan, True)
        if args.resume:
            prog = plan.program
            check_checkpoint(args.checkpoint, {n: prog.tensors[n].shape for n in prog.inputs("param")}, exact=False)

    opts["train"] = True
    report, code = _on_ranks(args, opts, mesh, lambda rank, world: train_rank(rank, world, opts), check,
                             f"training {args.steps} step(s)", train_rank)
    if report is None:
        return code
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0 if report["equal"] else 1
    st = report["step_seconds"]
    print(f"trained {report['steps']} step(s) ({report['optimizer']}{', compiled' if report['compile'] else ''}) on "
          f"{report['ranks']} ranks, mesh {report['mesh']} ({report['backend']}) in {report['seconds']:.2f} s")
    for i, (a, b) in enumerate(zip(report["losses"], report["reference_losses"]), 1):
        print(f"  step {i:>3}: loss {a:.10g}   unsharded {b:.10g}")
    if report.get("weights"):
        w = report["weights"]
        print(f"weights: {w['tensors']} tensors from {args.weights}; rank 0 read {w['bytes_read'] / 2**20:.2f} of "
              f"{w['bytes_total'] / 2**20:.2f} MiB")
    ck = report.get("checkpoint") or {}
    if ck.get("loaded"):
        print(f"resumed from {ck['loaded']['path']} after {ck['loaded']['steps']} step(s): "
              f"{ck['loaded']['tensors']} tensors and their optimizer state, resharded to this plan")
    if ck.get("saved"):
        print(f"saved {ck['saved']['tensors']} tensors and their optimizer state to {ck['saved']['path']} "
              f"(torch.distributed.checkpoint; {ck['saved']['steps']} step(s) trained)")
    if report["collectives"]:
        print(f"collectives of step 1 (counted at the dispatcher): {report['collectives']}; planned: "
              f"{report['planned_collectives']}")
    print(f"step time {st['median'] * 1e3:.2f} ms (median of {st['steps']}; first step "
          f"{report['first_step_seconds']:.2f} s{' with compilation' if report['compile'] else ''})")
    verdict = "equal to" if report["equal"] else "NOT equal to"
    print(f"{verdict} the unsharded model: losses within {report['max_loss_rel_err']:.1e}, updated parameters "
          f"within {report['max_param_rel_err']:.1e} relative ({report['tolerance']})")
    if report.get("param_elements_skipped"):
        print(f"({report['param_elements_skipped']} parameter element(s) not compared: the unsharded model's own "
              "float32 gradient there is off its float64 value by more than AdamW's step lets the check tell apart)")
    if report.get("float64_reference_missing"):
        print(f"(no float64 run of the unsharded model to tell its own float32 rounding apart: "
              f"{report['float64_reference_missing']}; every parameter element compared)")
    return 0 if report["equal"] else 1


def cmd_export(args) -> int:
    """Per parameter, the plan's sharding as DTensor placements or a JAX PartitionSpec."""
    with _report("progress").task(f"planning on mesh {args.mesh}"):
        p = jobs.build_plan(args)
    entries = p.to_dtensor() if args.to == "dtensor" else p.to_partition_specs()
    data = {"target": args.to, "mesh": {"names": list(p.mesh.names), "shape": list(p.mesh.shape)},
            "tensors": entries}
    if args.json:
        print(json.dumps(data, sort_keys=True))
        return 0
    key = "placements" if args.to == "dtensor" else "partition_spec"
    print(f"{args.to} export of the plan on mesh {p.mesh} (mesh dims {', '.join(p.mesh.names)})")
    w = max((len(n) for n in entries), default=6)
    for name, e in entries.items():
        what = json.dumps(e[key]) if key in e else f"not representable: {e['not_representable']}"
        print(f"  {name.ljust(w)}  {str(tuple(e['shape'])):<14} {what}")
    return 0


def _add_model_args(pl) -> None:
    pl.add_argument("--model", default="llama", help="built-in model: llama, moe (routed experts) or moe-dense")
    pl.add_argument("--program", help="a program JSON file instead of a built-in model")
    pl.add_argument("--module", help="pkg.mod:factory returning (torch module, example args); via torch.export")
    pl.add_argument("--export", help="a torch.export .pt2 file")
    pl.add_argument("--hf", metavar="CONFIG", help="a Hugging Face transformers config.json (or a directory holding "
                    "one, or a cached model id): its causal-LM class built on the meta device, no weights; example "
                    "input_ids of --size batch=B,seq=S (default: one sequence per dp x ep rank, 128 tokens or "
                    "the model's max_position_embeddings)")
    pl.add_argument("--layers", type=int, default=None, help="the built-in llama's layers (default 2)")
    pl.add_argument("--size", metavar="KEY=N,...", help="a built-in model's sizes, e.g. dim=4096,seq=4096,batch=1,"
                    "heads=32,ffn=11008 (llama) or tokens=...,experts=... (moe)")
    pl.add_argument("--mesh", default="dp=2,tp=4")
    pl.add_argument("--style", choices=["dp", "megatron", "megatron-sp", "fsdp", "ep", "auto"], default=None,
                    help="pins found by graph structure (attention/MLP blocks, embeddings, norms, heads, experts)")
    pl.add_argument("--tp-plan", help="a torchtitan-style TP plan JSON: {\"layers.*.attention.wq\": \"colwise\", ...}")
    pl.add_argument("--allow-unmatched", action="store_true",
                    help="plan even when the style or a --tp-plan pattern matches nothing")
    pl.add_argument("--pin", action="append", help="name=SHARDING pins any tensor (repeatable)")
    pl.add_argument("--dynamic", metavar="INPUT:DIM=SYMBOL,...",
                    help="--module: export these dims dynamic, e.g. 'x:0=batch,x:1=seq' (INPUT: a forward argument's "
                         "name or position); the plan is made at the example sizes and states its guards")
    pl.add_argument("--uneven", action="store_true",
                    help="a symbolic program's plan claims sizes that do not divide too (uneven shards, as "
                         "torch.chunk cuts): its guards say E >= P instead of E %% P == 0")
    pl.add_argument("--memory", help="--style auto: memory per device, e.g. 80GiB, 512MiB, 40KiB")
    pl.add_argument("--flop-rate", type=float, help="FLOP/s of one device for compute estimates: --style auto's "
                    "search and the stream overlaps (default 1e14)")
    pl.add_argument("--training", choices=["adam", "momentum", "sgd", "inference"], default=None,
                    help="--style auto: optimizer state kept per parameter, and whether a backward runs "
                         "(default adam)")


def _add_ring_arg(p) -> None:
    p.add_argument("--ring", action="store_true",
                   help="stream overlaps may also be ring-style (chunk j = rank j's shard, k-1 send/recv steps to "
                        "the next rank): planned, priced, verified, and run step by step on torch.distributed")


def _add_picture_args(p, what: str) -> None:
    p.add_argument("--png", metavar="FILE", help=f"also write a picture ({what}) as PNG (needs matplotlib)")
    p.add_argument("--svg", metavar="FILE", help=f"also write a picture ({what}) as SVG (needs matplotlib)")


def _ascii_int(text: str) -> int:
    """argparse's ``type=int``, ASCII digits only (Python's int() reads '２' as 2)."""
    if not text.strip().isascii() or len(text.strip()) > 19:
        raise ValueError(text)
    return int(text)


def _ascii_float(text: str) -> float:
    if not text.strip().isascii():
        raise ValueError(text)
    return float(text)


_ascii_int.__name__, _ascii_float.__name__ = "int", "float"  # argparse names the type in its message
_USAGE_ERROR: list = []


class _Parser(argparse.ArgumentParser):
    """argparse with ASCII-only ints and floats, and usage errors as one line (exit 2)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.register("type", int, _ascii_int)
        self.register("type", float, _ascii_float)

    def error(self, message):
        _USAGE_ERROR[:] = [message]
        self.exit(2, f"shardlayout: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = _Parser(prog="shardlayout", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"shardlayout {__version__}")
    p.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="show the main job on the built-in default example")
    d.set_defaults(func=cmd_demo)
    sh = sub.add_parser("show", help="a sharding in every notation, with a picture of who holds what")
    _add_sharding_args(sh)
    _add_picture_args(sh, "who holds what")
    sh.set_defaults(func=cmd_show)
    vw = sub.add_parser("view", help="propagate a sharding through a view/reshape")
    _add_sharding_args(vw)
    vw.add_argument("--to", required=True, help="output shape, e.g. 16,6 (one -1 allowed)")
    vw.add_argument("--no-subaxes", action="store_true",
                    help="only outputs DTensor can express (no sub-axes; gathers instead)")
    vw.set_defaults(func=cmd_view)
    pl = sub.add_parser("plan", help="plan a whole model: every tensor's sharding and every collective")
    _add_model_args(pl)
    _add_ring_arg(pl)
    pl.add_argument("--verify", nargs="?", const="classes", choices=["classes", "full"],
                    help="prove the plan for every rank and simulate one pair per rank class (--verify=full: "
                         "simulate every rank) and compare with the unsharded run")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--max-rows", type=int, default=40, help="tensor rows to print")
    _add_picture_args(pl, "a per-layer diagram of shardings and collectives")
    pl.add_argument("--timeline", metavar="FILE", help="also draw the stream overlaps' timeline (serial vs "
                    "chunked) as PNG or SVG, by the file's extension (needs matplotlib)")
    pl.set_defaults(func=cmd_plan)
    rn = sub.add_parser("run", help="run the plan on torch.distributed (forward) and compare with the unsharded run")
    _add_model_args(rn)
    rn.add_argument("--nproc", type=int, default=None, help="ranks to start (default: the mesh size)")
    rn.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    rn.add_argument("--seed", type=int, default=0)
    rn.add_argument("--repeat", type=int, default=0,
                    help="time this many more steps after the checked one (steady state; median reported)")
    rn.add_argument("--train", action="store_true",
                    help="also backward through the planned collectives and one SGD step, compared too")
    rn.add_argument("--steps", type=int, default=None,
                    help="train this many steps through shardlayout.parallelize (DTensor parameters, the per-rank "
                         "program, a torch optimizer), each compared with the unsharded model trained alike")
    rn.add_argument("--optimizer", choices=["adamw", "sgd"], default=None, help="with --steps (default adamw)")
    rn.add_argument("--lr", type=float, default=None, help="with --steps: learning rate (adamw 1e-3, sgd 1e-2)")
    rn.add_argument("--checkpoint", default=None, metavar="DIR",
                    help="with --steps: save the model and optimizer state there after training "
                         "(torch.distributed.checkpoint; loadable under any plan or mesh, or unsharded)")
    rn.add_argument("--weights", default=None, metavar="PATH",
                    help="with --steps: start from safetensors weights (a file, or a directory of shards with "
                         "model.safetensors.index.json); each rank reads only its own pieces")
    rn.add_argument("--resume", action="store_true",
                    help="with --checkpoint: load the state from DIR before training (the unsharded reference too)")
    rn.add_argument("--compile", action="store_true",
                    help="with --steps: torch.compile(fullgraph=True) the parallel module (forward and backward)")
    rn.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="element type of the run (float64: equal to 1e-10 relative)")
    rn.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait (default 60)")
    rn.add_argument("--no-streams", action="store_true",
                    help="run the plan's stream overlaps as whole moves (default: chunk by chunk, as planned)")
    _add_ring_arg(rn)
    rn.add_argument("--json", action="store_true")
    rn.set_defaults(func=cmd_run)
    xp = sub.add_parser("export", help="the plan's parameter shardings as DTensor placements or JAX PartitionSpecs")
    _add_model_args(xp)
    xp.add_argument("--to", choices=["dtensor", "jax"], required=True)
    xp.add_argument("--json", action="store_true")
    xp.set_defaults(func=cmd_export)
    ex = sub.add_parser("explain", help="the strategy chosen for one op, the alternatives and collectives")
    ex.add_argument("op", help="op name, short or aten (mm, aten.mm.default, _softmax, ...)")
    ex.add_argument("--mesh", required=True)
    ex.add_argument("--inputs", nargs="+", required=True,
                    help="one per tensor input: '[dp*4, tp*3]' or 'SHAPE:PLACEMENTS' like '8,12:S(0),R'")
    ex.add_argument("--param", action="append", help="op parameter name=value (dim=1, equation=mk,kn->mn)")
    ex.add_argument("--top", type=int, default=8, help="candidates to list, cheapest first (default 8)")
    ex.add_argument("--all", action="store_true", help="list every candidate strategy")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=cmd_explain)
    lay = sub.add_parser("layout", help="run one CuTe layout-algebra operation")
    lay.add_argument("op", choices=LAYOUT_OPS)
    lay.add_argument("operands", nargs="+", help="layouts like '(4,2):(1,4)', ints, '_', '[..]'")
    lay.add_argument("--json", action="store_true", help="machine-readable output")
    lay.set_defaults(func=cmd_layout)
    return p


def _need_torch(what: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ShardingError(f"{what} needs torch, which is not installed: pip install 'shardlayout[torch]' "
                            "(torch==2.13.0 for the CPU build)")


def _fail(args, kind: str, message: str, code: int) -> int:
    """One line on stderr (and, with --json, an error object on stdout); never a traceback."""
    print(f"shardlayout: error: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": {"type": kind, "message": message}}))
    return code


def main(argv=None) -> int:
    """The ``shardlayout`` command: exit 0 on success, 1 when a plan, verification or run fails,
    2 for bad input or usage. ``main(["--version"])`` prints the version."""
    import warnings

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error: one line on stderr (and the error object with --json)
        if e.code == 2 and _USAGE_ERROR and "--json" in (sys.argv[1:] if argv is None else argv):
            print(json.dumps({"error": {"type": "UsageError", "message": _USAGE_ERROR[0]}}))
        raise
    try:
        with warnings.catch_warnings():
            if not args.debug:  # third-party warnings (torch.export's FutureWarnings) stay off stderr
                warnings.simplefilter("ignore")
            with _report("progress").enabled(not getattr(args, "json", False)):  # bars: a terminal, not --json
                if getattr(args, "mesh", None) is not None and not args.mesh.strip():
                    raise ShardingError("--mesh '': give the mesh axes, e.g. --mesh dp=2,tp=4 (one device: "
                                        "--mesh tp=1)")
                return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ShardingError, TypeError) as e:
        if args.debug:
            raise
        from .plan.auto import NoPlanFits

        return _fail(args, type(e).__name__, str(e), 1 if isinstance(e, NoPlanFits) else 2)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # noqa: BLE001 - a failure we did not foresee: one line, exit 1
        if args.debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        return _fail(args, type(e).__name__, f"internal error {type(e).__name__}: {msg} (rerun with --debug for "
                     "the traceback, and please report it)", 1)


if __name__ == "__main__":
    sys.exit(main())
