"""Sharding propagation with the Stream parallel type: nvFuser's PropagateShardingsPass
(``csrc/preseg_passes/propagate_shardings.cpp`` after PR #5363) over ``Op`` records.

Stream is a parallel type of its own: an outer split of a loop ID run by CUDA streams, one
chunk after the other on every rank. It is no mesh axis and adds no ranks, so it propagates
whether or not a tensor has a mesh, and ``sharding_of`` reads a Stream ID as a local factor
(which rank holds which element does not change; tests/domain/test_stream.py checks it).

``propagate_shardings`` runs two phases over the program (ops in topological order):

    forward   for each op, its reference inputs in order -> the output, unless user-sharded
              (matmul / linear: the weight B, the bias, then A; other ops: inputs with more
              non-reduction Stream/device loop IDs first, then larger meshes, ties in input order)
    backward  for each op in reverse, its output -> each input that is not user-sharded;
              a fusion (program) input, user-sharded or not, receives Stream and ONLY Stream

One reference ID is carried over when (nvFuser's ``propagateDIDTransform``)

    its parallel type is not yet on the target (PropagateParallelTypeOnce; a reduction
        ID, ``r{DIDx}``, does not count as having DIDx, but a Stream reduction ID counts as
        having Stream; two pieces of one mesh axis count as one)
        nor carried already from this reference (a Stream on an output dim and another on its
        reduction ID both tie to a matmul input: the first in loop order is carried)
    the target's mesh, if any, has its axis with the same size (device types only)
    its logical ID is tied by the op to a target ID (through a reshape: the outer reshaped
        ID, by theorem; see graph._down_to_logical / _up_to_root)
    that target ID is still a serial loop ID: split or parallelized IDs are never overwritten

and then the splits from the reference's logical ID down to the parallel ID are replayed on the
target (each split once, so ``[DIDy(2), DIDx(3), n/6]`` of one dim crosses as a whole). Worked
example, nvFuser's ``ColumnAndSequenceParallelLinear_Forward`` (conformance C.17, d = 2)::

    in  [t, h]               w [4h, h]              out = linear(in, w)  [t, 4h, r{h}]
         /\\ d                  /\\ d                        /\\ d       (the user's Stream)
    [DIDx(d), t/d, h]      [DIDx(d), 4h/d, h]      [S(d), t/d, 4h, r{h}]
    w first: 4h -> [S(d), t/d, DIDx(d), 4h/d, r{h}]; in's DIDx is skipped, out has DIDx.

A scatter's output only receives a mesh, never splits (either phase). Parallelized IDs are not moved by the pass;
``reorder_parallelized_to_front`` (nvFuser's FinalizeMultideviceDomains) sorts a loop domain
``Stream < DIDz < DIDy < DIDx < Serial`` where DIDx is the mesh's LAST axis (``createForShape``).

Allocation: fusion inputs and outputs are allocated whole (allocation == logical); an
intermediate with a Stream ID is allocated per chunk unless one of its uses has a different
Stream sharding (``stream_allocated``, ``have_different_shardings(a, b, {STREAM})``).

    >>> from shardlayout.domain import TensorDomain, STREAM, set_op
    >>> x = TensorDomain.create("x", (4, 6))
    >>> op = set_op(x, "y")
    >>> (op,) = propagate_shardings([op.with_domains(op.output.outer_split(0, 2).parallelize(0, STREAM))])
    >>> [str(i) for i in op.inputs[0].loop]
    ['x.0.o{2}@stream', 'x.0.i{2}', 'x.1{6}']
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import DomainError
from ..mesh import Mesh
from .graph import IdGraph, Op, OpKind, _ancestors, _dims, _down_to_logical, _pairs, _up_to_root, split_chain
from .iterdomain import SERIAL, STREAM, IterDomain, Kind, ParallelType, TensorDomain, divides, equal

# ------------------------------------------------------------------------------------------
# small facts about one tensor
# ------------------------------------------------------------------------------------------


def _parallel_ids(td: TensorDomain) -> tuple:
    """Non-reduction loop IDs on Stream or a device (what nvFuser counts and what blocks a type)."""
    return tuple(i for i in td.loop if not i.is_reduction and (i.ptype.kind is Kind.STREAM or i.ptype.is_device))


def _present_types(td: TensorDomain) -> set:
    """The parallel types a target already has, which propagation does not add again (nvFuser's
    ``getParallelTypesToPropagate``): device types of non-reduction loop IDs (``r{DIDx}`` is
    reduced, so a reduce-scatter's scattered dim may still take DIDx) and Stream on any loop ID,
    a reduction's included (a matmul streamed over ``r{K}`` takes no second Stream)."""
    return {i.ptype for i in td.loop if i.ptype.kind is Kind.STREAM or (i.ptype.is_device and not i.is_reduction)}


def _blocked(p: ParallelType, present) -> bool:
    """True when ``p`` is already on the tensor: the same type, or another piece of its mesh axis."""
    return any(p == q or (p.is_device and q.is_device and p.axis == q.axis) for q in present)


def _fits(p: ParallelType, ref_mesh: Mesh | None, mesh: Mesh) -> bool:
    """Whether device type ``p`` of a tensor on ``ref_mesh`` can run on ``mesh`` (same axis, same size)."""
    if p.axis not in mesh.names:
        return False
    if ref_mesh is not None and p.axis in ref_mesh.names and ref_mesh.axis_size(p.axis) != mesh.axis_size(p.axis):
        return False
    try:
        p.axis_size(mesh)
    except DomainError:
        return False
    return True


def _ties(op: Op) -> list:
    """(input ID, output ID) pairs the op ties, with a cat's cat dim (input piece -> whole)."""
    pairs = list(_pairs(op))
    if op.kind is OpKind.CAT:
        pairs += [(_dims(t)[op.dim], op.output.logical[op.dim]) for t in op.inputs]
    return pairs


def _ids(td: TensorDomain) -> set:
    return {i.id for i in td.root + td.logical}


def _fusion_inputs(ops) -> set:
    produced = {op.output.name for op in ops}
    return {t.name for op in ops for t in op.inputs if t.name not in produced}


def _fusion_outputs(ops, outputs) -> set:
    if outputs is not None:
        return {t.name if isinstance(t, TensorDomain) else t for t in outputs}
    used = {t.name for op in ops for t in op.inputs}
    return {op.output.name for op in ops if op.output.name not in used}


def _latest(ops) -> dict:
    """Tensor name -> its domain: an intermediate's as its op produced it, an input's first use."""
    cur: dict = {}
    for op in ops:
        for t in op.inputs + (op.output,):
            cur.setdefault(t.name, t)
    return cur


# ------------------------------------------------------------------------------------------
# one reference -> one target
# ------------------------------------------------------------------------------------------


def _target_of(op: Op, ref: TensorDomain, target: TensorDomain, lid: IterDomain, n, forward: bool):
    """The target's logical ID that ``ref``'s logical ID ``lid`` (split first by ``n``) lands on,
    and whether a reshape is crossed; (None, False) when the op does not tie it to the target."""
    ref_ids, target_ids, tied = _ids(ref), _ids(target), {}
    if forward:
        for a, b in _ties(op):  # the first tie wins when a tensor is two operands (x @ x)
            if a.id in ref_ids and b.id in target_ids:
                tied.setdefault(a.id, b)
        b = tied.get(lid.id)
        if b is None:
            return None, False
        if op.kind is OpKind.VIEW:
            t = _down_to_logical(target, b, n, lid)
            return target.current(t.id), t.id != b.id
        return target.current(b.id), False
    root = _up_to_root(ref, lid, n) if op.kind is OpKind.VIEW else lid
    for a, b in _ties(op):
        if a.id in target_ids and b.id in ref_ids:
            tied.setdefault(b.id, a)
    a = tied.get(root.id)
    return (None, False) if a is None else (target.current(a.id), root.id != lid.id)


def _picks(op: Op, ref: TensorDomain, target: TensorDomain, forward: bool, stream_only: bool) -> list:
    """The reference loop IDs to carry over, each with (logical ID, splits, target ID, crosses a view)."""
    present = _present_types(target)
    loop = {i.id for i in target.loop}
    out, claimed = [], {}  # target ID -> the ref logical ID that splits it
    carried: set = set()  # types picked from this reference: each once (a Stream on an output dim and
    #                       another on its reduction ID both tie to the input; the first in loop order wins)
    for rid in ref.loop:
        p = rid.ptype
        if p == SERIAL or (p.is_device and stream_only) or _blocked(p, present) or p in carried:
            continue
        if p.is_device and target.mesh is not None and not _fits(p, ref.mesh, target.mesh):
            continue
        chain = split_chain(ref, rid)
        if chain is None:
            raise DomainError(f"{ref.name}: {rid} lies under a merge of loop IDs; nvFuser carries only splits of one "
                              f"logical ID to {target.name}: split the dim before merging")
        lid, splits = chain
        n = splits[0].factor if splits else lid.extent
        t, crosses = _target_of(op, ref, target, lid, n, forward)
        if t is None or t.ptype != SERIAL or t.id not in loop or claimed.setdefault(t.id, lid.id) != lid.id:
            continue
        if crosses and any(s.inner_split for s in splits):
            raise DomainError(f"{target.name}: {ref.name}'s {rid} comes from {lid} by an inner split; only outer "
                              "splits carry a device or stream ID through a reshape: outer_split it instead")
        out.append((rid, lid, splits, t, crosses))
        carried.add(p)
    return out


def _transfer(target: TensorDomain, picks: list) -> TensorDomain:
    """Replay the picked splits on the target (each once), then parallelize the images."""
    image: dict = {}  # ref ID -> target loop ID
    dest: dict = {}
    for rid, lid, splits, t, crosses in picks:
        image.setdefault(lid.id, t.id)
        if not splits and equal(t.extent, lid.extent) is not True:  # a whole ID onto a larger reshaped one
            pos = target.position(image[lid.id])
            target = target.outer_split(pos, lid.extent)
            image[lid.id] = target.loop[pos + 1].id
            dest[rid.id] = target.loop[pos].id
            continue
        for s in splits:
            if s.outer.id in image:
                continue
            pos = target.position(image[s.input.id])
            if crosses and divides(s.factor, target.loop[pos].extent) is False:
                raise DomainError(f"{target.name}: {target.loop[pos]} is not divisible by the split factor {s.factor} "
                                  f"it gets through a reshape (nvFuser: require the sharded ID to be divisible by "
                                  "the split factor); shard a dim the factor divides")
            target = target.split(pos, s.factor, s.inner_split)
            image[s.outer.id], image[s.inner.id] = target.loop[pos].id, target.loop[pos + 1].id
        dest[rid.id] = image[rid.id]
    for rid, *_ in picks:
        target = target.parallelize(target.position(dest[rid.id]), rid.ptype)
    return target


def _propagate_pair(op: Op, ref: TensorDomain, target: TensorDomain, forward: bool, stream_only: bool,
                    scattered: bool = False) -> TensorDomain:
    picks = () if scattered else _picks(op, ref, target, forward, stream_only)
    if target.mesh is None:
        target = target.with_mesh(ref.mesh)  # meshes back-propagate too (nvFuser's BackpropMeshes)
    return _transfer(target, picks)


def _reference_inputs(op: Op) -> tuple:
    """The inputs in the order they are references: matmul / linear take B (and the bias) before A."""
    if op.kind in (OpKind.MATMUL, OpKind.LINEAR):
        return op.inputs[1:] + op.inputs[:1]
    return tuple(sorted(op.inputs, key=lambda t: (-len(_parallel_ids(t)), -(t.mesh.ndim if t.mesh else 0))))


# ------------------------------------------------------------------------------------------
# the pass
# ------------------------------------------------------------------------------------------


def propagate_shardings(ops, user_sharded=None, *, reorder: bool = False) -> tuple:
    """nvFuser's sharding propagation pass with Stream (module docstring): forward, then
    backward; returns the ops with every tensor's updated domain. ``user_sharded`` (names or
    tensors) are never changed except that fusion inputs may gain Stream IDs; by default the
    tensors with a mesh or a device ID (a Stream ID alone is no placement). ``reorder`` sorts
    every loop domain by ``reorder_parallelized_to_front``. ``propagate_shardings([matmul_op(x, w, "z")])``"""
    ops = tuple(ops)
    if not all(isinstance(op, Op) for op in ops):
        raise DomainError("propagate_shardings: every step must be an Op (set_op, add_op, matmul_op, ...)")
    cur = _latest(ops)
    if user_sharded is None:
        user = {n for n, t in cur.items() if t.mesh is not None or t.device_ids()}
    else:
        user = {t.name if isinstance(t, TensorDomain) else t for t in user_sharded}
    inputs = _fusion_inputs(ops)
    scattered = {op.output.name for op in ops if op.kind is OpKind.SCATTER}  # their loops are left alone

    def fresh(op: Op) -> Op:
        return op.with_domains(*(cur[t.name] for t in op.inputs + (op.output,)))

    for op in ops:
        op = fresh(op)
        out = op.output
        if out.name in user:
            continue
        for ref in _reference_inputs(op):
            out = _propagate_pair(op, ref, out, True, False, out.name in scattered)
        cur[out.name] = out
    for op in reversed(ops):
        for name in dict.fromkeys(t.name for t in op.inputs):
            if name in user and name not in inputs:
                continue
            op = fresh(op)
            cur[name] = _propagate_pair(op, op.output, cur[name], False, name in inputs, name in scattered)
    if reorder:
        cur = {n: reorder_parallelized_to_front(t) for n, t in cur.items()}
    return tuple(fresh(op) for op in ops)


def reorder_parallelized_to_front(td: TensorDomain, mesh: Mesh | None = None) -> TensorDomain:
    """The loop domain sorted Stream < DIDz < DIDy < DIDx < Serial, stably (nvFuser's
    ``reorderParallelizedToFront``): device IDs by their axis's position in ``mesh`` (default the
    tensor's), so the last axis, DIDx, comes last; sub-axes major piece first; without a mesh
    device IDs keep their order. ``reorder_parallelized_to_front(td).loop[0].ptype -> STREAM``"""
    mesh = mesh if mesh is not None else td.mesh

    def rank(i: IterDomain) -> tuple:
        p = i.ptype
        if p.kind is Kind.STREAM:
            return (0, 0, 0)
        if p.is_device:
            return (1, mesh.axis_index(p.axis) if mesh is not None and p.axis in mesh.names else 0, p.pre)
        return (2, 0, 0)

    return replace(td, loop=tuple(sorted(td.loop, key=rank)))


# ------------------------------------------------------------------------------------------
# shardings compared, allocation
# ------------------------------------------------------------------------------------------


def _types(types, a: TensorDomain, b: TensorDomain) -> list:
    seen = list(dict.fromkeys(i.ptype for i in _parallel_ids(a) + _parallel_ids(b)))
    if types is None:  # every type on either tensor, and every axis of either mesh (nvFuser's callers: all DIDs)
        axes = [ParallelType.device(n) for m in (a.mesh, b.mesh) if m is not None for n in m.names]
        return list(dict.fromkeys(seen + axes))
    out = []
    for t in ([types] if isinstance(types, (ParallelType, Kind)) else types):
        if isinstance(t, ParallelType):
            out.append(t)
        elif t is Kind.DEVICE:
            out.extend(p for p in seen if p.is_device)
        elif t is Kind.STREAM:
            out.append(STREAM)
        else:
            raise DomainError(f"have_different_shardings: {t!r} is not a ParallelType or Kind "
                              "(give e.g. {STREAM} or {Kind.DEVICE})")
    return list(dict.fromkeys(out))


def _on_mesh(p: ParallelType, mesh: Mesh | None) -> bool:
    """Whether ``mesh`` has the axis a device type runs on (nvFuser's ``DeviceMesh::hasParallelType``)."""
    return mesh is not None and p.is_device and p.axis in mesh.names


def have_different_shardings(producer: TensorDomain, consumer: TensorDomain, types=None, *, op: Op | None = None,
                             facts=None) -> bool:
    """nvFuser's ``haveDifferentShardings``: for each parallel type in ``types`` (ParallelTypes,
    or ``Kind.DEVICE`` / ``Kind.STREAM``; default every type on either tensor and every axis of
    either mesh), the producer's and the consumer's non-reduction loop ID of that type (counted
    only when derived from an ID the op ties) are both absent, or ``IdGraph.mapped``. Different
    meshes differ only on a device type one of them has (an axis neither mesh has cannot differ);
    with no mesh on either side only Stream is compared (nvFuser's early ``false``).
    ``op`` relates them (default ``set``). ``have_different_shardings(tv1, tv2, {STREAM}) -> False``"""
    if op is None:
        try:
            op = Op(OpKind.SET, (producer,), consumer)
        except DomainError as e:
            raise DomainError(f"have_different_shardings: {consumer.name} is no set of {producer.name} ({e}); "
                              "pass the op that relates them") from e
    op = op.with_domains(producer, consumer)
    if producer.name not in {t.name for t in op.inputs} or consumer.name != op.output.name:
        raise DomainError(f"have_different_shardings: {producer.name} -> {consumer.name} is not an input -> output "
                          f"of the {op.kind.value} op {op.output.name}; pass the op that relates them")
    types = _types(types, producer, consumer)
    if producer.mesh is None and consumer.mesh is None and STREAM not in types:
        return False  # nvFuser: no mesh on either side, no device placement to compare (Stream needs none)
    if producer.mesh != consumer.mesh and any(_on_mesh(p, producer.mesh) or _on_mesh(p, consumer.mesh)
                                              for p in types):
        return True
    mine = _ids(producer)
    ties = [(a, b) for a, b in _ties(op) if a.id in mine]
    p_tied, c_tied = {a.id for a, _ in ties}, {b.id for _, b in ties}
    graph = IdGraph((op,), facts)
    for p in types:
        pid = next((i for i in _parallel_ids(producer) if i.ptype == p), None)
        cid = next((i for i in _parallel_ids(consumer) if i.ptype == p), None)
        pid = pid if pid is not None and _ancestors(producer, pid, p_tied) else None
        cid = cid if cid is not None and _ancestors(consumer, cid, c_tied) else None
        if pid is None and cid is None:
            continue
        if pid is None or cid is None or graph.mapped(pid, cid) is None:
            return True
    return False


def stream_allocated(ops, tensor, outputs=None) -> bool:
    """Whether ``tensor`` (a name or TensorDomain) of the program ``ops`` is allocated per Stream
    chunk: it has a Stream loop ID, is neither a fusion input nor output (those keep allocation
    == logical; outputs default to the tensors no op uses), and every use has the same Stream
    sharding. ``stream_allocated(propagate_shardings(ops), "tv1") -> True``"""
    ops = tuple(ops)
    name = tensor.name if isinstance(tensor, TensorDomain) else tensor
    cur = _latest(ops)
    if name not in cur:
        raise DomainError(f"stream_allocated: no tensor {name!r} in the program ({', '.join(cur)}); name one of them")
    td = cur[name]
    if name in _fusion_inputs(ops) | _fusion_outputs(ops, outputs):
        return False
    if not any(i.ptype.kind is Kind.STREAM for i in td.loop):
        return False
    uses = [op for op in ops if name in {t.name for t in op.inputs}]
    return not any(have_different_shardings(td, cur[op.output.name], {STREAM}, op=op) for op in uses)
