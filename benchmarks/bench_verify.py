"""Verifying a 32-layer Llama plan (megatron-sp) on 8, 128, 512 and 8192 ranks: the scalable
verification (index-level proof for every rank + numeric runs per rank class) against the full
per-rank simulation where that is feasible.

Method (printed in the header too):

* Every measurement is a fresh Python process: imports, a warm-up plan and verify of a 1-layer
  Llama of other sizes on the same mesh (one-time set-up and lazy imports, paid untimed as in
  ``bench_plan``), ``shardlayout.caches.clear_caches()``, then ``llama(layers=32)``, ``style_pins``
  and ``plan`` (the plan time is ``Plan.plan_seconds`` plus the plan's stream choices,
  ``Plan.stream_choices()``, made when first read: cold), then the timed call (cold too). Per mesh the
  processes alternate classes, full, classes, full ... ``ROUNDS`` times; medians with p25–p75.
* **classes**: ``Plan.verify()`` (``mode="classes"``). **full**: ``Plan.verify(mode="full")``, every
  rank simulated in numpy (run only where one call stays under ``FULL_LIMIT`` seconds; issue 19
  measured it at 12.5 s for 2 layers on 128 ranks and 81 s on 512).
* Memory: the process's peak RSS (``ru_maxrss``: Python, numpy and the plan included) after the
  timed call, and the peak of what the verification itself allocates (``tracemalloc``, a second,
  untimed classes call in the same process); the full simulation's peak RSS is in the notes.

Run: ``python benchmarks/bench_verify.py [ROUNDS]`` (writes ``benchmarks/results/verify.md``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emit, spread  # noqa: E402

LAYERS = 32
STYLE = "megatron-sp"
MESHES = (("dp=2,tp=4", 8), ("dp=8,tp=16", 128), ("dp=16,tp=32", 512), ("dp=256,tp=32", 8192))
FULL_UP_TO = 128  # ranks; beyond, one full simulation takes minutes
FULL_LIMIT = 300.0  # seconds a full-simulation process may take
ROUNDS = 3

CHILD = """
import json, resource, sys, time, tracemalloc
from shardlayout import Mesh
from shardlayout.plan import plan
from shardlayout.caches import clear_caches
from shardlayout.program.models import llama, style_pins
mesh = Mesh.parse(sys.argv[1])
warm = llama(layers=1, dim=32, heads=2, ffn=64)  # pays imports and one-time set-up, other shapes
plan(warm, mesh, style_pins(warm, mesh, sys.argv[3])).verify(mode=sys.argv[4])
clear_caches()
prog = llama(layers=int(sys.argv[2]))
p = plan(prog, mesh, style_pins(prog, mesh, sys.argv[3]))
s0 = time.perf_counter()
p.stream_choices()  # the plan's stream choices, made when first read (the plan command prints them)
t0 = time.perf_counter()
v = p.verify(mode=sys.argv[4])
t1 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
traced = None
if sys.argv[4] == "classes":  # tracemalloc slows Python code several times: not for the full simulation
    tracemalloc.start()
    p.verify(mode=sys.argv[4])
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
print(json.dumps({"plan": p.plan_seconds + (t0 - s0), "streams": t0 - s0, "verify": t1 - t0, "rss": rss,
                  "traced": traced, "ok": v.ok,
                  "proven": v.proven, "classes": v.classes, "simulated": v.simulated, "ops": v.ops,
                  "collectives": v.collectives, "checked": v.checked}))
"""


def run(mesh: str, mode: str, timeout: float | None = None):
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, mesh, str(LAYERS), STYLE, mode], capture_output=True,
                             text=True, check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(rounds: int = ROUNDS) -> None:
    rows, full_rss = [], []
    for mesh, ranks in MESHES:
        fast, full = [], []
        for _ in range(rounds):
            fast.append(run(mesh, "classes"))
            if ranks <= FULL_UP_TO:
                got = run(mesh, "full", FULL_LIMIT)
                if got is not None:
                    full.append(got)
        assert all(r["ok"] and r["proven"] for r in fast) and all(r["ok"] for r in full)
        mib = 1 / 2 ** 20
        plan_s = [r["plan"] for r in fast]
        ver_s = [r["verify"] for r in fast]
        full_cell = spread([r["verify"] for r in full]) if full else (
            f"> {FULL_LIMIT:.0f}" if ranks <= FULL_UP_TO else "not run")
        if full:
            full_rss.append(f"{ranks} ranks {max(r['rss'] for r in full) / 2 ** 20:.0f} MiB")
        last = fast[-1]
        alone = [r["plan"] - r["streams"] for r in fast]
        rows.append([ranks, mesh, spread(plan_s), spread([r["streams"] for r in fast]), spread(ver_s),
                     f"{statistics.median(v / p for v, p in zip(ver_s, plan_s)):.2f}",
                     f"{statistics.median(v / p for v, p in zip(ver_s, alone)):.2f}",
                     f"{max(r['rss'] for r in fast) * mib:.0f}", f"{max(r['traced'] for r in fast) * mib:.1f}",
                     f"{last['ops']} / {last['collectives']}", last["classes"], last["simulated"], full_cell])
    header = ["ranks", "mesh", "plan s", "of which stream choices s", "verify s (classes)", "verify / plan",
              "verify / plan() alone",
              "peak RSS MiB",
              "verify alloc MiB", "distinct ops / collectives", "rank classes", "local runs", "full simulation s"]
    method = (f"Verify the plan of a {LAYERS}-layer Llama ({STYLE}); each cell a fresh process (imports and a warm-up "
              "on a 1-layer model of other sizes, then every memo cleared; build and plan untimed, plan and verify "
              "both cold; plan s is `Plan.plan_seconds` plus the plan's stream choices, `Plan.stream_choices()`, "
              "made when first read and timed before verify, which checks them), medians (p25–p75) of "
              f"{rounds} rounds, classes and full alternating. `classes`: "
              "Plan.verify() — the index-level proof for every rank plus numeric runs of two representatives per "
              "rank class; `full`: Plan.verify(mode='full') — every rank simulated in numpy, where feasible. "
              "Peak RSS: the whole process after the timed call; verify alloc: tracemalloc peak of one verify. "
              "The Llama's layers are one repeated block (`ProgramBuilder.repeat`): plan and verify both read "
              "its compressed program (layers 0-3 and the last; the others are layer 3's decisions renamed).")
    notes = ("Every classes run is `ok` and `proven` (every op and collective passed the index-level proof for every "
             "rank). The work follows the distinct ops and collectives and their rank classes (uneven shards on "
             "dp=256,tp=32 make more classes), not the 32 layers nor the number of ranks. Full simulation peak RSS: "
             + (", ".join(full_rss) or "-") + ".")
    emit("verify", method, header, rows, notes)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS)
