"""GGUF Q4_0/Q4_1 blocks repacked into the int4 layout: codes and scales bit-exact against the gguf package's
dequantisation, rows in HF order, and the default model's int4 layers loaded from them."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open

from engine.layers.quantization.gguf_repack import read_q4_tensors, unpack_q4_blocks
from engine.layers.quantization.quant_utils import dequantize_int4
from engine.model_files import resolve_model, smollm2_gguf_path


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_unpacked_blocks_reproduce_the_gguf_dequantisation_bit_for_bit(type_name: str) -> None:
    weights = np.random.default_rng(0).standard_normal((16, 96)).astype(np.float32)
    quant_type = gguf.GGMLQuantizationType[type_name]
    raw = gguf.quants.quantize(weights, quant_type)
    expected = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, quant_type), dtype=np.float32))
    q, d, m = unpack_q4_blocks(raw, type_name, (16, 96))
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    d_full, m_full = d.repeat_interleave(32, dim=1), m.repeat_interleave(32, dim=1)
    # the gguf package's own formulas: Q4_1 d * q + m, Q4_0 d * (q - 8)
    got = d_full * q.float() + m_full if type_name == "Q4_1" else d_full * (q - 8).float()
    assert torch.equal(got, expected)


def test_default_model_blocks_match_its_converted_weights_in_hf_row_order() -> None:
    wanted = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
              "model.layers.7.mlp.down_proj.weight", "model.embed_tokens.weight"}  # fmt: skip
    blocks = read_q4_tensors(smollm2_gguf_path(), only=wanted)
    assert "model.embed_tokens.weight" not in blocks  # the embedding is Q8_0, not repacked
    wanted.discard("model.embed_tokens.weight")
    assert set(blocks) == wanted
    with safe_open(str(resolve_model("smollm2-135m") / "model.safetensors"), framework="pt") as f:
        dense = {name: f.get_tensor(name) for name in wanted}
    for name in wanted:
        q, scale, zero = blocks[name]
        torch.testing.assert_close(dequantize_int4(q, scale, zero), dense[name], atol=1e-6, rtol=0)
