"""Shared helpers for the CuTe conformance corpus (../shared/conformance/cute)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardlayout import layout as L
from shardlayout.layout import Layout

HERE = Path(__file__).resolve()
CANDIDATES = [
    Path(os.environ["SHARDLAYOUT_CONFORMANCE"]) if os.environ.get("SHARDLAYOUT_CONFORMANCE") else None,
    HERE.parents[3] / "shared" / "conformance",
    HERE.parents[2] / "shared" / "conformance",
]
CONFORMANCE = next((p for p in CANDIDATES if p is not None and (p / "cute").is_dir()), None)


def load(name: str) -> dict:
    with open(CONFORMANCE / "cute" / name) as f:
        return json.load(f)


def to_tuple(x):
    return tuple(to_tuple(y) for y in x) if isinstance(x, list) else x


def decode_layout(d) -> Layout:
    return Layout(to_tuple(d["shape"]), to_tuple(d["stride"]))


def decode_tiler(t):
    if t is None or isinstance(t, int):
        return t
    if isinstance(t, list):
        return tuple(decode_tiler(x) for x in t)
    return decode_layout(t)


def run(op: str, inputs: dict) -> Layout:
    """Run our operation named ``op`` on corpus-encoded inputs."""
    if op in ("coalesce",):
        return L.coalesce(decode_layout(inputs["layout"]), decode_tiler(inputs.get("profile")))
    if op == "complement":
        return L.complement(decode_layout(inputs["layout"]), inputs.get("cotarget"))
    if op in ("right_inverse", "left_inverse"):
        return getattr(L, op)(decode_layout(inputs["layout"]))
    a = decode_layout(inputs["a"])
    b = decode_tiler(inputs["b"])
    return getattr(L, op)(a, b)


def mode_sizes(layout: Layout):
    return [layout[i].size() for i in range(layout.rank)]


def same_behaviour(ours: Layout, want: Layout) -> str | None:
    """None when equal by behaviour (size, per-mode sizes, every value), else why not."""
    if ours.size() != want.size():
        return f"size {ours.size()} != {want.size()}"
    if ours.rank != want.rank and not (ours.rank == 1 or want.rank == 1):
        return f"rank {ours.rank} != {want.rank}"
    if ours.rank == want.rank and mode_sizes(ours) != mode_sizes(want):
        return f"mode sizes {mode_sizes(ours)} != {mode_sizes(want)}"
    if ours.values() != want.values():
        return f"values {ours.values()[:16]} != {want.values()[:16]}"
    return None


def check_inverse(op: str, layout: Layout, result: Layout) -> str | None:
    if op == "right_inverse":
        bad = [i for i in range(result.size()) if layout(result(i)) != i]
        return f"L(R(i)) != i at {bad[:5]}" if bad else None
    bad = [i for i in range(layout.size()) if result(layout(i)) != i]
    return f"R(L(i)) != i at {bad[:5]}" if bad else None


def expected_for(case: dict) -> Layout:
    """C++ CuTe's answer: the DSL's where pycute differs, else pycute's."""
    dsl = case.get("dsl") or {}
    if dsl.get("agrees") == "differs":
        return decode_layout(dsl)
    return decode_layout(case["expected"])


def check_case(case: dict) -> str | None:
    op = case["op"]
    ours = run(op, case["inputs"])
    if op in ("right_inverse", "left_inverse"):
        layout = decode_layout(case["inputs"]["layout"])
        why = check_inverse(op, layout, ours)
        if why:
            return why
        if op == "right_inverse" and ours.size() < expected_for(case).size():
            return f"right inverse size {ours.size()} smaller than CuTe's {expected_for(case).size()}"
        return None
    return same_behaviour(ours, expected_for(case))
