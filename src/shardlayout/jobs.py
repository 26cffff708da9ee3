"""What a command asks for, read from its options: the program and the plan.

``plan``, ``run`` and ``demo`` (and every rank of a ``run``) build their plan here from the same
options (``model``, ``program``, ``module``, ``export``, ``layers``, ``mesh``, ``style``,
``pin``), so a rank rebuilds exactly the plan the command printed.

    >>> from argparse import Namespace
    >>> p = build_plan(Namespace(model="llama", program=None, module=None, export=None, layers=1,
    ...                          mesh="tp=2", style="megatron", pin=None))
    >>> p.counts()
    {('all_reduce', ('tp',)): 2}
"""

from __future__ import annotations

from .errors import ShardingError


def load_program(args):
    """The Program the options name (a built-in model, JSON, a torch module or an export)."""
    from .program import Program
    from .program.models import MODELS

    if getattr(args, "module", None):
        import importlib

        from .program.torch_import import from_torch

        mod_name, _, attr = args.module.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr or "make")
        except (ImportError, AttributeError) as e:
            raise ShardingError(f"--module {args.module}: {e}") from None
        module, example_args = factory()
        return from_torch(module, example_args)
    if getattr(args, "export", None):
        import torch

        from .program.torch_import import from_exported

        try:
            return from_exported(torch.export.load(args.export))
        except (OSError, RuntimeError) as e:
            raise ShardingError(f"--export {args.export}: {e}") from None
    if args.program:
        try:
            with open(args.program) as f:
                return Program.from_json(f.read())
        except OSError as e:
            raise ShardingError(f"--program {args.program}: {e.strerror}") from None
    if args.model not in MODELS:
        raise ShardingError(f"unknown model {args.model!r}; built-in models: {', '.join(MODELS)}")
    return MODELS[args.model](layers=args.layers)


def build_plan(args):
    """The Plan the options describe (model, mesh, style, pins)."""
    from .mesh import Mesh
    from .plan import plan
    from .program.models import style_pins

    mesh = Mesh.parse(args.mesh)
    prog = load_program(args)
    pins = style_pins(prog, mesh, args.style) if args.style else {}
    for text in args.pin or []:
        if "=" not in text:
            raise ShardingError(f"--pin {text!r}: write name=SHARDING, e.g. 'x=[dp, 8, 16]'")
        name, sh = text.split("=", 1)
        from .sharding import Sharding

        pins[name.strip()] = Sharding.parse(sh, mesh)
    return plan(prog, mesh, pins)


__all__ = ["build_plan", "load_program"]
