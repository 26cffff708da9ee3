"""The numpy implementations the simulator runs agree with torch's aten ops (the independent
oracle), and every registered op can be simulated or says why not."""

from __future__ import annotations

import numpy as np
import pytest

from shardlayout.errors import SimulationUnsupported
from shardlayout.ops import get_op, registered

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
    ("native_layer_norm_backward", lambda: aten.native_layer_norm_backward(
        torch.tensor(X3[1]), torch.tensor(X3[0]), [6], *aten.native_layer_norm(torch.tensor(X3[0]), [6], None, None,
                                                                               1e-5)[1:], None, None,
        [True, False, False])[0],
     [X3[1], X3[0], None, None], {"normalized_shape": (6,), "eps": 1e-5}),
    ("split_with_sizes", lambda: aten.split_with_sizes(torch.tensor(X), [2, 4], 1), [X],
     {"split_sizes": (2, 4), "dim": 1}),
    ("chunk", lambda: aten.chunk(torch.tensor(X), 4, 1), [X], {"chunks": 4, "dim": 1}),
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
    ("add", lambda: aten.add(torch.tensor(X), torch.tensor(X), alpha=3), [X, X], {"alpha": 3}),
    ("topk", lambda: aten.topk(torch.tensor(X), 3, 1, largest=False), [X], {"k": 3, "dim": 1, "largest": False}),
    ("sort", lambda: aten.sort(torch.tensor(X), 1, True), [X], {"dim": 1, "descending": True}),
    ("addmm", lambda: aten.addmm(torch.tensor(X[0, :4]), torch.tensor(X[:4, :4]), torch.tensor(X[:4, :4].T),
                                 beta=2, alpha=0.5),
     [X[0, :4], X[:4, :4], X[:4, :4].T], {"beta": 2, "alpha": 0.5}),
    ("div", lambda: aten.div(torch.tensor(X), 0.7, rounding_mode="floor"), [X, 0.7], {"rounding_mode": "floor"}),
]


@pytest.mark.parametrize("name,call,args,params", CASES, ids=[c[0] for c in CASES])
def test_numpy_implementations_agree_with_torch(name, call, args, params):
    want = call()
    wants = [w.numpy() for w in want] if isinstance(want, (tuple, list)) else [want.numpy()]
    args = [a for a in args if a is not None] if name != "native_layer_norm_backward" else args[:2]
    got = get_op(name).run_numpy(list(args), params, [np.shape(w) for w in wants])
    for g, w in zip(got, wants):
        assert np.shape(g) == np.shape(w) and np.allclose(g, w, atol=1e-6), name


def test_every_op_is_simulated_or_says_why_not():
    silent = sorted(n for n, op in registered().items() if op.numpy is None and not op.not_simulated)
    assert silent == []
    with pytest.raises(SimulationUnsupported, match="depends on the data"):
        get_op("nonzero").run_numpy([X], {}, [(1,)])
