"""``parallelize``: a user's ``nn.Module`` running a plan, with DTensor parameters (torch extra).

    pmod = shardlayout.parallelize(model, "dp=2,tp=2", style="megatron-sp", example_inputs=(tokens,))
    loss = loss_fn(pmod(tokens).full_tensor(), target); loss.backward(); opt.step()

What comes back is an ``nn.Module`` with the user's FQNs (it adopts the module's children; their
parameters are replaced in place) whose parameters are ``nn.Parameter(DTensor)`` with the plan's
placements (``_StridedShard`` where a dim is cut out of order; a sharding DTensor cannot say —
pieces of one mesh axis in two dims — is refused naming the parameter), so ``torch.optim``,
``clip_grad_norm_`` and ``torch.distributed.checkpoint`` work unchanged. Its forward calls the
plan's per-rank program (``run.program``): local aten ops and functional collectives in one
``GraphModule``, whose backward is the plan's (``plan.backward``); ``torch.compile`` compiles both.

Inputs: a DTensor (moved to the plan's input sharding), or a plain tensor that is either the whole
(global) value — every rank passes the same; the rank keeps its piece — or this rank's local piece
already (told apart by shape). Outputs: DTensors with the plan's output placements
(``outputs="local"``: this rank's local pieces instead).
"""

from __future__ import annotations

from ..errors import RunError, ShardingError


class ParallelizeError(ShardingError):
    """A module, mesh, plan or input that ``parallelize`` cannot use, and the fix."""


def _torch_mesh(mesh):
    """``(our Mesh, DeviceMesh)`` from a Mesh, its text, or a torch ``DeviceMesh``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from ..mesh import Mesh

    if not dist.is_initialized():
        raise ParallelizeError("parallelize needs torch.distributed initialised (torchrun, or "
                               "dist.init_process_group) with one rank per mesh device")
    if isinstance(mesh, DeviceMesh):
        names = mesh.mesh_dim_names
        if not names:
            raise ParallelizeError("the DeviceMesh has no mesh_dim_names; give init_device_mesh(..., "
                                   "mesh_dim_names=('dp', 'tp')) so plans can name its axes")
        ours = Mesh(tuple(mesh.mesh.shape), tuple(names))
        if mesh.mesh.flatten().tolist() != list(range(ours.size)):
            raise ParallelizeError(f"the DeviceMesh's ranks {mesh.mesh.tolist()} are not 0..{ours.size - 1} row-major; "
                                   "shardlayout's meshes number ranks row-major (as init_device_mesh does)")
        dm = mesh
    else:
        ours = Mesh.parse(mesh) if isinstance(mesh, str) else mesh
        if not isinstance(ours, Mesh):
            raise ParallelizeError(f"mesh: give a shardlayout Mesh, its text ('dp=2,tp=2') or a torch DeviceMesh, "
                                   f"not {type(mesh).__name__}")
        dm = None
    world = dist.get_world_size()
    if ours.size != world:
        raise ParallelizeError(f"the mesh {ours} has {ours.size} devices but torch.distributed runs {world} ranks; "
                               f"give a mesh of {world} devices (or start {ours.size} ranks)")
    if dm is None:
        dm = init_device_mesh(_device_type(), tuple(ours.shape), mesh_dim_names=tuple(ours.names))
    return ours, dm


def _device_type() -> str:
    import torch
    import torch.distributed as dist

    return "cuda" if dist.get_backend() == "nccl" and torch.cuda.is_available() else "cpu"


def _on_meta(module) -> bool:
    return any(t.device.type == "meta" for t in list(module.parameters()) + list(module.buffers()))


def _meta_args(args):
    """The example arguments on the meta device (exporting a module built on ``meta``)."""
    import torch

    if isinstance(args, torch.Tensor):
        return args.to("meta")
    if isinstance(args, (list, tuple)):
        return type(args)(_meta_args(a) for a in args)
    if isinstance(args, dict):
        return {k: _meta_args(v) for k, v in args.items()}
    return args


def _export(module, example_inputs):
    """``torch.export`` of the module at the example inputs (on meta for a module built there)."""
    from ..program.torch_import import export_module

    return export_module(module, _meta_args(example_inputs) if _on_meta(module) else example_inputs)


def _imported(module, example_inputs) -> tuple:
    """``(program, output structure, lifted constants)`` of the module's ``torch.export``."""
    from ..program.torch_import import constants_of, from_exported, output_structure

    ep = _export(module, example_inputs)
    return from_exported(ep), output_structure(ep), constants_of(ep)


def _plan_module(prog, mesh, style, tp_plan, pins, allow_unmatched):
    """The plan of ``prog`` on ``mesh`` from a style / tp-plan / pins (``auto``: the search)."""
    from ..plan import plan as make_plan

    given = dict(pins or {})
    if style == "auto":
        from ..plan.auto import auto_plan
        from ..program.styles import kept_pins

        applied = []
        if tp_plan:
            from ..program.tp_plan import apply_tp_plan, read_tp_plan

            applied.append(apply_tp_plan(prog, mesh, read_tp_plan(tp_plan) if isinstance(tp_plan, str) else tp_plan,
                                         allow_unmatched))
            given = {**applied[0].pins, **given}
        given = _pins(given, mesh)
        return auto_plan(prog, mesh, given, keep=kept_pins(given, *applied)).plan
    from ..program.styles import apply_style, kept_pins

    got, applied = {}, []
    if style:
        applied.append(apply_style(prog, mesh, style, allow_unmatched))
        got.update(applied[-1].pins)
    if tp_plan:
        from ..program.tp_plan import apply_tp_plan, read_tp_plan

        applied.append(apply_tp_plan(prog, mesh, read_tp_plan(tp_plan) if isinstance(tp_plan, str) else tp_plan,
                                     allow_unmatched))
        got.update(applied[-1].pins)
    got.update(_pins(given, mesh))
    return make_plan(prog, mesh, got, keep=kept_pins(got, *applied))


def _pins(pins: dict, mesh) -> dict:
    from ..sharding import Sharding

    out = {}
    for name, s in pins.items():
        if isinstance(s, str):
            s = Sharding.parse(s, mesh)
        if not isinstance(s, Sharding):
            raise ParallelizeError(f"pins[{name!r}]: give a Sharding or its text ('[dp*4, 8]'), not "
                                   f"{type(s).__name__}")
        out[name] = s
    return out


def _flat_tensors(args) -> list:
    import torch

    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_flat_tensors(a))
        elif isinstance(a, dict):
            out.extend(_flat_tensors(list(a.values())))
    return out


def _placements(s, what: str):
    from ..errors import NotRepresentable
    from ..sharding.placements import to_dtensor

    try:
        return tuple(to_dtensor(s))
    except NotRepresentable as e:
        raise ParallelizeError(f"{what}: its planned sharding has no DTensor placements ({e}); pin it to a "
                               "sharding DTensor can say (whole mesh axes, applied in mesh order)") from None


def _stride(shape) -> tuple:
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return tuple(reversed(out))


def parallelize(module, mesh, plan=None, *, example_inputs=None, style=None, tp_plan=None, pins=None,
                allow_unmatched: bool = False, outputs: str = "dtensor", init_weights=None, weights=None,
                streams: bool = True):
    """``module`` running ``plan`` (or the plan of ``style`` / ``tp_plan`` / ``pins``; ``style="auto"``
    searches) on ``mesh``: see the module docstring. Collective: every rank calls it alike.
    A module built on the ``meta`` device gets only this rank's pieces allocated, then initialised
    by ``init_weights(module)`` (its parameters already DTensors), else by its own ``init_weights()``,
    else by every submodule's ``reset_parameters()``; or, with ``weights`` (safetensors: a file or a
    directory, ``run.weights``), each rank reads its pieces from there instead. ``streams``: run
    the plan's stream choices chunk by chunk (``execute.stream``; each chunk's collective issued a
    chunk ahead of its wait), else every move whole; ``pmod.streams`` holds the segments run.
    ``parallelize(model, "tp=2", style="megatron", example_inputs=(x,))``"""
    import torch

    from ..plan import Plan
    from .backward import gradient_reductions, training_pieces
    from .moves import process_groups
    from .once import made_once
    from .program import InterpretedProgram, ragged_tensors, rank_program, stream_pieces, stream_segments

    if not isinstance(module, torch.nn.Module):
        raise ParallelizeError(f"parallelize takes an nn.Module, not {type(module).__name__}")
    if outputs not in ("dtensor", "local"):
        raise ParallelizeError(f"outputs={outputs!r}: give 'dtensor' (DTensors with the plan's placements) or "
                               "'local' (this rank's pieces)")
    if not isinstance(streams, bool):
        raise ParallelizeError(f"streams={streams!r}: give True (run the plan's stream choices chunk by chunk) or "
                               "False (every move whole)")
    ours, dm = _torch_mesh(mesh)
    if example_inputs is None:
        raise ParallelizeError("parallelize needs example_inputs (a tuple of the forward's arguments, global sizes): "
                               "the module is exported with them to plan it and to know its inputs")
    example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    imported = structure = None
    if plan is None:  # exported by rank 0 alone: N ranks pay one torch.export
        imported = made_once(lambda: _imported(module, example_inputs))
        structure = imported[1]
        plan = _plan_module(imported[0], ours, style, tp_plan, pins, allow_unmatched)
    elif not isinstance(plan, Plan):
        raise ParallelizeError(f"plan: give a shardlayout Plan (or None to plan with style=...), not "
                               f"{type(plan).__name__}")
    elif style or tp_plan or pins:
        raise ParallelizeError("give either a plan or style/tp_plan/pins to make one, not both")
    if plan.mesh != ours:
        raise ParallelizeError(f"the plan is for mesh {plan.mesh}, parallelize was given {ours}")
    prog = plan.program
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    constants = {}
    meta = _on_meta(module)
    if weights is not None and init_weights is not None:
        raise ParallelizeError("give init_weights or weights (where the values come from), not both")
    can_init = callable(getattr(module, "init_weights", None)) or any(
        callable(getattr(m, "reset_parameters", None)) for m in module.modules())
    if meta and weights is None and init_weights is None and not can_init:
        raise ParallelizeError(f"{type(module).__name__} is on the meta device and has no way to initialise its "
                               "pieces: pass init_weights=fn (called with the module once its parameters are "
                               "DTensors), or give it init_weights() or submodules with reset_parameters()")
    if init_weights is not None and not callable(init_weights):
        raise ParallelizeError(f"init_weights: give a function of the module, not {type(init_weights).__name__}")
    if any(prog.tensors[n].kind == "buffer" and n not in state for n in prog.inputs()):
        if meta:
            raise ParallelizeError("the module builds a tensor constant in forward (torch.export lifts it) and is on "
                                   "the meta device, where its values do not exist: register it as a buffer, or "
                                   "build the module on a real device")
        from ..program.torch_import import constants_of  # a tensor made in forward, lifted by export

        constants = imported[2] if imported else made_once(lambda: constants_of(_export(module, example_inputs)))
        state.update(constants)
    user = prog.inputs("input")
    examples = _flat_tensors(example_inputs)
    if len(examples) != len(user):
        raise ParallelizeError(f"the plan's program takes {len(user)} input tensor(s) ({', '.join(user)}), "
                               f"example_inputs hold {len(examples)}")
    missing = [n for n in prog.inputs() if prog.tensors[n].kind in ("param", "buffer") and n not in state]
    if missing:
        raise ParallelizeError(f"the plan's parameters {', '.join(missing[:3])} are not in the module (its "
                               f"parameters: {', '.join(list(state)[:3])}, ...); plan this module, or the module "
                               "the plan was made from")
    rank = torch.distributed.get_rank()
    reductions = gradient_reductions(plan)
    segs = stream_segments(plan) if streams else ()
    groups = process_groups(plan, rank, training_pieces(plan, reductions) | stream_pieces(plan, segs))
    by_name = dict(zip(user, examples))
    if ragged_tensors(plan):  # routed rows: sizes known at run time, the plan interpreted (eager)
        gm = InterpretedProgram(plan, rank, groups, reductions, segs)
    else:
        gm = rank_program(plan, rank, groups, [by_name[n] if n in by_name else draw_example(prog.tensors[n])
                                               if prog.tensors[n].kind in ("rand", "randn") else state[n]
                                               for n in prog.inputs()],
                          reductions, segs)
    pmod = ParallelModule(module, plan, dm, rank, gm, outputs, constants, structure)
    object.__setattr__(pmod, "streams", segs)
    if weights is not None:
        from .weights import load_safetensors

        load_safetensors(pmod, weights)
    elif meta:
        _initialise(module, init_weights)  # the user's module: its parameters are pmod's DTensors now
    return pmod


def _initialise(module, init_weights) -> None:
    """Fill the pieces of a module built on meta: the user's function, the module's
    ``init_weights()``, or every submodule's ``reset_parameters()`` (DTensor ops on the pieces)."""
    import torch

    with torch.no_grad():
        if init_weights is not None:
            init_weights(module)
        elif callable(getattr(module, "init_weights", None)):
            module.init_weights()
        else:
            for m in module.modules():
                if m is not module and callable(getattr(m, "reset_parameters", None)):
                    m.reset_parameters()


def _local_index(s, rank: int):
    """Index tensors picking ``rank``'s piece of ``s`` out of the global value."""
    import numpy as np
    import torch

    return tuple(torch.from_numpy(np.array(i, dtype=np.int64)) for i in np.ix_(*s.indices(rank)))


def _module_base():
    import torch

    return torch.nn.Module


class ParallelModule(_module_base()):
    """The user's module (its children adopted, FQNs kept) with DTensor parameters and the plan's
    per-rank program as its forward. ``plan``, ``program`` (the GraphModule) and ``device_mesh``
    are attributes."""

    def __init__(self, module, plan, device_mesh, rank: int, program, outputs: str, constants=None, structure=None):
        import torch
        from torch.distributed.tensor import DTensor

        super().__init__()
        object.__setattr__(self, "plan", plan)  # not a submodule: no FQNs added
        object.__setattr__(self, "device_mesh", device_mesh)
        self.rank, self._outputs = rank, outputs
        self.program = program
        prog = plan.program
        self._inputs = prog.inputs()
        self._user = prog.inputs("input")
        self._signature = _forward_names(module)
        made: dict = {}  # id(original tensor) -> its DTensor (tied parameters stay tied)
        named = list(module.named_parameters(remove_duplicate=False)) + \
            list(module.named_buffers(remove_duplicate=False))
        planned = {}  # a tied tensor takes the sharding of the name the program reads (export may list both)
        read = {x for op in prog.ops for x in op.inputs if isinstance(x, str)}
        used = lambda fqn: (fqn in read, fqn in plan.shardings)  # noqa: E731
        for fqn, t in named:
            if id(t) not in planned or used(fqn) > used(planned[id(t)]):
                planned[id(t)] = fqn
        for fqn, t in named:
            owner, _, leaf = fqn.rpartition(".")
            sub = module.get_submodule(owner) if owner else module
            if id(t) not in made:
                made[id(t)] = self._distribute(planned[id(t)], t, plan, device_mesh, rank)
            new = made[id(t)]
            if isinstance(t, torch.nn.Parameter):
                sub._parameters[leaf] = new
            else:
                sub._buffers[leaf] = new
        for fqn, t in (constants or {}).items():  # export's lifted constants: non-persistent buffers
            owner, _, leaf = fqn.rpartition(".")
            (module.get_submodule(owner) if owner else module).register_buffer(
                leaf, self._distribute(fqn, t, plan, device_mesh, rank), persistent=False)
        for name, child in module.named_children():
            self.add_module(name, child)
        for name, p in module._parameters.items():
            self.register_parameter(name, p)
        for name, b in module._buffers.items():
            self.register_buffer(name, b, persistent=name not in module._non_persistent_buffers_set)
        self._index = {n: _local_index(plan.shardings[n], rank) for n in self._user}
        self._draws = draws(plan, rank)
        self._seed, self._calls = shared_seed() if self._draws else 0, 0
        self._local_shapes = {n: tuple(plan.shardings[n].local_shape(rank)) for n in self._user}
        self._out = [(n, plan.shardings[n], _placements(plan.shardings[n], f"output {n!r}")
                      if outputs == "dtensor" else None) for n in prog.outputs]
        self._dtensor = DTensor
        n_tensors = sum(1 for v in structure[1] if v is _tensor_leaf()) if structure else -1
        self._structure = structure if n_tensors == len(prog.outputs) else None  # else: a tuple

    def _distribute(self, fqn, t, plan, dm, rank):
        import torch
        from torch.distributed.tensor import DTensor

        s = plan.shardings.get(fqn)
        if s is None:  # not in the program (unused by forward): replicated
            from ..sharding import Sharding

            s = Sharding.replicated(plan.mesh, tuple(t.shape))
        if tuple(t.shape) != tuple(s.shape):
            raise ParallelizeError(f"parameter {fqn!r} has shape {tuple(t.shape)}, the plan says {tuple(s.shape)}")
        if isinstance(t, DTensor):
            raise ParallelizeError(f"parameter {fqn!r} is already a DTensor; give parallelize the plain module")
        placements = _placements(s, f"parameter {fqn!r}")
        if t.device.type == "meta":  # only this rank's piece is ever allocated; initialised after
            local = torch.empty(s.local_shape(rank), dtype=t.dtype, device=_device_type())
        else:
            with torch.no_grad():
                local = t.detach()[_local_index(s, rank)].clone()
        dt = DTensor.from_local(local, dm, placements, run_check=False, shape=tuple(s.shape),
                                stride=_stride(s.shape))
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(dt, requires_grad=t.requires_grad)
        return dt

    def _local_input(self, name: str, x):
        import torch

        s = self.plan.shardings[name]
        if isinstance(x, self._dtensor):
            want = _placements(s, f"input {name!r} (given as a DTensor)")
            if tuple(x.placements) != want:
                x = x.redistribute(self.device_mesh, want)
            return x.to_local()
        if not isinstance(x, torch.Tensor):
            raise ParallelizeError(f"input {name!r}: got {type(x).__name__}, expected a tensor")
        shape = tuple(x.shape)
        if shape == tuple(s.shape):
            return x[self._index[name]]
        if shape == self._local_shapes[name]:
            return x
        raise ParallelizeError(f"input {name!r} has shape {shape}: give the global value {tuple(s.shape)} or this "
                               f"rank's piece {self._local_shapes[name]} (sharding {s})")

    def forward(self, *args, **kwargs):
        given = _bind(self._signature, self._user, args, kwargs)
        values = []
        self._calls += 1
        for n in self._inputs:
            if n in given:
                values.append(self._local_input(n, given[n]))
            elif n in self._draws:
                if not self.training:
                    raise ParallelizeError(
                        f"the module is in eval mode but its plan was made in training mode: its dropout draws "
                        f"({', '.join(list(self._draws)[:2])}{', ...' if len(self._draws) > 2 else ''}) are part of "
                        "the program; parallelize the module after .eval() to evaluate without dropout")
                values.append(local_draw(self._draws[n], self._seed, self._calls))
            else:
                t = self.get_parameter(n) if _is_param(self, n) else self.get_buffer(n)
                values.append(t.to_local())
        outs = self.program(*values)
        if self._outputs != "local":
            outs = tuple(self._dtensor.from_local(o, self.device_mesh, pl, run_check=False, shape=tuple(s.shape),
                                                  stride=_stride(s.shape))
                         for o, (_, s, pl) in zip(outs, self._out))
        if self._structure is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        from torch.utils._pytree import tree_unflatten

        spec, leaves = self._structure
        it = iter(outs)
        return tree_unflatten([next(it) if v is _tensor_leaf() else v for v in leaves], spec)


def draws(plan, rank: int) -> dict:
    """The program's random draws (dropout's masks, inputs of kind ``rand`` / ``randn``) as
    ``{name: (kind, dtype, this rank's shape, the piece it holds)}``: ranks holding the same piece
    (replicas) draw the same values, ranks holding other pieces independent ones.
    ``draws(plan, 0) -> {"drop.rand_like": ("rand", "float32", (2, 8, 16), "9f2c...")}``"""
    import hashlib

    import numpy as np

    prog = plan.program
    out = {}
    for n in prog.inputs():
        t = prog.tensors[n]
        if t.kind in ("rand", "randn"):
            s = plan.shardings[n]
            h = hashlib.blake2b(n.encode(), digest_size=16)
            for ix in s.indices(rank):  # the global indices of this rank's piece, dim by dim
                h.update(np.asarray(ix, dtype=np.int64).tobytes() + b"|")
            out[n] = (t.kind, t.dtype, tuple(s.local_shape(rank)), h.hexdigest())
    return out


def shared_seed() -> int:
    """One seed for every rank of the job: rank 0's draw from torch's default generator,
    broadcast (a job seeded with ``torch.manual_seed`` draws the same dropout masks run after run)."""
    import torch

    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64).to(_device_type())  # nccl takes device tensors
    torch.distributed.broadcast(seed, src=0)
    return int(seed.item())


def local_draw(draw: tuple, seed: int, call: int):
    """This rank's piece of a draw at forward call ``call``: seeded by the job's seed, the call and
    the piece (``draws``), so replicas agree and the draw changes every call."""
    import hashlib

    import torch

    kind, dtype, shape, piece = draw
    digest = hashlib.blake2b(f"{seed}|{call}|{piece}".encode(), digest_size=8).digest()
    device = _device_type()
    g = torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)
    fn = torch.rand if kind == "rand" else torch.randn
    return fn(shape, generator=g, dtype=getattr(torch, dtype), device=device)


def draw_example(t):
    """A tensor of a draw's dtype (``rank_program`` reads only dtypes of its examples)."""
    import torch

    return torch.zeros((), dtype=getattr(torch, t.dtype))


def _tensor_leaf():
    from ..program.torch_import import TENSOR

    return TENSOR


def _is_param(mod, fqn: str) -> bool:
    owner, _, leaf = fqn.rpartition(".")
    return leaf in (mod.get_submodule(owner) if owner else mod)._parameters


def _forward_names(module) -> tuple:
    """The forward's positional parameter names (to bind a call's arguments to program inputs)."""
    import inspect

    try:
        ps = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _bind(names: tuple, user: list, args: tuple, kwargs: dict) -> dict:
    """``{program input: value}``: arguments matched by the forward's parameter names where the
    program kept them, else the tensors in order."""
    import torch

    if set(user) <= set(names):
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise ParallelizeError(f"unexpected argument {k!r}; the module takes {', '.join(names)}")
            given[k] = v
        missing = [n for n in user if n not in given]
        if missing:
            raise ParallelizeError(f"missing input(s) {', '.join(missing)}")
        return {n: given[n] for n in user}
    flat = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if len(flat) != len(user):
        raise ParallelizeError(f"the module's program takes {len(user)} tensor input(s) ({', '.join(user)}), "
                               f"the call gave {len(flat)}")
    return dict(zip(user, flat))


__all__ = ["ParallelModule", "ParallelizeError", "RunError", "parallelize"]
