"""Paste every ``benchmarks/results/<name>.md`` into README.md between ``<!-- bench:<name> -->`` and
``<!-- /bench:<name> -->``. Run by ``make bench`` after the benchmarks; a marker without a result
file, or a result file without markers, is an error (exit 2), so README cannot drift silently.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    names = set(re.findall(r"<!-- bench:([\w-]+) -->", text))
    results = {p.stem: p.read_text() for p in RESULTS.glob("*.md")}
    missing = sorted(names - set(results))
    unused = sorted(set(results) - names)
    if missing or unused:
        print(f"update_readme: markers without results {missing}, results without markers {unused}",
              file=sys.stderr)
        return 2
    for name in sorted(names):
        pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
        text, n = pattern.subn(lambda m, body=results[name]: m.group(1) + body + m.group(2), text)
        if n != 1:
            print(f"update_readme: markers for {name!r} found {n} times, expected once", file=sys.stderr)
            return 2
    readme.write_text(text)
    print(f"README.md: {len(names)} benchmark tables updated ({', '.join(sorted(names))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
