"""safetensors weights into each rank's pieces: every rank's piece equals its slice of the stored
tensor (contiguous, strided and uneven pieces), read from a box around the piece; another model's
file is refused before anything is written. In one process with torch's fake process group (the
loads are local reads: no collective)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")


def _model():
    from shardlayout.program.torch_models import LlamaTorch

    torch.manual_seed(0)
    return LlamaTorch(layers=1, dim=16, heads=4, ffn=24), (torch.randn(4, 8, 16), torch.randn(8, 4),
                                                           torch.randn(8, 4))


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_each_rank_reads_exactly_its_piece(fake_world, tmp_path, rank):
    from safetensors.torch import save_file

    import shardlayout

    fake_world(4, rank)
    model, args = _model()
    g = torch.Generator().manual_seed(7)
    stored = {n: torch.randn(p.shape, generator=g) for n, p in model.state_dict().items()}
    save_file(stored, str(tmp_path / "model.safetensors"))
    # w_up cut on tp then dp inside one dim (a _StridedShard), ffn 24 on tp=2 (even) and w_gate's 24 on dp*tp
    pins = {"layers.0.w_up": "[16, tp*2*dp*3]"}
    pmod = shardlayout.parallelize(model, "dp=2,tp=2", style="megatron-sp", pins=pins, example_inputs=args)
    got = shardlayout.load_safetensors(pmod, tmp_path)
    assert got["tensors"] == len(stored) and got["bytes_read"] < got["bytes_total"]
    placements = {n: str(p.placements) for n, p in pmod.named_parameters()}
    assert "_StridedShard" in placements["layers.0.w_up"]
    for n, p in pmod.named_parameters():
        idx = pmod.plan.shardings[n].indices(rank)
        want = stored[n][tuple(torch.from_numpy(np.array(a)) for a in np.ix_(*idx))]
        assert torch.equal(p.to_local(), want), n


def test_a_file_of_another_model_is_refused_before_anything_is_written(fake_world, tmp_path):
    from safetensors.torch import save_file

    import shardlayout
    from shardlayout.run.train import CheckpointError

    fake_world(2)
    model, args = _model()
    pmod = shardlayout.parallelize(model, "tp=2", style="megatron", example_inputs=args)
    before = {n: p.to_local().clone() for n, p in pmod.named_parameters()}
    sd = {n: torch.zeros(p.shape) for n, p in model.state_dict().items()}
    wrong = dict(sd, **{"layers.0.wq": torch.zeros(16, 8)})
    save_file(wrong, str(tmp_path / "a.safetensors"))
    with pytest.raises(CheckpointError, match=r"weight layers.0.wq is \(16, 8\) in .*a.safetensors, \(16, 16\)"):
        shardlayout.load_safetensors(pmod, tmp_path / "a.safetensors")
    other = {k: v for k, v in sd.items() if k != "layers.0.wo"}
    other["lm_head.weight"] = torch.zeros(3)
    save_file(other, str(tmp_path / "b.safetensors"))
    with pytest.raises(CheckpointError, match="another model: they have no layers.0.wo; they have lm_head.weight"):
        shardlayout.load_safetensors(pmod, tmp_path / "b.safetensors")
    (tmp_path / "c.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        shardlayout.load_safetensors(pmod, tmp_path / "c.safetensors")
    assert all(torch.equal(p.to_local(), before[n]) for n, p in pmod.named_parameters())
