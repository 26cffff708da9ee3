"""The exact solver (``plan.ilp``): stream columns are declared continuous, and a solution is kept
only when they are integral, else re-solved with them integer. The oracle: every subset of the
options, priced by hand."""

from __future__ import annotations

import itertools

import pytest

from shardlayout import Mesh, Sharding
from shardlayout.plan import ilp
from shardlayout.plan.overlap import StreamOption
from shardlayout.plan.space import Combo, OpTable
from shardlayout.plan.stream import StreamChoice


def _option(tensor: str, sites: tuple, saving: float, s: Sharding) -> StreamOption:
    choice = StreamChoice(tuple(f"op{i}" for i in sites), tensor, "before", s, 0.0, 0.0, 0.0, 0.0)
    return StreamOption(tensor, s, None, (), sites, saving, choice, s)


@pytest.mark.parametrize("savings", [(3.0, 3.0, 3.0), (3.0, 2.0, 2.0), (1.0, 5.0, 1.0)])
def test_options_whose_relaxation_splits_them_are_solved_as_binaries(savings):
    """Three options on three matmuls, each pair sharing one (each matmul in one overlap at
    most): the relaxation takes half of each (1.5 options' savings); the answer is the best single
    option, as trying every subset by hand says."""
    mesh = Mesh.parse("tp=2")
    s = Sharding.replicated(mesh, (4, 4))
    tables = tuple(OpTable(i, (f"t{i}",), (Combo((s,), ((), (), (10e-6,)), (), ()),)) for i in range(3))
    doms = {f"t{i}": (s,) for i in range(3)}
    sites = ((0, 1), (1, 2), (0, 2))
    opts = tuple(_option(f"t{k}", sites[k], v * 1e-6, s) for k, v in enumerate(savings))
    model = ilp.build(tables, doms, {}, None, opts)
    sol = ilp.solve(ilp.highs(model), model)

    def fits(pick):  # each matmul in one chosen option at most
        used = [i for k in pick for i in sites[k]]
        return len(used) == len(set(used))

    best = max(sum(savings[k] for k in pick) for r in range(4) for pick in itertools.combinations(range(3), r)
               if fits(pick))
    assert sol.objective == pytest.approx((30.0 - best) * 1e-6, rel=1e-9)
    assert len(sol.streams) == 1 and sol.streams[0].saving == pytest.approx(best * 1e-6)
    assert all(not model.integer[c] for c in model.zcol)  # declared continuous, still solved whole
