"""The fused Triton norm and activation kernels against the torch layers, interpreted on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined: triton.jit reads it then

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from engine.layers.activation import SiluAndMul  # noqa: E402
from engine.layers.layernorm import RMSNorm  # noqa: E402
from engine.layers.triton_fused import add_rms_norm, silu_and_mul, use_triton_fused_layers  # noqa: E402

# The interpreter converts float32 -> bfloat16 by truncation (a GPU rounds to nearest), so bfloat16 results may
# sit a few bfloat16 ulps (2**-8 relative) from torch's here.
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 2**-8, "rtol": 2**-6}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [48, 64])
def test_add_rms_norm_matches_the_torch_layer(dtype: torch.dtype, hidden: int) -> None:
    torch.manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-5, dtype)
    norm.weight.data = torch.randn(hidden).to(dtype)
    x, residual = torch.randn(5, hidden).to(dtype), torch.randn(5, hidden).to(dtype)
    torch.testing.assert_close(add_rms_norm(x, norm.weight, 1e-5), norm(x), **TOLERANCE[dtype])
    out, summed = add_rms_norm(x, norm.weight, 1e-5, residual)
    expected_out, expected_sum = norm(x, residual)
    torch.testing.assert_close(summed, expected_sum, **TOLERANCE[dtype])
    if dtype == torch.float32:
        assert torch.equal(summed, expected_sum)
    torch.testing.assert_close(out, expected_out, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [40, 1100])  # one column block, and two with a ragged end (SILU_BLOCK = 1024)
def test_silu_and_mul_matches_the_torch_layer(dtype: torch.dtype, width: int) -> None:
    torch.manual_seed(width)
    x = (torch.randn(3, 2 * width) * 3).to(dtype)
    torch.testing.assert_close(silu_and_mul(x), SiluAndMul()(x), **TOLERANCE[dtype])


def test_empty_batches_and_the_model_switch() -> None:
    assert add_rms_norm(torch.zeros(0, 8), torch.ones(8), 1e-5).shape == (0, 8)
    assert silu_and_mul(torch.zeros(0, 8)).shape == (0, 4)
    model = nn.Sequential(RMSNorm(8, 1e-5, torch.float32), SiluAndMul(), nn.Linear(4, 4))
    assert use_triton_fused_layers(model) == 2
    assert model[0].fused_kernel is add_rms_norm and model[1].fused_kernel is silu_and_mul
    x = torch.randn(2, 8)
    torch.testing.assert_close(model[1](x), SiluAndMul()(x))
