"""Our chosen cost is never higher than the cost of DTensor's choice, under the same model.

DTensor 2.13's ``propagate_op_sharding_non_cached`` runs in this process over a fake process
group; its chosen input targets are priced by the collectives ``plan_move`` emits to reach
them, with DTensor's own formulas (``tests/ops/pricing.py``), as ours are.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from shardlayout import Mesh, Sharding, propagate  # noqa: E402
from shardlayout.sharding.move import plan_move  # noqa: E402

from .pricing import price_collectives  # noqa: E402


@pytest.fixture(scope="module")
def dtensor():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    return DeviceMesh, DTensor._op_dispatcher.sharding_propagator


def price(inputs, targets) -> float:
    return price_collectives([c for s, t in zip(inputs, targets) for c in plan_move(s, t)])


def test_never_costlier_than_dtensor(dtensor):
    DeviceMesh, prop = dtensor
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    aten = torch.ops.aten
    rng = random.Random(3)
    compared = 0
    for _ in range(120):
        shape = rng.choice([(2,), (4,), (2, 4), (2, 2, 2)])
        mesh = Mesh(shape, tuple("abcd"[: len(shape)]))
        dm = DeviceMesh("cpu", torch.arange(mesh.size).reshape(shape))
        op = rng.choice(["mm", "bmm", "sum", "softmax", "add"])
        shapes = {"mm": [(8, 16), (16, 8)], "bmm": [(4, 8, 16), (4, 16, 8)], "sum": [(8, 16, 4)],
                  "softmax": [(8, 16)], "add": [(8, 16), (8, 16)]}[op]
        pls = []
        for sh in shapes:
            opts = [Replicate()] + [Shard(d) for d in range(len(sh))]
            if op in ("add", "sum"):
                opts.append(Partial())
            pls.append([rng.choice(opts) for _ in shape])
        if op == "add" and any(isinstance(p, Partial) for p in pls[0] + pls[1]):
            pls[1] = list(pls[0])  # DTensor needs matching partials for add; keep it linear

        def spec(sh, pl, dm=dm):
            t = torch.empty(sh)
            return DTensorSpec(dm, tuple(pl), tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype))

        specs = [spec(sh, pl) for sh, pl in zip(shapes, pls)]
        args = {"mm": (aten.mm.default, tuple(specs)), "bmm": (aten.bmm.default, tuple(specs)),
                "sum": (aten.sum.dim_IntList, (specs[0], [1])),
                "softmax": (aten._softmax.default, (specs[0], 1, False)),
                "add": (aten.add.Tensor, tuple(specs))}[op]
        out = prop.propagate_op_sharding_non_cached(OpSchema(args[0], args[1], {}))
        targets_specs = specs if out.redistribute_schema is None else [
            a for a in out.redistribute_schema.args_schema if isinstance(a, DTensorSpec)
        ]
        ours_in = [Sharding.from_placements(mesh, sh, pl) for sh, pl in zip(shapes, pls)]
        dt_targets = [Sharding.from_placements(mesh, sh, t.placements)
                      for sh, t in zip(shapes, targets_specs)]
        dt_cost = price(ours_in, dt_targets)
        params = {"dim": 1} if op in ("sum", "softmax") else {}
        p = propagate({"softmax": "_softmax"}.get(op, op), ours_in, **params)
        assert p.cost == pytest.approx(price(ours_in, p.input_targets), rel=1e-12, abs=1e-15)
        assert p.cost <= dt_cost * (1 + 1e-9) + 1e-15, (op, shape, pls, p.cost, dt_cost)
        compared += 1
    assert compared == 120
