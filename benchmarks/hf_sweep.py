"""Hugging Face transformers' causal-LM classes, tiny configs, every style: does each plan right?

Not part of the test suite (it takes minutes): a sweep over many classes and config variants of
transformers, each written as a ``config.json`` and planned by the CLI as a user would,
``shardlayout plan --hf CONFIG --mesh M --style S --verify --json``, in a fresh process per run:

* ``megatron`` on ``tp=2`` and on ``dp=2,tp=2``, ``megatron-sp`` on ``tp=2``, ``auto`` on
  ``dp=2,tp=2``, and ``ep`` on ``ep=2`` for MoE models, each at ``--size batch=2`` (and the
  default sequence, 64 tokens for these configs), so a config is imported once and its other runs
  read the import cache;
* each run is classified: its exit code, ``verified`` (every rank simulated), the collectives
  against Megatron's count (``expected``), every layer weight (a parameter of the layer list) cut
  on ``tp`` in Megatron's dim (``examples/hf_models.py:megatron_cuts``; megatron and megatron-sp
  only), and auto's estimate against the best built-in style that fits. A run is *strict OK* when
  all of these hold.

Megatron's count, per style: ``megatron``: one all_reduce on tp per attention and per MLP (or MoE)
block — one per layer when attention and MLP read the same input (parallel residual: GPT-J,
GPT-NeoX, Falcon, Phi, Cohere, ...) — and one for a tied, vocab-parallel table's lookup;
``megatron-sp``: that many reduce_scatters, and one all_gather before each block (the tied
lookup's reduce_scatter and the head's gather counted too); ``ep``: two all_to_alls per MoE layer
(the routed rows out and back). An attention whose query heads tp does not divide (differential
attention's head pairs: ``examples/hf_models.py:head_runs``) is kept whole
(no cut inside a head): its all_reduce is not due (under megatron-sp its input is still
gathered). Where the expectation is not Megatron's, the case says so in ``extra`` and the table
names it:

* ``stat``: a q/k norm over all of q's (or k's) features (OLMo-2, OLMo-3, OLMoE): with q cut on
  tp, the norm's mean square is a sum over the cut features, one all_reduce of the
  ``[batch, seq, 1]`` statistic per norm — an inherent extra collective (vLLM all-gathers q and k
  instead, a larger one), so two more small all_reduces per layer.
* ``sub_norm``: an RMSNorm over the features a row Linear reads (BitNet's ``attn_sub_norm`` before
  o_proj, ``ffn_sub_norm`` before down_proj): with those features cut on tp, the norm's mean square
  is a sum over the cut features, one all_reduce of the ``[batch, seq, 1]`` statistic per norm (as
  any tensor-parallel BitNet must), so two more small all_reduces per layer.
* ``moa``: a mixture of attention (JetMoE): the q and o projections are experts run on routed rows,
  q before the attention core and o after it, with the core on the tokens between them, so ``ep``
  moves each layer's rows out and back twice more (four more all_to_alls per layer; under
  Megatron the q and o stacks are cut by heads like q_proj and o_proj: the same one all_reduce).

Resumable: each run's result is kept in ``--work`` (default ``/tmp/hf_sweep``) under a key of the
config's bytes, the style, the mesh and shardlayout's own source, so a rerun after a fix reruns
only what changed; the import cache (``SHARDLAYOUT_CACHE_DIR``) lives there too.

Run: ``python benchmarks/hf_sweep.py [-j 2] [--only REGEX] [--json]`` (writes
``benchmarks/results/hf_sweep.md``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, machine, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "hf_models.py"
SRC = ROOT / "src"
TP, DPTP, EP = "tp=2", "dp=2,tp=2", "ep=2"
RUNS = (("megatron", TP), ("megatron-sp", TP), ("megatron", DPTP), ("auto", DPTP))
BATCH = 2  # on every mesh (one sequence per dp or ep rank): each config is imported once, then read from the cache
CLASS_OF: dict = {}  # case name -> its config's model_type, as prepared
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class Case:
    """A config to sweep: ``name``; ``example`` (a factory of examples/hf_models.py whose model's
    config is used) or ``model_type`` with ``kwargs`` over the examples' tiny sizes; ``parallel``
    (attention and MLP read the same input: one all_reduce a layer); ``extra``: named departures
    from Megatron's count (``stat``: q/k norms over all features, ``sub_norm``: norms of a row
    Linear's cut input features; one all_reduce each per layer; ``moa``: a mixture of attention,
    four all_to_alls more per layer under ep)."""

    name: str
    model_type: str = ""
    kwargs: dict = field(default_factory=dict)
    example: str = ""
    parallel: bool = False
    extra: tuple = ()


def _c(name, model_type, parallel=False, extra=(), **kwargs) -> Case:
    return Case(name, model_type, kwargs, parallel=parallel, extra=extra)


def _e(name, parallel=False, extra=()) -> Case:
    return Case(name, example=name, parallel=parallel, extra=extra)


GQA = dict(num_key_value_heads=2)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
CASES = (
    # the examples' configs (examples/hf_models.py)
    _e("llama"), _e("mistral"), _e("qwen2"), _e("qwen3"), _e("phi3"), _e("phi3_gqa"), _e("gpt_bigcode"),
    _e("phi", parallel=True), _e("olmo2", extra=("stat",)), _e("llama_3_heads"), _e("gemma"), _e("gpt2"),
    _e("mixtral"), _e("qwen2_moe"), _e("falcon", parallel=True), _e("falcon_mq", parallel=True),
    _e("gptj", parallel=True), _e("apertus"), _e("gpt_oss"), _e("qwen3_moe"),
    # variants of those
    _c("llama_mha", "llama", num_key_value_heads=4), _c("llama_mqa", "llama", num_key_value_heads=1),
    _c("llama_tied", "llama", tie_word_embeddings=True, **GQA),
    _c("llama_bias", "llama", attention_bias=True, mlp_bias=True, **GQA),
    _c("mistral_swa", "mistral", sliding_window=4, **GQA), _c("qwen2_tied", "qwen2", tie_word_embeddings=True, **GQA),
    _c("qwen3_mha", "qwen3", head_dim=8, num_key_value_heads=4),
    _c("phi_plain", "phi", parallel=True, num_key_value_heads=4),
    _c("gpt_bigcode_mha", "gpt_bigcode", multi_query=False), _c("gemma_gqa", "gemma", head_dim=8, **GQA),
    _c("falcon_mha", "falcon", parallel=True, new_decoder_architecture=False, multi_query=False),
    _c("falcon_seq", "falcon", new_decoder_architecture=False, multi_query=False, parallel_attn=False),
    # more classes
    _c("olmo", "olmo", **GQA), _c("olmo_clip", "olmo", clip_qkv=8.0, **GQA),
    _c("olmo3", "olmo3", extra=("stat",), **GQA), _c("olmoe", "olmoe", extra=("stat",), **GQA, **MOE),
    _c("stablelm", "stablelm", **GQA), _c("stablelm_parallel", "stablelm", parallel=True, use_parallel_residual=True,
       num_key_value_heads=4),
    _e("stablelm_qk_layernorm"), _c("gemma2", "gemma2", head_dim=8, **GQA),
    _c("gemma3", "gemma3_text", head_dim=8, **GQA), _c("gpt_neox", "gpt_neox", parallel=True),
    _c("gpt_neox_seq", "gpt_neox", use_parallel_residual=False, rotary_pct=0.5),
    _c("cohere", "cohere", parallel=True, **GQA),
    _c("cohere_qk_norm", "cohere", parallel=True, use_qk_norm=True, **GQA),
    _c("cohere2", "cohere2", parallel=True, **GQA), _c("granite", "granite", **GQA),
    _c("granitemoe", "granitemoe", num_local_experts=4, num_experts_per_tok=2, **GQA),
    _c("starcoder2", "starcoder2", **GQA), _c("glm", "glm", head_dim=8, **GQA), _c("glm4", "glm4", head_dim=8, **GQA),
    _c("helium", "helium", head_dim=8, **GQA), _c("exaone4", "exaone4", **GQA), _c("smollm3", "smollm3", **GQA),
    _c("arcee", "arcee", **GQA), _c("seed_oss", "seed_oss", head_dim=8, **GQA),
    _c("internlm3", "internlm3", head_dim=8, **GQA), _c("ernie4_5", "ernie4_5", head_dim=8, **GQA),
    _c("hunyuan_dense", "hunyuan_v1_dense", head_dim=8, **GQA), _c("nemotron", "nemotron", head_dim=8, **GQA),
    _c("persimmon", "persimmon"), _c("bitnet", "bitnet", extra=("sub_norm",), **GQA),
    _c("vaultgemma", "vaultgemma", head_dim=8, **GQA),
    _c("diffllama", "diffllama", **GQA), _c("diffllama_mha", "diffllama", num_key_value_heads=4),
    _c("phimoe", "phimoe", num_local_experts=4, num_experts_per_tok=2, **GQA),
    _c("jetmoe", "jetmoe", extra=("moa",), num_local_experts=4, num_experts_per_tok=2, kv_channels=8,
       num_key_value_heads=4),
    _c("ernie4_5_moe", "ernie4_5_moe", head_dim=8, moe_num_experts=4, moe_k=2, moe_intermediate_size=48,
       moe_layer_start_index=0, **GQA),
    _c("mpt", "mpt"), _c("opt", "opt", ffn_dim=64, word_embed_proj_dim=32), _c("gpt_neo", "gpt_neo",
                                                                             attention_types=[[["global"], 2]]),
    _c("xglm", "xglm", ffn_dim=64), _c("bloom", "bloom"), _c("codegen", "codegen", parallel=True, rotary_dim=4),
)




@functools.cache
def examples():
    """examples/hf_models.py as a module: its factories and ``megatron_cuts``."""
    spec = importlib.util.spec_from_file_location("hf_models_example", EXAMPLES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def config_of(case: Case):
    """The transformers config of ``case``: the example factory's model's, or ``model_type`` at the
    examples' tiny sizes (vocab 128, hidden 32, ffn 64, 2 layers, 4 heads, 64 positions)."""
    import transformers as hf

    ex = examples()
    if case.example:
        return getattr(ex, case.example)()[0].config
    sizes = dict(vocab_size=ex.VOCAB, hidden_size=ex.HIDDEN, intermediate_size=ex.FFN, num_hidden_layers=ex.LAYERS,
                 num_attention_heads=ex.HEADS, max_position_embeddings=64, pad_token_id=0, bos_token_id=0,
                 eos_token_id=0)
    return hf.AutoConfig.for_model(case.model_type, **{**sizes, **case.kwargs})


@dataclass(frozen=True)
class Facts:
    """What the expectation reads off a case's model: ``layers``, ``tied`` (one vocab-parallel table
    for lookup and head), ``moe_layers``, ``cuts`` (``megatron_cuts`` on tp=2), ``whole_attention``
    (tp=2 does not divide the query heads, or their pairs under differential attention: the attention
    is kept whole, its all_reduce not due)."""

    layers: int
    tied: bool
    moe_layers: int
    cuts: dict
    whole_attention: bool = False


def facts(model) -> Facts:
    """The Facts of a built ``model``."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    tied = out is not None and out.weight is inp.weight and inp.weight.shape[0] % 2 == 0
    cuts = examples().megatron_cuts(model, tp=2)
    moe = {re.search(r"\.(\d+)\.", n).group(1) for n, p in model.named_parameters()
           if p.dim() == 3 and re.search(r"\.(layers|h|blocks)\.\d+\.", n)}
    heads = getattr(model.config, "num_attention_heads", 2)
    return Facts(model.config.num_hidden_layers, tied, len(moe), cuts, heads % (2 * examples().head_runs(model)) != 0)


def prepare(case: Case, work: Path) -> tuple[Path, Facts | str]:
    """Write ``case``'s config.json under ``work`` and read its Facts from the model the CLI
    builds (on meta); a config transformers refuses gives its error line instead of Facts."""
    from shardlayout.program.hf import hf_model

    d = work / "configs" / case.name
    d.mkdir(parents=True, exist_ok=True)
    try:
        cfg = config_of(case)
        CLASS_OF[case.name] = cfg.model_type
        (d / "config.json").write_text(cfg.to_json_string())
        model, _ = hf_model(str(d / "config.json"))
    except Exception as e:  # noqa: BLE001 - a class this transformers cannot build: reported, not raised
        return d, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return d, facts(model)


def expected(case: Case, f: Facts, style: str) -> Counter | None:
    """Megatron's collectives for ``style`` (``auto``: None, not counted). ``stat`` adds one
    all_reduce per q/k norm over all features, ``sub_norm`` one per norm of a row Linear's input;
    ``moa`` four all_to_alls per layer under ep."""
    blocks = f.layers * (1 if case.parallel or f.whole_attention else 2) + f.tied
    stat = 2 * f.layers * sum(x in case.extra for x in ("stat", "sub_norm"))
    if style == "megatron":
        want = Counter({("all_reduce", "tp"): blocks + stat})
    elif style == "megatron-sp":
        whole = f.layers if f.whole_attention and not case.parallel else 0  # a whole attention reads gathered input
        want = Counter({("reduce_scatter", "tp"): blocks, ("all_gather", "tp"): blocks + whole,
                        ("all_reduce", "tp"): stat})
    elif style == "ep":
        want = Counter({("all_to_all", "ep"): 2 * f.moe_layers + (4 * f.layers if "moa" in case.extra else 0)})
    else:
        return None
    return +want


def use_source(src: Path) -> None:
    """Plan with the shardlayout under ``src`` (imported here, run by every subprocess)."""
    global SRC
    SRC = src
    sys.path.insert(0, str(src))


def source_key() -> str:
    """A fingerprint of shardlayout's source: a run (the CLI's output, classified afresh each time)
    is redone when it changes."""
    h = hashlib.sha256()
    for p in sorted(SRC.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def run_one(config: Path, style: str, mesh: str, work: Path, key: str) -> dict:
    """One CLI run, its result kept under ``work/runs`` (read back when already there)."""
    run = f"{style}|{mesh}|batch={BATCH}|{key}".encode()
    tag = hashlib.sha256((config / "config.json").read_bytes() + run).hexdigest()[:16]
    kept = work / "runs" / f"{config.name}-{style}-{mesh.replace(',', '_').replace('=', '')}-{tag}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    cmd = [sys.executable, "-m", "shardlayout", "plan", "--hf", str(config / "config.json"), "--mesh", mesh,
           "--style", style, "--size", f"batch={BATCH}", "--verify", "--json"]
    return run_kept(cmd, kept, work)


def run_kept(cmd: list, kept: Path, work: Path) -> dict:
    """Run ``shardlayout plan ... --verify --json`` (``cmd``) in a fresh process on this sweep's
    source, and keep its result in ``kept``: exit code, seconds, the last error line (and how many
    lines stderr had: one is a clean refusal), whether it verified, every tensor's sharding, the
    collectives and auto's comparison with the best style."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "SHARDLAYOUT_CACHE_DIR": str(work / "cache")}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = -9, "", "timed out after 900 s"
    lines = [x for x in err.strip().splitlines() if x.strip()]
    result = {"rc": rc, "seconds": time.perf_counter() - t0, "error": lines[-1] if lines and rc else "",
              "error_lines": len(lines) if rc else 0}
    try:
        data = json.loads(out) if rc in (0, 1) else None
    except json.JSONDecodeError:
        data = None
    if data is not None and "tensors" not in data:  # a refusal or an internal error, as JSON
        result["error"] = result["error"] or str(data.get("error", data))[:300]
        data = None
    if data is not None:
        result.update(verified=bool(data.get("verified")), tensors=data["tensors"],
                      collectives=[[c["kind"], c["axes_text"], c["bytes"], c["tensor"]] for c in data["collectives"]],
                      auto=data.get("auto") and {k: data["auto"][k] for k in ("best_style", "vs_best_style")})
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(result))
    return result


def cut_dims(sharding: str) -> tuple:
    """The dims of a sharding's text bound to tp: ``cut_dims("[32, tp*16]") -> (1,)``."""
    dims = re.sub(r"\s*\+.*$", "", sharding).strip("[]").split(", ")
    return tuple(d for d, text in enumerate(dims) if re.search(r"\btp\b", text))


def classify(case: Case, f: Facts, style: str, mesh: str, r: dict) -> list:
    """Why run ``r`` is not strict OK, one reason a string (``[]``: strict OK)."""
    if r["rc"] not in (0, 1) or "tensors" not in r:
        return [f"exit {r['rc']}: {r['error']}"]
    reasons = [] if r["verified"] else ["not verified"]
    want = expected(case, f, style)
    got = Counter((k, axes) for k, axes, _, _ in r["collectives"])
    if want is not None and got != want:
        reasons.append("counts " + _counts(got) + " want " + _counts(want))
    if style in ("megatron", "megatron-sp"):
        wrong = [n for n, dims in f.cuts.items() if dims is not None and n in r["tensors"]
                 and cut_dims(r["tensors"][n]) != dims]
        if wrong:
            leaves = sorted({re.sub(r"^.*\.\d+\.", "", n) for n in wrong})
            reasons.append("weights not in Megatron's dim: " + ", ".join(leaves))
    if style == "auto" and r.get("auto") and (r["auto"]["vs_best_style"] or 0) > 1 + 1e-9:
        reasons.append(f"auto {r['auto']['vs_best_style']:.3f}x the best style ({r['auto']['best_style']})")
    return reasons


def _counts(c: Counter) -> str:
    return " + ".join(f"{v} {k}" for (k, _), v in sorted(c.items())) or "none"


def cell(r: dict, why: list) -> str:
    """A run's table cell: the collectives it made, then OK or why not (a clean refusal: "refused")."""
    if why and why[0].startswith("refused"):
        return "refused"
    made = _counts(Counter((k, a) for k, a, *_ in r.get("collectives", [])))
    return made + (" OK" if not why else " ✗ " + "; ".join(why))


def runs_of(case: Case, f: Facts | str) -> list:
    """The (style, mesh) runs of ``case``: ep too when its model routes experts."""
    moe = not isinstance(f, str) and f.moe_layers or any(k in case.kwargs for k in MOE_KEYS) or \
        case.example in ("mixtral", "qwen2_moe", "gpt_oss", "qwen3_moe")
    return [*RUNS, *([("ep", EP)] if moe else [])]


def sweep(cases, work: Path, jobs: int) -> list:
    """Every case's runs, ``jobs`` at a time, progress on stderr; rows of
    ``(case, facts, style, mesh, result, reasons)``."""
    key = source_key()
    prepared = [(c, *prepare(c, work)) for c in cases]
    todo = [(c, d, f, s, m) for c, d, f in prepared for s, m in runs_of(c, f)]
    first = {}  # the first run of each config imports the model; the others read the import cache
    for item in todo:
        first.setdefault(item[0].name, item)
    todo.sort(key=lambda item: first[item[0].name] is not item)  # imports first: never one config's twice at once
    rows, done = [], 0

    def one(item):
        c, d, f, s, m = item
        if isinstance(f, str):
            return item, {"rc": "build", "error": f, "seconds": 0.0}
        return item, run_one(d, s, m, work, key)

    with ThreadPoolExecutor(jobs) as pool:
        for (c, _, f, s, m), r in pool.map(one, todo):
            done += 1
            reasons = [f"config: {r['error']}"] if r["rc"] == "build" else classify(c, f, s, m, r)
            rows.append((c, f, s, m, r, reasons))
            print(f"[{done}/{len(todo)}] {c.name} {s} {m}: {'; '.join(reasons) or 'strict OK'} "
                  f"({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
    return rows


def summary(rows) -> dict:
    """The figures: runs, exit 0, verified, strict OK, and the failures grouped by reason."""
    by, label = {}, {}
    for c, _, st, m, _, reasons in rows:
        for why in reasons:
            group = re.sub(r"\d+", "N", why) if why.startswith("counts") else why  # counts alike whatever the numbers
            label.setdefault(group, why if group == why else f"{why} (or other numbers)")
            by.setdefault(label[group], []).append(f"{c.name} {st} {m}")
    return {"runs": len(rows), "configs": len({c.name for c, *_ in rows}),
            "classes": len({CLASS_OF.get(c.name, c.name) for c, *_ in rows}),
            "exit0": sum(r["rc"] == 0 for *_, r, _ in rows),
            "verified": sum(bool(r.get("verified")) for *_, r, _ in rows),
            "strict": sum(not why for *_, why in rows),
            "failures": sorted(by.items(), key=lambda kv: -len(kv[1]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--only", default="", help="a regex of case names to run")
    ap.add_argument("--work", default="/tmp/hf_sweep", help="configs, kept runs and the import cache")
    ap.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    ap.add_argument("--src", default=str(SRC), help="the shardlayout source tree to run (default: this checkout's)")
    ap.add_argument("--out", default=str(RESULTS / "hf_sweep.md"), help="the markdown written (full sweeps only)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: give 1 or more runs at a time")
    try:
        only = re.compile(args.only)
    except re.error as e:
        ap.error(f"--only {args.only!r} is no regular expression ({e}); e.g. --only 'llama|mixtral'")
    cases = [c for c in CASES if only.search(c.name)]
    if not cases:
        ap.error(f"--only {args.only!r} matches no config; the configs are: {', '.join(c.name for c in CASES)}")
    if not (Path(args.src) / "shardlayout" / "__init__.py").is_file():
        ap.error(f"--src {args.src}: no shardlayout package there; give a source tree's src directory")
    use_source(Path(args.src))
    rows = sweep(cases, Path(args.work), args.jobs)
    s = summary(rows)
    if args.json:
        print(json.dumps({"summary": s, "runs": [
            {"case": c.name, "class": CLASS_OF.get(c.name, ""), "style": st, "mesh": m, "rc": r["rc"],
             "verified": r.get("verified"), "strict": not why, "reasons": why} for c, _, st, m, r, why in rows]},
            indent=1))
    text = report(rows, s)
    if not args.json:
        print(text)
    if not args.only:
        Path(args.out).write_text(text + "\n")
    return 0


def report(rows, s) -> str:
    """The markdown: what was run, the summary, the failures by reason, then one row per config with
    each run's collectives (``OK`` when strict OK, else why not)."""
    lines = [f"{machine()}; `python benchmarks/hf_sweep.py`: `shardlayout plan --hf CONFIG --mesh M --style S "
             f"--size batch={BATCH} --verify --json` per config, style and mesh, each in a fresh process.", "",
             f"**{s['runs']} runs over {s['configs']} configs of {s['classes']} classes: {s['exit0']} exit 0, "
             f"{s['verified']} verified, {s['strict']} strict OK.**", ""]
    if s["failures"]:
        lines += [table(["runs", "not strict OK because", "where"],
                        [[len(where), why, ", ".join(where)] for why, where in s["failures"]]), ""]
    runs = [*RUNS, ("ep", EP)]
    by_case: dict = {}
    for c, _, st, m, r, why in rows:
        by_case.setdefault(c.name, (c, {}))[1][(st, m)] = (r, why)
    body = []
    for c, got in by_case.values():
        cells = []
        for key in runs:
            if key not in got:
                cells.append("")
                continue
            cells.append(cell(*got[key]))
        body.append([c.name + (f" ({', '.join(c.extra)})" if c.extra else "") +
                     (" [parallel]" if c.parallel else ""), CLASS_OF.get(c.name, ""), *cells])
    lines.append(table(["config", "class", *[f"{st} {m}" for st, m in runs]], body))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
