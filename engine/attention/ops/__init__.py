"""Triton kernels over the paged KV cache (CUDA; on the CPU they run under TRITON_INTERPRET=1 for tests)."""
