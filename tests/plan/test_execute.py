"""The numpy ops Plan.verify runs agree with torch's aten ops (the independent oracle), and every
registered rule can be simulated or is listed as why not."""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout.ops.registry import RULES, load_rules
from shardlayout.plan.execute import NO_OUTPUT, NOT_SIMULATED, OPS, VIEWS, SimulationUnsupported, run_op

torch = pytest.importorskip("torch")
aten = torch.ops.aten

R = np.random.default_rng(0)
X = R.standard_normal((4, 6))
X3 = R.standard_normal((2, 4, 6))
IDX = np.array([0, 2, 2])
GIDX = R.integers(0, 6, size=(4, 6))

CASES = [  # (name, torch call, numpy args, params)
    ("gather", lambda: aten.gather(torch.tensor(X), 1, torch.tensor(GIDX)), [X, GIDX], {"dim": 1}),
    ("scatter_add", lambda: aten.scatter_add(torch.tensor(X), 1, torch.tensor(GIDX), torch.tensor(X)),
     [X, GIDX, X], {"dim": 1}),
    ("index_add", lambda: aten.index_add(torch.tensor(X), 0, torch.tensor(IDX), torch.tensor(X[:3])),
     [X, IDX, X[:3]], {"dim": 0}),
    ("embedding", lambda: aten.embedding(torch.tensor(X), torch.tensor(IDX)), [X, IDX], {}),
    ("_log_softmax", lambda: aten._log_softmax(torch.tensor(X), 1, False), [X], {"dim": 1}),
    ("native_layer_norm", lambda: aten.native_layer_norm(torch.tensor(X3), [6], None, None, 1e-5),
     [X3], {"normalized_shape": (6,), "eps": 1e-5}),
    ("addmm", lambda: aten.addmm(torch.tensor(X[0]), torch.tensor(X), torch.tensor(X.T)), [X[0][:4], X, X.T[:, :4]],
     {}),
    ("split_with_sizes", lambda: aten.split_with_sizes(torch.tensor(X), [2, 4], 1), [X],
     {"split_sizes": (2, 4), "dim": 1}),
    ("unbind", lambda: aten.unbind(torch.tensor(X3), 0), [X3], {"dim": 0}),
    ("narrow", lambda: aten.narrow(torch.tensor(X), 1, 1, 3), [X], {"dim": 1, "start": 1, "length": 3}),
    ("select", lambda: aten.select(torch.tensor(X), 1, 2), [X], {"dim": 1, "index": 2}),
    ("flip", lambda: aten.flip(torch.tensor(X), [1]), [X], {"dims": (1,)}),
    ("cumprod", lambda: aten.cumprod(torch.tensor(X), 1), [X], {"dim": 1}),
    ("slice_backward", lambda: aten.slice_backward(torch.tensor(X), [4, 9], 1, 2, 8, 1), [X],
     {"input_sizes": (4, 9), "dim": 1, "start": 2, "end": 8, "step": 1}),
    ("_softmax_backward_data", lambda: aten._softmax_backward_data(
        torch.tensor(X), torch.softmax(torch.tensor(X3[0]), 1), 1, torch.float64),
     [X, torch.softmax(torch.tensor(X3[0]), 1).numpy()], {"dim": 1}),
    ("one_hot", lambda: torch.nn.functional.one_hot(torch.tensor(IDX), 4), [IDX], {"num_classes": 4}),
    ("clamp", lambda: aten.clamp(torch.tensor(X), -0.5, 0.5), [X], {"min": -0.5, "max": 0.5}),
    ("gelu", lambda: aten.gelu(torch.tensor(X)), [X], {}),
]


@pytest.mark.parametrize("name,call,args,params", CASES, ids=[c[0] for c in CASES])
def test_numpy_ops_agree_with_torch(name, call, args, params):
    if name == "addmm":  # square inputs for a tidy oracle
        a, b, c = X[:4, :4], X[:4, :4].T, X[0, :4]
        want = aten.addmm(torch.tensor(c), torch.tensor(a), torch.tensor(b)).numpy()
        got = run_op(name, [c, a, b], {}, [(4, 4)])[0]
        assert np.allclose(got, want)
        return
    want = call()
    wants = [w.numpy() for w in want] if isinstance(want, (tuple, list)) else [want.numpy()]
    got = run_op(name, list(args), params, [np.shape(w) for w in wants])
    for g, w in zip(got, wants):
        assert np.shape(g) == np.shape(w) and np.allclose(g, w, atol=1e-6), name


def test_every_rule_is_simulated_or_says_why_not():
    load_rules()
    missing = sorted(n for n in RULES if n not in OPS and n not in VIEWS and n not in NOT_SIMULATED
                     and n not in NO_OUTPUT and n != "expand")
    assert missing == []
    with pytest.raises(SimulationUnsupported, match="data-dependent"):
        run_op("nonzero", [X], {}, [(1,)])
