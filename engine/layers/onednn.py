"""Prepacked oneDNN linear kernels (CPU), used by the unquantized linear method and the roofline benchmark.

On AMD CPUs torch's default float32 GEMM (MKL) runs well below the AVX-512 peak, and it re-packs the weight
on every call; a prepacked oneDNN linear is 2-3x faster at both decode (M ~ 32) and prefill (M ~ 2048)
shapes. Results are float32-accurate but not bitwise equal to F.linear (another summation order).
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
import torch.nn.functional as F

# oneDNN (and ideep inside torch) keep a compiled primitive per distinct input shape, up to 1024 of each. A server's
# batches have a new token count almost every step, so with the defaults the engine process's resident memory grew
# by ~200 kB per request for thousands of requests (tiny-random, `bench soak`, docs/BENCHMARKS.md). Both variables
# are read when torch loads, so they must be in the environment of a process before it starts. A shape evicted from
# the 16-entry cache is compiled again when it recurs. An explicit setting in the environment wins.
ONEDNN_CACHE_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16", "LRU_CACHE_CAPACITY": "16"}


def bound_onednn_caches_for_children() -> None:
    """Put ONEDNN_CACHE_ENV in this process's environment (unless set) so processes it starts inherit it."""
    for name, value in ONEDNN_CACHE_ENV.items():
        os.environ.setdefault(name, value)


def onednn_prepack(weight: torch.Tensor) -> torch.Tensor:
    """The weight reordered into oneDNN's blocked layout (CPU); pair with `onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W^T (+ bias) with W prepacked by `onednn_prepack`. Inside torch.compile it is one opaque op (the
    packed weight does not trace through inductor's own lowering of the oneDNN kernel)."""
    if torch.compiler.is_compiling():
        return _onednn_linear_op(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.custom_op("servelab::onednn_linear", mutates_args=())
def _onednn_linear_op(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@_onednn_linear_op.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


@lru_cache(maxsize=4)
def onednn_linear_available(dtype: torch.dtype) -> bool:
    """Whether this torch build runs prepacked oneDNN linears in `dtype` on the CPU, and agrees with F.linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(3, 64, generator=generator).to(dtype)
        w = torch.randn(48, 64, generator=generator).to(dtype)
        y = onednn_linear(x, onednn_prepack(w), None)
        return bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=0.1, rtol=0.02))
    except (RuntimeError, AttributeError):  # an op missing or unsupported in this build
        return False
