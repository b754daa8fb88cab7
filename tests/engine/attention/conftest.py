"""Triton kernels run under the interpreter on CPU tensors here: set before any kernel module is imported,
because `triton.jit` decides interpreted vs compiled when a kernel is defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
