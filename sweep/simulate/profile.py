"""The step-cost profile behind `bench model profile`: time the model runner over a grid of step shapes and fit the
step-time cost model.

Each grid point is one engine step built by hand: prefill chunks of P tokens (over C tokens of cached context) and
D decodes over L tokens of context each, run as a real SchedulerOutput through `ModelRunner.execute_model` and
sampled greedily by the engine's `Sampler` (what EngineCore does in a step, less the scheduler, whose own cost
`bench simulate` measures). The requests of a step share one block table: every KV read and write still happens
(the timing is the same), but the cache only needs room for the longest sequence, so a grid of 64 decodes at
2048 tokens profiles in the memory of one.

A point's time is the median of `--repeats` runs after one warm-up run. The profile JSON holds the measurements,
the fitted `CostModel` (engine/executor/cost_model.py) with its in-sample and leave-one-out relative errors, the
KV cache's capacity on this machine (`kv_cache.tokens`: the budget the engine would size with these knobs, its
default cap or --kv-cache-memory-bytes / --gpu-memory-utilization, uncapped by max_num_seqs), the fixed knobs
(model, dtype, quantization, kv_cache_dtype, device, block size, and tensor-parallel size 1: the in-process
runner), the machine and the versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

PROFILE_KIND = "servelab-step-profile"


@dataclass(frozen=True)
class GridPoint:
    """One step: `prefill_seqs` chunks of `prefill_tokens` tokens each over `prefill_context` cached tokens, and
    `decode_seqs` decodes over `decode_context` tokens each."""

    prefill_tokens: int = 0
    prefill_context: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    prefill_seqs: int = 1

    @property
    def longest(self) -> int:
        return max(self.prefill_context + self.prefill_tokens, self.decode_context + 1)


def default_grid(prefill_tokens: list[int], decode_seqs: list[int], context_lens: list[int]) -> list[GridPoint]:
    """Prefill alone (fresh, and as a chunk over the longest context), decode alone at every context, and
    mixed steps (each prefill size next to the middle decode batch at the middle context)."""
    grid = [GridPoint(prefill_tokens=p) for p in prefill_tokens]
    grid += [GridPoint(prefill_tokens=p, prefill_context=max(context_lens)) for p in prefill_tokens[:2]]
    grid += [GridPoint(decode_seqs=d, decode_context=c) for d in decode_seqs for c in context_lens]
    middle_d, middle_c = decode_seqs[len(decode_seqs) // 2], context_lens[len(context_lens) // 2]
    grid += [GridPoint(prefill_tokens=p, decode_seqs=middle_d, decode_context=middle_c) for p in prefill_tokens]
    return grid


def build_step(point: GridPoint, vocab_size: int, block_size: int, seed: int = 0) -> Any:
    """The SchedulerOutput of one grid point, every request on the shared block table."""
    import random

    from engine.kv_cache_manager import cdiv
    from engine.request import Request
    from engine.sampling_params import SamplingParams
    from engine.scheduler_output import ScheduledRequest, SchedulerOutput

    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    scheduled = []

    def add(name: str, context: int, query: int) -> None:
        ids = [rng.randrange(vocab_size) for _ in range(context + query)]
        request = Request(name, ids, params, max_tokens=1)
        request.num_computed_tokens = context
        blocks = list(range(cdiv(context + query, block_size)))
        scheduled.append(ScheduledRequest(request, query, blocks, sample=True))

    for i in range(point.prefill_seqs if point.prefill_tokens else 0):
        add(f"prefill-{i}", point.prefill_context, point.prefill_tokens)
    for i in range(point.decode_seqs):
        add(f"decode-{i}", point.decode_context, 1)
    return SchedulerOutput(scheduled, sum(s.num_scheduled_tokens for s in scheduled))


def time_steps(runner: Any, grid: list[GridPoint], repeats: int, echo: Any = print) -> list[float]:
    """Median seconds of execute_model + greedy sampling per grid point (after one warm-up run each)."""
    import torch

    from engine.sampler import Sampler, SamplingMetadata

    sampler = Sampler(runner.device)
    times = []
    for index, point in enumerate(grid):
        output = build_step(point, runner.vocab_size, runner.block_size, seed=index)
        samples = []
        for run in range(repeats + 1):
            start = time.perf_counter()
            logits = runner.execute_model(output)
            metadata = SamplingMetadata.build([s.request for s in output.scheduled], runner.vocab_size,
                                              logits.device, {})  # fmt: skip
            sampler(logits, metadata)  # returns host lists: the step is synchronised
            if runner.device.type == "cuda":
                torch.cuda.synchronize(runner.device)
            if run:
                samples.append(time.perf_counter() - start)
        times.append(statistics.median(samples))
        echo(f"  [{index + 1}/{len(grid)}] {_describe(point)}: {times[-1] * 1e3:.2f} ms")
    return times


def _describe(point: GridPoint) -> str:
    parts = []
    if point.prefill_tokens:
        parts.append(
            f"prefill {point.prefill_tokens} tok" + (f" @ctx {point.prefill_context}" if point.prefill_context else "")
        )
    if point.decode_seqs:
        parts.append(f"{point.decode_seqs} decodes @ctx {point.decode_context}")
    return " + ".join(parts)


def profile_model(knobs: dict[str, Any], grid: list[GridPoint], repeats: int, echo: Any = print) -> dict[str, Any]:
    """Build the model runner from `knobs`, time `grid`, fit; returns the profile's JSON dict."""
    from engine.config import EngineConfig
    from engine.executor.cost_model import StepShape, fit
    from engine.kv_cache_manager import cdiv
    from engine.model_runner import ModelRunner

    config = EngineConfig.from_kwargs(**knobs)
    if config.parallel_config.tensor_parallel_size != 1:
        raise ValueError("bench model profile times the in-process model runner: tensor_parallel_size must be 1")
    max_model_len = config.model_config.max_model_len
    assert max_model_len is not None
    too_long = [p for p in grid if p.longest > max_model_len]
    if too_long:
        raise ValueError(f"grid step {_describe(too_long[0])} is longer than max_model_len={max_model_len}")
    runner = ModelRunner(config)
    if config.cache_config.num_gpu_blocks_override is not None:
        kv_tokens = config.cache_config.num_gpu_blocks_override * runner.block_size
    else:  # the pool this machine's memory holds, before the max_num_seqs cap (which the simulation applies)
        budget = runner.kv_cache_budget()
        kv_tokens = budget.bytes // runner.block_bytes * runner.block_size
        echo(f"KV cache budget: {budget.bytes} bytes ({budget.limit})")
    runner.initialize_kv_cache(cdiv(max(p.longest for p in grid), runner.block_size) + 1)
    for cache in runner.kv_caches:
        cache.zero_()  # shared blocks are read before any step of the grid writes them
    echo(f"profiling {config.model_config.model} ({runner.dtype}, {runner.device}): {len(grid)} steps x {repeats}")
    times = time_steps(runner, grid, repeats, echo)
    shapes = [StepShape.of(build_step(p, runner.vocab_size, runner.block_size)) for p in grid]
    model = fit(shapes, times)
    mc = config.model_config
    return {
        "kind": PROFILE_KIND,
        "version": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "knobs": {
            "model": mc.model,
            "dtype": str(runner.dtype).removeprefix("torch."),
            "quantization": mc.quantization,
            "kv_cache_dtype": config.cache_config.kv_cache_dtype,
            "device": runner.device.type,
            "block_size": runner.block_size,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        },
        "kv_cache": {
            "tokens": int(kv_tokens),
            "bytes_per_token": runner.block_bytes // runner.block_size,
            "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
            "kv_cache_memory_bytes": config.cache_config.kv_cache_memory_bytes,
        },
        "cost_model": model.to_dict(),
        "measurements": [
            {"grid": asdict(p), "shape": asdict(s), "seconds": t, "predicted_seconds": model.step_time(s)}
            for p, s, t in zip(grid, shapes, times, strict=True)
        ],
        "repeats": repeats,
        "machine": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("servelab", "torch", "numpy"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
