"""``--hf CONFIG``: a transformers model built from its config alone on the meta device (no
weights, no network), planned like any module; bad sources are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from shardlayout.cli import main

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64).save_pretrained(d)
    return d


def test_the_model_is_built_on_meta_from_the_config_alone(tiny):
    from shardlayout.program.hf import hf_model

    module, (ids,) = hf_model(str(tiny / "config.json"), batch=2, seq=16)
    assert type(module).__name__ == "LlamaForCausalLM"
    assert {p.device.type for p in module.parameters()} == {"meta"}
    assert tuple(ids.shape) == (2, 16) and ids.device.type == "meta"  # with the weights
    _, (cpu_ids,) = hf_model(str(tiny / "config.json"), batch=2, seq=16, device="cpu")
    assert cpu_ids.device.type == "cpu" and int(cpu_ids.max()) < 128


def test_plan_hf_megatron_counts_and_sizes(tiny, capsys):
    assert main(["plan", "--hf", str(tiny), "--mesh", "tp=2", "--style", "megatron", "--size", "batch=2,seq=16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kinds = [c["kind"] for c in out["collectives"]]
    assert kinds == ["all_reduce"] * 4  # 2 layers: attention and MLP
    assert out["shapes"]["input_ids"] == [2, 16]


def test_default_sizes_give_each_data_parallel_rank_a_sequence(tiny, capsys):
    """Without --size, the batch is one sequence per rank of dp (and ep) and seq is 128 or the
    model's max_position_embeddings (64 here): dp=2,tp=2 plans Megatron's 4 all-reduces, no gather."""
    assert main(["plan", "--hf", str(tiny), "--mesh", "dp=2,tp=2", "--style", "megatron", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shapes"]["input_ids"] == [2, 64]
    assert [(c["kind"], c["axes_text"]) for c in out["collectives"]] == [("all_reduce", "tp")] * 4


def test_positions_built_on_the_ids_device_index_a_meta_table(tmp_path, capsys):
    """XGLM builds its position ids on ``input_ids.device`` and indexes its sinusoidal table (a
    buffer on the model's device) with them: the example ids live where the weights do."""
    transformers.XGLMConfig(vocab_size=128, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4,
                            max_position_embeddings=64).save_pretrained(tmp_path)
    assert main(["plan", "--hf", str(tmp_path), "--mesh", "tp=2", "--style", "megatron", "--size", "batch=2,seq=16",
                 "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 2 layers of attention and MLP, and the tied embedding cut on its vocabulary
    assert [c["kind"] for c in out["collectives"]] == ["all_reduce"] * 5
    assert out["verified"] is True


@pytest.mark.parametrize("argv,match", [
    (["--hf", "/no/such/config.json"], "no such file or directory"),
    (["--hf", "{tiny}", "--size", "seq=65"], "longer than the model's max_position_embeddings 64"),
    (["--hf", "{tiny}", "--size", "dim=8"], "hf takes batch=N, seq=N"),
    (["--hf", "{tiny}", "--module", "x.py:make"], "--hf and --module: give one model source"),
    (["--hf", "{bad}"], "has no \"model_type\""),
    (["--hf", "not-a-cached-model-id"], "not a transformers config"),
    (["--hf", ""], "--hf '': an empty value names no model"),
    (["--hf", "{empty_dir}"], "the directory holds no config.json"),
])
def test_bad_sources_are_one_line(argv, match, tiny, tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    empty_dir = tmp_path / "no-config"
    empty_dir.mkdir()
    argv = [a.format(tiny=tiny, bad=bad, empty_dir=empty_dir) for a in argv]
    assert main(["plan", *argv, "--mesh", "tp=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlayout: error:") and err.count("\n") == 1 and match in err, err


def test_run_builds_the_same_class_on_the_cpu_with_weights(tiny):
    """``run --hf`` needs values: the same class, built on the CPU and randomly initialised, with the
    --size the plan uses."""
    from argparse import Namespace

    from shardlayout.jobs import hf_source

    module, (ids,), dynamic = hf_source(Namespace(hf=str(tiny), size="batch=2,seq=8"), "cpu")
    assert dynamic is None and tuple(ids.shape) == (2, 8)
    assert {p.device.type for p in module.parameters()} == {"cpu"}
    assert module(ids).logits.shape == (2, 8, 128)


def _llama_config(d, layers):
    transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64).save_pretrained(d)
    return str(d)


def test_uniform_layers_import_only_the_first_ones_and_equal_the_whole_import(tmp_path):
    from shardlayout.program.hf import hf_model, import_hf, uniform_layers
    from shardlayout.program.torch_import import from_torch

    module, args = hf_model(_llama_config(tmp_path, 9), batch=2, seq=16)
    assert uniform_layers(module, module.config) == ("model.layers", 9)
    got = import_hf(module, args, module.config)
    assert len(module.model.layers) == 9  # the module is given back whole
    want = from_torch(module, args)  # the oracle: every layer exported and imported
    assert got.repeated[1].count == want.repeated[1].count == 9
    assert got == want and list(got.tensors) == list(want.tensors) and got.inputs() == want.inputs()


def test_layers_that_differ_are_exported_whole(tmp_path):
    from shardlayout.program.hf import hf_model, import_hf, uniform_layers
    from shardlayout.program.torch_import import from_torch

    module, args = hf_model(_llama_config(tmp_path, 7), batch=2, seq=16)
    module.model.layers[5].self_attn.scaling = 0.5  # one layer computes otherwise
    assert uniform_layers(module, module.config) is None
    got = import_hf(module, args, module.config)
    assert got == from_torch(module, args) and got.repeated is None
    module, args = hf_model(_llama_config(tmp_path, 7), batch=2, seq=16)
    module.config.layer_types = ["full_attention"] * 6 + ["sliding_attention"]  # a per-layer choice in the config
    assert uniform_layers(module, module.config) is None


def test_a_forward_that_needs_every_layer_is_exported_whole(tmp_path):
    from shardlayout.program.hf import hf_model, import_hf
    from shardlayout.program.torch_import import from_torch

    module, args = hf_model(_llama_config(tmp_path, 7), batch=2, seq=16)
    inner = module.model
    plain = type(inner).forward

    def forward(self, *a, **kw):  # indexes the layers by the config's count: fails on the first 6 alone
        assert len(self.layers) == self.config.num_hidden_layers, "every layer is needed"
        return plain(self, *a, **kw)

    inner.forward = forward.__get__(inner)
    got = import_hf(module, args, module.config)
    assert len(inner.layers) == 7 and got == from_torch(module, args) and got.repeated[1].count == 7
