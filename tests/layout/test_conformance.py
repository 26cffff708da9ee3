"""The CuTe conformance corpus: every accepted case behaves like C++ CuTe, every reject
is refused (../shared/conformance/cute)."""

from __future__ import annotations

import pytest

from shardlayout.errors import LayoutError

from .conformance import CONFORMANCE, check_case, decode_layout, load, run, same_behaviour

pytestmark = pytest.mark.skipif(
    CONFORMANCE is None, reason="shared/conformance/cute not found beside the checkout"
)

CASES = load("corpus.json")["cases"] if CONFORMANCE else []
REJECTS = load("rejects.json")["rejects"] if CONFORMANCE else []


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_case_behaves_like_cpp_cute(case):
    why = check_case(case)
    assert why is None, f"{case['id']} {case['inputs']}: {why}"


@pytest.mark.parametrize("case", REJECTS, ids=[c["id"] for c in REJECTS])
def test_reject_is_refused(case):
    if case["kind"] == "pycute_bug":
        out = run(case["op"], case["inputs"])
        assert same_behaviour(out, decode_layout(case["correct_expected"])) is None
        return
    with pytest.raises(LayoutError) as info:
        run(case["op"], case["inputs"])
    # the message names the operation
    assert case["op"].split("_")[0] in str(info.value) or "Layout" in str(info.value)


def test_corpus_is_complete():
    assert len(CASES) >= 500 and len(REJECTS) >= 180
