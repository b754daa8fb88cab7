"""Scheduler + KV manager CPU per step at a steady decode of N running sequences (no model, no admissions).

    python -m engine.benchmarks.scheduler_cost [N ...]     (default 16 64 256)

A bare `Scheduler` on smollm2-135m's config (512-token prompts, an 8192-token budget, prefix caching on) admits
N requests, then runs `schedule()` + `update_from_output()` with one sampled token per request per step; the
figure is the median process CPU time of 300 steps after 20 warm-up steps (the prefills). `bench simulate`
reports the same quantity per point under a workload (its `scheduler_cpu_us_per_step_*`).
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine.config import EngineConfig
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler


def steady_decode_cpu_us(num_running: int, steps: int = 300, warmup_steps: int = 20) -> float:
    config = EngineConfig.from_kwargs(
        model="smollm2-135m", max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=2048,
        enable_prefix_caching=True,
    )  # fmt: skip
    scheduler = Scheduler(config, num_gpu_blocks=40000)
    params = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)
    for i in range(num_running):
        prompt = [(i * 7919 + j) % 30000 + 1000 for j in range(512)]
        scheduler.add_request(Request(str(i), prompt, params, eos_token_id=0, max_tokens=1500))
    times = []
    for step in range(steps + warmup_steps):
        start = time.process_time()
        output = scheduler.schedule()
        rows = [[1] for _ in output.sampling_requests()]
        middle = time.process_time()
        scheduler.update_from_output(output, rows)
        if step >= warmup_steps:
            times.append(middle - start + time.process_time() - middle)
    return statistics.median(times) * 1e6


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the number of running sequences must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engine.benchmarks.scheduler_cost",
        description="Scheduler + KV manager CPU per step at a steady decode of N running sequences.",
    )
    parser.add_argument("num_running", nargs="*", type=_positive_int, default=[16, 64, 256], metavar="N")
    for n in parser.parse_args(argv).num_running:
        print(f"{n:4d} running: {steady_decode_cpu_us(n):7.1f} us/step (median)")


if __name__ == "__main__":
    main()
