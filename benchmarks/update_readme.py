"""Paste every ``benchmarks/results/<name>.md`` into the page that shows it (README.md or a page under
docs/), between ``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->``. Run by ``make bench`` after
the benchmarks; a marker without a result file, a result file without a marker, or a marker on two
pages is an error (exit 2), so no page can drift silently.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main() -> int:
    texts = {page: page.read_text() for page in PAGES}
    where: dict[str, list[Path]] = {}
    for page, text in texts.items():
        for name in set(re.findall(r"<!-- bench:([\w-]+) -->", text)):
            where.setdefault(name, []).append(page)
    results = {p.stem: p.read_text() for p in RESULTS.glob("*.md")}
    missing = sorted(set(where) - set(results))
    unused = sorted(set(results) - set(where))
    twice = sorted(name for name, pages in where.items() if len(pages) > 1)
    if missing or unused or twice:
        print(f"update_readme: markers without results {missing}, results without markers {unused}, "
              f"markers on several pages {twice}", file=sys.stderr)
        return 2
    for name, (page,) in sorted(where.items()):
        pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
        texts[page], n = pattern.subn(lambda m, body=results[name]: m.group(1) + body + m.group(2), texts[page])
        if n != 1:
            print(f"update_readme: markers for {name!r} found {n} times in {page.name}, expected once",
                  file=sys.stderr)
            return 2
    for page in {page for (page,) in where.values()}:
        page.write_text(texts[page])
    print(f"{len(where)} benchmark tables updated: "
          + ", ".join(f"{name} ({where[name][0].relative_to(ROOT)})" for name in sorted(where)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
