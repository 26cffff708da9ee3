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

from ..errors import ShardingError
from .torch_import import _first_line


class HfModelError(ShardingError):
    """A ``--hf`` source that is not a readable transformers config, and what to give instead."""


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
    except HfModelError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HfModelError(f"--hf {source}: not a transformers config ({_first_line(e)}); give a config.json, a "
                           "directory with one, or a model id in the local Hugging Face cache (no download happens)") \
            from None


def hf_model(source: str, batch: int = 1, seq: int = 128, device: str = "meta"):
    """``(module, (input_ids,))``: the causal-LM class ``source``'s config names, built on
    ``device`` (``"meta"``: no memory for weights; ``"cpu"``: randomly initialised, seed 0), in eval mode,
    and example token ids ``[batch, seq]``. ``hf_model("config.json", 8, 2048)``"""
    import torch
    import transformers

    for name, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HfModelError(f"--hf: {name} {v!r} must be an int >= 1 (e.g. --size batch=8,seq=2048)")
    cfg = hf_config(source)
    limit = getattr(cfg, "max_position_embeddings", None)
    if isinstance(limit, int) and seq > limit:
        raise HfModelError(f"--hf {source}: seq {seq} is longer than the model's max_position_embeddings {limit}; "
                           f"give --size seq={limit} or less")
    try:  # seeded: every rank (and every run) builds the same random weights
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError as e:
        raise HfModelError(f"--hf {source}: transformers builds no causal LM from this config ({_first_line(e)})") \
            from None
    vocab = getattr(cfg, "vocab_size", None) or 2
    ids = torch.arange(batch * seq).reshape(batch, seq) % vocab
    return model.eval(), (ids,)


__all__ = ["HfModelError", "hf_config", "hf_model"]
