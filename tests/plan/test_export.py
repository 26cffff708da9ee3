"""Exported plans: DTensor placements (in DTensor's reprs) applied with torch's own split
functions give exactly our local shards; JAX PartitionSpecs read back to the same Sharding."""

from __future__ import annotations

import re

import numpy as np
import pytest

from shardlayout import Mesh, Sharding
from shardlayout.plan import plan
from shardlayout.program.models import llama, moe, style_pins

torch = pytest.importorskip("torch")
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard  # noqa: E402

from ..sharding.test_placements_dtensor import dtensor_local  # noqa: E402


def torch_placement(text: str):
    """DTensor's repr -> torch's object, read independently of shardlayout's parser."""
    if text == "Replicate()":
        return Replicate()
    m = re.fullmatch(r"Shard\(dim=(\d+)\)", text)
    if m:
        return Shard(int(m.group(1)))
    m = re.fullmatch(r"_StridedShard\(dim=(\d+), sf=(\d+)\)", text)
    if m:
        return _StridedShard(int(m.group(1)), split_factor=int(m.group(2)))
    m = re.fullmatch(r"Partial\((\w+)\)", text)
    assert m, text
    return Partial(m.group(1))


CASES = [(llama, s, m) for s, ms in {"dp": ["dp=4"], "fsdp": ["dp=2,tp=2"], "megatron": ["tp=3", "dp=2,tp=4"],
                                     "megatron-sp": ["dp=2,tp=2"]}.items() for m in ms] + [(moe, "ep", "ep=4")]


@pytest.mark.parametrize("model,style,mesh", CASES, ids=[f"{s}-{m}" for _, s, m in CASES])
def test_every_style_exports_placements_dtensor_splits_exactly_as_we_shard(model, style, mesh):
    prog = model() if model is moe else model(layers=1)
    m = Mesh.parse(mesh)
    p = plan(prog, m, style_pins(prog, m, style))
    exported = p.to_dtensor()
    assert exported and set(exported) == {n for n in prog.inputs() if prog.tensors[n].kind in ("param", "buffer")}
    sharded = 0
    for name, entry in exported.items():
        assert "placements" in entry, (name, entry)
        pls = [torch_placement(t) for t in entry["placements"]]
        assert len(pls) == m.ndim
        shape = tuple(entry["shape"])
        g = torch.arange(int(np.prod(shape))).reshape(shape)
        ours = p.shardings[name]
        for r in m.ranks():
            want = dtensor_local(m, g, pls, m.coord(r)).numpy()
            assert np.array_equal(g.numpy()[np.ix_(*ours.indices(r))], want), (name, r)
        sharded += any(not isinstance(x, Replicate) for x in pls)
    assert sharded or style == "dp"
    specs = p.to_partition_specs()
    for name, entry in specs.items():
        if "partition_spec" in entry:
            spec = [tuple(e) if isinstance(e, list) else e for e in entry["partition_spec"]]
            assert Sharding.from_partition_spec(m, tuple(entry["shape"]), spec) == p.shardings[name]


def test_what_a_target_cannot_say_is_reported_not_approximated():
    prog = llama(layers=1)
    m = Mesh.parse("dp=2,tp=4")
    p = plan(prog, m, {"layers.0.wq": Sharding.parse("[16, tp:(2)2*tp:(1)2*4]", m),
                       "layers.0.wk": Sharding.parse("[16, 2*tp*2]", m)})
    d = p.to_dtensor()
    assert "no DTensor placement list" in d["layers.0.wq"]["not_representable"]
    assert d["layers.0.wk"]["placements"] == ["Replicate()", "_StridedShard(dim=1, sf=2)"]
    j = p.to_partition_specs()
    assert j["layers.0.wq"]["partition_spec"] == [None, ["tp:(2)2", "tp:(1)2"]]  # Shardy sub-axes
    assert "strided" in j["layers.0.wk"]["not_representable"]


def test_dtensor_reprs_are_accepted_as_placements():
    m = Mesh.parse("dp=2,tp=2")
    a = Sharding.from_placements(m, (8, 8), ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"])
    assert a == Sharding.from_placements(m, (8, 8), ["SS(0,2)", "S(0)"])
    assert Sharding.from_placements(m, (8, 8), ["Replicate()", "Partial(max)"]).partial == (("tp", "max"),)
