"""``--hf SOURCE``: a Hugging Face transformers model built from its config alone — no weights,
no network — on the meta device, with example token ids, ready for ``from_torch`` (torch and
transformers extras).

``SOURCE`` is a ``config.json`` file, a directory holding one (a downloaded checkpoint), or a
model id already in the local Hugging Face cache. The model class is the one the config names
(``AutoModelForCausalLM.from_config``); the example input is ``input_ids`` of ``[batch, seq]``.

    >>> module, (ids,) = hf_model("config.json", batch=1, seq=4096)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

from ..errors import ShardingError
from .torch_import import _first_line


class HfModelError(ShardingError):
    """A ``--hf`` source that is not a readable transformers config, and what to give instead."""


@contextmanager
def quiet_transformers():
    """transformers' own warnings (a kernel it falls back from, a config value it corrects) held to
    errors while a model is built and exported: the CLI's answer is the plan or one line."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def hf_config(source: str):
    """The transformers config ``source`` names (a config.json, a directory with one, or a
    cached model id). ``hf_config("llama/config.json").model_type -> 'llama'``"""
    try:
        import transformers
    except ImportError:
        raise HfModelError("--hf needs transformers: pip install 'shardlayout[hf]'") from None
    path = os.path.join(source, "config.json") if os.path.isdir(source) else source
    if os.path.isdir(source) and not os.path.isfile(path):
        raise HfModelError(f"--hf {source}: the directory holds no config.json; give the directory of a transformers "
                           "checkpoint (config.json beside the weights) or the config.json itself")
    try:
        with quiet_transformers():
            return _read_config(transformers, source, path)
    except HfModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HfModelError(f"--hf {source}: not a transformers config ({_first_line(e)}); give a config.json, a "
                           "directory with one, or a model id in the local Hugging Face cache (no download happens)") \
            from None


def _read_config(transformers, source: str, path: str):
    """The config of a file ``path`` (its ``model_type`` names the class) or a cached model id."""
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        kind = data.get("model_type") if isinstance(data, dict) else None
        if not kind:
            raise HfModelError(f"--hf {source}: {path} has no \"model_type\"; give a transformers config.json "
                               "(as saved by config.save_pretrained)")
        return transformers.AutoConfig.for_model(**data)
    if os.path.sep in source or source.endswith(".json"):
        raise HfModelError(f"--hf {source}: no such file or directory; give a config.json, a directory with "
                           "one, or a model id in the local Hugging Face cache")
    return transformers.AutoConfig.from_pretrained(source, local_files_only=True)


def hf_model(source: str, batch: int = 1, seq: int | None = None, device: str = "meta"):
    """``(module, (input_ids,))``: the causal-LM class ``source``'s config names, built on
    ``device`` (``"meta"``: no memory for weights; ``"cpu"``: randomly initialised, seed 0), in eval mode,
    and example token ids ``[batch, seq]`` (``seq`` None: 128, or the model's
    ``max_position_embeddings`` when shorter). ``hf_model("config.json", 8, 2048)``"""
    import torch
    import transformers

    cfg = hf_config(source)
    limit = getattr(cfg, "max_position_embeddings", None)
    if seq is None:
        seq = min(128, limit) if isinstance(limit, int) and limit >= 1 else 128
    for name, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HfModelError(f"--hf: {name} {v!r} must be an int >= 1 (e.g. --size batch=8,seq=2048)")
    if isinstance(limit, int) and seq > limit:
        raise HfModelError(f"--hf {source}: seq {seq} is longer than the model's max_position_embeddings {limit}; "
                           f"give --size seq={limit} or less")
    try:  # seeded: every rank (and every run) builds the same random weights
        with torch.random.fork_rng(devices=[]), torch.device(device), quiet_transformers():
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError as e:
        raise HfModelError(f"--hf {source}: transformers builds no causal LM from this config ({_first_line(e)})") \
            from None
    vocab = getattr(cfg, "vocab_size", None) or 2
    ids = (torch.arange(batch * seq).reshape(batch, seq) % vocab).to(device)  # where the weights are: a
    # forward may build positions on the ids' device and index a weight with them (XGLM)
    return model.eval(), (ids,)


_SKIP = {"_modules", "_parameters", "_buffers", "_non_persistent_buffers_set", "training", "layer_idx",
         "_is_hf_initialized"}  # per-instance bookkeeping: not what a layer computes


def _signature(layer) -> tuple:
    """What a layer computes, as far as its module tree says: per submodule, its class, its plain
    attributes (numbers, strings, flags, tuples of them: head counts, sliding windows, attention
    types), its parameters' and buffers' names, shapes and dtypes."""
    out = []
    for name, m in layer.named_modules():
        attrs = tuple(sorted((k, repr(v)) for k, v in vars(m).items()
                             if k not in _SKIP and not k.startswith("_") and
                             isinstance(v, (int, float, str, bool, type(None), tuple))))
        tensors = tuple((k, tuple(t.shape), str(t.dtype)) for k, t in
                        [*m._parameters.items(), *m._buffers.items()] if t is not None)
        out.append((name, type(m).__qualname__, attrs, tensors))
    return tuple(out)


def uniform_layers(module, config=None) -> tuple | None:
    """``(path, count)`` of the model's layer list (its longest ``nn.ModuleList``) when every layer
    is the same block by ``_signature`` and no per-layer list of the config varies (``layer_types``,
    ``mlp_only_layers``, ...); else None."""
    import torch

    lists = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    if not lists:
        return None
    path, layers = max(lists, key=lambda nm: len(nm[1]))
    first = _signature(layers[0])
    if any(_signature(layer) != first for layer in layers[1:]):
        return None
    for v in vars(config or {}).values():  # a per-layer choice the module tree may not show
        if isinstance(v, (list, tuple)) and len(v) == len(layers) and len({repr(x) for x in v}) > 1:
            return None
    return path, len(layers)


def import_hf(module, example_args, config=None):
    """The Program of an HF model (``from_torch``), exported with only its first ``MIN_COUNT``
    layers when all its layers are one block (``uniform_layers``): the import finds them to be a
    repeated block and ``program.repeat.with_count`` stamps the rest, named as the full model names
    them. torch.export and its decompositions then cost the same for 8 layers or 80. Anything else
    (layers that differ, a forward that does not run them as one block) is exported whole."""
    with quiet_transformers():
        return _import_hf(module, example_args, config)


def _import_hf(module, example_args, config):
    from .repeat import MIN_COUNT, with_count
    from .torch_import import from_torch

    found = uniform_layers(module, config)
    routed = any(getattr(config, k, None) for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    if found is None or found[1] <= MIN_COUNT or routed:  # routed rows (MoE) are not stamped: ragged programs
        return from_torch(module, example_args)           # are planned whole (program.repeat.compress)
    path, count = found
    owner, _, leaf = path.rpartition(".")
    parent = module.get_submodule(owner) if owner else module
    full = getattr(parent, leaf)
    setattr(parent, leaf, type(full)(list(full)[:MIN_COUNT]))
    try:
        prog = from_torch(module, example_args)
    except ShardingError:  # a forward that needs every layer (indexes them by the config's count): whole
        prog = None
    finally:
        setattr(parent, leaf, full)
    rep = None if prog is None else prog.repeated
    if rep is None or rep[1].prefix != path or rep[1].count != MIN_COUNT:
        return from_torch(module, example_args)  # the first layers were not one block as imported
    return with_count(prog, count)


__all__ = ["HfModelError", "hf_config", "hf_model", "import_hf", "quiet_transformers", "uniform_layers"]
