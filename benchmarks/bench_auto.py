"""``--style auto``: solve time, optimality gap and estimated step time against the best built-in
style, per model, mesh and memory budget, in one run.

Method (printed in the header too):

* Every case is a fresh Python process: imports and a warm-up ``auto_plan`` of a 1-layer Llama on
  ``tp=2`` are paid, then ``shardlayout.caches.clear_caches()`` empties every memo; timed:
  ``auto_plan(program, mesh, memory_per_device=budget)`` — the whole search: the seed plans (every
  built-in style, which the comparison needs anyway), the op tables, HiGHS, the final
  ``plan()`` with every tensor pinned and its estimate (asserted equal to the solver's).
* The cost model is DTensor's alpha-beta default; compute at the default 100 TFLOP/s per device;
  training with Adam (4 copies of each parameter); budgets are bytes per device.
* "tight" budget: 1.25 x the memory of the leanest built-in style (so at least one style fits),
  found by a separate process first.
* "best style": the fastest built-in style that fits the budget, estimated by the same function;
  auto / best below 1 means the auto plan is faster. Gap 0: proven optimal; otherwise the bound
  HiGHS or the chain's Lagrangian relaxation proves.

A second table sweeps budgets at real size: a Llama of Llama-3-8B's width (dim 4096, 32 heads,
ffn 14336, batch 8 x seq 4096) with 1, 2, 4, 32 and 80 layers on ``dp=8,tp=8``, training with
Adam, each at the smallest budget any plan fits (``NoPlanFits.smallest``, found by a first process)
and 1.25x, 1.6x, 2x and 3x it. Each cell is a fresh process; ``wall s`` is the whole
``auto_plan`` call as above, then the plan is verified (``Plan.verify()``, not timed).

Run: ``python benchmarks/bench_auto.py`` (writes ``benchmarks/results/auto.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit, table  # noqa: E402

MODELS = (("llama", 8), ("llama", 32), ("moe", 1))
MESHES = ("dp=2,tp=4", "dp=8,tp=8")

CASE = """
import json, sys, time
from shardlayout import Mesh
from shardlayout.caches import clear_caches
from shardlayout.plan.auto import auto_plan
from shardlayout.program.models import llama, moe
auto_plan(llama(layers=1), Mesh.parse("tp=2"))
clear_caches()
model, layers, mesh, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
prog = llama(layers=layers) if model == "llama" else moe()
t0 = time.perf_counter()
a = auto_plan(prog, Mesh.parse(mesh), memory_per_device=None if budget == "none" else int(budget))
took = time.perf_counter() - t0
best = a.best_style()
print(json.dumps({"seconds": took, "gap": a.gap, "method": a.method, "solves": a.stats["solves"],
                  "kinds": a.stats["kinds"], "blocks": a.stats["blocks"], "auto": a.estimate.seconds,
                  "memory": a.estimate.memory, "binding": a.binding, "predicted": a.predicted,
                  "best": None if best is None else [best.style, best.estimate.seconds],
                  "styles": [[s.style, s.estimate.memory] for s in a.styles if s.estimate is not None]}))
"""


SWEEP = """
import json, sys, time
from shardlayout import Mesh
from shardlayout.caches import clear_caches
from shardlayout.plan.auto import NoPlanFits, auto_plan
from shardlayout.program.models import llama
auto_plan(llama(layers=1), Mesh.parse("tp=2"))
clear_caches()
layers, budget = int(sys.argv[1]), sys.argv[2]
prog = llama(layers=layers, dim=4096, heads=32, ffn=14336, batch=8, seq=4096)
mesh = Mesh.parse("dp=8,tp=8")
t0 = time.perf_counter()
try:
    a = auto_plan(prog, mesh, memory_per_device=None if budget == "none" else int(budget), training="adam")
except NoPlanFits as e:
    print(json.dumps({"smallest": e.smallest}))
    raise SystemExit(0)
took = time.perf_counter() - t0
best = a.best_style()
print(json.dumps({"seconds": took, "gap": a.gap, "method": a.method, "auto": a.estimate.seconds,
                  "memory": a.estimate.memory, "predicted": a.predicted, "verified": a.plan.verify().ok,
                  "best": None if best is None else [best.style, best.estimate.seconds]}))
"""
SWEEP_LAYERS = (1, 2, 4, 32, 80)
SWEEP_FACTORS = (1.0, 1.25, 1.6, 2.0, 3.0)


def sweep_case(layers: int, budget) -> dict:
    out = subprocess.run([sys.executable, "-c", SWEEP, str(layers), str(budget)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def sweep() -> list:
    rows = []
    for layers in SWEEP_LAYERS:
        smallest = sweep_case(layers, 1)["smallest"]  # 1 byte fits nothing: the error names the least budget
        for f in SWEEP_FACTORS:
            budget = int(smallest * f)
            got = sweep_case(layers, budget)
            assert "seconds" in got, (layers, f, got)
            assert got["auto"] == got["predicted"] and got["verified"], (layers, f)
            best_name, best_s = got["best"] if got["best"] else ("-", None)
            assert best_s is None or got["auto"] <= best_s * (1 + 1e-12), (layers, f)
            rows.append([str(layers), f"{f:.2f}x = {gib(budget)}", f"{got['seconds']:.2f}", got["method"],
                         "0" if got["gap"] == 0 else f"{got['gap']:.2%}", f"{got['auto'] * 1e3:.1f}",
                         f"{best_name} {best_s * 1e3:.1f}" if best_s else "none fits",
                         f"{got['auto'] / best_s:.2f}" if best_s else "-", gib(got["memory"]),
                         "yes" if got["verified"] else "NO"])
    return rows


def run(model: str, layers: int, mesh: str, budget) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, model, str(layers), mesh, str(budget)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def kib(n: int) -> str:
    return f"{n / 1024:.0f} KiB"


def main() -> None:
    rows = []
    for model, layers in MODELS:
        name = f"llama {layers} layers" if model == "llama" else "moe"
        for mesh in MESHES:
            free = run(model, layers, mesh, "none")
            tight = int(1.25 * min(m for _, m in free["styles"]))
            for label, got in (("none", free), (kib(tight), run(model, layers, mesh, tight))):
                assert got["auto"] == got["predicted"]
                best_name, best_s = got["best"] if got["best"] else ("-", None)
                assert best_s is None or got["auto"] <= best_s * (1 + 1e-12), (name, mesh, label)
                rows.append([name, mesh, label, f"{got['seconds']:.2f}", f"{got['method']}, {got['kinds']} kinds "
                             f"x {got['solves']} solves" if got["method"] == "chain" else "full ILP",
                             "0" if got["gap"] == 0 else f"{got['gap']:.2%}", got["binding"],
                             f"{got['auto'] * 1e6:.1f}", f"{best_name} {best_s * 1e6:.1f}" if best_s else "-",
                             f"{got['auto'] / best_s:.2f}" if best_s else "-", kib(got["memory"])])
    emit("auto", __doc__.split("Method (printed in the header too):")[1].split("Run:")[0].strip(),
         ["model", "mesh", "budget", "solve s", "method", "gap", "binding", "auto µs", "best style µs",
          "auto / best", "auto memory"], rows,
         "Gap 0 means HiGHS proved the plan optimal over the search space (each tensor's shardings in the seed "
         "plans: no pins and every built-in style). A chain whose memory budget binds is priced by its blocks' "
         "(time, memory) hulls, joined by an exact dynamic program over those points; its gap is the Lagrangian "
         "bound's (a block's points off its hull are not searched); the full ILP is exact but slower.\n\n"
         + sweep_table())


def sweep_table() -> str:
    """The budget sweep at real size as markdown (its own header row)."""
    rows = sweep()
    head = ["layers", "budget (x smallest that fits)", "wall s", "method", "gap", "auto ms", "best style ms",
            "auto / best", "auto memory", "verified"]
    return "Budget sweep at real size (dim 4096, dp=8,tp=8, Adam; see the method above):\n\n" + table(head, rows)


if __name__ == "__main__":
    main()
