"""The compiled CPU forward: each decoder layer's work outside attention under torch.compile (inductor).

Cut: per layer, two compiled regions, `pre_attention` (input RMSNorm with the residual add, the QKV projection,
rotary on q and k) and `post_attention` (output projection, RMSNorm with the residual add, gate/up projection,
SiLU * up, down projection); attention runs between them in its backend, eagerly. The regions hold the linears
because every elementwise chain sits between two of them: compiled alone, each small chain (one RMSNorm, one
SiLU * mul) cost more in torch.compile's per-call overhead than its eager kernels (measured on SmolLM2-135M), so
the regions are as large as attention allows. The oneDNN linear is one opaque op inside them
(engine/layers/onednn.py); the tensor-parallel all-reduce is a graph break (engine/layers/linear.py). Every layer
shares one compiled graph per region (inductor sees the layer's weights as inputs), so the compile costs the same for
30 layers as for one. Measured (indicative only, SmolLM2-135M float32, two cores shared with other work): the
compiled decode step is level with eager to ~15 % slower at batch 1 and 16 (eager ~45-50 ms, compiled ~50-60 ms at
batch 1); start-up pays ~45 s for a cold compile and ~5-12 s with a warm cache (inductor's import is ~4 s of it).

Batch sizes: the token dimension is dynamic. The warm-up (`compile_forward`) runs a 2-token forward with the
regions' tensor arguments marked dynamic (one graph for any number of tokens >= 2) and a 1-token forward (torch
specialises size 1: its own graph), each with and without the incoming residual (the first layer has none), so a
changing batch never recompiles after start-up.

Cache: inductor's FX graph cache lives in TORCHINDUCTOR_CACHE_DIR, `<servelab cache>/inductor` unless the user set
it, so a second start reuses the first's kernels. It runs only with `--no-enforce-eager`: eager is the default, since
the compiled forward measured no faster (docs/BENCHMARKS.md, 2026-12-03: batch 1 43.3 vs 40.5 ms TPOT eager, batch
32 within the run-order noise). `--enforce-eager` (vLLM's flag) or SERVELAB_ENFORCE_EAGER=1 in the
environment (the test suite sets it: tests/conftest.py) runs the forward eagerly; so does a failed compile, after one
warning with the reason. On CUDA the forward stays eager (the triton backend brings its own fused kernels).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.model_files import cache_dir

logger = logging.getLogger(__name__)

ENFORCE_EAGER_ENV = "SERVELAB_ENFORCE_EAGER"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
PROGRESS_LINE = "compiling the forward (torch.compile, inductor)..."
REGIONS = ("pre_attention", "post_attention")
# Inductor's C++ wrapper: the compiled region's launcher is C++, not Python. Per call it saves about as much as the
# fusion gains on a 135M model at batch 1 (indicative A/B on SmolLM2-135M, two shared cores: with the Python wrapper
# the compiled step was ~15 % slower than eager; with this one, level with it).
INDUCTOR_OPTIONS = {"cpp_wrapper": True}

_fallback_reported = False  # the compile-failure warning is said once per process (a draft model compiles too)


def inductor_cache_dir() -> str:
    """Where inductor keeps its compiled kernels: $TORCHINDUCTOR_CACHE_DIR, else <servelab cache>/inductor."""
    return os.environ.get(INDUCTOR_CACHE_ENV) or str(cache_dir() / "inductor")


def eager_reason(enforce_eager: bool, device: torch.device) -> str | None:
    """Why the forward runs eagerly (None: it is compiled)."""
    if enforce_eager:
        return "--enforce-eager"
    if os.environ.get(ENFORCE_EAGER_ENV, "") not in ("", "0"):
        return f"{ENFORCE_EAGER_ENV}={os.environ[ENFORCE_EAGER_ENV]}"
    if device.type != "cpu":
        return f"torch.compile is used on the CPU only, this forward runs on {device.type}"
    return None


class CompiledRegion:
    """One layer method under torch.compile. While `mark_dynamic` is set (the warm-up), every tensor argument's
    token dimension (dim 0, when >= 2) is marked dynamic before the call, so the graph serves any token count."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.eager = method
        self.compiled = torch.compile(method, options=INDUCTOR_OPTIONS)
        self.mark_dynamic = False

    def __call__(self, *args: Any) -> Any:
        if self.mark_dynamic:
            for arg in args:
                if isinstance(arg, torch.Tensor) and arg.dim() and arg.shape[0] >= 2:
                    torch._dynamo.mark_dynamic(arg, 0)
        return self.compiled(*args)


def compile_regions(model: nn.Module) -> list[CompiledRegion]:
    """Put every decoder layer's `REGIONS` under torch.compile (compiled lazily, at their first call)."""
    regions = []
    for layer in model.layers:  # type: ignore[union-attr]
        for name in REGIONS:
            region = CompiledRegion(getattr(layer, name))
            setattr(layer, name, region)
            regions.append(region)
    return regions


def restore_eager(model: nn.Module) -> None:
    """Undo `compile_regions`: the layers' own methods again."""
    for layer in model.layers:  # type: ignore[union-attr]
        for name in REGIONS:
            layer.__dict__.pop(name, None)


def compile_forward(
    model: nn.Module, warm_up: Callable[[int], object], *, enforce_eager: bool, device: torch.device, report: bool
) -> str:
    """Compile the model's regions and warm them with `warm_up(num_tokens)` (a forward of that many tokens), unless
    the forward is to run eagerly. Returns how the forward runs, for the start-up line: "compiled in 8.7 s" or
    "eager (reason)". A failed compile leaves the model eager and, when `report`, warns once with the reason."""
    reason = eager_reason(enforce_eager, device)
    if reason is not None:
        return f"eager ({reason})"
    os.environ.setdefault(INDUCTOR_CACHE_ENV, inductor_cache_dir())
    if report:
        logger.info(PROGRESS_LINE)
    start = time.perf_counter()
    try:
        regions = compile_regions(model)
        for region in regions:
            region.mark_dynamic = True
        warm_up(2)
        for region in regions:
            region.mark_dynamic = False
        warm_up(1)
    except Exception as error:  # noqa: BLE001 - any compiler failure (no C++ compiler, an untraceable op) -> eager
        restore_eager(model)
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        reason = f"torch.compile failed: {type(error).__name__}: {first_line}"
        _report_fallback(reason, report)
        return f"eager ({reason})"
    seconds = time.perf_counter() - start
    if report:
        logger.info("compiled the forward in %.1f s (torch.compile, inductor; cache %s)", seconds, inductor_cache_dir())
    return f"compiled in {seconds:.1f} s"


def _report_fallback(reason: str, report: bool) -> None:
    global _fallback_reported
    if report and not _fallback_reported:
        _fallback_reported = True
        logger.warning("%s; running the forward eagerly (--enforce-eager skips the attempt)", reason)
