"""Device meshes: ordered named axes with sizes; ranks are row-major (last axis fastest).

    >>> m = Mesh.parse("dp=2,tp=4"); m.size, m.coord(5), m.rank_of((1, 1))
    (8, (1, 1), 5)
"""

from __future__ import annotations

import numbers
import re
import reprlib
from dataclasses import dataclass
from functools import cached_property

from .errors import MeshError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


MAX_DEVICES = 1 << 20  # per-rank index sets are enumerated: a mesh beyond a million devices is refused
MAX_AXES = 16  # strategy search grows with the number of axes; no real mesh has more


@dataclass(frozen=True)
class Mesh:
    """A mesh ``Mesh((2, 4), ("dp", "tp"))``: axis ``dp`` of size 2, ``tp`` of size 4."""

    shape: tuple
    names: tuple

    def __post_init__(self):
        shape, names = self.shape, self.names
        if isinstance(shape, (str, bytes)) or not (isinstance(shape, numbers.Integral) or hasattr(shape, "__iter__")):
            raise MeshError(f"Mesh: shape {reprlib.repr(shape)} is not a tuple of axis sizes; give e.g. "
                            "Mesh((2, 4), ('dp', 'tp')) or Mesh.parse('dp=2,tp=4')")
        if isinstance(names, bytes) or not (isinstance(names, str) or hasattr(names, "__iter__")):
            raise MeshError(f"Mesh: names {reprlib.repr(names)} is not a tuple of axis names; give e.g. "
                            "Mesh((2, 4), ('dp', 'tp')) or Mesh.parse('dp=2,tp=4')")
        shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        names = (names,) if isinstance(names, str) else tuple(names)
        if len(shape) != len(names):
            raise MeshError(
                f"Mesh: {len(shape)} sizes {shape} but {len(names)} names {names}; give one name per axis"
            )
        for n, s in zip(names, shape):
            if not isinstance(n, str) or not _NAME.match(n):
                raise MeshError(f"Mesh: axis name {n!r} is not an identifier (e.g. 'dp', 'tp')")
            if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
                raise MeshError(f"Mesh: axis {n!r} has size {s!r}; sizes are positive ints")
        shape = tuple(int(s) for s in shape)  # numpy ints become ints: the hash and the text stay plain
        if len(set(names)) != len(names):
            raise MeshError(f"Mesh: axis names {names} repeat; each axis needs its own name")
        if len(names) > MAX_AXES:
            raise MeshError(f"Mesh: {len(names)} axes, more than the {MAX_AXES} this tool plans for; "
                            "merge axes that act together (e.g. dp=2,fsdp=4 as dp=8)")
        total = 1
        for s in shape:
            total *= s
        if total > MAX_DEVICES:
            raise MeshError(
                f"Mesh: {'x'.join(map(str, shape))} is {total} devices, more than the {MAX_DEVICES} this tool "
                "plans for (per-rank work is enumerated); give a smaller mesh"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "names", names)

    @staticmethod
    def parse(text: str) -> "Mesh":
        """``Mesh.parse("dp=2,tp=4")``; the empty string is a mesh of one device."""
        if not isinstance(text, str):
            raise MeshError(f"Mesh.parse: got {type(text).__name__} {reprlib.repr(text)}, not text; write e.g. "
                            "'dp=2,tp=4'" + (" (decode bytes first)" if isinstance(text, bytes) else
                                             " (a Mesh is used as it is, not parsed)"))
        text = text.strip()
        if not text:
            return Mesh((), ())
        names, shape = [], []
        for part in text.split(","):
            if "=" not in part:
                raise MeshError(
                    f"Mesh.parse: {part.strip()!r} in {text!r} is not 'name=size'; write e.g. 'dp=2,tp=4'"
                )
            n, s = part.split("=", 1)
            n, s = n.strip(), s.strip()
            if not (s.isascii() and s.isdigit()):
                raise MeshError(f"Mesh.parse: size {s[:24]!r} of axis {n!r} is not a positive integer (ASCII digits)")
            if len(s) > 18:
                raise MeshError(f"Mesh.parse: axis {n!r} of size {s[:20]}... ({len(s)} digits) is more than the "
                                f"{MAX_DEVICES} devices this tool plans for; give a smaller mesh")
            names.append(n)
            shape.append(int(s))
        return Mesh(tuple(shape), tuple(names))

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.shape))

    def __hash__(self) -> int:  # computed once: every Sharding's hash and memo key holds its mesh
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.shape, self.names))
            self.__dict__["_hash"] = h  # what object.__setattr__ does here (no descriptor), one store
        return h

    def __reduce__(self):  # rebuilt from its fields: a hash is valid in one process only
        return (Mesh, (self.shape, self.names))

    @property
    def ndim(self) -> int:
        """Number of axes. ``Mesh.parse("dp=2,tp=4").ndim -> 2``."""
        return len(self.shape)

    @cached_property
    def size(self) -> int:
        """Number of devices. ``Mesh.parse("dp=2,tp=4").size -> 8``."""
        p = 1
        for s in self.shape:
            p *= s
        return p

    def axis_size(self, name: str) -> int:
        """Size of an axis. ``Mesh.parse("dp=2,tp=4").axis_size("tp") -> 4``."""
        return self.shape[self.axis_index(name)]

    def axis_index(self, name: str) -> int:
        """Position of an axis. ``Mesh.parse("dp=2,tp=4").axis_index("tp") -> 1``."""
        try:
            return self.names.index(name)
        except ValueError:
            raise MeshError(
                f"mesh {self} has no axis {name!r}; its axes are {', '.join(self.names) or '(none)'}"
            ) from None

    def coord(self, rank: int) -> tuple:
        """Mesh coordinate of a rank, row-major. ``Mesh.parse("dp=2,tp=4").coord(5) -> (1, 1)``."""
        if type(rank) is not int:
            rank = _whole(rank, f"mesh {self}: rank {reprlib.repr(rank)}",
                          f"give the rank as an int from 0 to {self.size - 1}")
        if not 0 <= rank < self.size:
            raise MeshError(f"rank {rank} is not in mesh {self} of {self.size} devices")
        out = []
        for s in reversed(self.shape):
            out.append(rank % s)
            rank //= s
        return tuple(reversed(out))

    def rank_of(self, coord) -> int:
        """Rank at a mesh coordinate. ``Mesh.parse("dp=2,tp=4").rank_of((1, 1)) -> 5``."""
        if type(coord) is not tuple:
            if isinstance(coord, (set, frozenset, dict)):
                raise MeshError(f"mesh {self}: coordinate {reprlib.repr(coord)} is a {type(coord).__name__}, which has "
                                f"no order; give a tuple with one int per axis ({', '.join(self.names) or 'none'}), "
                                f"e.g. mesh.rank_of({(0,) * self.ndim})")
            if isinstance(coord, (str, bytes)) or not hasattr(coord, "__iter__"):
                raise MeshError(f"mesh {self}: coordinate {reprlib.repr(coord)} is not a tuple of ints; give one int "
                                f"per axis ({', '.join(self.names) or 'none'}), e.g. mesh.rank_of({(0,) * self.ndim})")
            coord = tuple(coord)
        if len(coord) != self.ndim:
            raise MeshError(
                f"coordinate {tuple(coord)} has {len(coord)} entries; mesh {self} has {self.ndim} axes"
            )
        r = 0
        for i, (c, s, n) in enumerate(zip(coord, self.shape, self.names)):
            if type(c) is not int:
                c = _whole(c, f"mesh {self}: coordinate {reprlib.repr(coord)}, entry {i} (axis {n!r}) "
                           f"{reprlib.repr(c)}", f"give one int per axis, from 0 to {s - 1} on axis {n!r}")
            if not 0 <= c < s:
                raise MeshError(f"coordinate {c} on axis {n!r} is outside 0..{s - 1}")
            r = r * s + c
        return r

    def ranks(self) -> range:
        """All ranks. ``list(Mesh.parse("x=2").ranks()) -> [0, 1]``."""
        return range(self.size)

    def submesh(self, names) -> "Mesh":
        """The mesh of the named axes, in the given order. ``Mesh.parse("dp=2,tp=4").submesh(["tp"])``."""
        if isinstance(names, str):
            names = [names]
        if isinstance(names, (bytes, set, frozenset, dict)) or not hasattr(names, "__iter__"):
            raise MeshError(f"mesh {self}: submesh names {reprlib.repr(names)} are not a list of axis names; give "
                            f"e.g. submesh([{self.names[-1] if self.names else 'tp'!r}])")
        names = tuple(names)
        return Mesh(tuple(self.axis_size(n) for n in names), tuple(names))


def _whole(x, what: str, fix: str) -> int:
    """``x`` as an int (numpy ints accepted), or a MeshError: ``what`` is not a whole number; ``fix``.
    bools are refused (True is an int to Python, never a rank or coordinate to a user)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        kind = "a bool" if isinstance(x, bool) else f"a {type(x).__name__}"
        raise MeshError(f"{what} is {kind}, not an int; {fix}")
    return int(x)


def as_mesh(mesh, where: str) -> Mesh:
    """``mesh`` as a Mesh: a Mesh as it is, its text (``"dp=2,tp=4"``) parsed; anything else a
    MeshError naming ``where`` and the type received. ``as_mesh("tp=2", "plan").size -> 2``"""
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, str):
        return Mesh.parse(mesh)
    raise MeshError(f"{where}: mesh must be a Mesh or its text, got {type(mesh).__name__} {reprlib.repr(mesh)}; "
                    "pass e.g. Mesh.parse('dp=2,tp=4') or 'dp=2,tp=4'")


def group_ranks(mesh: Mesh, rank: int, pieces) -> tuple:
    """The ranks that agree with ``rank`` everywhere but in the digits of ``pieces`` (mesh-axis
    pieces with ``axis``, ``size`` and ``pre``: ``AxisPiece`` values), ascending — enumerated from
    the pieces, never by scanning the mesh.
    ``group_ranks(Mesh.parse("dp=2,tp=4"), 5, (AxisPiece("tp", 2, 2),)) -> (4, 5)``"""
    coord = list(mesh.coord(rank))
    place = [1] * mesh.ndim  # row-major: a step of one along axis i moves the rank by place[i]
    for i in range(mesh.ndim - 2, -1, -1):
        place[i] = place[i + 1] * mesh.shape[i + 1]
    offsets = [0]
    for p in pieces:
        i = mesh.axis_index(p.axis)
        stride = mesh.shape[i] // (p.pre * p.size)
        coord[i] -= ((coord[i] // stride) % p.size) * stride
        step = stride * place[i]
        offsets = [o + g * step for o in offsets for g in range(p.size)]
    base = mesh.rank_of(tuple(coord))
    return tuple(sorted({base + o for o in offsets}))
