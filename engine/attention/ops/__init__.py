"""Kernels over the paged KV cache: Triton (CUDA; interpreted on the CPU in tests) and the C++ CPU decode kernel."""
