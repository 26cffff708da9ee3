"""Nested tensors: the storage of a tensor with a ragged dim (nvFuser RFC #5550).

A nested tensor has a *component* dim (e.g. experts) followed by a *ragged* dim whose extent
differs per component (the tokens each expert received). It is stored the RFC's way: the two
dims as one flat dim of ``data`` at position ``dim``, component after component, and the
extents beside it. ``extents`` has shape ``(sources, components)``: component ``c``'s rows
are the blocks of sources ``0 .. sources-1`` in that order (a source is the rank a block came
from, in expert parallelism; one source when nothing was exchanged). Zero-size components and
blocks are allowed. ``data`` is a numpy array or a torch tensor: every function here takes
the array module from the data.

    >>> import numpy as np
    >>> n = Nested.from_list([np.ones((2, 3)), np.zeros((0, 3)), np.full((1, 3), 5.0)])
    >>> n.logical_shape, n.extents.tolist(), n.data.shape
    ((3, 'ragged[2, 0, 1]', 3), [[2, 0, 1]], (3, 3))
    >>> [c.shape for c in n.to_list()]
    [(2, 3), (0, 3), (1, 3)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShardingError


class RaggedError(ShardingError):
    """An operation on a ragged dim that its semantics leave undefined (mixing ragged and
    dense rows in one dim, extents that do not match the data or each other)."""


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _concat(parts: list, axis: int, like):
    if _is_torch(like):
        import torch

        return torch.cat(parts, dim=axis)
    return np.concatenate(parts, axis=axis)


def _take(data, axis: int, start: int, stop: int):
    return data[(slice(None),) * axis + (slice(start, stop),)]


@dataclass(frozen=True, eq=False)
class Nested:
    """One nested tensor (or one rank's piece of one): ``data`` with the component and ragged
    dims stored as one flat dim at ``dim``, ``extents`` an int array ``(sources, components)``
    whose sum is that flat dim's length. See the module docstring."""

    data: object
    extents: np.ndarray
    dim: int = 0

    def __post_init__(self):
        e = np.asarray(self.extents, dtype=np.int64)
        if e.ndim == 1:
            e = e[None, :]
        if e.ndim != 2:
            raise RaggedError(f"nested tensor: extents must be (sources, components), got shape {e.shape}")
        if (e < 0).any():
            raise RaggedError(f"nested tensor: extents {e.tolist()} has a negative entry; extents count rows")
        object.__setattr__(self, "extents", e)
        shape = tuple(self.data.shape)
        if not 0 <= self.dim < max(len(shape), 1):
            raise RaggedError(f"nested tensor: dim {self.dim} is out of range for data of shape {shape}")
        if shape[self.dim] != int(e.sum()):
            raise RaggedError(f"nested tensor: data has {shape[self.dim]} rows in dim {self.dim} but the extents "
                              f"{e.tolist()} sum to {int(e.sum())}; give extents that count the stored rows")

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_list(cls, parts: list, dim: int = 0) -> "Nested":
        """A one-source nested tensor from its components (arrays whose ``dim`` is the ragged
        one). ``Nested.from_list([np.ones((2, 4)), np.ones((0, 4))]).extents -> [[2, 0]]``"""
        if not parts:
            raise RaggedError("nested tensor: give at least one component (an empty list has no dense shape)")
        rest = {tuple(p.shape[:dim]) + tuple(p.shape[dim + 1:]) for p in parts}
        if len(rest) != 1:
            raise RaggedError(f"nested tensor: components differ outside the ragged dim {dim}: "
                              f"{[tuple(p.shape) for p in parts]}; only the ragged dim may vary")
        return cls(_concat(list(parts), dim, parts[0]), np.asarray([[p.shape[dim] for p in parts]]), dim)

    # -- shape ------------------------------------------------------------------------------------
    @property
    def sources(self) -> int:
        """Blocks per component (1 unless exchanged between ranks)."""
        return int(self.extents.shape[0])

    @property
    def components(self) -> int:
        """Number of components."""
        return int(self.extents.shape[1])

    @property
    def component_extents(self) -> np.ndarray:
        """Rows per component (summed over sources)."""
        return self.extents.sum(axis=0)

    @property
    def logical_shape(self) -> tuple:
        """The RFC's shape: the component count, then ``'ragged[...]'``, around the dense dims."""
        shape = tuple(self.data.shape)
        ragged = "ragged[" + ", ".join(str(int(x)) for x in self.component_extents) + "]"
        return shape[: self.dim] + (self.components, ragged) + shape[self.dim + 1:]

    def offsets(self) -> np.ndarray:
        """Where each (component, source) block starts in the flat dim, component-major then
        source, and the end as the last entry: ``components * sources + 1`` ints."""
        flat = self.extents.T.reshape(-1)
        return np.concatenate([[0], np.cumsum(flat)]).astype(np.int64)

    # -- access -----------------------------------------------------------------------------------
    def block(self, component: int, source: int):
        """The rows of one (component, source) block."""
        off = self.offsets()
        k = component * self.sources + source
        return _take(self.data, self.dim, int(off[k]), int(off[k + 1]))

    def component(self, c: int):
        """Every row of component ``c`` (its sources in order)."""
        off = self.offsets()
        return _take(self.data, self.dim, int(off[c * self.sources]), int(off[(c + 1) * self.sources]))

    def to_list(self) -> list:
        """The components as arrays (the reference form: a list of arrays)."""
        return [self.component(c) for c in range(self.components)]

    def merged(self) -> "Nested":
        """The same rows with the sources merged into one (the RFC's merge of a batch dim with the
        ragged dim: extents summed). ``n.merged().sources -> 1``"""
        return Nested(self.data, self.component_extents[None, :], self.dim)

    def with_data(self, data, dim: int | None = None) -> "Nested":
        """Same extents, new data (an op that keeps every row where it was)."""
        return Nested(data, self.extents, self.dim if dim is None else dim)


def from_blocks(blocks: dict, components: int, sources: int, dim: int, like, shape=None) -> Nested:
    """A nested tensor from ``{(component, source): rows}`` (every pair present), stored
    component-major then source. ``like`` gives the array type, ``shape`` the storage shape
    (any length at ``dim``) of a piece with no blocks (a rank holding no component)."""
    parts, ext = [], np.zeros((sources, components), dtype=np.int64)
    for c in range(components):
        for s in range(sources):
            b = blocks[(c, s)]
            parts.append(b)
            ext[s, c] = b.shape[dim]
    if not parts:
        if shape is None:
            raise RaggedError("nested tensor: no blocks and no storage shape to make an empty piece of")
        empty = tuple(shape[:dim]) + (0,) + tuple(shape[dim + 1:])
        data = like.new_zeros(empty) if _is_torch(like) else np.zeros(empty, dtype=np.asarray(like).dtype)
        return Nested(data, ext if components else np.zeros((max(sources, 1), 0), dtype=np.int64), dim)
    return Nested(_concat(parts, dim, like), ext, dim)


def same_extents(values: list) -> np.ndarray:
    """The extents shared by nested operands of one op; raises RaggedError when they differ (the
    RFC leaves mismatched offsets undefined)."""
    nested = [v for v in values if isinstance(v, Nested)]
    first = nested[0].extents
    for v in nested[1:]:
        if v.extents.shape != first.shape or not np.array_equal(v.extents, first):
            raise RaggedError(f"nested operands have different extents {first.tolist()} and {v.extents.tolist()}; "
                              "operands of one op must share their ragged dim (the same offsets)")
    return first


__all__ = ["Nested", "RaggedError", "from_blocks", "same_extents"]
