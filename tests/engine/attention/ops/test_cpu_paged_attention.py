"""The C++ CPU decode kernel against plain SDPA over the gathered KV, and its build fallback.

The kernel is built once per cache directory (~/.cache/servelab/torch_extensions, or $TORCH_EXTENSIONS_DIR):
the first test to need it pays the build (about 30 s on two cores), later sessions only load it."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from engine.attention.ops import cpu_paged_attention as ops

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def kernel() -> ops.DecodeKernel:
    loaded = ops.load_cpu_decode_kernel()
    assert loaded is not None, "the CPU kernel did not build: see the warning above"
    return loaded


def reference(q, cache, tables, lens, rows, scale):  # type: ignore[no-untyped-def]
    """Per decode: its blocks gathered in table order, cut to seq_len, then SDPA in float64 with GQA."""
    out = {}
    for table, seq_len, row in zip(tables, lens, rows, strict=True):
        kv = cache[:, :, table].flatten(2, 3)[:, :, :seq_len].double()  # [2, kv_heads, seq_len, dim]
        query = q[row].double()[None, :, None, :]  # [1, heads, 1, dim]
        o = F.scaled_dot_product_attention(query, kv[0][None], kv[1][None], scale=scale, enable_gqa=True)
        out[row] = o[0, :, 0]
    return out


def make_batch(lens, heads, kv_heads, dim, q_dtype, cache_dtype, spare_rows=2, seed=0):  # type: ignore[no-untyped-def]
    """Random q and cache; each decode's blocks drawn from a shuffled pool (tables out of order); decodes sit at
    scattered rows of a batch with `spare_rows` other rows between them."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(needed) + 3
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[pool.pop() for _ in range(b)] for b in needed]
    cache = torch.randn(2, kv_heads, num_blocks, BLOCK_SIZE, dim, generator=gen).to(cache_dtype)
    num_tokens = len(lens) * (spare_rows + 1)
    q = torch.randn(num_tokens, heads, dim, generator=gen).to(q_dtype)
    rows = [i * (spare_rows + 1) + spare_rows for i in range(len(lens))]
    return q, cache, tables, rows


def ints(values):  # type: ignore[no-untyped-def]
    return torch.tensor(values, dtype=torch.int32)


def run(kernel, q, cache, tables, lens, rows, scale):  # type: ignore[no-untyped-def]
    width = max(len(t) for t in tables)
    out = torch.full_like(q, 7.0)
    kernel(out, q, cache, ints([t + [0] * (width - len(t)) for t in tables]), ints(lens), ints(rows), scale)
    return out


# Odd lengths, lengths at and across block boundaries (16, 17, 32, 33), one token, and a long one.
LENS = [1, 2, 7, 15, 16, 17, 31, 32, 33, 50, 129]


@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("dim", [64, 80])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_float32_queries_match_sdpa(kernel, group: int, dim: int, cache_dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    kv_heads = 2
    q, cache, tables, rows = make_batch(LENS, kv_heads * group, kv_heads, dim, torch.float32, cache_dtype)
    out = run(kernel, q, cache, tables, LENS, rows, dim**-0.5)
    expected = reference(q, cache, tables, LENS, rows, dim**-0.5)
    for row, want in expected.items():
        torch.testing.assert_close(out[row].double(), want, atol=2e-6, rtol=1e-5)
    untouched = [r for r in range(q.shape[0]) if r not in expected]
    assert bool((out[untouched] == 7.0).all())  # rows that are not decodes are left as they were


@pytest.mark.parametrize("group", [1, 3])
def test_bfloat16_queries_and_cache(kernel, group: int) -> None:  # type: ignore[no-untyped-def]
    """Both bf16 (the model in bfloat16): float32 inside, one rounding of the output to bf16."""
    q, cache, tables, rows = make_batch(LENS, 2 * group, 2, 64, torch.bfloat16, torch.bfloat16, seed=1)
    out = run(kernel, q, cache, tables, LENS, rows, 0.125)
    assert out.dtype == torch.bfloat16
    for row, want in reference(q, cache, tables, LENS, rows, 0.125).items():
        torch.testing.assert_close(out[row].double(), want.to(torch.bfloat16).double(), atol=1e-2, rtol=1e-2)
        assert (out[row].double() - want).abs().max() <= want.abs().max() * 2**-8 + 1e-6  # within one bf16 ulp


def test_a_view_of_the_fused_projection_is_read_in_place(kernel) -> None:  # type: ignore[no-untyped-def]
    """q as the model passes it: a slice of [tokens, heads + kv_heads, dim] (rows further apart than heads * dim)."""
    lens = [17, 40]
    q, cache, tables, rows = make_batch(lens, 6, 2, 64, torch.float32, torch.float32, seed=2)
    fused = torch.cat([q, torch.randn(q.shape[0], 2, 64)], dim=1)
    view = fused.split([6, 2], dim=1)[0]
    assert not view.is_contiguous()
    out = torch.zeros_like(q)
    width = max(len(t) for t in tables)
    kernel(out, view, cache, ints([t + [0] * (width - len(t)) for t in tables]), ints(lens), ints(rows), 0.125)
    for row, want in reference(q, cache, tables, lens, rows, 0.125).items():
        torch.testing.assert_close(out[row].double(), want, atol=2e-6, rtol=1e-5)


def test_bad_inputs_are_clear_errors(kernel) -> None:  # type: ignore[no-untyped-def]
    q, cache, tables, rows = make_batch([20], 2, 2, 64, torch.float32, torch.float32)
    table, out = ints([tables[0]]), torch.empty_like(q)
    with pytest.raises(RuntimeError, match="seq_len 40 outside"):
        kernel(out, q, cache, table, ints([40]), ints(rows), 1.0)
    with pytest.raises(RuntimeError, match="block id 99 out of range"):
        kernel(out, q, cache, ints([[99, 0]]), ints([20]), ints(rows), 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        kernel(out, q, cache, table.long(), ints([20]), ints(rows), 1.0)
    with pytest.raises(RuntimeError, match="outside the batch"):
        kernel(out, q, cache, table, ints([20]), ints([q.shape[0]]), 1.0)


def test_a_failed_build_warns_once_and_returns_none(monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    def broken() -> None:
        raise RuntimeError("Error building extension: g++: not found")

    monkeypatch.setattr(ops, "_build", broken)
    ops.reset_for_tests()
    try:
        with caplog.at_level(logging.WARNING, logger=ops.__name__):
            assert ops.load_cpu_decode_kernel() is None
            assert ops.load_cpu_decode_kernel() is None
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "g++: not found" in warnings[0] and "torch path" in warnings[0]
    finally:
        ops.reset_for_tests()


def test_a_missing_compiler_fails_the_build_cleanly(monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A real build in a fresh cache directory with CXX naming no binary: a warning, no exception, None. Under
    another extension name: cpp_extension versions a name per process, and a changed build directory would make the
    real one load as a second library registering the same ops."""
    monkeypatch.setattr(ops, "EXTENSION_NAME", "servelab_cpu_attention_no_compiler")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    ops.reset_for_tests()
    try:
        with caplog.at_level(logging.WARNING, logger=ops.__name__):
            assert ops.load_cpu_decode_kernel() is None
        assert str(tmp_path) in str(ops.extension_dir())
        assert any("unavailable" in r.getMessage() for r in caplog.records)
    finally:
        ops.reset_for_tests()


def test_a_build_logs_its_time_once_and_a_cached_start_only_loads(kernel, monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """cpp_extension.load stubbed: writing the library is a build (one info line with its time), finding it
    unchanged is a cached start (no line); the cache folder is under TORCH_EXTENSIONS_DIR; a stale lock goes."""
    import os

    from torch.utils import cpp_extension

    calls = []

    def fake_load(name, sources, build_directory, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(build_directory)
        library = os.path.join(build_directory, f"{name}.so")
        if not os.path.exists(library):
            open(library, "w").close()

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = ops.extension_dir()
    directory.mkdir(parents=True)
    lock = directory / "lock"
    lock.touch()
    os.utime(lock, (1, 1))  # left by a build that was killed long ago
    ops.reset_for_tests()
    try:
        with caplog.at_level(logging.INFO, logger=ops.__name__):
            assert ops.load_cpu_decode_kernel() is kernel
            ops.reset_for_tests()
            assert ops.load_cpu_decode_kernel() is kernel
        built = [r.getMessage() for r in caplog.records if "built the CPU paged-attention kernel in" in r.getMessage()]
        assert len(built) == 1 and str(directory) in built[0]
        assert calls == [str(directory)] * 2 and directory.parent == tmp_path and not lock.exists()
    finally:
        ops.reset_for_tests()
