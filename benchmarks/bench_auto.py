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

Run: ``python benchmarks/bench_auto.py`` (writes ``benchmarks/results/auto.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit  # noqa: E402

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
         "bound's (a block's points off its hull are not searched); the full ILP is exact but slower.")


if __name__ == "__main__":
    main()
