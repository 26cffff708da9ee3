"""Every ``$ shardlayout ...`` example of README.md and the docs site (docs/) runs and prints what the
page shows; the site builds without a warning; README links every task page.

An example is a ``$ shardlayout ...`` line in a code block; its expected output is the lines after
it up to the next ``$`` line or the end of the block. Numbers vary between runs (times, float
errors), so both sides have every number replaced by ``#`` before comparing; ``...`` in a line
stands for any text. Each expected line must appear in the output, in order. The exit code must be
2 when the page shows ``shardlayout: error:`` and 0 otherwise. (Python examples, ``>>>``, are run by
pytest's doctest of README.md and docs/*.md: ``make test``.)
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shardlayout.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").rglob("*.md"))
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def examples(page: Path) -> list:
    """``(line, command, expected lines)`` of each ``$ shardlayout`` example on ``page``."""
    out, block, cur = [], False, None
    for no, line in enumerate(page.read_text().splitlines(), 1):
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


EXAMPLES = [(page.relative_to(ROOT).as_posix(), *ex) for page in PAGES for ex in examples(page)]


def test_docs_have_examples():
    pages = {page for page, *_ in EXAMPLES}
    assert len(EXAMPLES) >= 30 and len(pages) >= 10, (len(EXAMPLES), sorted(pages))


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{page}:{no}" for page, no, _, _ in EXAMPLES])
def test_docs_example(example, monkeypatch):
    page, no, command, expected = example
    argv = shlex.split(command)[1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse usage errors
            code = e.code
    text = out.getvalue() + err.getvalue()
    wants_error = any("shardlayout: error:" in line for line in expected)
    assert code == (2 if wants_error else 0), f"{page} line {no}: `{command}` exited {code}:\n{text[-2000:]}"
    actual = " ".join(_norm(text).split())  # README wraps long lines: compare as one text
    pos = 0
    for want in expected:
        if not want.strip() or want.strip() == "...":
            continue
        nxt = _find(want, actual, pos)
        assert nxt >= 0, (f"{page} line {no}: `{command}` does not print (numbers aside)\n  {want}\n"
                          f"actual output:\n{text[-3000:]}")
        pos = nxt


def test_readme_is_short_and_links_every_page():
    """README is the landing page: under 200 lines, one click from each task page of the site."""
    text = README.read_text()
    assert len(text.splitlines()) < 200
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", text))
    nav = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav <= {p.relative_to(ROOT / "docs").as_posix() for p in PAGES[1:]}, "mkdocs.yml names a missing page"
    missing = sorted(p for p in nav - linked if not p.startswith("reference/") or p == "reference/index.md")
    assert not missing, f"README does not link {missing}"


def test_site_builds_without_warnings(tmp_path):
    """``make docs``: mkdocs in strict mode, so a broken link, a page left out of the nav or a docstring
    mkdocstrings cannot render fails the build."""
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "reference" / "run" / "index.html").read_text().count("parallelize") > 3
