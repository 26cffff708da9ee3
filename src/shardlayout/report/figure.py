"""Pictures as files (matplotlib, Agg): who holds what of one sharding, and a plan layer by layer.

``sharding_figure(s, "x.png")`` draws the blocks of ``s`` (``cells.py``: computed per block from
the factors, never the whole tensor; a dim past ``MAX_FIGURE_BLOCKS`` blocks is elided) coloured
by the devices holding them, beside the mesh (1-D to 3-D) with each device in the colour of what it
holds and its local shape. ``plan_figure(p, "plan.svg")`` draws one row per op (and per program
input, where it is first read), grouped by layer (a name's first numeric part: ``layers.3``), with
its output sharding per mesh axis and the collectives it needs; a layer equal to the one before it,
up to the layer number, is folded into one line. The format comes from the file name (``.png``,
``.svg``) or ``fmt``. matplotlib is an optional extra: ``pip install 'shardlayout[plot]'``.
"""

from __future__ import annotations

import colorsys
import itertools
import os

from ..errors import ShardingError
from .cells import CellTable, cell_table

MAX_FIGURE_BLOCKS = 32  # blocks per dim drawn; the rest of the dim is one elided block
MAX_PANELS = 4  # 2-D slices drawn of a tensor of rank 3 or more
MAX_DEVICES_DRAWN = 64  # the mesh panel is drawn up to this many devices
MAX_LABELLED_CELLS = 256  # cells labelled with their holders
MAX_PLAN_ROWS = 120  # rows of a plan figure; the rest is counted
FORMATS = ("png", "svg")
KIND_COLOURS = {"all_gather": "#1f77b4", "reduce_scatter": "#ff7f0e", "all_reduce": "#d62728",
                "all_to_all": "#9467bd", "permute": "#8c564b"}


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or a one-line error naming the install."""
    try:
        import matplotlib
    except ImportError:
        raise ShardingError("pictures (--png, --svg) need matplotlib, which is not installed: "
                            "pip install 'shardlayout[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _format(path: str, fmt: str | None) -> str:
    fmt = (fmt or os.path.splitext(str(path))[1].lstrip(".") or "png").lower()
    if fmt not in FORMATS:
        raise ShardingError(f"picture {path!r}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def _save(fig, path: str, fmt: str) -> str:
    plt = _pyplot()
    try:
        fig.savefig(path, format=fmt, dpi=110, bbox_inches="tight")
    except OSError as e:
        raise ShardingError(f"picture {path!r}: cannot write it: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return str(path)


def _colour(i: int) -> tuple:
    """The i-th of a sequence of distinct, light colours (tab20's first, then golden-ratio hues)."""
    tab = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
           "#9edae5", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf"]
    if i < len(tab):
        return tab[i]
    r, g, b = colorsys.hls_to_rgb((i * 0.618033988749895) % 1.0, 0.72, 0.6)
    return (r, g, b)


# ------------------------------------------------------------------------------------------
# one sharding
# ------------------------------------------------------------------------------------------


class _Palette:
    """A colour per holder set (a cell's constraint), in order of first appearance; grey for all."""

    def __init__(self):
        self.index: dict = {}

    def __call__(self, constraint: tuple):
        if not constraint:
            return "#e0e0e0"
        key = tuple(sorted(constraint))
        if key not in self.index:
            self.index[key] = len(self.index)
        return _colour(self.index[key])


def _extents(d, floor: float = 0.04) -> list:
    """Widths of the blocks of one dim (proportional to their sizes, none thinner than
    ``floor``) and an elided block when the dim goes on."""
    sizes = [b.hi - b.lo for b in d.blocks]
    total = sum(sizes) or 1
    w = [max(x / total, floor) for x in sizes]
    if not d.complete:
        w.append(max(0.1, floor) * sum(w))
    s = sum(w)
    return [x / s for x in w]


def _ticks(d, widths: list, max_ticks: int = 12) -> tuple:
    pos, labels, x = [], [], 0.0
    for b, w in zip(d.blocks, widths):
        pos.append(x)
        labels.append(str(b.lo))
        x += w
    if d.complete:
        pos.append(1.0)
        labels.append(str(d.size))
    if len(pos) > max_ticks:
        step = -(-len(pos) // max_ticks)
        last = len(pos) - 1
        keep = {i for i in range(0, last, step) if last - i > step // 2} | {last}
        pos = [p for i, p in enumerate(pos) if i in keep]
        labels = [x for i, x in enumerate(labels) if i in keep]
    return pos, labels


def _draw_grid(ax, t: CellTable, lead: tuple, palette: _Palette, title: str) -> None:
    from matplotlib.patches import Rectangle

    nd = len(t.dims)
    rdim = t.dims[-2] if nd >= 2 else None
    cdim = t.dims[-1] if nd >= 1 else None
    rw = _extents(rdim) if rdim else [1.0]
    cw = _extents(cdim) if cdim else [1.0]
    nrows = len(rdim.blocks) if rdim else 1
    ncols = len(cdim.blocks) if cdim else 1
    cells = [lead + ((i,) if rdim else ()) + ((j,) if cdim else ()) for i in range(nrows) for j in range(ncols)]
    labels = t.labels(cells, width=16) if len(cells) <= MAX_LABELLED_CELLS else {}
    y = 0.0
    for i in range(nrows):
        x = 0.0
        for j in range(ncols):
            cell = lead + ((i,) if rdim else ()) + ((j,) if cdim else ())
            ax.add_patch(Rectangle((x, y), cw[j], rw[i], facecolor=palette(t.constraint(cell)),
                                   edgecolor="white", linewidth=0.8))
            if cell in labels:
                size = max(4.0, min(9.0, 300 * min(cw[j], rw[i] * 0.5) / max(len(labels[cell]), 1)))
                ax.text(x + cw[j] / 2, y + rw[i] / 2, labels[cell], ha="center", va="center", fontsize=size)
            x += cw[j]
        y += rw[i]
    hatch = {"facecolor": "#f4f4f4", "edgecolor": "#999999", "hatch": "//", "linewidth": 0.5}
    if cdim is not None and not cdim.complete:
        ax.add_patch(Rectangle((1 - cw[-1], 0), cw[-1], 1, **hatch))
        ax.text(1 - cw[-1] / 2, 0.5, f"{cdim.shown}:{cdim.size}\nelided", ha="center", va="center",
                fontsize=6, rotation=90)
    if rdim is not None and not rdim.complete:
        ax.add_patch(Rectangle((0, 1 - rw[-1]), 1, rw[-1], **hatch))
        ax.text(0.5, 1 - rw[-1] / 2, f"rows {rdim.shown}:{rdim.size} elided", ha="center", va="center", fontsize=6)
    ax.set_xlim(0, 1)
    ax.set_ylim(1, 0)
    if cdim is not None:
        pos, lab = _ticks(cdim, cw)
        ax.set_xticks(pos, lab, fontsize=7)
        ax.set_xlabel(f"dim {nd - 1} (size {cdim.size})", fontsize=8)
    else:
        ax.set_xticks([])
    if rdim is not None:
        pos, lab = _ticks(rdim, rw)
        ax.set_yticks(pos, lab, fontsize=7)
        ax.set_ylabel(f"dim {nd - 2} (size {rdim.size})", fontsize=8)
    else:
        ax.set_yticks([])
    ax.set_title(title, fontsize=8)


def _draw_mesh(ax, t: CellTable, palette: _Palette) -> None:
    """Each device in the colour of the blocks it holds (one colour per device: a device holds
    exactly the cells whose digits are its own), with its rank, coordinate and local shape."""
    from matplotlib.patches import Rectangle

    s, mesh = t.sharding, t.mesh
    cols = mesh.shape[-1] if mesh.ndim else 1
    rows = mesh.size // cols
    for r in range(mesh.size):
        i, j = divmod(r, cols)
        cells = t.device_cells(r)
        colour = palette(t.constraint(cells[0])) if cells else "white"
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="#555555", linewidth=0.6))
        coord = ",".join(str(c) for c in mesh.coord(r))
        local = "x".join(str(n) for n in s.local_shape(r)) or "()"
        ax.text(j + 0.5, i + 0.5, f"{r}\n({coord})\n{local}", ha="center", va="center",
                fontsize=max(4.0, 8.0 - 0.5 * max(rows, cols) ** 0.5 * 2))
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal")
    names = ",".join(mesh.names)
    lead = ",".join(mesh.names[:-1])
    ax.set_title(f"mesh {mesh} ({mesh.size} devices): rank, ({names}), local shape"
                 + (f"\nrows: {lead}; columns: {mesh.names[-1]}" if mesh.ndim > 1 else ""), fontsize=8)


def sharding_figure(s, path: str, fmt: str | None = None, table: CellTable | None = None) -> str:
    """Write a picture of ``s`` to ``path`` (PNG or SVG): its blocks coloured by their holders,
    and the mesh with each device in the colour of what it holds. Returns ``path``."""
    fmt = _format(path, fmt)
    plt = _pyplot()
    t = table or cell_table(s, MAX_FIGURE_BLOCKS)
    lead_dims = t.dims[:-2]
    leads = list(itertools.islice(itertools.product(*(range(len(d.blocks)) for d in lead_dims)), MAX_PANELS + 1))
    shown = leads[:MAX_PANELS]
    with_mesh = s.mesh.size <= MAX_DEVICES_DRAWN
    n = len(shown) + with_mesh
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n + 0.6, 4.4), squeeze=False)
    palette = _Palette()
    for ax, lead in zip(axes[0], shown):
        where = ""
        if lead:
            where = "[" + ", ".join(
                f"{b.lo}" if b.hi == b.lo + 1 else f"{b.lo}..{b.hi - 1}"
                for b in (lead_dims[d].blocks[i] for d, i in enumerate(lead))) + ", :, :]"
        _draw_grid(ax, t, lead, palette, f"{where} cells: devices holding the block".strip())
    if with_mesh:
        _draw_mesh(axes[0][-1], t, palette)
    notes = []
    if len(leads) > MAX_PANELS or not all(d.complete for d in lead_dims):
        notes.append(f"first {MAX_PANELS} slices of the leading dims shown")
    if not with_mesh:
        notes.append(f"mesh of {s.mesh.size} devices not drawn (over {MAX_DEVICES_DRAWN})")
    if s.partial:
        notes.append("partial on " + ", ".join(f"{a} ({op})" for a, op in s.partial)
                     + ": every holder has a partial value")
    fig.suptitle(f"{s}   shape {tuple(s.shape)}   mesh {s.mesh}" + ("\n" + "; ".join(notes) if notes else ""),
                 fontsize=9)
    fig.tight_layout()
    return _save(fig, path, fmt)


# ------------------------------------------------------------------------------------------
# a plan
# ------------------------------------------------------------------------------------------


def _layer_of(name: str) -> tuple:
    """``("layers.3", "attn.q")`` for ``layers.3.attn.q``; ``("", name)`` without a numeric part."""
    parts = str(name).split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[: i + 1]), ".".join(parts[i + 1:])
    return "", str(name)


def plan_rows(p) -> list:
    """The rows of ``plan_figure``: per layer ``(layer, rows)``, each row ``(name, what, sharding,
    collectives)``, program inputs placed before their first reader, in program order."""
    prog = p.program
    first_reader: dict = {}
    produced = {o for op in prog.ops for o in op.outputs}
    for k, op in enumerate(prog.ops):
        for i in op.inputs:
            if isinstance(i, str) and i not in first_reader and i not in produced:
                first_reader[i] = k
    by_op: dict = {}
    for c in p.collectives:
        by_op.setdefault(c.op, []).append(c)
    groups: list = []
    shared = [i for i in first_reader if not _layer_of(i)[0]]  # inputs of no layer: drawn first
    if shared and any(_layer_of(op.name)[0] for op in prog.ops):
        groups.append(("inputs", [(i, prog.tensors[i].kind, p.shardings[i], ()) for i in shared]))
    else:
        shared = []
    for k, (op, pop) in enumerate(zip(prog.ops, p.ops)):
        layer, rel = _layer_of(op.name)
        if not groups or groups[-1][0] != layer:
            groups.append((layer, []))
        rows = groups[-1][1]
        for i in op.inputs:
            if isinstance(i, str) and first_reader.get(i) == k and i not in shared:
                lay, rel_i = _layer_of(i)
                rows.append((rel_i if lay == layer else i, prog.tensors[i].kind, p.shardings[i], ()))
        out = p.shardings.get(op.outputs[0]) if op.outputs else None
        rows.append((rel, op.target, out, tuple(by_op.get(pop.name, ()))))
    return groups


def _signature(rows) -> tuple:
    return tuple((name, what, str(s), tuple((c.kind.value, c.axes_text(), c.bytes) for c in cs))
                 for name, what, s, cs in rows)


def _fold(groups: list) -> list:
    """Consecutive layers equal to the first of their run, up to the layer number, folded:
    ``[(layer, rows, repeats)]``."""
    out: list = []
    for layer, rows in groups:
        if out and layer and out[-1][0] and _signature(rows) == out[-1][3]:
            out[-1][2].append(layer)
            continue
        out.append([layer, rows, [], _signature(rows)])
    return [(layer, rows, reps) for layer, rows, reps, _ in out]


def plan_figure(p, path: str, fmt: str | None = None, title: str | None = None) -> str:
    """Write a per-layer diagram of plan ``p`` to ``path`` (PNG or SVG): one row per op and per
    program input, its output sharding per mesh axis (the tensor dim each axis shards, P for a
    partial axis) and in text, and the collectives the op needs with their bytes and cost."""
    from matplotlib.patches import Patch, Rectangle

    fmt = _format(path, fmt)
    plt = _pyplot()
    mesh = p.mesh
    lines: list = []  # ("layer", text) | ("row", row) | ("note", text)
    for layer, rows, reps in _fold(plan_rows(p)):
        if layer:
            lines.append(("layer", layer))
        lines.extend(("row", r) for r in rows)
        if reps:
            span = reps[0] if len(reps) == 1 else f"{reps[0]} .. {reps[-1]}"
            lines.append(("note", f"{span}: the same as {layer} ({len(reps)} more layer{'s' * (len(reps) > 1)})"))
    hidden = max(0, len(lines) - MAX_PLAN_ROWS)
    lines = lines[:MAX_PLAN_ROWS]
    if hidden:
        lines.append(("note", f"... {hidden} more rows (the text and --json output list every tensor)"))
    n = len(lines)
    fig = plt.figure(figsize=(15, 1.4 + 0.19 * n))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.98 - 1.0 / (1.4 + 0.19 * n)))
    ax.set_xlim(0, 100)
    ax.set_ylim(n + 0.5, -1.2)
    ax.axis("off")
    lane0, lane_w = 34.0, 3.0
    x_sh = lane0 + lane_w * mesh.ndim + 1
    x_coll = x_sh + 26
    heads = [(0, "op / tensor"), (20, "op"), (x_sh, "output sharding"),
             (x_coll, "collectives (bytes moved per device, estimated time)")]
    for x, h in heads:
        ax.text(x, -0.6, h, fontsize=7, fontweight="bold", va="center")
    for a, name in enumerate(mesh.names):
        ax.text(lane0 + lane_w * (a + 0.5), -0.6, name, fontsize=7, fontweight="bold", ha="center", va="center")
    lanes = ["#8dd3c7", "#bebada", "#fdb462", "#b3de69", "#fccde5", "#80b1d3", "#ffffb3", "#d9d9d9"]
    axis_colour = {name: lanes[a % len(lanes)] for a, name in enumerate(mesh.names)}
    for y, (kind, item) in enumerate(lines):
        if kind == "layer":
            ax.axhline(y - 0.5, color="#bbbbbb", linewidth=0.5)
            ax.text(0, y, item, fontsize=7, fontweight="bold", va="center")
            continue
        if kind == "note":
            ax.text(2, y, item, fontsize=7, style="italic", va="center", color="#555555")
            continue
        name, what, s, colls = item
        ax.text(1.5, y, name[:40], fontsize=6.5, va="center", family="monospace")
        ax.text(20, y, str(what)[:28], fontsize=6.5, va="center", family="monospace",
                color="#777777" if what in ("input", "param", "buffer") else "black")
        if s is not None:
            partial = dict(s.partial)
            used = {f.axis: d for d, fs in enumerate(s.dims) for f in fs if f.axis}
            for a, axis in enumerate(mesh.names):
                x = lane0 + lane_w * a + 0.3
                if axis in used:
                    ax.add_patch(Rectangle((x, y - 0.4), lane_w - 0.6, 0.8, facecolor=axis_colour[axis],
                                           edgecolor="none"))
                    ax.text(x + (lane_w - 0.6) / 2, y, f"d{used[axis]}", fontsize=6, ha="center", va="center")
                elif axis in partial:
                    ax.add_patch(Rectangle((x, y - 0.4), lane_w - 0.6, 0.8, facecolor="white", hatch="////",
                                           edgecolor=axis_colour[axis], linewidth=0.6))
                    ax.text(x + (lane_w - 0.6) / 2, y, "P", fontsize=6, ha="center", va="center")
                else:
                    ax.add_patch(Rectangle((x, y - 0.4), lane_w - 0.6, 0.8, facecolor="#f2f2f2", edgecolor="none"))
            ax.text(x_sh, y, str(s)[:44], fontsize=6.5, va="center", family="monospace")
        text_x = x_coll
        for c in colls[:3]:
            col = KIND_COLOURS.get(c.kind.value, "black")
            ax.plot([text_x + 0.4], [y], marker="o", markersize=4, color=col)
            label = f"{c.kind.value} on {c.axes_text()}: {c.bytes} B, {p.seconds(c) * 1e6:.1f} µs"
            ax.text(text_x + 1.2, y, label, fontsize=6, va="center", color=col)
            text_x += 1.6 + 0.62 * len(label)
        if len(colls) > 3:
            ax.text(text_x, y, f"+{len(colls) - 3}", fontsize=6, va="center")
    handles = [Patch(facecolor=c, label=k) for k, c in KIND_COLOURS.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=6, ncol=len(handles), frameon=False,
              bbox_to_anchor=(1.0, 1.0 + 0.9 / (n + 1.7)))
    counts = ", ".join(f"{k} x {kind} on {','.join(a)}" for (kind, a), k in sorted(p.counts().items()))
    head = title or f"plan of {len(p.program.ops)} ops on mesh {mesh}"
    ax.set_title(f"{head}: {len(p.collectives)} collectives ({counts or 'none'}), {p.total_bytes} bytes, "
                 f"~{p.total_seconds * 1e6:.1f} µs estimated\nper mesh axis: the tensor dim it shards (d0, d1, ...), "
                 "P partial, grey replicated", fontsize=8, loc="left")
    return _save(fig, path, fmt)


__all__ = ["FORMATS", "plan_figure", "plan_rows", "sharding_figure"]


def stream_schedule(c) -> tuple:
    """``(serial, streamed)`` bars of one ``plan.stream.StreamChoice``: lists of ``(start, width,
    what)`` in seconds, ``what`` "comm" or "compute"; the streamed one chunk by chunk as the
    two-stage pipeline runs (a collective chunk, then its matmul chunk, or the reverse after); a
    ring's first chunk is the rank's own shard (no transfer), then its ``k - 1`` steps.
    ``stream_schedule(choice)[1][-1][0] + stream_schedule(choice)[1][-1][1] == choice.overlapped``"""
    a_all, m_all, k = c.collective_seconds, c.compute_seconds, c.chunks
    first, second = ("comm", "compute") if c.side == "before" else ("compute", "comm")
    widths = {"comm": a_all, "compute": m_all}
    serial = [(0.0, widths[first], first), (widths[first], widths[second], second)]
    per = {"compute": m_all / k, "comm": c.chunk_seconds}
    streamed, done1, free2 = [], 0.0, 0.0
    for j in range(k):
        if j or c.style != "ring":
            streamed.append((done1, per[first], first))
            done1 += per[first]
        start = max(done1, free2)
        streamed.append((start, per[second], second))
        free2 = start + per[second]
    return serial, streamed


def stream_figure(sp, path: str, fmt: str | None = None, title: str | None = None, max_rows: int = 8) -> str:
    """Write the timeline of a plan's stream overlaps (``plan.stream.stream_plan``) to ``path``:
    per overlap, the serial collective then matmul, and below it the ``k`` chunks pipelined."""
    from matplotlib.patches import Patch

    fmt = _format(path, fmt)
    if not sp.choices:
        raise ShardingError("--timeline: no stream pays on this plan (each collective is cheaper whole, e.g. on a "
                            "small model); nothing to draw")
    plt = _pyplot()
    choices = sp.choices[:max_rows]
    rows = len(choices) * 2
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.42 * rows))
    colours = {"comm": "#1f77b4", "compute": "#2ca02c"}
    labels = []
    for i, c in enumerate(choices):
        serial, streamed = stream_schedule(c)
        for row, bars in ((2 * i, serial), (2 * i + 1, streamed)):
            for start, width, what in bars:  # collectives in the upper lane, matmuls in the lower
                ax.barh(row + (-0.19 if what == "comm" else 0.19), width * 1e6, left=start * 1e6, height=0.36,
                        color=colours[what], edgecolor="white", linewidth=0.6)
        labels += [f"{c.tensor} -> {c.ops[0]}{' ...' if len(c.ops) > 1 else ''}  serial",
                   f"{c.text}  {c.chunks} chunks" + (" (ring)" if c.style == "ring" else "")]
    ax.set_yticks(range(rows))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("µs (cost model; compute at the default FLOP rate)")
    ax.legend(handles=[Patch(color=colours["comm"], label="collective"),
                       Patch(color=colours["compute"], label="matmul")], loc="lower right", fontsize=8)
    saved = sp.serial_seconds - sp.overlapped_seconds
    ax.set_title((title + "\n" if title else "") + f"forward step ~{sp.serial_seconds * 1e6:.0f} µs serial, "
                 f"~{sp.overlapped_seconds * 1e6:.0f} µs with streams ({saved * 1e6:.0f} µs overlapped)"
                 + (f"; {len(sp.choices) - len(choices)} more overlaps not drawn" if len(sp.choices) > len(choices)
                    else ""), fontsize=9)
    return _save(fig, path, fmt)
