"""Imported programs kept on disk: planning a model again skips torch.export and its decompositions.

Importing a real model is torch's work almost entirely (``torch.export`` and ``run_decompositions``
re-trace every op: ~20 s for an 8B Llama here), and a user plans the same model many times, on
other meshes and styles. ``cached(key, build)`` returns the Program ``build()`` makes, kept as
JSON under the cache directory by a key of everything the import depends on: the caller's parts
(a Hugging Face config's canonical text, the example sizes), the versions of torch and
transformers, and a fingerprint of shardlayout's own source (a changed importer never reads an
older import). A hit is read with ``Program.from_json`` (every name and shape checked) and its
repeated layers found again (``program.repeat.compress``). A file that does not read back is
rebuilt and replaced; files are written whole (a temporary file renamed), so a killed run leaves
no half file.

The directory is ``$SHARDLAYOUT_CACHE_DIR``, else ``~/.cache/shardlayout/programs``;
``SHARDLAYOUT_CACHE_DIR=off`` turns the cache off. ``cached(("llama", 1, 128), build) -> Program``
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..caches import memo

ENV = "SHARDLAYOUT_CACHE_DIR"


def cache_dir() -> Path | None:
    """Where imported programs are kept, or None when the cache is off (``SHARDLAYOUT_CACHE_DIR=off``)."""
    got = os.environ.get(ENV)
    if got is not None and got.strip().lower() in ("", "off", "0", "none"):
        return None
    return Path(got) if got else Path.home() / ".cache" / "shardlayout" / "programs"


@memo(1)
def source_fingerprint() -> str:
    """A digest of every ``.py`` file of the installed shardlayout package (names and bytes)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cache_key(parts) -> str:
    """The file stem for ``parts`` (JSON-able), the library versions (read from the installed
    packages' metadata: nothing is imported) and our source fingerprint."""
    text = json.dumps({"parts": parts, "torch": _version("torch"), "transformers": _version("transformers"),
                       "shardlayout": source_fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _read(path: Path):
    """The program kept at ``path`` (its repeated layers found again), or None when there is none
    or it does not read back (a damaged or foreign file: the caller rebuilds and replaces it)."""
    from ..errors import ShardingError
    from . import Program
    from .repeat import compress

    if not path.is_file():
        return None
    try:
        return compress(Program.from_json(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ShardingError):  # ValueError: not UTF-8, not JSON
        return None


def cached(parts, build):
    """``(program, hit)``: the program ``build()`` makes for ``parts``, read from the cache when
    it holds one, else built and stored (unless the cache is off or cannot be written)."""
    where = cache_dir()
    if where is None:
        return build(), False
    path = where / f"{cache_key(parts)}.json"
    kept = _read(path)
    if kept is not None:
        return kept, True
    prog = build()
    tmp = None
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(prog.to_json())
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk: the import is still right, only not kept
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return prog, False


__all__ = ["ENV", "cache_dir", "cache_key", "cached", "source_fingerprint"]
