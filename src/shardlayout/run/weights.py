"""Weights from ``safetensors`` files straight into each rank's pieces (torch extra + safetensors).

``load_safetensors(module, files)`` fills every parameter and persistent buffer of ``module`` — a
``ParallelModule`` (each rank reads only the box of rows and columns around its own piece:
``safe_open(...).get_slice(name)[box]``, never the whole tensor unless its piece spans it) or a
plain module (whole tensors) — from the files that hold them (Hugging Face's layout: one file, or
shards named by ``model.safetensors.index.json``, keys equal to the module's ``state_dict`` keys).
Every name, shape and dtype is checked before anything is written: a file of another model is a
``CheckpointError`` naming the tensor, never a partial load.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..errors import CheckpointError


def weight_files(where) -> list:
    """The safetensors files ``where`` names: a file, a list of files, or a directory (its index
    ``model.safetensors.index.json`` when present, else every ``*.safetensors`` in it)."""
    if isinstance(where, (list, tuple)):
        return [str(w) for w in where]
    where = str(where)
    if os.path.isdir(where):
        index = os.path.join(where, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                names = sorted(set(json.load(f).get("weight_map", {}).values()))
            return [os.path.join(where, n) for n in names]
        files = sorted(os.path.join(where, n) for n in os.listdir(where) if n.endswith(".safetensors"))
        if not files:
            raise CheckpointError(f"--weights {where}: no .safetensors file in the directory")
        return files
    if not os.path.isfile(where):
        raise CheckpointError(f"--weights {where}: no such file")
    return [where]


def check_header(path: str) -> None:
    """A CheckpointError unless ``path`` starts as a safetensors file does: an 8-byte little-endian
    header length, then that many bytes of a JSON object naming each tensor's dtype, shape and
    offsets. Read without safetensors or torch (``run`` checks it before any rank starts)."""
    bad = f"--weights {path}: not a safetensors file"
    fix = "give a .safetensors file (or a directory of them), e.g. written by safetensors.torch.save_file"
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            size = os.fstat(f.fileno()).st_size
            if not 2 <= n <= min(size - 8, 100 << 20):
                raise CheckpointError(f"{bad} (its first 8 bytes give no header length that fits the file); {fix}")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"--weights {path}: {e.strerror}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{bad} (its header is not JSON); {fix}") from None
    if not isinstance(header, dict) or not all(
            k == "__metadata__" or (isinstance(v, dict) and {"dtype", "shape", "data_offsets"} <= set(v))
            for k, v in header.items()):
        raise CheckpointError(f"{bad} (its header does not list tensors with dtype, shape and data_offsets); {fix}")


def _targets(module) -> dict:
    """``{name: tensor}`` to fill: parameters and persistent buffers (the state_dict's tensors)."""
    return dict(module.state_dict(keep_vars=True))


def load_safetensors(module, where) -> dict:
    """Fill ``module``'s parameters and buffers from safetensors ``where``; returns ``{"tensors",
    "bytes_read", "bytes_total"}`` (this rank's reads against the files' whole tensors).
    ``load_safetensors(pmod, "model.safetensors")``"""
    import torch
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    files = weight_files(where)
    found: dict = {}  # name -> (file, shape, dtype)
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    found[k] = (path, tuple(sl.get_shape()), sl.get_dtype())
        except (OSError, Exception) as e:  # noqa: BLE001 - a damaged or foreign file: one line
            raise CheckpointError(f"--weights {path}: not a readable safetensors file ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None
    targets = _targets(module)
    missing = [n for n in targets if n not in found]
    extra = [k for k in found if k not in targets]
    if missing or extra:
        raise CheckpointError("the safetensors weights are of another model: "
                              + (f"they have no {', '.join(missing[:3])}" if missing else "")
                              + ("; " if missing and extra else "")
                              + (f"they have {', '.join(extra[:3])}, which the module has not" if extra else ""))
    for n, t in targets.items():
        if found[n][1] != tuple(t.shape):
            raise CheckpointError(f"weight {n} is {found[n][1]} in {found[n][0]}, {tuple(t.shape)} in the module")
    plan = getattr(module, "plan", None)
    rank = getattr(module, "rank", 0)
    read = total = 0
    with torch.no_grad():
        for path in files:
            names = [n for n in targets if found[n][0] == path]
            if not names:
                continue
            with safe_open(path, framework="pt") as f:
                for n in names:
                    t = targets[n]
                    total += t.numel() * t.element_size()
                    if isinstance(t, DTensor):
                        idx = plan.shardings[n].indices(rank)
                        piece = _read_piece(f.get_slice(n), idx)
                        t.to_local().copy_(piece)
                        read += piece.numel() * piece.element_size() if piece.numel() else 0
                    else:
                        whole = f.get_tensor(n)
                        t.copy_(whole)
                        read += whole.numel() * whole.element_size()
    return {"tensors": len(targets), "bytes_read": read, "bytes_total": total}


def _read_piece(sl, idx: tuple):
    """This rank's piece of one stored tensor: the box around its indices per dim, then the
    indices inside the box (exact for strided and uneven pieces alike)."""
    import torch

    if any(len(i) == 0 for i in idx):
        return torch.empty([len(i) for i in idx])
    box = tuple(slice(int(np.min(i)), int(np.max(i)) + 1) for i in idx)
    block = sl[box] if idx else sl[:]
    inner = [np.asarray(i, dtype=np.int64) - b.start for i, b in zip(idx, box)]
    if all(np.array_equal(i, np.arange(len(i))) for i in inner):
        return block
    return block[tuple(torch.from_numpy(np.array(a)) for a in np.ix_(*inner))]


__all__ = ["load_safetensors", "weight_files"]
