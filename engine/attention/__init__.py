"""Attention backends over the paged KV cache. `get_attention_backend(name)` picks one."""

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend, TorchAttentionMetadata

ATTENTION_BACKENDS = ("torch", "triton", "cpu")


def get_attention_backend(name: str = "torch") -> type[AttentionBackend]:
    """The backend class named `name` ("triton" imports triton on first use; "cpu" builds its kernel then)."""
    if name == "torch":
        return TorchAttentionBackend
    if name == "cpu":
        from engine.attention.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend
    raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(ATTENTION_BACKENDS)}")


def resolve_attention_backend(name: str, device_type: str) -> str:
    """`auto` is triton on CUDA when triton imports, cpu on the CPU when its C++ kernel builds and loads (once a
    process; warned when not), torch otherwise; other names pass through."""
    if name != "auto":
        return name
    if device_type == "cpu":
        from engine.attention.ops.cpu_paged_attention import load_cpu_decode_kernel

        return "cpu" if load_cpu_decode_kernel() is not None else "torch"
    if device_type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
    "get_attention_backend",
    "resolve_attention_backend",
]
