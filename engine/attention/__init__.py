"""Attention backends over the paged KV cache. `get_attention_backend(name)` picks one."""

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend, TorchAttentionMetadata


def get_attention_backend(name: str = "torch") -> type[AttentionBackend]:
    backends: dict[str, type[AttentionBackend]] = {"torch": TorchAttentionBackend}
    if name not in backends:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(backends)}")
    return backends[name]


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttentionBackend",
    "TorchAttentionMetadata",
    "get_attention_backend",
]
