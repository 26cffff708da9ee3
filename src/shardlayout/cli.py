"""The ``shardlayout`` command line.

    shardlayout demo
    shardlayout layout composition "(4,6):(6,1)" "(2,3):(1,4)"

Errors from bad input are one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import ShardingError

LAYOUT_OPS = (
    "coalesce",
    "filter",
    "composition",
    "complement",
    "right_inverse",
    "left_inverse",
    "logical_divide",
    "zipped_divide",
    "tiled_divide",
    "flat_divide",
    "logical_product",
    "zipped_product",
    "tiled_product",
    "blocked_product",
    "raked_product",
)


def _parse_operand(text: str):
    """A layout ``(4,2):(1,4)``, an int ``4``, ``_`` (None) or a by-mode tiler ``[4,_,(2,2):(1,2)]``."""
    from .layout import Layout

    text = text.strip()
    if text in ("_", "None"):
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        parts, depth, cur = [], 0, ""
        for ch in text[1:-1]:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch in "(["
            depth -= ch in ")]"
            cur += ch
        if cur.strip():
            parts.append(cur)
        return tuple(_parse_operand(p) for p in parts)
    return Layout.parse(text)


def cmd_layout(args) -> int:
    from . import layout as L

    f = getattr(L, args.op)
    operands = [_parse_operand(x) for x in args.operands]
    result = f(*operands)
    if args.json:
        print(json.dumps({"op": args.op, "operands": args.operands, "result": str(result),
                          "shape": result.shape, "stride": result.stride,
                          "size": result.size(), "cosize": result.cosize()}))
    else:
        print(result)
    return 0


def cmd_demo(args) -> int:
    from .layout import Layout, composition, zipped_divide

    print("shardlayout demo: a sharding is a layout\n")
    print("Tensor (8,12), row-major:            T =", Layout((8, 12), (12, 1)))
    T = Layout((8, 12), (12, 1))
    print("Mesh dp=2, tp=4; dim 0 split over dp, dim 1 over tp (DTensor [S(0), S(1)]).")
    Z = zipped_divide(T, (4, 3))
    print("zipped_divide(T, (4,3)) = ((local), (device)) =", Z)
    print("  rank r = (dp, tp) holds the offsets Z(local, device):")
    for dp in range(2):
        for tp in range(4):
            rank = dp * 4 + tp
            offs = [Z((i, j), (dp, tp)) for i in range(4) for j in range(3)]
            print(f"    rank {rank} (dp={dp}, tp={tp}): {offs[:6]} ... {offs[-1]}")
    print("\nA view re-reads offsets without moving data: flatten (8,12) -> (96,)")
    V = composition(Layout(96, 1), Layout((8, 12), (12, 1)))
    print("  composition(96:1, (8,12):(12,1)) =", V, "(the same function as T)")
    print("\nNext: Sharding, placements and the view rules build on this algebra.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardlayout", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="show the main job on the built-in default example")
    d.set_defaults(func=cmd_demo)
    lay = sub.add_parser("layout", help="run one CuTe layout-algebra operation")
    lay.add_argument("op", choices=LAYOUT_OPS)
    lay.add_argument("operands", nargs="+", help="layouts like '(4,2):(1,4)', ints, '_', '[..]'")
    lay.add_argument("--json", action="store_true", help="machine-readable output")
    lay.set_defaults(func=cmd_layout)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ShardingError as e:
        print(f"shardlayout: error: {e}", file=sys.stderr)
        return 2
    except TypeError as e:
        print(f"shardlayout: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
