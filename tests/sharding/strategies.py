"""Hypothesis strategies for meshes and shardings (plain, strided, sub-axis, uneven)."""

from __future__ import annotations

from hypothesis import strategies as st

from shardlayout import Mesh, Sharding
from shardlayout.sharding import Factor


@st.composite
def meshes(draw, max_dims=3):
    nd = draw(st.integers(1, max_dims))
    return Mesh(tuple(draw(st.sampled_from([2, 2, 3, 4])) for _ in range(nd)), ("a", "b", "c")[:nd])


@st.composite
def shardings(draw, mesh=None, max_ndim=3, uneven=True, partial=True):
    """Random shardings: each mesh axis (or its halves, for sub-axes) goes to a random dim
    at a random position, between random local factors."""
    mesh = mesh or draw(meshes())
    ndim = draw(st.integers(1, max_ndim))
    dims = [[Factor(draw(st.sampled_from([1, 2, 3])))] for _ in range(ndim)]
    partial_axes = []
    for name, n in zip(mesh.names, mesh.shape):
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # replicated
        if choice == 1 and partial:
            partial_axes.append((name, draw(st.sampled_from(["sum", "max", "min", "avg"]))))
            continue
        if choice == 2 and n == 4:
            pieces = [Factor(2, name, 1), Factor(2, name, 2)]
        else:
            pieces = [Factor(n, name)]
        for f in pieces:
            d = draw(st.integers(0, ndim - 1))
            pos = draw(st.integers(0, len(dims[d])))
            dims[d].insert(pos, f)
            if draw(st.booleans()):
                dims[d].insert(pos + 1, Factor(draw(st.sampled_from([2, 3]))))
    shape = []
    for fs in dims:
        fs[:] = [f for f in fs if f.size != 1]
        full = 1
        for f in fs:
            full *= f.size
        shrinkable = fs and fs[-1].local and (len(fs) == 1 or not fs[-2].local)
        if uneven and shrinkable and draw(st.integers(0, 3)) == 0:
            # shrink the dim: the innermost local factor becomes the torch.chunk extent
            size = draw(st.integers(max(1, full // 2), full))
            body = fs[:-1]
            shape.append(size)
            fs[:] = body
        else:
            shape.append(full)
    ops = {op for _, op in partial_axes}
    if len(ops) > 1:
        partial_axes = [p for p in partial_axes if p[1] == partial_axes[0][1]]
    return Sharding(mesh, tuple(shape), dims, partial_axes)
