"""Sharding: canonical form, text round trip, validation errors."""

from __future__ import annotations

import pytest
from hypothesis import given

from shardlayout import Mesh, MeshError, Sharding, ShardingError, ShardingSpecError
from shardlayout.sharding import Factor

from .strategies import shardings

M = Mesh.parse("dp=2,tp=4")


@given(shardings())
def test_text_round_trip(s):
    t = Sharding.parse(str(s), s.mesh)
    assert t == s and str(t) == str(s) and hash(t) == hash(s)


def test_examples_from_the_design():
    assert str(Sharding.from_placements(M, (8, 12), ["S(0)", "S(1)"])) == "[dp*4, tp*3]"
    s = Sharding.parse("[2*tp*2, 12]", Mesh.parse("tp=2"))
    assert s.shape == (8, 12) and s.to_placements() == ("SS(0,2)",)
    p = Sharding.parse("[8, 12] +sum(tp)", M)
    assert p.partial == (("tp", "sum"),) and p.replicated_axes() == ("dp",)
    sub = Sharding.parse("[dp*4*tp:(1)2, tp:(2)2*3]", M)
    assert sub.shape == (16, 6) and sub.dims[1][0] == Factor(2, "tp", 2)


def test_canonical_form_and_equality_by_meaning():
    a = Sharding(M, (8, 12), [["dp", 2, 2], [Factor(2, "tp", 1), Factor(2, "tp", 2), 3]])
    b = Sharding.parse("[dp*4, tp*3]", M)
    assert a == b and str(a) == "[dp*4, tp*3]"
    assert Sharding(M, (8, 12), [["dp"], ["tp"]]) == b  # innermost local factor filled in
    assert Sharding(M, (8, 12), [[1, "dp", 4], [Factor(1, "tp", 1), "tp", 3]]) == b
    assert Sharding(M, (8, 12)) == Sharding.replicated(M, (8, 12))
    assert Sharding(M, (8,), [["dp"]], {"tp": "max"}) != Sharding(M, (8,), [["dp"]])


def test_uneven_text_carries_the_size():
    s = Sharding(Mesh.parse("x=2,y=2"), (9,), [["x", "y"]])
    assert str(s) == "[x*y*3 of 9]" and not s.is_even()
    assert Sharding.parse("[x*y*3 of 9]", s.mesh) == s


@pytest.mark.parametrize(
    "build,needle",
    [
        (lambda: Sharding(M, (8, 12), [["dp"], ["dp"]]), "axis 'dp' is used twice"),
        (lambda: Sharding(M, (16,), [[Factor(4, "tp", 2)]]), "does not fit"),
        (lambda: Sharding(M, (8, 8), [[Factor(2, "tp", 1)], [Factor(2, "tp", 1)]]), "overlap"),
        (lambda: Sharding(M, (8,), [["tp"]], {"tp": "sum"}), "both shards a dim and holds partial"),
        (lambda: Sharding(M, (8,), [["dp", 3]]), "innermost local factor must be 4"),
        (lambda: Sharding(M, (8,), [["dp"]], {"dp2": "sum"}), "no axis 'dp2'"),
        (lambda: Sharding(M, (8,), [["dp"]], {"tp": "mean"}), "not one of sum, avg, max, min"),
        (lambda: Sharding(M, (8, 0), None), "positive int"),
        (lambda: Sharding(M, (8,), [[], []]), "1 dims but 2 factor lists"),
        (lambda: Sharding(M, (8,), [["pp"]]), "no axis 'pp'"),
        (lambda: Sharding.parse("[dp*4", M), "Sharding.parse"),
        (lambda: Sharding.parse("[dp*4] junk", M), "unexpected 'junk'"),
        (lambda: Sharding.parse("[tp:(3)2]", M), "m*k to divide"),
        (lambda: Mesh.parse("dp=2,tp"), "not 'name=size'"),
        (lambda: Mesh((2, 0), ("a", "b")), "positive ints"),
        (lambda: Mesh((2, 2), ("a", "a")), "repeat"),
    ],
)
def test_validation_errors_name_the_problem(build, needle):
    with pytest.raises(ShardingError) as e:
        build()
    assert needle in str(e.value)


def test_error_classes():
    with pytest.raises(ShardingSpecError):
        Sharding(M, (8,), [["dp", 3]])
    with pytest.raises(MeshError):
        M.coord(8)
    assert issubclass(MeshError, ShardingError)


def test_mesh_basics():
    assert M.size == 8 and M.coord(5) == (1, 1) and M.rank_of((1, 1)) == 5
    assert [M.rank_of(M.coord(r)) for r in M.ranks()] == list(range(8))
    assert M.submesh(["tp"]) == Mesh((4,), ("tp",)) and str(M) == "dp=2,tp=4"


def test_shardings_and_meshes_pickle_across_processes():
    """A pickled Sharding or Mesh carries its fields, not its hash (string hashes differ between
    processes): unpickled in another process it is equal to, and finds, the same layout there."""
    import os
    import pickle
    import subprocess
    import sys

    code = ("import pickle, sys\nfrom shardlayout import Mesh, Sharding\nm = Mesh.parse('dp=2,tp=4')\n"
            "s = Sharding.parse('[dp*4, tp*2] +sum(x)', Mesh.parse('dp=2,tp=4,x=2'))\n"
            "hash(m), hash(s)\nsys.stdout.buffer.write(pickle.dumps((m, s)))\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, env=env).stdout
    m2, s2 = pickle.loads(out)
    m, s = Mesh.parse("dp=2,tp=4"), Sharding.parse("[dp*4, tp*2] +sum(x)", Mesh.parse("dp=2,tp=4,x=2"))
    assert m2 == m and s2 == s and {m: 1}[m2] == 1 and {s: 2}[s2] == 2
    assert str(s2) == str(s) and pickle.loads(pickle.dumps(s)) == s


# -- bad inputs at the boundary: the error class and what the message names ----------------------
S = Sharding.parse("[dp*4, tp*3]", M)


@pytest.mark.parametrize(
    "build,cls,needle",
    [
        (lambda: Mesh.parse(None), MeshError, "Mesh.parse: got NoneType None, not text"),
        (lambda: Mesh.parse(42), MeshError, "Mesh.parse: got int 42, not text"),
        (lambda: Mesh.parse(b"dp=2"), MeshError, "got bytes b'dp=2', not text; write e.g. 'dp=2,tp=4' (decode"),
        (lambda: Mesh(None, None), MeshError, "Mesh: shape None is not a tuple of axis sizes"),
        (lambda: Mesh(2, 5), MeshError, "Mesh: names 5 is not a tuple of axis names"),
        (lambda: M.submesh(None), MeshError, "submesh names None are not a list of axis names"),
        (lambda: M.rank_of({1, 0}), MeshError, "is a set, which has no order; give a tuple"),
        (lambda: Sharding.parse("[8, 12] +sum()", M), ShardingSpecError, "'+sum()' in '[8, 12] +sum()' names no mesh "
                                                                        "axis; write the partial axes inside"),
        (lambda: Sharding.parse("[chunks(dp/99999999999999999999, tp) of 16]", M), ShardingSpecError,
         "split factor 99999999999999999999 of dp must be an int in [1, 9223372036854775807]"),
        (lambda: Sharding.parse("[chunks(dp/" + "9" * 5000 + ", tp) of 16]", M), ShardingSpecError,
         "(5000 digits) of dp must be an int in [1, 9223372036854775807]"),
        (lambda: Sharding("dp=2", (8,), [[(2, "dp", 1.0)]]), ShardingSpecError, "has pre 1.0, not an int"),
        (lambda: S.is_even(5), ShardingSpecError, "is_even: dim 5 is not a dim of [dp*4, tp*3] (2 dims)"),
        (lambda: S.is_even("0"), ShardingSpecError, "is_even: dim '0' is not a dim"),
        (lambda: S.axis_pieces("zz"), MeshError, "has no axis 'zz'; its axes are dp, tp"),
    ],
)
def test_bad_inputs_raise_the_fitting_error(build, cls, needle):
    with pytest.raises(cls) as e:
        build()
    assert needle in str(e.value), str(e.value)


def test_near_misses_of_the_bad_inputs_succeed():
    assert Mesh(2, "dp") == Mesh.parse("dp=2") and M.submesh(("tp", "dp")) == Mesh.parse("tp=4,dp=2")
    assert M.rank_of([1, 1]) == 5
    assert Sharding("dp=2", (8,), [[(2, "dp", 1)]]) == Sharding.parse("[dp*4]", "dp=2")
    assert str(Sharding.parse("[chunks(dp/3, tp) of 16]", M)) == "[chunks(dp/3, tp) of 16]"
    assert S.is_even(-1) and S.is_even(1) and S.axis_pieces("tp") == [(1, 0, Factor(4, "tp"))]
