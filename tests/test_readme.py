"""Every ``$ shardlayout ...`` example of README.md runs and prints what README shows.

An example is a ``$ shardlayout ...`` line in a code block; its expected output is the lines after
it up to the next ``$`` line or the end of the block. Numbers vary between runs (times, float
errors), so both sides have every number replaced by ``#`` before comparing; ``...`` in a line
stands for any text. Each expected line must appear in the output, in order. The exit code must be
2 when README shows ``shardlayout: error:`` and 0 otherwise. (Python examples, ``>>>``, are run by
pytest's doctest of README.md.)
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from shardlayout.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def examples() -> list:
    out, block, cur = [], False, None
    for no, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = not block
            if cur:
                out.append(cur)
            cur = None
            continue
        if not block:
            continue
        if line.startswith("$ shardlayout "):
            if cur:
                out.append(cur)
            cur = (no, line[2:], [])
        elif line.startswith("$ "):
            if cur:
                out.append(cur)
            cur = None
        elif cur is not None:
            cur[2].append(line)
    return out


def _norm(text: str) -> str:
    return NUMBER.sub("#", text.rstrip())


def _find(expected: str, actual: str, pos: int) -> int:
    """Where ``expected`` (numbers as ``#``, ``...`` any text) ends in ``actual`` at or after
    ``pos``, or -1."""
    for part in _norm(expected).split("..."):
        part = " ".join(part.split())
        if not part:
            continue
        at = actual.find(part, pos)
        if at < 0:
            return -1
        pos = at + len(part)
    return pos


EXAMPLES = examples()


def test_readme_has_examples():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{no}" for no, _, _ in EXAMPLES])
def test_readme_example(example, monkeypatch):
    no, command, expected = example
    argv = shlex.split(command)[1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse usage errors
            code = e.code
    text = out.getvalue() + err.getvalue()
    wants_error = any("shardlayout: error:" in line for line in expected)
    assert code == (2 if wants_error else 0), f"README line {no}: `{command}` exited {code}:\n{text[-2000:]}"
    actual = " ".join(_norm(text).split())  # README wraps long lines: compare as one text
    pos = 0
    for want in expected:
        if not want.strip() or want.strip() == "...":
            continue
        nxt = _find(want, actual, pos)
        assert nxt >= 0, (f"README line {no}: `{command}` does not print (numbers aside)\n  {want}\n"
                          f"actual output:\n{text[-3000:]}")
        pos = nxt
