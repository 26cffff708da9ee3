"""Imported programs kept on disk (program.cache): a hit equals the import it stands for."""

from __future__ import annotations

import json

import pytest

from shardlayout.program.cache import cache_key, cached
from shardlayout.program.models import llama

pytest.importorskip("torch")


def _flat(p):
    from shardlayout.program import Program

    return Program(p.tensors, p.ops, p.outputs, p.symbols, p.sym_shapes, p.facts, p.notes)


def test_a_program_is_built_once_and_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLAYOUT_CACHE_DIR", str(tmp_path))
    built = []

    def build():
        built.append(1)
        return _flat(llama(layers=7))  # as an import makes it: op by op

    first, hit1 = cached(("model", 7), build)
    second, hit2 = cached(("model", 7), build)
    assert (hit1, hit2) == (False, True) and len(built) == 1
    assert second == first and list(second.tensors) == list(first.tensors)
    assert second.repeated is not None  # the layers found again on reading
    assert len(list(tmp_path.glob("*.json"))) == 1 and not list(tmp_path.glob("*.tmp"))
    _, hit3 = cached(("model", 8), build)  # other parts: another entry
    assert not hit3 and len(built) == 2


def test_a_damaged_entry_is_rebuilt_and_the_cache_can_be_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLAYOUT_CACHE_DIR", str(tmp_path))
    (tmp_path / f"{cache_key(('m',))}.json").write_text('{"tensors": [')  # a killed writer's half file
    prog, hit = cached(("m",), lambda: llama(layers=1))
    assert not hit and prog == llama(layers=1)
    assert cached(("m",), lambda: pytest.fail("not rebuilt"))[1]
    monkeypatch.setenv("SHARDLAYOUT_CACHE_DIR", "off")
    calls = []
    for _ in range(2):
        cached(("m",), lambda: calls.append(1) or llama(layers=1))
    assert len(calls) == 2


def test_plan_hf_a_second_time_reads_the_import_from_the_cache(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")
    from shardlayout.cli import main

    monkeypatch.setenv("SHARDLAYOUT_CACHE_DIR", str(tmp_path / "cache"))
    transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64).save_pretrained(tmp_path / "m")
    argv = ["plan", "--hf", str(tmp_path / "m"), "--mesh", "tp=2", "--style", "megatron", "--size", "batch=2,seq=16",
            "--json"]
    outs = []
    for _ in range(2):
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        out.pop("plan_seconds", None)
        outs.append(out)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    assert outs[0] == outs[1] and [c["kind"] for c in outs[0]["collectives"]] == ["all_reduce"] * 12
