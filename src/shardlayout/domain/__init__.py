"""The domain layer: nvFuser's IterDomains, the loop domain of a Sharding, and the ID graph
that proves, theorem by theorem, when two device-parallel IDs are the same.

    iterdomain.py  IterDomain, ParallelType, Split / Merge / Resize, TensorDomain,
                   index_map (brute force), loop_domain_of / sharding_of
    theorems.py    named theorems over extents, each returning a Justification
    graph.py       Op records of a program, IdGraph.mapped, is_resharding, propagate
    stream.py      nvFuser's propagation pass with Stream (propagate_shardings, forward and
                   backward), have_different_shardings, stream_allocated, reorder to front

Imports run one way: stream -> graph -> theorems -> iterdomain -> sharding, mesh, errors.

    >>> from shardlayout.mesh import Mesh
    >>> from shardlayout.sharding import Sharding
    >>> s = Sharding.parse("[dp*4, tp*3]", Mesh.parse("dp=2,tp=4"))
    >>> td = loop_domain_of(s, "x")
    >>> [str(i) for i in td.loop]
    ['x.0.o{2}@dp', 'x.0.i{4}', 'x.1.o{4}@tp', 'x.1.i{3}']
    >>> sharding_of(td, s.mesh) == s
    True
    >>> j = outer_split_of_merge(3, 2, 2)  # nvFuser case A.5: [6] -> [3, 2], device split by 2
    >>> j.holds, j.failed[0].detail
    (False, 'ceilDiv(3*2, 2) = 3, e1*ceilDiv(e0, n) = 4; n | e0: False')
"""

from .graph import (
    IdGraph,
    Op,
    OpKind,
    Resharding,
    add_op,
    cat_op,
    factory_op,
    is_resharding,
    linear_op,
    matmul_op,
    pad_op,
    permute_op,
    propagate,
    reshape_op,
    scatter_op,
    select_op,
    set_op,
    sharded_logical_axis,
    slice_op,
    sum_op,
)
from .iterdomain import (
    SERIAL,
    STREAM,
    IterDomain,
    Kind,
    Merge,
    ParallelType,
    Resize,
    Split,
    TensorDomain,
    cat,
    divides,
    equal,
    index_map,
    loop_domain_of,
    loop_indices,
    merge,
    resize,
    ring_domains,
    ring_of,
    root_index,
    sharding_of,
    split,
)
from .stream import (
    have_different_shardings,
    propagate_shardings,
    reorder_parallelized_to_front,
    stream_allocated,
)
from .theorems import (
    Justification,
    Precondition,
    divmod_commute,
    inner_split_cat,
    inner_split_slice,
    outer_split_cat,
    outer_split_of_merge,
    outer_split_slice,
    split_of_merge,
    split_split_commute,
)

__all__ = [
    "SERIAL",
    "STREAM",
    "IdGraph",
    "IterDomain",
    "Justification",
    "Kind",
    "Merge",
    "Op",
    "OpKind",
    "ParallelType",
    "Precondition",
    "Resharding",
    "Resize",
    "Split",
    "TensorDomain",
    "add_op",
    "cat",
    "cat_op",
    "divides",
    "divmod_commute",
    "equal",
    "factory_op",
    "have_different_shardings",
    "index_map",
    "inner_split_cat",
    "inner_split_slice",
    "is_resharding",
    "linear_op",
    "loop_domain_of",
    "loop_indices",
    "matmul_op",
    "merge",
    "outer_split_cat",
    "outer_split_of_merge",
    "outer_split_slice",
    "pad_op",
    "permute_op",
    "propagate",
    "propagate_shardings",
    "reorder_parallelized_to_front",
    "reshape_op",
    "resize",
    "ring_domains",
    "ring_of",
    "root_index",
    "scatter_op",
    "select_op",
    "set_op",
    "sharded_logical_axis",
    "sharding_of",
    "slice_op",
    "split",
    "split_of_merge",
    "split_split_commute",
    "stream_allocated",
    "sum_op",
]
