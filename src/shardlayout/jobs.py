"""What a command asks for, read from its options: the program and the plan.

``plan``, ``run`` and ``demo`` (and every rank of a ``run``) build their plan here from the same
options (``model``, ``program``, ``module``, ``export``, ``layers``, ``mesh``, ``style``,
``tp_plan``, ``allow_unmatched``, ``pin``), so a rank rebuilds exactly the plan the command printed.

    >>> from argparse import Namespace
    >>> p = build_plan(Namespace(model="llama", program=None, module=None, export=None, layers=1,
    ...                          mesh="tp=2", style="megatron", pin=None))
    >>> p.counts()
    {('all_reduce', ('tp',)): 2}
"""

from __future__ import annotations

from .errors import ShardingError

MAX_LAYERS = 4096


def load_program(args):
    """The Program the options name (a built-in model, JSON, a torch module or an export)."""
    from .program import Program, ProgramError
    from .program.models import MODELS
    from .program.repeat import compress

    for k, example in (("hf", "llama/config.json"), ("module", "model.py:make"), ("export", "model.pt2"),
                       ("program", "program.json")):
        v = getattr(args, k, None)
        if v is not None and not str(v).strip():
            raise ShardingError(f"--{k} {v!r}: an empty value names no model; give e.g. --{k} {example}, or drop --{k} "
                                "for the built-in --model")
    sources = [f"--{k}" for k in ("hf", "module", "export", "program") if getattr(args, k, None)]
    if len(sources) > 1:
        raise ShardingError(f"{' and '.join(sources)}: give one model source")
    if getattr(args, "size", None) and (getattr(args, "module", None) or getattr(args, "export", None)
                                        or getattr(args, "program", None)):
        raise ShardingError("--size sets a built-in model's sizes (--model llama|moe|moe-dense); a module, program or "
                            "export has its own")
    _check_layers(args)
    if getattr(args, "dynamic", None) is not None and not args.dynamic.strip(" ,"):
        raise ShardingError("--dynamic '': name at least one dim, e.g. --dynamic x:0=batch (INPUT:DIM=SYMBOL)")
    if getattr(args, "dynamic", None) and not getattr(args, "module", None):
        raise ShardingError("--dynamic applies to --module (the model is exported with those dims dynamic); an "
                            "--export archive keeps the dynamic dims it was exported with")
    if getattr(args, "hf", None):
        import hashlib
        import os

        from .program.cache import cached
        from .program.hf import hf_config, import_hf

        def build():
            module, example_args, _ = hf_source(args, "meta")
            return import_hf(module, example_args, getattr(module, "config", None))

        sizes = hf_sizes(args)
        path = os.path.join(args.hf, "config.json") if os.path.isdir(args.hf) else args.hf
        if os.path.isfile(path):  # the file's bytes define the model: keyed without importing transformers
            with open(path, "rb") as f:
                config = hashlib.sha256(f.read()).hexdigest()
        else:  # a model id in the local cache: its config as transformers resolves it
            config = hf_config(args.hf).to_json_string(use_diff=False)
        return cached(("hf", config, sizes["batch"], sizes["seq"]), build)[0]
    if getattr(args, "module", None):
        from .program.torch_import import dynamic_shapes_from_text, from_torch

        module, example_args, dynamic = _call_factory(args.module)
        if getattr(args, "dynamic", None):
            if dynamic is not None:
                raise ShardingError(f"--dynamic: {args.module} already returns dynamic_shapes; give them in one "
                                    "place (drop --dynamic, or return (module, example_args))")
            dynamic = dynamic_shapes_from_text(args.dynamic, module, example_args)
        return from_torch(module, example_args, dynamic)
    if getattr(args, "export", None):
        import logging
        import os
        import zipfile

        if not os.path.isfile(args.export):
            raise ShardingError(f"--export {args.export}: no such file")
        if not zipfile.is_zipfile(args.export):  # before torch, which would log a traceback
            raise ShardingError(f"--export {args.export}: not a torch.export archive (.pt2, a zip file written by "
                                "torch.export.save)")
        import torch

        from .program.cache import cached
        from .program.torch_import import from_exported

        def build():
            quiet = logging.getLogger("torch.export")  # it logs a traceback before falling back to old archives
            level, quiet.level = quiet.level, logging.CRITICAL
            try:
                ep = torch.export.load(args.export)
            except Exception as e:  # noqa: BLE001 - a damaged or foreign archive: one line
                raise ShardingError(f"--export {args.export}: torch.export.load failed ({type(e).__name__}): not an "
                                    "archive written by torch.export.save, or a damaged one") from None
            finally:
                quiet.setLevel(level)
            return from_exported(ep)

        import hashlib

        with open(args.export, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return cached(("export", digest), build)[0]
    if args.program:
        try:
            with open(args.program, encoding="utf-8") as f:
                return compress(Program.from_json(f.read()))  # layers named {prefix}.{i}.: one block
        except OSError as e:
            raise ShardingError(f"--program {args.program}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ProgramError(f"--program {args.program}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                               f"{e.start}); save the program JSON as UTF-8") from None
    if args.model not in MODELS:
        raise ShardingError(f"unknown model {args.model!r}; built-in models: {', '.join(MODELS)}")
    if isinstance(args.layers, int) and args.layers > MAX_LAYERS:
        raise ShardingError(f"--layers {args.layers}: the built-in models go up to {MAX_LAYERS} layers "
                            f"(planning time grows linearly, ~2 ms a layer); give at most {MAX_LAYERS}")
    layers = 2 if args.layers is None else args.layers
    return MODELS[args.model](layers=layers, **model_sizes(args.model, getattr(args, "size", None)))


def _check_layers(args) -> None:
    """``--layers`` sets the built-in llama's depth; with any other model it would be ignored: refused."""
    layers = getattr(args, "layers", None)
    if layers is None:
        return
    source = next((f"--{k}" for k in ("hf", "module", "export", "program") if getattr(args, k, None)), None)
    if source is not None or getattr(args, "model", "llama") != "llama":
        what = f"{source} has its own layers" if source else f"--model {args.model} has no layer count"
        raise ShardingError(f"--layers {layers}: --layers applies to the built-in llama only ({what}); drop --layers")


def hf_source(args, device: str):
    """``(module, example_args, None)`` of ``--hf SOURCE [--size batch=B,seq=S]`` built on
    ``device`` (``program.hf``; sizes by :func:`hf_sizes`)."""
    from .program.hf import hf_model

    sizes = hf_sizes(args)
    module, example_args = hf_model(args.hf, sizes["batch"], sizes["seq"], device)
    return module, example_args, None


def hf_sizes(args) -> dict:
    """``--hf``'s example sizes: ``--size batch=B,seq=S`` where given; else a batch of one sequence
    per data-parallel rank (the product of the mesh's ``dp`` and ``ep`` sizes, the axes a style
    splits the batch on; 1 without them) and seq None (``hf_model``: 128, or the model's
    ``max_position_embeddings`` when shorter).
    ``hf_sizes(Namespace(size=None, mesh="dp=2,tp=2")) -> {"batch": 2, "seq": None}``"""
    from .mesh import Mesh

    mesh = Mesh.parse(getattr(args, "mesh", None) or "")
    batch = 1
    for axis in ("dp", "ep"):
        batch *= mesh.axis_size(axis) if axis in mesh.names else 1
    return {"batch": batch, "seq": None, **model_sizes("hf", getattr(args, "size", None))}


def model_sizes(model: str, text: str | None) -> dict:
    """``--size dim=4096,seq=4096`` for a built-in model: its size parameters, checked.
    ``model_sizes("llama", "dim=64,seq=32") -> {"dim": 64, "seq": 32}``"""
    import inspect

    from .program.models import llama, moe, moe_dense

    if not text:
        return {}
    if model == "hf":
        known = ["batch", "seq"]
    else:
        fn = {"llama": llama, "moe": moe, "moe-dense": moe_dense}[model]
        known = [p for p in inspect.signature(fn).parameters if p != "layers"]
    out = {}
    if not text.strip(" ,"):
        raise ShardingError(f"--size '': give KEY=N pairs, e.g. --size dim=64 ({model} takes "
                            f"{', '.join(known)})")
    items = [x.strip() for x in text.split(",")]
    if "" in items:
        i = items.index("")
        raise ShardingError(f"--size {text!r}: entry {i} is empty (a comma too many); give KEY=N pairs separated by "
                            f"single commas, e.g. --size dim=64,seq=32")
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in known or not eq:
            raise ShardingError(f"--size {item!r}: {model} takes {', '.join(f'{k}=N' for k in known)}")
        if not value.strip().isascii() or not value.strip().isdigit() or int(value) < 1 or int(value) > 1 << 40:
            raise ShardingError(f"--size {key}={value.strip()!r}: give a positive whole number (at most 2**40)")
        if key in out:
            raise ShardingError(f"--size {key} is given twice ({out[key]} and {int(value)}); give it once")
        out[key] = int(value)
    return out


def _call_factory(spec: str):
    """``FILE.py:factory`` or ``pkg.mod:factory`` (the current directory importable): the
    factory's ``(nn.Module, example_args, dynamic_shapes or None)`` (it returns the first two, or
    all three: torch.export's ``dynamic_shapes``); every failure is a ``ShardingError`` naming the fix."""
    import importlib
    import importlib.util
    import os
    import sys

    target, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    attr = attr or "make"
    try:
        if target.endswith(".py"):
            if not os.path.isfile(target):
                raise ShardingError(f"--module {spec}: no file {target!r}; give FILE.py:factory or pkg.mod:factory")
            name = "_shardlayout_user_" + os.path.splitext(os.path.basename(target))[0]
            loader = importlib.util.spec_from_file_location(name, target)
            mod = importlib.util.module_from_spec(loader)
            sys.modules[name] = mod
            loader.loader.exec_module(mod)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            mod = importlib.import_module(target)
    except ShardingError:
        raise
    except ModuleNotFoundError as e:
        hint = " (pip install 'shardlayout[torch]')" if e.name == "torch" else ""
        raise ShardingError(f"--module {spec}: importing {target!r} failed: {e}{hint}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's module failed (or exited): one line
        raise ShardingError(f"--module {spec}: importing {target!r} failed: {type(e).__name__}: {e}") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ShardingError(f"--module {spec}: {target!r} has no callable {attr!r}; name the factory after ':'")
    try:
        got = factory()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise ShardingError(f"--module {spec}: {attr}() raised {type(e).__name__}: {e}") from None
    if not (isinstance(got, tuple) and len(got) in (2, 3)):
        raise ShardingError(
            f"--module {spec}: {attr}() must return (nn.Module, example_args) or (nn.Module, example_args, "
            f"dynamic_shapes), got {type(got).__name__}"
        )
    module, example_args, dynamic = got if len(got) == 3 else (*got, None)
    import torch

    if not isinstance(module, torch.nn.Module):
        raise ShardingError(f"--module {spec}: {attr}() returned a {type(module).__name__} first; it must return "
                            "(nn.Module, example_args)")
    return module, tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,), dynamic


def build_plan(args, program=None):
    """The Plan the options describe (model, mesh, style, pins); ``program``: the Program
    already loaded (a module exported by the caller), instead of loading the one the options name."""
    from .mesh import Mesh
    from .plan import plan
    from .plan.estimate import check_flop_rate

    rate = getattr(args, "flop_rate", None)
    if rate is not None:
        check_flop_rate(rate)
    if getattr(args, "style", None) == "auto":
        p = build_auto(args, program).plan
        p.flop_rate, p.ring = rate, bool(getattr(args, "ring", False))
        return p
    only_auto = [f"--{n.replace('_', '-')}" for n in ("memory", "training")
                 if getattr(args, n, None) is not None]
    if only_auto:
        raise ShardingError(f"{', '.join(only_auto)} {'is' if len(only_auto) == 1 else 'are'} only for --style auto "
                            "(the search under a budget): add --style auto or drop "
                            f"{'it' if len(only_auto) == 1 else 'them'}")
    mesh = Mesh.parse(args.mesh)
    prog = load_program(args) if program is None else program
    from .program.styles import kept_pins

    pins, matched, applied = style_and_tp_plan(prog, mesh, args)
    pins.update(user_pins(args, mesh))
    _check_uneven(args, prog)
    p = plan(prog, mesh, pins, uneven=bool(getattr(args, "uneven", False)), keep=kept_pins(pins, *applied))
    p.matched, p.flop_rate, p.ring = matched, rate, bool(getattr(args, "ring", False))
    return p


def user_pins(args, mesh) -> dict:
    """``{name: Sharding}`` of the ``--pin name=SHARDING`` options."""
    from .sharding import Sharding

    pins = {}
    for text in getattr(args, "pin", None) or []:
        if "=" not in text:
            raise ShardingError(f"--pin {text!r}: write name=SHARDING, e.g. 'x=[dp, 8, 16]'")
        name, sh = text.split("=", 1)
        try:
            pins[name.strip()] = Sharding.parse(sh, mesh)
        except ShardingError as e:
            raise type(e)(f"--pin {name.strip()}: {e}") from None
    return pins


def build_auto(args, program=None):
    """The ``AutoPlan`` of ``--style auto``: the minimum-step-time plan within ``--memory``
    (``--flop-rate``, ``--training``), keeping the pins of ``--tp-plan`` and ``--pin``; the
    TP plan's colwise/rowwise weights are its promise: no collective moves them."""
    from .mesh import Mesh
    from .plan import pin_shardings
    from .plan.auto import auto_plan, parse_memory
    from .program.styles import kept_pins

    mesh = Mesh.parse(args.mesh)
    prog = load_program(args) if program is None else program
    _check_uneven(args, prog)
    pins, applied = {}, []
    if getattr(args, "tp_plan", None) is not None:  # '' is refused by read_tp_plan, never skipped
        from .program.tp_plan import apply_tp_plan, read_tp_plan

        applied.append(apply_tp_plan(prog, mesh, read_tp_plan(args.tp_plan),
                                     bool(getattr(args, "allow_unmatched", False))))
        pins.update(applied[0].pins)
    pins.update(user_pins(args, mesh))
    memory = getattr(args, "memory", None)
    a = auto_plan(prog, mesh, pins, None if memory is None else parse_memory(memory),
                  flop_rate=getattr(args, "flop_rate", None), training=getattr(args, "training", None) or "adam",
                  keep=kept_pins(pin_shardings(prog, mesh, pins), *applied))
    if prog.symbols:  # the guards of the plan the search found (verify re-plans with every tensor pinned)
        from .plan.guards import plan_guards

        a.plan.uneven = bool(getattr(args, "uneven", False))
        a.plan.guards = plan_guards(a.plan, a.plan.uneven)
    return a


def _check_uneven(args, prog) -> None:
    if getattr(args, "uneven", False) and not prog.symbols:
        raise ShardingError("--uneven is for programs with symbolic sizes (torch.chunk semantics instead of "
                            "divisibility guards): add --dynamic INPUT:DIM=SYMBOL to --module, or drop --uneven")


def style_and_tp_plan(prog, mesh, args) -> tuple:
    """``(pins, matched, applied)`` of ``--style`` and ``--tp-plan`` (the plan's entries win); matched
    is None when neither is given, else the ``[{block, kind, tensors}]`` they found; ``applied``: their
    ``StylePins`` (what each keeps in place)."""
    from .program.styles import apply_style
    from .program.tp_plan import apply_tp_plan, read_tp_plan

    allow = bool(getattr(args, "allow_unmatched", False))
    pins, matched, applied = {}, None, []
    if args.style:
        got = apply_style(prog, mesh, args.style, allow)
        pins, matched = dict(got.pins), got.matched_json()
        applied.append(got)
    if getattr(args, "tp_plan", None) is not None:  # '' is refused by read_tp_plan, never skipped
        got = apply_tp_plan(prog, mesh, read_tp_plan(args.tp_plan), allow)
        pins.update(got.pins)
        matched = (matched or []) + got.matched_json()
        applied.append(got)
    return pins, matched, applied


__all__ = ["build_auto", "build_plan", "load_program", "style_and_tp_plan", "user_pins"]
