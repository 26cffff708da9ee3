"""torchtitan 0.3's own language models at their debug flavors, every style: does each plan right?

Not part of the test suite (it takes minutes): each factory of ``examples/titan_models.py`` (a
torchtitan family's ``debugmodel`` cut to 2 layers, maskless SDPA) planned by the CLI as a user
would, ``shardlayout plan --module examples/titan_models.py:FACTORY --mesh M --style S --verify
--json``, in a fresh process per run:

* ``megatron`` and ``megatron-sp`` on ``tp=2`` and on ``dp=2,tp=2``, ``auto`` on ``dp=2,tp=2``,
  ``ep`` on ``ep=2`` for MoE models, and torchtitan's own TP plan (read off its code path by
  ``examples/titan_models.py:tp_plan``, sequence parallel, written to
  ``examples/titan_tp/FACTORY.json``) as ``--tp-plan`` on ``dp=2,tp=2``;
* each run is classified as ``benchmarks/hf_sweep.py`` does: its exit code (2 with one line: a
  model the project cannot plan yet, listed with its reason), ``verified``, the collectives
  against Megatron's count, every layer weight cut on ``tp`` in Megatron's dim
  (``examples/titan_models.py:megatron_cuts``: torchtitan's names), auto's estimate against the
  best built-in style that fits. torchtitan's plan is counted as Megatron-SP's plus one
  reduce_scatter for the vocab-parallel embedding and one all_gather before the head.

Resumable: each run's result is kept in ``--work`` (default ``/tmp/titan_sweep``) under a key of
the example's source, the factory, the style, the mesh and shardlayout's own source.

Run: ``python benchmarks/titan_sweep.py [-j 2] [--only REGEX] [--json]`` (writes
``benchmarks/results/titan_sweep.md``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_sweep  # noqa: E402
from hf_sweep import _counts, cut_dims  # noqa: E402
from report import RESULTS, machine, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "titan_models.py"
PLANS = ROOT / "examples" / "titan_tp"
TP, DPTP, EP = "tp=2", "dp=2,tp=2", "ep=2"
RUNS = (("megatron", TP), ("megatron-sp", TP), ("megatron", DPTP), ("megatron-sp", DPTP), ("auto", DPTP))
TITAN = ("tp-plan", DPTP)  # torchtitan's own TP plan
CASES = ("llama3", "llama3_gqa", "qwen3", "qwen3_split_qkv", "qwen3_moe", "deepseek_v3", "kimi_k2_7", "gpt_oss",
         "muse_glimmer", "qwen3_5")


@functools.cache
def examples():
    """examples/titan_models.py as a module: its factories, ``tp_plan`` and ``megatron_cuts``."""
    spec = importlib.util.spec_from_file_location("titan_models_example", EXAMPLES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class Facts:
    """What the expectation reads off a factory's model: ``layers``, ``tied`` (one vocab-parallel
    table for lookup and head), ``moe_layers``, ``cuts`` (``megatron_cuts`` on tp=2)."""

    layers: int
    tied: bool
    moe_layers: int
    cuts: dict


def prepare(name: str) -> Facts | str:
    """The Facts of factory ``name``'s model, and its torchtitan TP plan written to
    ``examples/titan_tp/NAME.json``; a factory that cannot build gives its error line instead."""
    ex = examples()
    try:
        model, _ = getattr(ex, name)()
        plan = ex.tp_plan(name)
    except Exception as e:  # noqa: BLE001 - a model this environment cannot build: reported, not raised
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    PLANS.mkdir(exist_ok=True)
    text = json.dumps(plan, indent=2) + "\n"
    path = PLANS / f"{name}.json"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    head = getattr(model, "lm_head", None)
    tied = head is not None and any(head.weight is m.weight for m in model.modules() if isinstance(m, nn.Embedding))
    moe = {n.split(".")[1] for n, p in model.named_parameters() if p.dim() == 3 and n.startswith("layers.")}
    return Facts(len(model.layers), tied, len(moe), ex.megatron_cuts(model, tp=2))


def expected(f: Facts, style: str) -> Counter | None:
    """Megatron's collectives for ``style`` (``auto``: None, not counted); ``tp-plan``:
    Megatron-SP's plus the embedding's reduce_scatter and the head's all_gather."""
    blocks = 2 * f.layers + f.tied
    if style == "megatron":
        return Counter({("all_reduce", "tp"): blocks})
    if style == "megatron-sp":
        return Counter({("reduce_scatter", "tp"): blocks, ("all_gather", "tp"): blocks})
    if style == "tp-plan":
        return Counter({("reduce_scatter", "tp"): 2 * f.layers + 1, ("all_gather", "tp"): 2 * f.layers + 1})
    if style == "ep":
        return Counter({("all_to_all", "ep"): 2 * f.moe_layers})
    return None


def run_one(name: str, style: str, mesh: str, work: Path, key: str) -> dict:
    """One CLI run, its result kept under ``work/runs`` (read back when already there)."""
    plan = PLANS / f"{name}.json"
    extra = ["--tp-plan", str(plan)] if style == "tp-plan" else ["--style", style]
    what = EXAMPLES.read_bytes() + (plan.read_bytes() if style == "tp-plan" else b"")
    tag = hashlib.sha256(what + f"{name}|{style}|{mesh}|{key}".encode()).hexdigest()[:16]
    kept = work / "runs" / f"{name}-{style}-{mesh.replace(',', '_').replace('=', '')}-{tag}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    cmd = [sys.executable, "-m", "shardlayout", "plan", "--module", f"{EXAMPLES}:{name}", "--mesh", mesh, *extra,
           "--verify", "--json"]
    return hf_sweep.run_kept(cmd, kept, work)


def classify(f: Facts, style: str, r: dict) -> list:
    """Why run ``r`` is not strict OK, one reason a string (``[]``: strict OK). An exit 2 with one
    line is a clean refusal (``refused: ...``), still not OK."""
    if r["rc"] == 2 and r.get("error_lines", 1) == 1:
        return [f"refused: {r['error'].replace(str(ROOT) + '/', '')}"]
    if r["rc"] not in (0, 1) or "tensors" not in r:
        return [f"exit {r['rc']}: {r['error']}"]
    reasons = [] if r["verified"] else ["not verified"]
    want = expected(f, style)
    got = Counter((k, axes) for k, axes, _, _ in r["collectives"])
    if want is not None and got != +want:
        reasons.append("counts " + _counts(got) + " want " + _counts(+want))
    if style in ("megatron", "megatron-sp", "tp-plan"):
        wrong = [n for n, dims in f.cuts.items() if dims is not None and n in r["tensors"]
                 and cut_dims(r["tensors"][n]) != dims]
        if wrong:
            leaves = sorted({re.sub(r"^.*\.\d+\.", "", n) for n in wrong})
            reasons.append("weights not in Megatron's dim: " + ", ".join(leaves))
    if style == "auto" and r.get("auto") and (r["auto"]["vs_best_style"] or 0) > 1 + 1e-9:
        reasons.append(f"auto {r['auto']['vs_best_style']:.3f}x the best style ({r['auto']['best_style']})")
    return reasons


def runs_of(f: Facts | str) -> list:
    """The (style, mesh) runs of a factory: ep too when its model routes experts, torchtitan's plan."""
    if isinstance(f, str):  # the CLI's own answer for a model that cannot build here
        return list(RUNS[:1])
    return [*RUNS, *([("ep", EP)] if f.moe_layers else []), TITAN]


def sweep(names, work: Path, jobs: int) -> list:
    """Every factory's runs, ``jobs`` at a time, progress on stderr; rows of
    ``(name, facts, style, mesh, result, reasons)``."""
    key = hf_sweep.source_key()
    todo = [(n, f, s, m) for n in names for f in [prepare(n)] for s, m in runs_of(f)]
    rows, done = [], 0

    def one(item):
        n, f, s, m = item
        return item, run_one(n, s, m, work, key)

    with ThreadPoolExecutor(jobs) as pool:
        for (n, f, s, m), r in pool.map(one, todo):
            done += 1
            reasons = classify(f, s, r) if not isinstance(f, str) or r["rc"] == 2 else [f"exit {r['rc']}: {f}"]
            rows.append((n, f, s, m, r, reasons))
            print(f"[{done}/{len(todo)}] {n} {s} {m}: {'; '.join(reasons) or 'strict OK'} "
                  f"({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
    return rows


def summary(rows) -> dict:
    """The figures: runs, exit 0, verified, strict OK, clean refusals, and the failures by reason."""
    by: dict = {}
    for n, _, st, m, _, reasons in rows:
        for why in reasons:
            by.setdefault(why, []).append(f"{n} {st} {m}")
    return {"runs": len(rows), "models": len({n for n, *_ in rows}),
            "exit0": sum(r["rc"] == 0 for *_, r, _ in rows),
            "verified": sum(bool(r.get("verified")) for *_, r, _ in rows),
            "strict": sum(not why for *_, why in rows),
            "refused": sum(bool(why) and why[0].startswith("refused") for *_, why in rows),
            "failures": sorted(by.items(), key=lambda kv: -len(kv[1]))}


def report(rows, s) -> str:
    """The markdown: what was run, the summary, the failures by reason, then one row per factory."""
    lines = [f"{machine()}; `python benchmarks/titan_sweep.py`: `shardlayout plan --module "
             "examples/titan_models.py:FACTORY --mesh M --style S --verify --json` (torchtitan 0.3's debug flavors, "
             "2 layers, batch 2, 16 tokens) per factory, style and mesh, each in a fresh process; `tp-plan` is "
             "torchtitan's own TP plan (`--tp-plan examples/titan_tp/FACTORY.json`).", "",
             f"**{s['runs']} runs over {s['models']} models: {s['exit0']} exit 0, {s['verified']} verified, "
             f"{s['strict']} strict OK, {s['refused']} refused in one line (exit 2).**", ""]
    if s["failures"]:
        lines += [table(["runs", "not strict OK because", "where"],
                        [[len(where), why, ", ".join(where)] for why, where in s["failures"]]), ""]
    runs = [*RUNS, ("ep", EP), TITAN]
    by: dict = {}
    for n, _, st, m, r, why in rows:
        by.setdefault(n, {})[(st, m)] = (r, why)
    body = []
    for n, got in by.items():
        cells = []
        for k in runs:
            if k not in got:
                cells.append("")
                continue
            cells.append(hf_sweep.cell(*got[k]))
        body.append([n, *cells])
    lines.append(table(["factory", *[f"{st} {m}" for st, m in runs]], body))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--only", default="", help="a regex of factory names to run")
    ap.add_argument("--work", default="/tmp/titan_sweep", help="kept runs and the import cache")
    ap.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    ap.add_argument("--src", default=str(hf_sweep.SRC), help="the shardlayout source tree to run")
    ap.add_argument("--out", default=str(RESULTS / "titan_sweep.md"), help="the markdown written (full sweeps only)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: give 1 or more runs at a time")
    try:
        only = re.compile(args.only)
    except re.error as e:
        ap.error(f"--only {args.only!r} is no regular expression ({e}); e.g. --only 'llama3|qwen3'")
    names = [n for n in CASES if only.search(n)]
    if not names:
        ap.error(f"--only {args.only!r} matches no factory; the factories are: {', '.join(CASES)}")
    if not (Path(args.src) / "shardlayout" / "__init__.py").is_file():
        ap.error(f"--src {args.src}: no shardlayout package there; give a source tree's src directory")
    hf_sweep.use_source(Path(args.src))
    rows = sweep(names, Path(args.work), args.jobs)
    s = summary(rows)
    if args.json:
        print(json.dumps({"summary": s, "runs": [
            {"factory": n, "style": st, "mesh": m, "rc": r["rc"], "verified": r.get("verified"), "strict": not why,
             "reasons": why} for n, _, st, m, r, why in rows]}, indent=1))
    text = report(rows, s)
    if not args.json:
        print(text)
    if not args.only:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
